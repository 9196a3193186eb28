"""What a launch on this machine waits for, and what it no longer waits for: the pid wait's
inotify instances are kept between launches (machines/local_launch.py), and still wake each
launch: real wrappers, real processes, real inotify."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from reconciler.machines import launchers, local_launch
from reconciler.machines.base import LaunchSpec
from reconciler.machines.local import LocalTransport

# Writes its pid a while after it starts: the launch's wait must be woken by the rename, not by a
# poll or the 2 s bound.
LATE_PID = 'sleep 0.3; mkdir -p runtime; echo "$$" > runtime/pid.tmp && mv runtime/pid.tmp runtime/pid\nexec sleep 30\n'


def _launch(t: LocalTransport, identity: str):
    ws = Path(t.workspace(identity))
    (ws / "scripts").mkdir(parents=True)
    (ws / "scripts" / "launch.sh").write_text(LATE_PID)
    (ws / "job.json").write_text('{\n  "spec_digest": "sha256:x"\n}\n')
    spec = LaunchSpec(identity=identity, run_name=identity.split("-g")[0], workspace=str(ws),
                      launch_mode="host_process", spec_digest="sha256:x")
    t0 = time.monotonic()
    done = launchers.launch(t, spec)
    return done, time.monotonic() - t0


def _inotify_fds() -> set[int]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify":
                out.add(int(fd))
        except OSError:
            pass
    return out


def test_the_pid_wait_keeps_its_inotify_instance_and_is_still_woken_by_each_launch(transport):
    done, waited = _launch(transport, "a-g1-a1")
    assert done.pid is not None and waited < 1.5  # woken by the rename (0.3 s), not the 2 s bound
    kept = set(local_launch._idle)
    assert kept and kept <= _inotify_fds()  # kept open for the next launch, without its watch
    for k in range(3):
        done, waited = _launch(transport, f"b{k}-g1-a1")
        assert done.pid is not None and waited < 1.5
        assert set(local_launch._idle) == kept  # the same instance, never a new one per launch
    # A watch removed leaves nothing queued: the next wait starts from an empty queue.
    for fd in kept:
        with pytest.raises(BlockingIOError):
            os.read(fd, 4096)
