"""The reconciler's own environment cannot be read by processes of its unix user.

Local runs run as the reconciler's user. Without the seal, any of them reads every secret of the
daemon from /proc/<pid>/environ; with it, that file belongs to root. Checked for real: two
processes under one unprivileged uid, one sealed and one not, and a third of the same uid trying
to read both.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534
# The system interpreter: the reconciler's own may live under a home an unprivileged user cannot enter.
PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
HOLDER = """
import os, sys
sys.path.insert(0, sys.argv[1])
from procenv import seal_own_environment
ok = seal_own_environment() if sys.argv[2] == "seal" else False
print(os.getpid(), ok, flush=True)
sys.stdin.read()
"""
READER = """
import sys
try:
    data = open(f"/proc/{sys.argv[1]}/environ", "rb").read()
except OSError as e:
    print("denied", type(e).__name__)
else:
    print("read", b"RC_SENTINEL_SECRET=s3cr3t" in data)
"""


def _as_nobody():
    os.setgid(NOBODY)
    os.setgroups([])
    os.setuid(NOBODY)


def _holder(lib: str, mode: str) -> tuple[subprocess.Popen, int, str]:
    p = subprocess.Popen([PYTHON, "-c", HOLDER, lib, mode], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, preexec_fn=_as_nobody, cwd="/",
                         env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "RC_SENTINEL_SECRET": "s3cr3t"})
    pid, ok = p.stdout.readline().split()
    return p, int(pid), ok


def _read_as_nobody(pid: int) -> str:
    return subprocess.run([PYTHON, "-c", READER, str(pid)], capture_output=True, text=True,
                          preexec_fn=_as_nobody, cwd="/", env={"PATH": "/usr/bin:/bin"}, timeout=30).stdout.strip()


@pytest.mark.skipif(os.geteuid() != 0 or not sys.platform.startswith("linux"),
                    reason="needs root to run the processes as another user, and Linux's /proc")
def test_a_process_of_the_same_user_cannot_read_the_sealed_environment():
    # The module, where an unprivileged user can read it (the checkout may be under /root).
    lib = tempfile.mkdtemp(prefix="rc-seal-", dir="/tmp")
    os.chmod(lib, 0o755)
    shutil.copy(ROOT / "reconciler" / "core" / "procenv.py", lib)
    os.chmod(os.path.join(lib, "procenv.py"), 0o644)
    plain, plain_pid, _ = _holder(lib, "plain")
    sealed, sealed_pid, ok = _holder(lib, "seal")
    try:
        # The control: without the seal, a same-uid process reads the secret.
        assert _read_as_nobody(plain_pid) == "read True"
        assert ok == "True"
        assert _read_as_nobody(sealed_pid).startswith("denied")
    finally:
        for p in (plain, sealed):
            p.stdin.close()
            p.wait(timeout=10)
        shutil.rmtree(lib, ignore_errors=True)


def test_every_command_that_holds_secrets_is_sealed():
    """The CLI seals itself before any command that reads secrets or starts runs."""
    src = (ROOT / "reconciler" / "cli" / "main.py").read_text()
    dispatch = src[src.index("def _dispatch"):]
    assert dispatch.index("seal_own_environment()") < dispatch.index("return commands.run(")
