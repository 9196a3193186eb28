"""``summarize.unchanged``, the loop's first test of every run of a pass: True exactly where
``summarize`` (without an outcome) would return the status it was given, so that what it lets
through never hides a move (a stall, progress, a pid, outputs, a machine answering again)."""

from __future__ import annotations

import itertools

from reconciler.core.actions import Action
from reconciler.core.observed import ObservedRun
from reconciler.core.plan import Change
from reconciler.core.runstatus import Handle, RunStatus, SpecRef
from reconciler.status.summarize import record, set_condition, summarize, unchanged

NOW = 1_700_000_000.0
STALL = "no training progress since the start at 2023-11-14T22:13:20Z (stall.afterSeconds 60)"


def _prev(reachable: str | None, stalled: str | None, progress: dict | None, pid: int | None,
          outputs: dict | None) -> RunStatus:
    st = RunStatus(name="r", phase="Running", generation=1, attempt=1, spec=SpecRef(digest="sha256:d"),
                   handle=Handle(machine="m", identity="r-g1-a1", pid=pid), progress=progress, outputs=outputs)
    record(st, "Running", "adopted", NOW - 100)
    if reachable is not None:
        set_condition(st, "MachineReachable", reachable, "x", "", NOW - 100)
    if stalled is not None:
        set_condition(st, "Stalled", "True" if stalled else "False", "x", stalled, NOW - 100)
    return st


def _cases():
    progress = [None, {"step": 3}, {"step": 4}]
    for reachable, stalled, p_prev, p_obs, pid_prev, pid_obs, out_prev, out_obs, c_stalled, action in \
            itertools.product([None, "True", "False"], [None, "", STALL], progress, progress, [None, 7], [None, 7],
                              [None, {"uri": "a"}], [None, {"uri": "a"}, {"uri": "b"}], [None, STALL],
                              [Action.NONE, Action.TERMINATE]):
        prev = _prev(reachable, stalled, p_prev, pid_prev, out_prev)
        change = Change("r", action, "Running", "running", "Running", 1, 1, identity="r-g1-a1", machine="m",
                        spec_digest="sha256:d", stalled=c_stalled)
        obs = ObservedRun(identity="r-g1-a1", machine="m", state="running", pid=pid_obs, progress=p_obs)
        obs.outputs = out_obs
        yield prev, change, obs


def test_unchanged_is_true_exactly_where_summarize_returns_the_status_itself() -> None:
    kinds = set()
    for prev, change, obs in _cases():
        expect = summarize(prev, change, None, obs, NOW, None) is prev
        assert unchanged(prev, change, obs) == expect, (prev, change, obs)
        kinds.add(expect)
    assert kinds == {True, False}


def test_a_stall_found_this_pass_is_never_passed_over() -> None:
    prev = _prev("True", None, None, 7, None)
    change = Change("r", Action.NONE, "Running", "running", "Running", 1, 1, identity="r-g1-a1", machine="m",
                    spec_digest="sha256:d", stalled=STALL)
    obs = ObservedRun(identity="r-g1-a1", machine="m", state="running", pid=7)
    assert not unchanged(prev, change, obs)
    new = summarize(prev, change, None, obs, NOW, None)
    assert new.condition("Stalled").status == "True"
    change.stalled = None  # progress again: the condition must be cleared
    assert not unchanged(new, change, obs)
    assert summarize(new, change, None, obs, NOW + 1, None).condition("Stalled").status == "False"
