"""The daemon's way from an edited spec to its process on this machine: the wrapper started by the
daemon itself (no shell in between), reaped once it ends, with a burst's launches overlapping
in one pass checked in test_daemon.py. Real daemons, real git, real processes; conditions polled, never fixed sleeps."""

from __future__ import annotations

import os
from pathlib import Path

from .conftest import run_spec, wait_for


def _stat(pid: int) -> list[str]:
    """state, ppid, pgrp, session, ... of a process (proc(5)), or [] once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def _write(runs: Path, name: str, command: str) -> None:
    tmp = runs / f".{name}.yaml.tmp"  # as an editor saves: write, then rename into place
    tmp.write_text(run_spec(name, command))
    os.replace(tmp, runs / f"{name}.yaml")


def _children(pid: int) -> list[tuple[int, str]]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields and fields[1] == str(pid):
                out.append((int(entry), fields[0]))
    return out


def test_a_saved_spec_is_started_by_the_daemon_itself_and_reaped_when_it_ends(world):
    clone = world.clone("daemon")
    d = world.start(clone, listen=False, RECONCILER_POLL_INTERVAL="300", RECONCILER_RESYNC_INTERVAL="0.5",
                    RECONCILER_LOG_LEVEL="DEBUG")
    d.wait_ready()
    wait_for(lambda: d.logged("pass"), timeout=20, what="the first pass")
    _write(clone / "specs" / "runs", "quick", "sleep 2")
    wait_for(lambda: world.pid_of("quick-g1-a1"), timeout=30, what="the run to start")
    pid = world.pid_of("quick-g1-a1")
    fields = _stat(pid)
    assert fields, "the wrapper ended before it could be looked at"
    assert fields[1] == str(d.proc.pid), "the daemon started the wrapper itself, with no shell in between"
    assert fields[2] == fields[3] == str(pid), "in a session and process group of its own"
    # The daemon logs the launch once it has seen the pid (the test may see the file first).
    wait_for(lambda: [e for e in d.logged("wrapper started") if e.get("identity") == "quick-g1-a1"], timeout=30,
             what="the launch's log line")
    started = [e for e in d.logged("wrapper started") if e.get("identity") == "quick-g1-a1"]
    assert len(started) == 1 and started[0]["pid"] == pid
    wait_for(lambda: (world.ws / "fixed" / "quick-g1-a1" / "runtime" / "result.json").exists(), timeout=30,
             what="the run to end")
    # The next passes (resync every 0.5 s) look at this machine and collect the wrapper's exit.
    wait_for(lambda: not any(p == pid for p, _ in _children(d.proc.pid)), timeout=30,
             what="the ended wrapper to be reaped")
    assert not [c for c in _children(d.proc.pid) if c[1] == "Z"], "no zombie is left behind"
