"""The old attempt is gone before the replacement starts: real passes, real processes, a worker in
a session of its own that survives its group's kill, on this machine and over SSH (loopback sshd).

A sampler reads the process table every 20 ms for the whole test and records every moment at which
processes of two attempts of the run (two RECONCILER_IDENTITY values) were alive at once.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from reconciler.runtime.readings import group_alive
from tests.e2e.attempts import Sampler, here, reap
from tests.world import World, fleet, kill_group, machine, run_spec

pytestmark = pytest.mark.e2e
pytest_plugins = ["tests.infra.fixtures"]

# A job whose worker leaves the group (torchrun's workers do), ignores SIGTERM (only SIGKILL ends
# it) and keeps forking children that carry the identity too.
JOB = ["sh", "-c", "setsid sh -c 'trap \"\" TERM; while :; do sleep 0.2; done' </dev/null >/dev/null 2>&1 & "
       "sleep 120"]


def relaunch_after_group_kill(w: World, name: str, template: str) -> Sampler:
    sampler = Sampler(name, w)
    sampler.start()
    try:
        w.add_run(run_spec(name, template, JOB, restartPolicy={"maxRetries": 2, "backoffSeconds": 0}))
        st = w.until(name, lambda s: s.phase == "Running", timeout=60)  # 20 s is short on a loaded machine
        first = st.handle.identity
        # Wait for the worker's own session, then kill only the job's process group.
        deadline = time.time() + 10
        while len(here(w).get(first, [])) < 3 and time.time() < deadline:
            time.sleep(0.02)
        pid_file = Path(st.handle.workspace, "runtime", "pid")
        assert kill_group(pid_file)
        deadline = time.time() + 10
        while group_alive(int(pid_file.read_text()), first) and time.time() < deadline:
            time.sleep(0.02)
        assert here(w).get(first), "the worker did not outlive its group: the test would show nothing"
        st = w.until(name, lambda s: s.attempt == 2 and s.phase == "Running", timeout=60)
        assert st.handle.identity == f"{name}-g1-a2"
        assert here(w).get(first) is None  # the old attempt's worker was ended...
        assert here(w).get(st.handle.identity)  # ...and the new attempt runs
        # A few more passes: nothing of the old attempt comes back, the current one is kept.
        for _ in range(3):
            w.run_pass()
        assert here(w).get(first) is None and w.status(name).handle.identity == st.handle.identity
    finally:
        sampler.stop()
        reap(name, w)
    return sampler


def test_a_relaunch_waits_for_the_old_attempts_worker_here(tmp_path):
    with World(tmp_path, terminate_grace=0.5) as w:
        sampler = relaunch_after_group_kill(w, "fenced", "local-host")
    assert sampler.seen == {"fenced-g1-a1", "fenced-g1-a2"} and sampler.samples > 20
    assert sampler.overlaps == [], f"two attempts alive at once: {sampler.overlaps[:3]}"


def test_a_relaunch_waits_for_the_old_attempts_worker_over_ssh(tmp_path, sshd):
    with World(tmp_path, [fleet([machine(sshd)])], terminate_grace=0.5) as w:
        sampler = relaunch_after_group_kill(w, "farfenced", "ssh-host")
    assert sampler.seen == {"farfenced-g1-a1", "farfenced-g1-a2"} and sampler.samples > 20
    assert sampler.overlaps == [], f"two attempts alive at once: {sampler.overlaps[:3]}"


def test_a_stopped_run_leaves_no_worker_behind(tmp_path):
    with World(tmp_path, terminate_grace=0.5) as w:
        try:
            w.add_run(run_spec("halted", "local-host", JOB))
            st = w.until("halted", lambda s: s.phase == "Running", timeout=60)
            ident = st.handle.identity
            deadline = time.time() + 10
            while len(here(w).get(ident, [])) < 3 and time.time() < deadline:
                time.sleep(0.02)
            assert kill_group(Path(st.handle.workspace, "runtime", "pid"), signal.SIGTERM)  # result: terminated
            assert here(w).get(ident)
            w.add_run(run_spec("halted", "local-host", JOB, desiredState="Stopped"))
            w.until("halted", lambda s: s.phase == "Terminated", timeout=60)
            assert here(w).get(ident) is None
        finally:
            reap("halted", w)


def test_the_soak_counts_two_attempts_alive_at_once(tmp_path, sshd):
    """The soak with an SSH machine: its attempts sampler reads the process table at least every
    50 ms (in the median), and catches a planted moment of two attempts of one run alive."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    work = tmp_path / "soak"
    p = subprocess.run([sys.executable, str(root / "benchmarks" / "soak.py"), "--seconds", "8", "--seed", "5",
                        "--sleep", "1-2", "--runs", "3", "--ssh", "1", "--plant", "two_attempts", "--json", "--quiet",
                        "--workdir", str(work)], capture_output=True, text=True, timeout=300, cwd=root)
    assert p.returncode in (0, 1), p.stderr[-3000:]
    report = json.loads(p.stdout)
    assert report["ssh"] == {"machines": 1, "sshd_stops": report["ssh"]["sshd_stops"]}
    attempts = report["attempts"]
    # Its period is the load's to decide (a timed assertion would flake on a busy machine); the
    # planted overlap below must be caught whatever it is.
    assert attempts["samples"] >= 20 and attempts["period_p50_ms"] <= 500, attempts
    assert report["planted"] == {"two_attempts": 1}
    planted = [d for d in report["details"] if "two_attempts" in d and "overlap-g1-a1" in d]
    assert planted and report["violations"]["two_attempts"] == len(
        [d for d in report["details"] if "two_attempts:" in d]), report["details"]
    # Only the planted pair: no two attempts of a real run were ever seen together.
    assert all("overlap-g1" in d for d in report["details"] if "two_attempts:" in d), report["details"]
