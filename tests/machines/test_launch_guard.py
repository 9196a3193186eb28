"""The guards run last before a job starts, on real machines (this one, and a real sshd on
loopback): a launch past its deadline is refused, retryably, and starts nothing; an identity is
claimed for one spec digest, so a second launch of it for another digest is refused and the same
digest again is idempotent."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from reconciler.core.errors import TemporaryError
from reconciler.machines import launchers
from reconciler.machines.base import LaunchSpec, MachineInfo
from reconciler.machines.local import LocalTransport
from reconciler.machines.ssh import SshTransport
from reconciler.runtime import stop
from tests.machines.test_ssh_transport import info
from tests.world import remote_root

WRAPPER = Path(__file__).resolve().parents[2] / "reconciler" / "runtime" / "launch.sh"
ONE, TWO = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def bundle(path: Path, digest: str) -> Path:
    """A bundle as artifacts/bundle.py lays it out, enough for the real wrapper: job.json (sorted
    keys, two-space indents, as the digest check reads it), the wrapper and a short entrypoint."""
    shutil.rmtree(path, ignore_errors=True)
    (path / "scripts").mkdir(parents=True)
    (path / "runtime").mkdir()
    (path / "artifacts").mkdir()
    (path / "job.json").write_text(json.dumps({"payload": {"spec_digest": digest}, "schema_version": "v1"},
                                              indent=2, sort_keys=True) + "\n")
    shutil.copy(WRAPPER, path / "scripts" / "launch.sh")
    (path / "scripts" / "entrypoint.sh").write_text("#!/bin/sh\nsleep 0.2\necho ran\n")
    return path


def spec(ws: str, digest: str, identity: str = "late-g1-a1") -> LaunchSpec:
    return LaunchSpec(identity=identity, run_name="late", workspace=ws, launch_mode="host_process",
                      spec_digest=digest)


def wait_result(ws: Path, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return json.loads((ws / "runtime" / "result.json").read_text())
        except (OSError, ValueError):
            time.sleep(0.02)
    raise AssertionError(f"no result in {ws}")


def check_guards(t, ws: Path) -> None:
    """The same story on any transport whose workspace ``ws`` this process can read."""
    bundle(ws, ONE)
    with pytest.raises(TemporaryError, match="after its deadline"):
        launchers.launch(t, spec(str(ws), ONE), not_after=time.time() - 30)
    assert not (ws / "runtime" / "launched_at").exists() and not (ws / "runtime" / "pid").exists()
    # The same spec again, within its deadline: the claim is its own, so it starts.
    res = launchers.launch(t, spec(str(ws), ONE), not_after=time.time() + 20)
    assert not res.adopted and res.pid is not None
    assert wait_result(ws)["state"] == "succeeded"
    claim = ws.parent / ".late-g1-a1.claim"
    assert claim.read_text().strip() == ONE

    # Another spec's bundle under the same identity (a rebuild in place): its launch is refused.
    shutil.rmtree(ws)
    bundle(ws, TWO)
    with pytest.raises(TemporaryError, match="claimed by a launch of another spec"):
        launchers.launch(t, spec(str(ws), TWO), not_after=time.time() + 20)
    assert not (ws / "runtime" / "launched_at").exists()
    assert claim.read_text().strip() == ONE

    # The workspace removed for good (a leftover, or a run's end in git): its claim goes too.
    assert stop.finish(str(ws), remove=True)["removed"] and not claim.exists()


def test_local_launch_past_its_deadline_is_refused_and_the_claim_holds(tmp_path):
    root = tmp_path / "ws" / "test"
    root.mkdir(parents=True)
    t = LocalTransport(MachineInfo("local", str(root)))
    check_guards(t, root / "late-g1-a1")


def test_local_launch_through_the_shell_script_applies_the_same_guards(tmp_path, monkeypatch):
    """The script every other machine runs, here through this machine's shell."""
    root = tmp_path / "ws" / "test"
    root.mkdir(parents=True)
    t = LocalTransport(MachineInfo("local", str(root)))
    monkeypatch.setattr(t, "start_host", None, raising=False)
    check_guards(t, root / "late-g1-a1")


def test_ssh_launch_past_its_deadline_is_refused_and_the_claim_holds(sshd, tmp_path):
    root = remote_root()
    t = SshTransport(info(sshd, root))
    try:
        local = bundle(tmp_path / "b", ONE)
        ws = t.stage(local, "late-g1-a1", ONE)
        with pytest.raises(TemporaryError, match="after its deadline"):
            launchers.launch(t, spec(ws, ONE), not_after=time.time() - 30)
        assert not Path(ws, "runtime", "launched_at").exists()
        res = launchers.launch(t, spec(ws, ONE), not_after=time.time() + 20)
        assert not res.adopted and res.pid is not None
        assert wait_result(Path(ws))["state"] == "succeeded"
        again = launchers.launch(t, spec(ws, ONE), not_after=time.time() - 30)  # started already: adopted
        assert again.adopted
        # The machine's copy rebuilt for another spec behind the reconciler's back: refused.
        job = Path(ws, "job.json")
        os.chmod(job, 0o666)
        job.write_text(job.read_text().replace(ONE, TWO))
        shutil.rmtree(Path(ws, "runtime"))
        with pytest.raises(TemporaryError, match="claimed by a launch of another spec"):
            launchers.launch(t, spec(ws, TWO), not_after=time.time() + 20)
        assert not Path(ws, "runtime", "launched_at").exists()
    finally:
        t.close()
        shutil.rmtree(root, ignore_errors=True)
