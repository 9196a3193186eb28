"""This machine's host launch without a shell (machines/local_launch.py), and a machine's plain
launches a few at once (engine/parallel_launches.py): real wrappers, real processes, real /proc."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from reconciler.core.actions import Action
from reconciler.core.errors import TemporaryError
from reconciler.core.plan import Change
from reconciler.engine.parallel_launches import in_order, plain_launch
from reconciler.machines import launchers, local_launch
from reconciler.machines.base import LaunchSpec
from reconciler.machines.local import LocalTransport
from reconciler.runtime.readings import process_table
from tests.repo_helpers import wait_for

WRAPPER = (Path(__file__).resolve().parents[2] / "reconciler" / "runtime" / "launch.sh").read_text()
DIGEST = "sha256:one"


def _workspace(t: LocalTransport, identity: str, entrypoint: str = "sleep 30\n", wrapper: str = WRAPPER) -> Path:
    ws = Path(t.workspace(identity))
    (ws / "scripts").mkdir(parents=True)
    (ws / "scripts" / "launch.sh").write_text(wrapper)
    (ws / "scripts" / "entrypoint.sh").write_text(entrypoint)
    (ws / "job.json").write_text(json.dumps({"payload": {"spec_digest": DIGEST}}, indent=2, sort_keys=True))
    return ws


def _spec(ws: Path, digest: str = DIGEST) -> LaunchSpec:
    return LaunchSpec(identity=ws.name, run_name=ws.name.split("-g")[0], workspace=str(ws),
                      launch_mode="host_process", spec_digest=digest)


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def test_the_wrapper_is_started_by_this_process_in_a_session_of_its_own_and_adopted_after(transport):
    ws = _workspace(transport, "a-g1-a1")
    done = launchers.launch(transport, _spec(ws), not_after=time.time() + 60)
    assert not done.adopted and done.pid == int((ws / "runtime" / "pid").read_text())
    fields = _stat(done.pid)  # state, ppid, pgrp, session
    assert fields[1] == str(os.getpid()), "no shell in between: the wrapper is this process's child"
    assert fields[2] == fields[3] == str(done.pid), "it leads its own session and process group"
    assert (ws / "runtime" / "launched_at").read_text().strip().isdigit()
    again = launchers.launch(transport, _spec(ws))
    assert again.adopted and again.pid == done.pid
    # A wrapper leads a session of its own: one session led by a process of the identity in this
    # test's workspace (its folder tells it from another test's wrapper of the same identity).
    leaders = [p for p, (_, sid) in process_table().items()
               if sid == p and b"a-g1-a1" in _cmdline(p) and _cwd(p) == str(ws)]
    assert leaders == [done.pid], "adopted, never started twice"


def _cwd(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_a_launch_refused_by_its_guard_starts_nothing(transport):
    claimed = _workspace(transport, "b-g1-a1")
    claim = claimed.parent / ".b-g1-a1.claim"
    claim.write_text("sha256:another\n")
    with pytest.raises(TemporaryError, match="claimed by a launch of another spec"):
        launchers.launch(transport, _spec(claimed))
    late = _workspace(transport, "c-g1-a1")
    with pytest.raises(TemporaryError, match="after its deadline"):
        launchers.launch(transport, _spec(late), not_after=time.time() - 120)
    for ws in (claimed, late):
        assert not (ws / "runtime" / "launched_at").exists() and not (ws / "runtime" / "pid").exists()
    assert (late.parent / ".c-g1-a1.claim").read_text() == DIGEST + "\n"  # claimed, then too late


def test_a_wrapper_that_ends_before_its_pid_is_answered_at_once_and_reaped(transport):
    ws = _workspace(transport, "d-g1-a1", wrapper="exit 3\n")
    t0 = time.monotonic()
    done = launchers.launch(transport, _spec(ws))
    waited = time.monotonic() - t0
    assert done.pid is None and not done.adopted
    assert waited < local_launch.PID_WAIT, "its exit woke the wait (pidfd): the 2 s bound was not waited out"
    wait_for(lambda: local_launch.reap() == 0, timeout=10, what="the ended wrapper to be reaped")
    zombies = [p for p in os.listdir("/proc") if p.isdigit() and _zombie_child(int(p))]
    assert zombies == []


def _zombie_child(pid: int) -> bool:
    try:
        fields = _stat(pid)
    except OSError:
        return False
    return fields[0] == "Z" and fields[1] == str(os.getpid())


SLOW_WRAPPER = ('sleep 1; mkdir -p runtime; echo "$$" > runtime/pid.tmp && mv runtime/pid.tmp runtime/pid\n'
                "exec sleep 30\n")


def _launch_change(name: str) -> Change:
    return Change(name, Action.LAUNCH, "NewRun", "new run", "Pending", identity=f"{name}-g1-a1", machine="local")


def test_a_stretch_of_launches_on_one_machine_runs_a_few_at_once(transport):
    """Each wrapper takes 1 s to write its pid, and a launch returns only once it has: one after
    another, two wrappers would start at least 1 s apart. Their start times in /proc say more
    than one started within that."""
    names = [f"p{i}" for i in range(6)]
    spaces = {n: _workspace(transport, f"{n}-g1-a1", wrapper=SLOW_WRAPPER) for n in names}
    changes = [_launch_change(n) for n in names]
    assert all(plain_launch(c) for c in changes)
    results = in_order(changes, lambda c: launchers.launch(transport, _spec(spaces[c.name])), lambda m: transport)
    assert [r.identity for r in results] == [f"{n}-g1-a1" for n in names]  # in the changes' order
    assert all(r.pid and not r.adopted for r in results)
    ticks = os.sysconf("SC_CLK_TCK")
    starts = sorted(int(_stat(r.pid)[19]) / ticks for r in results)  # starttime, seconds since boot
    closest = min(b - a for a, b in zip(starts, starts[1:]))
    assert closest < 0.8, f"the wrappers started one after another: {starts}"


def test_a_launch_that_stops_something_first_keeps_its_place_in_the_order(transport):
    from reconciler.core.plan import Kill

    stop_first = Change("s", Action.RELAUNCH, "SpecChanged", "spec changed", "Pending", identity="s-g2-a1",
                        machine="local", kill=[Kill("local", "s-g1-a1")])
    assert not plain_launch(stop_first)
    seen: list[str] = []

    def one(c: Change) -> str:
        seen.append(c.name)
        return c.name

    order = [_launch_change("a"), stop_first, _launch_change("b")]
    assert in_order(order, one, lambda m: transport) == ["a", "s", "b"]
    assert seen.index("s") > seen.index("a") and seen.index("b") > seen.index("s")
