"""A machine whose interpreter the login cannot reach is ruled out for the run, and the run goes to
the other machine: real passes, a real sshd on loopback, the real swift entrypoint and precheck.

lab-1's python is a virtualenv-style link into a 0700 folder of another owner (the login of the
SSH machine cannot traverse it); lab-2's python is the machine's own. The first attempt lands on
lab-1 (the first by name), its entrypoint refuses with ``scope: machine``, the next pass places
attempt 2 on lab-2 without counting a retry (maxRetries is 0), and the status file keeps lab-1
with the reason. lab-2 has no ms-swift, so attempt 2 then fails for that (the spec's own end).
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from tests.world import World, fleet, machine

pytestmark = pytest.mark.e2e
SYSTEM_PYTHON = "/usr/bin/python3"  # every login's (this one's may be a shim in root's home)


@pytest.fixture
def private_python():
    """``/tmp/rc-venv-*/bin/python`` → ``/tmp/rc-private-*/bin/python3``, the latter folder 0700 and
    not the SSH login's."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is needed: a python the SSH login can run")
    tag = uuid.uuid4().hex[:8]
    private, venv = Path(f"/tmp/rc-private-{tag}"), Path(f"/tmp/rc-venv-{tag}")
    (private / "bin").mkdir(parents=True)
    os.symlink(SYSTEM_PYTHON, private / "bin" / "python3")
    private.chmod(0o700)
    (venv / "bin").mkdir(parents=True)
    os.symlink(private / "bin" / "python3", venv / "bin" / "python")
    yield str(venv / "bin" / "python"), str(private)
    shutil.rmtree(private, ignore_errors=True)
    shutil.rmtree(venv, ignore_errors=True)


def test_a_machine_that_cannot_run_the_interpreter_is_ruled_out(tmp_path, sshd, private_python):
    venv_python, private = private_python
    bad, good = machine(sshd, "lab-1"), machine(sshd, "lab-2")
    bad["python"], good["python"] = venv_python, SYSTEM_PYTHON
    with World(tmp_path, [fleet([bad, good])]) as w:
        w.add_run({"apiVersion": "reconciler/v1", "kind": "Run", "metadata": {"name": "moved"},
                   "spec": {"template": "ssh-host", "task": {"type": "swift-sft", "model": "m", "dataset": ["d"]},
                            "restartPolicy": {"maxRetries": 0, "backoffSeconds": 0}}})
        st = w.until("moved", lambda s: s.attempt == 2 and s.handle is not None and s.handle.machine == "lab-2",
                     timeout=60)
        [entry] = st.ruled_out
        assert (entry["machine"], entry["attempt"]) == ("lab-1", 1)
        assert "venv" in entry["reason"] or "cannot reach" in entry["reason"], entry
        assert venv_python in entry["reason"] and f"login {sshd.user}" in entry["reason"], entry
        text = (w.repo / "status" / "moved.yaml").read_text()
        assert "ruled_out:" in text and "lab-1" in text  # durable: what a --once elsewhere reads
        # The first attempt's report came back with its logs.
        report = (w.bundle("moved-g1-a1") / "artifacts" / "runtime-precheck.json").read_text()
        assert '"scope": "machine"' in report and '"kind": "venv-unreadable"' in report
        st = w.until("moved", lambda s: s.phase == "Failed", timeout=60)
        assert st.attempt == 2 and [e["machine"] for e in st.ruled_out] == ["lab-1"], (st.message, st.ruled_out)
        assert "ruled out" not in st.message  # lab-2's own end: no swift there, the spec's problem
