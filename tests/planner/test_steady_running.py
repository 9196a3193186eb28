"""The shortcut for a run that keeps running (lifecycle._steady_running) decides as the general
path does: every plan case, and stalls judged against the clock, plan the same with it and without."""

from __future__ import annotations

import yaml
import pytest

from reconciler.core.observed import ObservedRun
from reconciler.core.runstatus import RunStatus
from reconciler.planner import lifecycle
from reconciler.planner.make import make_plan

from tests.planner.test_plan import CASES, build


def _both(monkeypatch, desired, world, previous, now, settings):
    taken = []
    real = lifecycle._steady_running

    def counted(*args):
        out = real(*args)
        if out is not None:
            taken.append(args[0])
        return out

    monkeypatch.setattr(lifecycle, "_steady_running", counted)
    fast = make_plan(desired, world, previous, now, settings).to_json()
    monkeypatch.setattr(lifecycle, "_steady_running", lambda *args: None)
    world._by_name = world._by_identity = None
    general = make_plan(desired, world, previous, now, settings).to_json()
    return fast, general, taken


@pytest.mark.parametrize("case_file", CASES, ids=[c.stem for c in CASES])
def test_every_plan_case_plans_the_same_without_the_shortcut(case_file, monkeypatch):
    desired, world, previous, now, settings = build(yaml.safe_load(case_file.read_text()))
    fast, general, _ = _both(monkeypatch, desired, world, previous, now, settings)
    assert fast == general


def _running_case(stall: dict | None, updated_at: str | None, now: float):
    spec = {"task": {"type": "command", "argv": ["true"]}}
    if stall:
        spec["stall"] = stall
    seen = {"state": "running", "pid": 7, "started_at": 100.0}
    if updated_at:
        seen["progress"] = {"step": 5, "updated_at": updated_at}
    history = [{"time": "1970-01-01T00:01:40Z", "phase": "Running", "generation": 1, "attempt": 1,
                "reason": "launched"}]
    previous = {"phase": "Running", "generation": 1, "attempt": 1, "spec": {"digest": "auto"},
                "handle": {"machine": "local", "identity": "r-g1-a1"}, "history": history}
    return build({"now": now, "runs": {"r": spec}, "observed": {"local": {"runs": {"r-g1-a1": seen}}},
                  "previous": {"r": previous}})


@pytest.mark.parametrize("stall,now,code", [
    (None, 5000.0, "Running"),
    ({"afterSeconds": 600, "action": "terminate"}, 500.0, "Running"),   # within its allowance
    ({"afterSeconds": 600, "action": "terminate"}, 5000.0, "Stalled"),  # past it: the clock decides
    ({"afterSeconds": 600, "action": "condition"}, 5000.0, "Running"),  # stalled, kept, said so
])
def test_a_kept_run_is_judged_against_the_clock_each_pass(stall, now, code, monkeypatch):
    desired, world, previous, now, settings = _running_case(stall, "1970-01-01T00:01:40Z", now)
    fast, general, taken = _both(monkeypatch, desired, world, previous, now, settings)
    assert taken == ["r"], "the shortcut was not taken for a run that keeps running"
    assert fast == general
    change = next(c for c in fast["changes"] if c["name"] == "r")
    assert change["code"] == code
    if stall and now > 700:
        assert change["stalled"]


def test_anything_else_takes_the_general_path(monkeypatch):
    desired, world, previous, now, settings = _running_case(None, None, 1000.0)
    # A second instance (the same attempt on another machine), a queued job, another spec.
    world.machines["local"].runs["r-g1-a2"] = ObservedRun("r-g1-a2", "local", "running", pid=8)
    fast, general, taken = _both(monkeypatch, desired, world, previous, now, settings)
    assert taken == [] and fast == general
    desired, world, previous, now, settings = _running_case(None, None, 1000.0)
    world.machines["local"].runs["r-g1-a1"].queued = "Priority"
    fast, general, taken = _both(monkeypatch, desired, world, previous, now, settings)
    assert taken == [] and fast == general
    desired, world, previous, now, settings = _running_case(None, None, 1000.0)
    previous["r"] = RunStatus.model_validate({**previous["r"].model_dump(), "phase": "Pending"})
    fast, general, taken = _both(monkeypatch, desired, world, previous, now, settings)
    assert taken == [] and fast == general
