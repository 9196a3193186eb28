"""The launch wrapper's heartbeat covers the wrapper's whole life: a group stopped the moment its
pid is visible has already beaten (else a frozen node of a run on several machines would never
be caught: no heartbeat reads as "not known", not as "old"), the beat goes on while the wrapper
waits before the job (here the wait for secrets under Slurm), and nothing of it outlives the
wrapper. Real ``sh`` processes in a scratch bundle."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.infra._proc import alive

LAUNCH = Path(__file__).resolve().parents[2] / "reconciler" / "runtime" / "launch.sh"


def _start(ws: Path, entrypoint: str, **env: str) -> subprocess.Popen:
    (ws / "scripts").mkdir(parents=True)
    shutil.copy(LAUNCH, ws / "scripts" / "launch.sh")
    (ws / "scripts" / "entrypoint.sh").write_text(entrypoint)
    base = {"PATH": os.environ["PATH"], "HOME": str(ws), "RECONCILER_HEARTBEAT_SECONDS": "0.2", **env}
    return subprocess.Popen(["sh", "scripts/launch.sh", "hb-g1-a1"], cwd=ws, env=base, start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _until(pred, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.01)
    raise AssertionError("condition not reached")


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_group_stopped_as_soon_as_its_pid_shows_has_beaten(tmp_path) -> None:
    proc = _start(tmp_path, "sleep 30\n")
    try:
        _until(lambda: (tmp_path / "runtime" / "pid").exists())
        os.killpg(proc.pid, signal.SIGSTOP)
        assert (tmp_path / "runtime" / "heartbeat").exists()
        beat = (tmp_path / "runtime" / "heartbeat").stat().st_mtime
        time.sleep(0.6)  # three beat intervals: a stopped group does not beat
        assert (tmp_path / "runtime" / "heartbeat").stat().st_mtime == beat
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_the_wrapper_beats_while_it_waits_before_the_job_and_not_after_it(tmp_path) -> None:
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "secrets.pending").write_text("")
    proc = _start(tmp_path, "exit 0\n", RECONCILER_SECRETS_WAIT="30")
    try:
        _until(lambda: (tmp_path / "runtime" / "heartbeat").exists())
        first = (tmp_path / "runtime" / "heartbeat").stat().st_mtime_ns
        _until(lambda: (tmp_path / "runtime" / "heartbeat").stat().st_mtime_ns != first, 5)  # beating, no job yet
        assert not (tmp_path / "runtime" / "child.pid").exists()  # the job has not started
        (tmp_path / "runtime" / "secrets.env").write_text("")  # delivered: the job runs and ends
        assert proc.wait(timeout=10) == 0
        _until(lambda: _group_gone(proc.pid), 5)  # the beat ended with the wrapper
        assert not alive(proc.pid)
    finally:
        if not _group_gone(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
