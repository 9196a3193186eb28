"""``reconcile logs`` for a run on an SSH machine: while it runs (--follow) and after collection."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

import pytest

from tests.repo_helpers import wait_for
from tests.world import World, fleet, machine, run_spec

pytestmark = pytest.mark.e2e


def cli(world: World, *args: str, **kw) -> subprocess.Popen:
    env = dict(os.environ, RECONCILER_WORKSPACE_ROOT=str(world.local_root), RECONCILER_NAMESPACE="test",
               RECONCILER_PUSH="false")
    return subprocess.Popen([sys.executable, "-m", "reconciler", "logs", *args, "--repo", str(world.repo)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2], **kw)


def test_logs_follow_on_ssh_then_collected(tmp_path, sshd):
    with World(tmp_path, [fleet([machine(sshd)])]) as w:
        w.add_run(run_spec("chatty", "ssh-host", ["sh", "-c", "echo first; echo oops >&2; "
                                                  "while [ ! -e go ]; do sleep 0.05; done; "
                                                  "for i in 1 2 3; do echo line $i; sleep 0.1; done; printf tail"]))
        st = w.until("chatty", lambda s: s.phase == "Running")
        ws = Path(st.handle.workspace)
        wait_for(lambda: (ws / "artifacts" / "stdout.log").exists() and
                 (ws / "artifacts" / "stdout.log").read_text() == "first\n", timeout=10, what="first line")
        follower = cli(w, "chatty", "--follow", "--stream", "stdout")
        ready, _, _ = select.select([follower.stdout], [], [], 20)
        assert ready and follower.stdout.readline() == "first\n"  # printed, now polling
        (ws / "go").write_text("")  # the job goes on while followed
        out, err = follower.communicate(timeout=30)
        assert follower.returncode == 0, err
        assert out == "line 1\nline 2\nline 3\ntail"
        p = cli(w, "chatty", "--stream", "stderr")
        assert p.communicate(timeout=30)[0] == "oops\n"
        st = w.until("chatty", lambda s: s.phase == "Succeeded")
        # removed by the pass after the one that recorded the end: logs come from the collected copy
        assert w.passes_until(lambda: not ws.exists()) == 1
        p = cli(w, "chatty", "-n", "2")
        out, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
        # Both streams, in the order the job wrote them (the collected copy kept the log index).
        assert out == "oops\nline 3\ntail\n"


def test_ssh_command_runs_in_the_workspace_on_the_machine(tmp_path, sshd):
    """``reconcile ssh NAME -- COMMAND`` logs in as the reconciler does (its key, the pinned host key)
    and runs COMMAND in the run's workspace on the machine."""
    with World(tmp_path, [fleet([machine(sshd)])]) as w:
        w.add_run(run_spec("shelled", "ssh-host", ["sh", "-c", "while [ ! -e go ]; do sleep 0.05; done"]))
        st = w.until("shelled", lambda s: s.phase == "Running")
        env = dict(os.environ, RECONCILER_WORKSPACE_ROOT=str(w.local_root), RECONCILER_NAMESPACE="test")
        r = subprocess.run([sys.executable, "-m", "reconciler", "ssh", "shelled", "--repo", str(w.repo), "--",
                            "sh", "-c", "pwd; id -un; touch go"], env=env, capture_output=True, text=True,
                           cwd=Path(__file__).parents[2], timeout=60, stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stderr
        where, login = r.stdout.split()[:2]
        assert where == st.handle.workspace
        assert login == sshd.user
        w.until("shelled", lambda s: s.phase == "Succeeded")  # the command ran there: the job saw `go`
