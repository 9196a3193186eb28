"""The planner's shortcuts decide as the slow paths they stand for.

A plain request is placed through the room index and the no-room memo; a constrained one is
judged machine by machine, with its verdicts kept while no room changes; the fair order keeps a
team's next key out of its heap while that team stays first. Each test runs the planner on
varied inputs twice, once as it is and once with a shortcut taken out (the reference), and
compares the outcome.
"""

from __future__ import annotations

import random

import pytest

from reconciler.core.identity import make
from reconciler.core.observed import ObservedMachine, ObservedRun, ObservedWorld
from reconciler.core.plan import PlanSettings
from reconciler.planner import placement, quota
from reconciler.planner.make import make_plan
from reconciler.planner.render import dumps
from reconciler.spec.load import DesiredState, RunEntry, run_digest
from reconciler.spec.models.fleet import Fleet
from reconciler.spec.models.policy import Policy
from reconciler.spec.models.run import Run
from reconciler.spec.models.template import ExecutionTemplate

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICqRT6LKgEqdobuvittBCu1add1q6i1ofysL9m5i7d6G"
TYPES = ("H100", "A100")


def _template(tid: str, target: str | None) -> ExecutionTemplate:
    doc = {"apiVersion": "reconciler/v1", "kind": "ExecutionTemplate", "id": tid, "placement": {"kind": "ssh"},
           "launch_mode": {"kind": "host_process"}, "allow_overrides": ["resources", "selector"]}
    if target:
        doc["defaults"] = {"target": target}
    return ExecutionTemplate.model_validate(doc)


def _machine(rng: random.Random, i: int) -> dict:
    gpus = [{"type": t, "count": rng.choice([1, 2, 4, 8]), "memory_gb": rng.choice([40, 80])}
            for t in rng.sample(TYPES, rng.choice([1, 1, 2]))]
    res = {"gpus": gpus}
    if rng.random() < 0.5:
        res["cpu_count"] = rng.choice([8, 16, 32])
    return {"name": f"m{i:03d}", "ssh": {"host": "h", "user": "u", "host_key": KEY},
            "max_tasks": rng.choice([0, 1, 2, 4, 8]), "resources": res,
            "labels": {"zone": rng.choice(["a", "b"])}}


def _request(rng: random.Random, constrained: float) -> dict:
    res: dict = {"gpu_type": rng.choice(TYPES), "gpu_count": rng.choice([0, 1, 2, 4])}
    if rng.random() < constrained:
        kind = rng.choice(["cpu", "memory", "models", "selector"])
        if kind == "cpu":
            res["cpu_count"] = rng.choice([2, 4, 8])
        elif kind == "memory" and res["gpu_count"]:
            res["gpu_memory_gb"] = rng.choice([40, 80])
        elif kind == "models" and res["gpu_count"]:
            res = {"gpu_types": list(rng.sample(TYPES, 2)), "gpu_count": res["gpu_count"]}
        elif kind == "selector":
            return {"resources": res, "selector": {"zone": rng.choice(["a", "b"])}}
    return {"resources": res}


