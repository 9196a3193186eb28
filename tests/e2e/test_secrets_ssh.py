"""A secret's value reaches the job and nothing else: not git, status, bundle, workspace or output."""

from __future__ import annotations

import gzip
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reconciler.artifacts import bundle as bundles
from tests.world import World, fleet, machine, run_spec

pytestmark = pytest.mark.e2e

JOB = ["sh", "-c", 'test -n "$CANARY" && printf %s "$CANARY" | sha256sum | cut -d" " -f1 > artifacts/canary.sha256 '
                   '&& echo job done']


def cli(world: World, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reconciler", *args, "--repo", str(world.repo)], env=env,
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2])


def files_under(root: Path):
    for p in Path(root).rglob("*"):
        if p.is_file() and not p.is_symlink():
            yield p


@pytest.mark.parametrize("template", ["ssh-host", "ssh-docker"])
def test_canary_secret_goes_nowhere_but_the_job(tmp_path, sshd, dockerd, template):
    canary = "canary-" + os.urandom(12).hex()
    remote = machine(sshd, docker_host=dockerd.host)
    with World(tmp_path, [fleet([remote])]) as w:
        env = dict(os.environ, CANARY=canary, RECONCILER_WORKSPACE_ROOT=str(w.local_root), RECONCILER_NAMESPACE="test",
                   RECONCILER_PUSH="false", RECONCILER_REMOTE_CLEANUP="never")
        w.add_run(run_spec("sekret", template, JOB, secrets=["CANARY"]))
        output = []
        deadline = time.monotonic() + 60
        while True:
            p = cli(w, env, "--once")
            output += [p.stdout, p.stderr]
            assert p.returncode == 0, p.stderr
            st = w.status("sekret")
            if st is not None and st.phase in ("Succeeded", "Failed"):
                break
            assert time.monotonic() < deadline, st
            time.sleep(0.1)
        assert st.phase == "Succeeded", st.message
        for args in (("status", "sekret"), ("status",), ("logs", "sekret"), ("config",)):
            p = cli(w, env, *args)
            output += [p.stdout, p.stderr]
        local = w.bundle("sekret-g1-a1")
        # the job had it
        assert (local / "artifacts" / "canary.sha256").read_text().strip() == hashlib.sha256(canary.encode()).hexdigest()
        # ...and nothing else does
        needle = canary.encode()
        assert canary not in "".join(output)
        history = subprocess.run(["git", "-C", str(w.repo), "log", "-p", "--all", "--full-history"],
                                 capture_output=True, check=True).stdout
        assert needle not in history and b"sekret" in history
        for p in files_under(w.repo):  # status/, specs/, .git objects (compressed: history covers them), bundles
            assert needle not in p.read_bytes(), p
        archive = bundles.archive(local)
        assert needle not in archive and needle not in gzip.decompress(archive)
        ws = Path(st.handle.workspace)
        assert (ws / "artifacts" / "stdout.log").read_text() == "job done\n"
        assert not (ws / "runtime" / "secrets.env").exists()
        for p in files_under(ws):
            assert needle not in p.read_bytes(), p
        assert "CANARY" in (local / "job.json").read_text()  # the name, never the value
