"""Benchmark: placing 10,000 pending runs on 1,000 machines, and that the result is the same
every time.

Desired, observed and previous state are built in memory: ``--machines`` fleet machines with 8
GPUs each (two GPU types, some already half busy), ``--runs`` pending runs asking for 1, 2 or 4
GPUs of a type, with three priority classes and ten teams under GPU quotas. The plan is computed
``--repeat`` times; the figure is the median, and every plan's placements must be identical.
Target: ≤ 1 s for 10,000 runs on 1,000 machines.

    python benchmarks/placement_bench.py [--runs 10000] [--machines 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reconciler.core.identity import make  # noqa: E402
from reconciler.core.observed import ObservedMachine, ObservedRun, ObservedWorld  # noqa: E402
from reconciler.planner.plan import PlanSettings, make_plan  # noqa: E402
from reconciler.spec.load import DesiredState, RunEntry, run_digest  # noqa: E402
from reconciler.spec.models import ExecutionTemplate, Fleet, Policy, Run  # noqa: E402

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10000)
    ap.add_argument("--machines", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    times, placements = [], []
    for _ in range(args.repeat):
        desired, world = world_of(args.runs, args.machines)  # fresh slots each time
        t0 = time.perf_counter()
        plan = make_plan(desired, world, {}, 1000.0, PlanSettings())
        times.append(time.perf_counter() - t0)
        placements.append([(c.name, c.action, c.machine, tuple(c.gpus), c.code) for c in plan.changes])
    placed = sum(1 for c in placements[0] if c[1] == "launch")
    same = all(p == placements[0] for p in placements)
    print(f"placing {args.runs} pending runs on {args.machines} machines: median {statistics.median(times):.2f}s "
          f"(min {min(times):.2f}s, max {max(times):.2f}s); {placed} placed, {args.runs - placed} waiting; "
          f"identical placements across {args.repeat} plans: {'yes' if same else 'NO'}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
