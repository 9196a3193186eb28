"""``foreign_gpus: avoid`` fails closed: every way the GPU query can fail (no nvidia-smi, a non-zero
exit, a hang, an answer that does not parse) is an error, never "no GPU in use", and the probe's
answer is untrusted too. A process counts as the reconciler's only when it runs as the probe's
login, whatever its environment claims. The whole path, through a tunnel to the planner and
``status --machines``, runs in tests/e2e/test_inhouse.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from reconciler.core import boundary
from reconciler.runtime import probe
from tests.infra.sshd import ensure_test_user, worker_user

HEADER = "#!/bin/sh\n"
GPUS = "--query-gpu=index,uuid) printf '0, GPU-aaa\\n1, GPU-bbb\\n' ;;"


def smi(tmp_path, body: str) -> str:
    """A stand-in nvidia-smi (this machine has no GPU) with ``body`` as its case arms."""
    path = tmp_path / "nvidia-smi"
    path.write_text(HEADER + 'case "$1" in\n' + body + "\n  *) exit 2 ;;\nesac\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("body, why", [
    ("--query-gpu=index,uuid) echo 'NVIDIA-SMI has failed' >&2; exit 9 ;;", "NVIDIA-SMI has failed"),
    ("--query-gpu=index,uuid) printf 'zero, GPU-aaa\\n' ;;", "invalid literal"),
    ("--query-gpu=index,uuid) printf '0, GPU-aaa, extra\\n' ;;", "unexpected output"),
    (GPUS + "\n  --query-compute-apps=gpu_uuid,pid) printf 'GPU-zzz, 12\\n' ;;", "the GPU list does not name"),
    (GPUS + "\n  --query-compute-apps=gpu_uuid,pid) printf 'GPU-aaa, [N/A]\\n' ;;", "the GPU list does not name"),
], ids=["non-zero", "bad-index", "bad-width", "unknown-gpu", "no-pid"])
def test_every_failure_is_an_error_not_an_empty_list(tmp_path, body, why):
    out = probe.foreign_gpus(smi(tmp_path, body))
    assert set(out) == {"error"} and why in out["error"], out


def test_a_hanging_nvidia_smi_is_an_error_within_its_timeout(tmp_path):
    out = probe.foreign_gpus(smi(tmp_path, "--query-gpu=index,uuid) exec sleep 30 ;;"), timeout=0.5)
    assert set(out) == {"error"} and "timed out" in out["error"]


def test_the_variable_alone_does_not_make_a_process_ours(tmp_path, monkeypatch):
    # Another login's process that sets RECONCILER_IDENTITY (a job hiding its GPU use, an engineer)
    # is foreign; the same variable in a process of the probe's own login is ours.
    user = ensure_test_user(worker_user("rcinhouse")).pw_name
    env = {"PATH": os.environ["PATH"], "RECONCILER_IDENTITY": "r-g1-a1"}
    theirs = subprocess.Popen(["runuser", "-u", user, "--", "sleep", "30"], env=env)
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        sleeper = _child_named(theirs.pid, "sleep")
        apps = f"GPU-aaa, {ours.pid}\\nGPU-bbb, {sleeper}\\n"
        out = probe.foreign_gpus(smi(tmp_path, GPUS + f"\n  --query-compute-apps=gpu_uuid,pid) printf '{apps}' ;;"))
        assert out == {"gpus": [1]}
    finally:
        for p in (theirs, ours):
            p.kill()
            p.wait()


def _child_named(pid: int, name: str) -> int:
    """runuser's child, once it is ``name`` (runuser forks it)."""
    from tests.infra._proc import descendants, process_name, wait_until

    found: list[int] = []
    wait_until(lambda: found.extend(p for p in [pid, *descendants(pid)] if process_name(p) == name) or found,
               timeout=10, what=f"{name} under {pid}")
    return found[0]


@pytest.mark.parametrize("value, error", [
    (None, "not listed"), ("busy", "not an object"), ({"error": "nvidia-smi: not found"}, "not found"),
    ({"gpus": "0,1"}, "not a list"), ({"gpus": [0, -1]}, "not a list"), ({"gpus": [True]}, "not a list"),
    ({"gpus": list(range(65))}, "not a list"), ({}, "not a list"),
])
def test_the_boundary_reads_anything_short_of_a_clean_list_as_unknown(value, error):
    report = {"runs": {}} if value is None else {"runs": {}, "foreign_gpus": value}
    reply = boundary.parse_probe(report)
    assert reply.foreign_gpus == [] and error in reply.gpu_error


def test_the_boundary_passes_a_clean_list():
    reply = boundary.parse_probe({"runs": {}, "foreign_gpus": {"gpus": [3, 1, 3]}})
    assert reply.foreign_gpus == [1, 3] and reply.gpu_error is None and reply.rejected == []