def _inputs(seed: int, constrained: float = 0.3) -> tuple[DesiredState, ObservedWorld]:
    """A fleet of two targets sharing no machine plus a template for any machine (so two room
    indexes hold the same machines), a third of the machines busy, runs of three priorities and
    four teams under quotas."""
    rng = random.Random(seed)
    desired = DesiredState()
    machines = [_machine(rng, i) for i in range(rng.randint(3, 30))]
    half = len(machines) // 2
    for name, part in (("east", machines[:half]), ("west", machines[half:])):
        if part:
            desired.fleets[name] = Fleet.model_validate({"apiVersion": "reconciler/v1", "kind": "Fleet",
                                                         "metadata": {"name": name}, "spec": {"machines": part}})
    for tid, target in (("any", None), ("east", "east"), ("west", "west")):
        desired.templates[tid] = _template(tid, target)
    desired.policy = Policy.model_validate({
        "apiVersion": "reconciler/v1", "kind": "Policy", "metadata": {"name": "policy"},
        "spec": {"priorityClasses": [{"name": "urgent", "value": 100}, {"name": "normal", "value": 10, "default": True},
                                     {"name": "batch", "value": 1}],
                 "teams": [{"name": f"team{t}", "maxGpus": rng.choice([4, 16, 64])} for t in range(3)]}})
    world = ObservedWorld(at=1000.0)
    for m in machines:
        obs = world.machines.setdefault(m["name"], ObservedMachine(m["name"]))
        if rng.random() < 0.1:  # (not unreachable: a new launch waits for such a machine, placed or not)
            obs.draining = "swap"
        elif rng.random() < 0.3:
            ident = make(f"old-{m['name']}", 1, 1)
            obs.runs[ident] = ObservedRun(ident, m["name"], "running", gpus=[0], started_at=900.0)
    for i in range(rng.randint(1, 120)):
        name = f"run-{i:03d}"
        spec = {"template": rng.choice(["any", "any", "east", "west"]), "overrides": _request(rng, constrained),
                "task": {"type": "command", "argv": ["python", "t.py", str(i)]}}
        if rng.random() < 0.4:
            spec["priority"] = rng.choice(["urgent", "batch"])
        labels = {"team": f"team{rng.randint(0, 3)}"}  # team3: no quota
        run = Run.model_validate({"apiVersion": "reconciler/v1", "kind": "Run",
                                  "metadata": {"name": name, "labels": labels}, "spec": spec})
        desired.runs[name] = RunEntry(run, f"specs/runs/{name}.yaml", run_digest(run))
    return desired, world


def _decisions(plan) -> list[tuple]:
    return [(c.name, c.action, c.code, c.machine, tuple(c.gpus), c.identity) for c in plan.changes]


class _Scanned(placement.Shape):
    """The reference for a plain request: judged machine by machine, as a constrained one is."""

    def __init__(self, eff, template, book):
        super().__init__(eff, template, book)
        self.constrained, self.index = True, None


@pytest.mark.parametrize("seed", range(40))
def test_the_room_index_and_its_memo_place_as_judging_every_machine_would(seed, monkeypatch) -> None:
    desired, world = _inputs(seed)
    fast = make_plan(desired, world, {}, 1000.0, PlanSettings())
    desired, world = _inputs(seed)
    monkeypatch.setattr(placement, "Shape", _Scanned)
    slow = make_plan(desired, world, {}, 1000.0, PlanSettings())
    assert _decisions(fast) == _decisions(slow)
    assert any(c.action == "launch" for c in fast.changes) or not desired.runs


@pytest.mark.parametrize("seed", range(40))
def test_machines_shared_by_two_targets_are_never_given_out_twice(seed) -> None:
    """Two templates whose candidates overlap (a target and no target) keep one room: a launch
    gets every GPU it asks for, none in use, and no machine goes past its task limit."""
    desired, world = _inputs(seed)
    plan = make_plan(desired, world, {}, 1000.0, PlanSettings())
    used = {(m, g) for m, o in world.machines.items() for r in o.runs.values() if r.alive for g in r.gpus}
    tasks = {m: sum(r.alive for r in o.runs.values()) for m, o in world.machines.items()}
    limit = {m.name: m.max_tasks for f in desired.fleets.values() for m in f.spec.machines}
    for c in plan.changes:
        if c.action != "launch":
            continue
        res = desired.runs[c.name].run.spec.overrides.resources
        assert len(c.gpus) == res.gpu_count, (c.name, c.machine, c.gpus)
        assert not {(c.machine, g) for g in c.gpus} & used, (c.name, c.machine, c.gpus)
        used.update((c.machine, g) for g in c.gpus)
        tasks[c.machine] += 1
        assert tasks[c.machine] <= limit[c.machine], (c.name, c.machine)


