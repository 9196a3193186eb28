"""Benchmark: placing 10,000 pending runs on 1,000 machines, against a plain greedy placer on the
same input, and that the planner's result is the same every time.

Desired, observed and previous state are built in memory: ``--machines`` fleet machines with 8
GPUs each (two GPU types, a third of them already half busy), ``--runs`` pending runs asking for
1, 2 or 4 GPUs of a type, with three priority classes and ten teams under GPU quotas.

The floor (``greedy``) is what placement costs with nothing but the arithmetic: runs in priority
order (then name), each put on the first machine by name with room for its GPU type and count
and below its task limit, within its team's maxGpus; no explanations, no Change objects, no
best-fit ranking, no fairness between teams. It keeps, per request shape, the index of the first
machine that may still fit (room only shrinks), so a waiting run costs one look-up. On this input it
places as many runs as the planner (both counts are printed), not necessarily on the same
machines.

The planner and the floor run alternately ``--repeat`` times (each on a freshly built input); the
figures are medians of CPU time (time.process_time) and wall time, each with the young collection
of what the side allocated, with the load average, and every plan's placements must be identical. Target: the planner ≤ 3x the floor's CPU time. The
runs' effective specs are kept from one plan to the next by spec digest (as a long-lived
reconciler keeps them from pass to pass), so the first plan of a process is printed on its own.

    python benchmarks/placement_bench.py [--runs 10000] [--machines 1000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reconciler.core.identity import make  # noqa: E402
from reconciler.core.observed import ObservedMachine, ObservedRun, ObservedWorld  # noqa: E402
from reconciler.core.plan import PlanSettings  # noqa: E402
from reconciler.planner.make import make_plan  # noqa: E402
from reconciler.spec.load import DesiredState, RunEntry, run_digest  # noqa: E402
from reconciler.spec.models.fleet import Fleet  # noqa: E402
from reconciler.spec.models.policy import Policy  # noqa: E402
from reconciler.spec.models.run import Run  # noqa: E402
from reconciler.spec.models.template import ExecutionTemplate  # noqa: E402

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICqRT6LKgEqdobuvittBCu1add1q6i1ofysL9m5i7d6G"
TYPES = ("H100", "A100")


def world_of(runs: int, machines: int) -> tuple[DesiredState, ObservedWorld]:
    desired = DesiredState()
    desired.templates["gpu"] = ExecutionTemplate.model_validate({
        "apiVersion": "reconciler/v1", "kind": "ExecutionTemplate", "id": "gpu", "placement": {"kind": "ssh"},
        "launch_mode": {"kind": "host_process"}, "allow_overrides": ["resources"]})
    desired.fleets["dc"] = Fleet.model_validate({
        "apiVersion": "reconciler/v1", "kind": "Fleet", "metadata": {"name": "dc"},
        "spec": {"machines": [{"name": f"m{i:04d}", "ssh": {"host": "h", "user": "u", "host_key": KEY},
                               "max_tasks": 8, "resources": {"gpus": [{"type": TYPES[i % 2], "count": 8}]}}
                              for i in range(machines)]}})
    desired.policy = Policy.model_validate({
        "apiVersion": "reconciler/v1", "kind": "Policy", "metadata": {"name": "policy"},
        "spec": {"priorityClasses": [{"name": "urgent", "value": 100}, {"name": "normal", "value": 10, "default": True},
                                     {"name": "batch", "value": 1}],
                 "teams": [{"name": f"team{t}", "maxGpus": 4000} for t in range(10)]}})
    world = ObservedWorld(at=1000.0)
    for i in range(machines):
        m = world.machines.setdefault(f"m{i:04d}", ObservedMachine(f"m{i:04d}"))
        if i % 3 == 0:  # a third of the machines half busy with work of the past
            ident = make(f"old-{i}", 1, 1)
            m.runs[ident] = ObservedRun(ident, m.name, "running", gpus=[0, 1, 2, 3], started_at=900.0)
    for i in range(runs):
        name = f"run-{i:05d}"
        spec = {"template": "gpu", "task": {"type": "command", "argv": ["python", "t.py", str(i)]},
                "overrides": {"resources": {"gpu_type": TYPES[i % 2], "gpu_count": (1, 2, 4)[i % 3]}}}
        if i % 5 == 0:
            spec["priority"] = ("urgent", "batch")[i % 2]
        run = Run.model_validate({"apiVersion": "reconciler/v1", "kind": "Run",
                                  "metadata": {"name": name, "labels": {"team": f"team{i % 10}"}}, "spec": spec})
        desired.runs[name] = RunEntry(run, f"specs/runs/{name}.yaml", run_digest(run))
    return desired, world


def greedy(desired: DesiredState, world: ObservedWorld) -> list[tuple[str, str, tuple[int, ...]]]:
    """The floor: first fit in priority order (see the module's docstring); (run, machine, GPUs)."""
    policy = desired.policy.spec
    prio = {c.name: c.value for c in policy.priorityClasses}
    default = next((c.value for c in policy.priorityClasses if c.default), 0)
    cap = {t.name: t.maxGpus for t in policy.teams}
    used_by_team: dict[str, int] = {}
    machines = []  # [name, {type: free GPU indexes}, tasks, max tasks], by name
    for fleet in desired.fleets.values():
        for m in fleet.spec.machines:
            busy, tasks = set(), 0
            for r in world.machines[m.name].runs.values() if m.name in world.machines else ():
                if r.alive:
                    busy.update(r.gpus)
                    tasks += 1
            free: dict[str, list[int]] = {}
            i = 0
            for g in m.resources.gpus:
                for _ in range(g.count):
                    if i not in busy:
                        free.setdefault(g.type.lower(), []).append(i)
                    i += 1
            machines.append([m.name, free, tasks, m.max_tasks])
    machines.sort(key=lambda x: x[0])
    order = sorted(desired.runs.values(), key=lambda e: (-prio.get(e.run.spec.priority, default), e.run.metadata.name))
    first: dict[tuple[str, int], int] = {}  # request shape → first machine that may still fit
    out = []
    for e in order:
        res = e.run.spec.overrides.resources
        gtype, count = res.gpu_type.lower(), res.gpu_count
        team = e.run.metadata.labels.get(policy.teamLabel)
        if team in cap and used_by_team.get(team, 0) + count > cap[team]:
            continue
        i = first.get((gtype, count), 0)
        while i < len(machines):
            name, free, tasks, max_tasks = machines[i]
            if len(free.get(gtype, ())) >= count and (max_tasks is None or tasks < max_tasks):
                break
            i += 1
        first[(gtype, count)] = i
        if i == len(machines):
            continue
        m = machines[i]
        got, m[1][gtype] = m[1][gtype][:count], m[1][gtype][count:]
        m[2] += 1
        used_by_team[team] = used_by_team.get(team, 0) + count
        out.append((e.run.metadata.name, m[0], tuple(got)))
    return out


def _timed(fn, *args):
    """``fn(*args)`` and the CPU and wall time it took, with the young collection of what it
    allocated: make_plan holds the collector off and leaves that collection to its caller's next
    allocation, so it is counted here, for both sides alike."""
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn(*args)
    gc.collect(0)
    return out, time.process_time() - c0, time.perf_counter() - w0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10000)
    ap.add_argument("--machines", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    cpu, wall, floor_cpu, floor_wall, placements = [], [], [], [], []
    load0 = os.getloadavg()
    floor_placed = 0
    for _ in range(args.repeat):  # alternating, so that both see the same load
        desired, world = world_of(args.runs, args.machines)  # fresh slots each time
        plan, c, w = _timed(make_plan, desired, world, {}, 1000.0, PlanSettings())
        cpu.append(c)
        wall.append(w)
        placements.append([(c.name, c.action, c.machine, tuple(c.gpus), c.code) for c in plan.changes])
        desired, world = world_of(args.runs, args.machines)
        placed, c, w = _timed(greedy, desired, world)
        floor_cpu.append(c)
        floor_wall.append(w)
        floor_placed = len(placed)
    load1 = os.getloadavg()
    placed = sum(1 for c in placements[0] if c[1] == "launch")
    same = all(p == placements[0] for p in placements)
    med = statistics.median
    print(f"placing {args.runs} pending runs on {args.machines} machines, {args.repeat} alternating rounds "
          f"(load average {load0[0]:.2f} before, {load1[0]:.2f} after):")
    print(f"  planner: CPU median {med(cpu) * 1000:.0f} ms (min {min(cpu) * 1000:.0f}, max {max(cpu) * 1000:.0f}); "
          f"wall median {med(wall) * 1000:.0f} ms; {placed} placed, {args.runs - placed} waiting; first plan "
          f"{cpu[0] * 1000:.0f} ms CPU (no effective spec kept from an earlier plan yet)")
    print(f"  greedy floor: CPU median {med(floor_cpu) * 1000:.0f} ms (min {min(floor_cpu) * 1000:.0f}, "
          f"max {max(floor_cpu) * 1000:.0f}); wall median {med(floor_wall) * 1000:.0f} ms; {floor_placed} placed")
    print(f"  ratio planner/floor (CPU medians): {med(cpu) / med(floor_cpu):.1f}x (target <= 3x); "
          f"identical placements across {args.repeat} plans: {'yes' if same else 'NO'}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
