"""The ms-swift entrypoint tells interpreter problems apart, names the path, the login and the
machine, and records them where the probe reads a precheck's refusal: a permanent failure."""

from __future__ import annotations

import json
import os
import pwd
import subprocess

import pytest

from reconciler.runtime import probe
from reconciler.tasks.swift import PRECHECK_JSON, entrypoint


def _run(tmp_path, py: str) -> tuple[int, str, dict | None]:
    (tmp_path / "entrypoint.sh").write_text(entrypoint("sft"))
    env = {"PATH": "/usr/bin:/bin", "RECONCILER_BUNDLE": str(tmp_path), "RECONCILER_PYTHON": py}
    p = subprocess.run(["sh", str(tmp_path / "entrypoint.sh")], env=env, capture_output=True, text=True, timeout=30)
    f = tmp_path / PRECHECK_JSON
    return p.returncode, p.stderr, json.loads(f.read_text()) if f.exists() else None


@pytest.mark.parametrize("case, expect", [
    ("missing", "does not exist"),
    ("dangling-link", "which login"),
    ("not-executable", "is not executable by login"),
    ("does-not-start", "does not start for login"),
    ("not-on-path", "is not on the PATH of login"),
])
def test_each_interpreter_problem_is_named_and_permanent(tmp_path, case, expect):
    target = {"missing": str(tmp_path / "venv/bin/python"), "not-on-path": "python-nowhere-9"}.get(case)
    if case == "dangling-link":
        (tmp_path / "venv/bin").mkdir(parents=True)
        os.symlink("/opt/nowhere/python3.11", tmp_path / "venv/bin/python")
        target = str(tmp_path / "venv/bin/python")
    elif case in ("not-executable", "does-not-start"):
        target = str(tmp_path / "python")
        (tmp_path / "python").write_text("#!/no/such/interpreter\n")
        os.chmod(tmp_path / "python", 0o755 if case == "does-not-start" else 0o644)
    code, err, report = _run(tmp_path, target)
    assert code == 127 and expect in err
    assert report is not None and report["ok"] is False and expect in report["reason"]
    assert f"login {pwd.getpwuid(os.getuid()).pw_name}" in report["reason"]  # who could not run it
    # The probe turns it into a permanent failure with that reason: no retry is burnt on it.
    reason, scope = probe._precheck_failure(str(tmp_path))
    assert expect in reason and scope == "machine"  # the machine's: another machine may take the run


def test_a_working_interpreter_goes_on_to_the_precheck(tmp_path):
    code, err, report = _run(tmp_path, "/usr/bin/python3")
    assert report is None and "reconciler:" not in err  # the precheck script itself is absent here