@pytest.mark.parametrize("seed", range(40))
def test_kept_verdicts_of_a_constrained_request_give_the_plan_judging_each_run_gives(seed, monkeypatch) -> None:
    desired, world = _inputs(seed, constrained=0.8)
    fast = dumps(make_plan(desired, world, {}, 1000.0, PlanSettings()))
    judge = placement._place_constrained
    calls = []

    def every_time(*args):
        calls.append(args[-1])
        return judge(*args[:-1])  # without the run's Shape: nothing kept, every machine judged

    desired, world = _inputs(seed, constrained=0.8)
    monkeypatch.setattr(placement, "_place_constrained", every_time)
    assert dumps(make_plan(desired, world, {}, 1000.0, PlanSettings())) == fast
    assert calls or not desired.runs


def test_a_full_fleet_judges_a_queue_of_constrained_runs_once() -> None:
    desired, world = _inputs(3, constrained=1.0)
    for i in range(200, 1200):  # a thousand more of one constrained shape, behind a full fleet
        name = f"queue-{i:04d}"
        run = Run.model_validate({"apiVersion": "reconciler/v1", "kind": "Run", "metadata": {"name": name},
                                  "spec": {"template": "any", "task": {"type": "command", "argv": ["x"]},
                                           "overrides": {"resources": {"gpu_type": "H100", "gpu_count": 64,
                                                                       "cpu_count": 4}}}})
        desired.runs[name] = RunEntry(run, f"specs/runs/{name}.yaml", run_digest(run))
    judged = []
    original = placement._judge

    def counting(*args, **kwargs):
        judged.append(args[0].name)
        return original(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(placement, "_judge", counting)
        plan = make_plan(desired, world, {}, 1000.0, PlanSettings())
    waits = [c for c in plan.changes if c.name.startswith("queue-")]
    assert len(waits) == 1000 and all(c.code == "NoCapacity" for c in waits)
    assert len({c.reason for c in waits}) == 1
    # The first of them judges every machine; the rest reuse it while no room changes in between.
    assert len(judged) < len(world.machines) * (120 + 2)


def _fair_by_scan(group: list[str], q: quota.Quotas, known: dict[str, str]) -> list[str]:
    """The fair order as its definition reads: each time, the least (share used, next run's
    time, team) over every team with runs left."""
    def since(name: str) -> str:
        return known.get(name, "~")

    queues: dict[str, list[str]] = {}
    for name in sorted(sorted(group), key=since):
        queues.setdefault(q.team(name) or "", []).append(name)
    out = []
    while queues:
        team = min(queues, key=lambda t: (q.share_used(t), since(queues[t][0]), t))
        out.append(queues[team].pop(0))
        if not queues[team]:
            del queues[team]
        yield out[-1]


def _fair_by_queues(group, q, since):
    """The planner's fair order of one priority's runs: each team's runs, queued as
    placement_order queues them, through quota._fair_queues."""
    queues: dict = {}
    for name in group:
        queues.setdefault(q.team(name) or "", []).append(name)
    return quota._fair_queues(queues, q, since)


@pytest.mark.parametrize("seed", range(30))
def test_the_fair_order_is_the_scan_of_every_team(seed) -> None:
    desired, world = _inputs(seed)
    rng = random.Random(seed)
    since = {n: rng.choice(["~", "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"]) for n in desired.runs}
    orders = []
    for fair in (_fair_by_queues, _fair_by_scan):
        q = quota.Quotas.build(desired, world, {})
        pick = random.Random(seed + 1)  # the same placements for both: each run placed or not by its turn
        got = []
        for name in fair(sorted(desired.runs), q, since):
            got.append(name)
            if pick.random() < 0.5:
                q.add(name, pick.choice([1, 2, 4]), 0.0)
        orders.append(got)
    assert orders[0] == orders[1]
    assert sorted(orders[0]) == sorted(desired.runs)
