"""A run's effective spec is kept from one plan to the next by its spec digest and its template's
content: an unchanged queue is not resolved again, and an edited template or spec is. A new run
is launched without the lifecycle's general walk, and plans as that walk would."""

from __future__ import annotations

import pytest

from reconciler.core.observed import ObservedMachine, ObservedWorld
from reconciler.core.plan import PlanSettings
from reconciler.planner import lifecycle, make
from reconciler.planner.make import make_plan
from reconciler.planner.render import dumps
from reconciler.spec import resolve
from reconciler.spec.load import DesiredState, RunEntry, run_digest
from reconciler.spec.models.fleet import Fleet
from reconciler.spec.models.run import Run
from reconciler.spec.models.template import ExecutionTemplate

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICqRT6LKgEqdobuvittBCu1add1q6i1ofysL9m5i7d6G"


def _template(gpus: int) -> ExecutionTemplate:
    return ExecutionTemplate.model_validate({
        "apiVersion": "reconciler/v1", "kind": "ExecutionTemplate", "id": "gpu", "placement": {"kind": "ssh"},
        "launch_mode": {"kind": "host_process"}, "allow_overrides": ["resources"],
        "defaults": {"resources": {"gpu_type": "H100", "gpu_count": gpus}}})


def _run(name: str, overrides: dict | None = None) -> Run:
    spec: dict = {"template": "gpu", "task": {"type": "command", "argv": ["python", "t.py", name]}}
    if overrides:
        spec["overrides"] = overrides
    return Run.model_validate({"apiVersion": "reconciler/v1", "kind": "Run", "metadata": {"name": name},
                               "spec": spec})


def _desired(template_gpus: int, runs: list[Run]) -> tuple[DesiredState, ObservedWorld]:
    desired = DesiredState()
    desired.templates["gpu"] = _template(template_gpus)
    desired.fleets["dc"] = Fleet.model_validate({
        "apiVersion": "reconciler/v1", "kind": "Fleet", "metadata": {"name": "dc"},
        "spec": {"machines": [{"name": "m0", "ssh": {"host": "h", "user": "u", "host_key": KEY},
                               "max_tasks": 8, "resources": {"gpus": [{"type": "H100", "count": 8}]}}]}})
    for run in runs:
        name = run.metadata.name
        desired.runs[name] = RunEntry(run, f"specs/runs/{name}.yaml", run_digest(run))
    world = ObservedWorld(at=1000.0)
    world.machines["m0"] = ObservedMachine("m0")
    return desired, world


def test_an_unchanged_spec_is_resolved_once_across_plans(monkeypatch) -> None:
    calls = []
    real = resolve.effective
    monkeypatch.setattr(resolve, "effective", lambda *a, **k: calls.append(a[0].metadata.name) or real(*a, **k))
    monkeypatch.setattr(resolve, "_BY_DIGEST", {})
    for _ in range(3):  # fresh models each time, as a pass that loads the specs again has
        desired, world = _desired(1, [_run("kept-a"), _run("kept-b")])
        plan = make_plan(desired, world, {}, 1000.0, PlanSettings())
        assert [len(c.gpus) for c in plan.changes] == [1, 1]
    assert sorted(calls) == ["kept-a", "kept-b"]


def test_an_edited_template_or_spec_is_resolved_again(monkeypatch) -> None:
    monkeypatch.setattr(resolve, "_BY_DIGEST", {})
    desired, world = _desired(1, [_run("edit-a")])
    assert [len(c.gpus) for c in make_plan(desired, world, {}, 1000.0, PlanSettings()).changes] == [1]
    desired, world = _desired(2, [_run("edit-a")])  # the template's default changed; the run did not
    assert [len(c.gpus) for c in make_plan(desired, world, {}, 1000.0, PlanSettings()).changes] == [2]
    desired, world = _desired(2, [_run("edit-a", {"resources": {"gpu_count": 4}})])
    assert [len(c.gpus) for c in make_plan(desired, world, {}, 1000.0, PlanSettings()).changes] == [4]


def test_the_kept_map_is_bounded_and_needs_a_content_digest(monkeypatch) -> None:
    monkeypatch.setattr(resolve, "_BY_DIGEST", {})
    monkeypatch.setattr(resolve, "BY_DIGEST_MAX", 2)
    template = _template(1)
    kept = resolve.effectives_of(template)
    assert resolve.effectives_of(_template(1)) is kept  # same content, another object
    assert resolve.effectives_of(_template(2)) is not kept
    runs = [_run(f"bound-{i}") for i in range(3)]
    for run in runs:
        resolve.effective_by_digest(run, run_digest(run), template, kept)
    assert len(kept) == 1  # emptied when full, then the third kept
    resolve.effective_by_digest(runs[0], "not-a-digest", template, kept)
    assert "not-a-digest" not in kept


@pytest.mark.parametrize("seed", range(12))
def test_a_new_run_called_directly_plans_as_the_general_walk(seed, monkeypatch) -> None:
    """make.py hands a run with no status and nothing observed straight to lifecycle.new_run;
    the general walk (lifecycle._running) gives the same plan, with or without a machine down."""
    from test_placement_fast import _inputs

    for down in (False, True):
        desired, world = _inputs(seed)
        if down:
            world.machines[sorted(world.machines)[0]].reachable = False
        direct = []
        real = make.new_run
        monkeypatch.setattr(make, "new_run", lambda *a: direct.append(a[0]) or real(*a))
        fast = dumps(make_plan(desired, world, {}, 1000.0, PlanSettings()))
        assert bool(direct) == (not down)

        def walk(name, entry, desired_, book, missing):
            return lifecycle._running(name, entry, None, world, desired_, PlanSettings(), 1000.0, missing, book)

        desired, world = _inputs(seed)
        if down:
            world.machines[sorted(world.machines)[0]].reachable = False
        monkeypatch.setattr(make, "new_run", walk)
        assert dumps(make_plan(desired, world, {}, 1000.0, PlanSettings())) == fast


@pytest.mark.parametrize("machines", [0, 3, 8, 9, 40])
def test_no_room_from_the_index_reads_as_the_scan_of_every_machine(machines) -> None:
    """When the room index finds no machine with room, the explanation names the first machines
    and counts the rest, as judging every machine would; a machine that does fit (the index
    behind) falls back to that judging."""
    from reconciler.planner.capacity import Slot
    from reconciler.planner.placement import _no_room
    from reconciler.spec.models.common import Resources

    res = Resources.model_validate({"gpu_type": "H100", "gpu_count": 2})
    slots = []
    for i in range(machines):
        s = Slot(f"m{i:02d}", "ssh", "dc", (0, 1, 4, None)[i % 4], {0: "H100", 1: "H100", 2: "A100"})
        s.used_gpus = {0} if i % 3 else set()
        s.tasks = 4
        s.reachable = i % 5 != 4
        slots.append(s)
    if any(s.fits(2, "H100") for s in slots):
        assert _no_room(slots, res, none_fit=True) == _no_room(slots, res)
    for s in slots:
        s.used_gpus = {0}
        s._counts.clear()
    assert not any(s.fits(2, "H100") for s in slots)
    assert _no_room(slots, res, none_fit=True) == _no_room(slots, res)
