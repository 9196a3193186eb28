"""rclone installed on a machine over the real SSH transport (a loopback sshd), kept intact."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from reconciler.machines import rclone
from reconciler.machines.base import MachineInfo
from reconciler.machines.local import LocalTransport
from reconciler.machines.ssh import SshTransport
from reconciler.spec.models.fleet import Machine


def transport(server) -> SshTransport:
    root = f"/tmp/rc-ws-{uuid.uuid4().hex[:10]}"
    m = Machine.model_validate({"name": "lab-1", "workspace_root": root, "ssh": {
        "host": server.host, "port": server.port, "user": server.user,
        "identity_file": str(server.identity_file), "host_key": server.host_key}})
    return SshTransport(MachineInfo("lab-1", root, fleet_machine=m, source="specs/fleets/lab.yaml"))


@pytest.fixture
def cache_dir():
    d = f"/tmp/rc-bin-{uuid.uuid4().hex[:10]}"
    yield d
    shutil.rmtree(d, ignore_errors=True)


def sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_installed_once_checked_every_time_and_replaced_when_damaged(sshd, cache_dir, tmp_path):
    # A small executable stands in for the 85 MB binary: on this shared two-core machine paramiko
    # moves it at a few hundred kB/s, and the installing is the same for any file.
    src = tmp_path / "rclone"
    src.write_text("#!/bin/sh\necho 'rclone v0-test'\n" + "# padding\n" * 20000)
    src.chmod(0o755)
    t = transport(sshd)
    try:
        want = rclone.digest(src)
        path = rclone.install(t, cache_dir, src)
        assert path == f"{cache_dir}/rclone-{want[:16]}"
        assert sha(path) == want and os.stat(path).st_mode & 0o777 == 0o755
        out = subprocess.run([path, "version"], capture_output=True, text=True, timeout=30).stdout
        assert out.startswith("rclone v")
        ino = os.stat(path).st_ino
        before = t.round_trips
        assert rclone.install(t, cache_dir, src) == path
        assert t.round_trips == before + 1 and os.stat(path).st_ino == ino  # checked, not copied again

        with open(path, "r+b") as fh:  # a partial or tampered binary is replaced, atomically
            fh.truncate(1000)
        assert rclone.install(t, cache_dir, src) == path
        assert sha(path) == want and os.stat(path).st_ino != ino
        assert [n for n in os.listdir(cache_dir)] == [f"rclone-{want[:16]}"]  # no temporary left
    finally:
        t.close()


def test_the_machine_answer_is_not_trusted():
    name = "rclone-0123456789abcdef"
    assert rclone._answer(f"ok /home/u/.cache/reconciler/bin/{name}\n", name) == f"/home/u/.cache/reconciler/bin/{name}"
    for bad in ("need", f"ok relative/{name}", f"ok /x/../{name}", f"ok /x/{name}\x1b[2J", "ok /x/other", ""):
        assert rclone._answer(bad, name) is None


def test_this_machine_uses_the_venv_binary_and_a_container_gets_a_copy(tmp_path):
    t = LocalTransport(MachineInfo("local", str(tmp_path)))
    path = rclone.install(t)
    assert path == str(rclone.host_binary()) and os.access(path, os.X_OK)
    assert subprocess.run([path, "version"], capture_output=True, text=True, timeout=30).stdout.startswith("rclone v")
    ws = tmp_path / "run-g1-a1"
    (ws / "scripts").mkdir(parents=True)
    assert rclone.into_workspace(t, str(ws), path) == "scripts/rclone"
    copied = ws / "scripts" / "rclone"
    assert sha(copied) == rclone.digest(Path(path)) and os.stat(copied).st_ino != os.stat(path).st_ino
    with pytest.raises(Exception, match="failed"):
        rclone.into_workspace(t, str(tmp_path / "gone"), path)


def test_the_storage_credentials_are_never_collected(sshd, tmp_path):
    """runtime/storage.env (the remote's credentials) stays on the machine, over SSH and locally."""
    t = transport(sshd)
    ident = "st-g1-a1"
    try:
        ws = t.workspace(ident)
        got = t.sh(f"mkdir -p {ws}/runtime {ws}/artifacts && echo KEY=v > {ws}/runtime/storage.env && "
                   f"echo KEY=v > {ws}/runtime/.storage.env.tmp && echo ok > {ws}/runtime/uploads.json")
        assert got.rc == 0, got.err
        res = t.fetch(ident, tmp_path / "ssh")
        assert res.complete
        assert sorted(os.listdir(tmp_path / "ssh" / "runtime")) == ["uploads.json"]
    finally:
        t.sh(f"rm -rf {t.machine.workspace_root}")
        t.close()

    from reconciler.machines.local import StagingLocalTransport

    local = StagingLocalTransport(MachineInfo("local", str(tmp_path / "root")))
    rt = tmp_path / "root" / ident / "runtime"
    rt.mkdir(parents=True)
    (rt / "storage.env").write_text("KEY=v\n")
    (rt / "uploads.json").write_text("{}")
    local.fetch(ident, tmp_path / "local")
    assert sorted(os.listdir(tmp_path / "local" / "runtime")) == ["uploads.json"]
