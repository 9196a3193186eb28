"""Table-driven placement cases: tests/planner/scheduling_cases/NN-name.yaml (the world) and NN-name.txt
(what the planner decides for each run, with its explanation). Pure: no SSH, no provider.

A case gives fleet machines (GPUs, type, GPU memory, CPUs, host memory, labels), live instances (``busy``: run →
[machine, GPUs, seconds it has run]), an optional Policy, provider offers and ``fallback: rental``,
the runs (priority, GPUs, type or any-of types, least GPU memory, CPUs, host memory, selector,
labels, affinity, anti) and previous
statuses (``phase``, ``since``). To regenerate the expected files after an intended change:
``UPDATE_SCHEDULING_CASES=1 pytest tests/planner/test_scheduling_cases.py``, then read the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from reconciler.core.identity import make
from reconciler.core.observed import ObservedMachine, ObservedRun, ObservedWorld
from reconciler.core.plan import PlanSettings
from reconciler.planner.make import make_plan
from reconciler.spec.load import load_tree
from reconciler.core.runstatus import RunStatus, Transition

CASES = Path(__file__).parent / "scheduling_cases"
NOW = 1_800_000_000.0
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICqRT6LKgEqdobuvittBCu1add1q6i1ofysL9m5i7d6G"


def _write(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def build(case: dict, root: Path):
    placement = {"kind": "ssh", **({"fallback": "rental"} if case.get("fallback") else {})}
    _write(root / "execution_templates" / "gpu.yaml", {
        "apiVersion": "reconciler/v1", "kind": "ExecutionTemplate", "id": "gpu", "placement": placement,
        "launch_mode": {"kind": "host_process"}, "allow_overrides": ["resources", "selector"]})
    machines = []
    for name, m in case["machines"].items():
        gpus = {"type": m.get("type", "H100"), "count": m["gpus"], **({"memory_gb": m["memory"]} if "memory" in m else {})}
        resources = {"gpus": [gpus], **({"cpu_count": m["cpus"]} if "cpus" in m else {}),
                     **({"memory_gb": m["memory_gb"]} if "memory_gb" in m else {})}
        machines.append({"name": name, "ssh": {"host": "h", "user": "u", "host_key": KEY}, "max_tasks": 8,
                         "resources": resources, "labels": m.get("labels", {})})
    _write(root / "specs" / "fleets" / "lab.yaml", {"apiVersion": "reconciler/v1", "kind": "Fleet",
                                                    "metadata": {"name": "lab"}, "spec": {"machines": machines}})
    if case.get("policy") is not None:
        _write(root / "specs" / "policy.yaml", {"apiVersion": "reconciler/v1", "kind": "Policy",
                                                "metadata": {"name": "policy"}, "spec": case["policy"]})
    if case.get("offers"):
        _write(root / "specs" / "providers" / "cloud.yaml", {
            "apiVersion": "reconciler/v1", "kind": "Provider", "metadata": {"name": "cloud"},
            "spec": {"type": "command", "offers": case["offers"],
                     "command": {"provision": ["p"], "inventory": ["i"], "terminate": ["t"]}}})
    for name, r in case["runs"].items():
        res = {"gpu_count": r.get("gpus", 1)}
        if "types" in r:
            res["gpu_types"] = r["types"]
        elif res["gpu_count"]:
            res["gpu_type"] = r.get("type", "H100")
        if "cpus" in r:
            res["cpu_count"] = r["cpus"]
        if "host_memory" in r:
            res["memory_gb"] = r["host_memory"]
        if "memory" in r:
            res["gpu_memory_gb"] = r["memory"]
        overrides = {"resources": res, **({"selector": r["selector"]} if "selector" in r else {})}
        spec = {"template": "gpu", "task": {"type": "command", "argv": ["train"]}, "overrides": overrides}
        if "priority" in r:
            spec["priority"] = r["priority"]
        if "affinity" in r:
            spec["affinity"] = r["affinity"]
        if "anti" in r:
            spec["antiAffinity"] = r["anti"]
        _write(root / "specs" / "runs" / f"{name}.yaml", {
            "apiVersion": "reconciler/v1", "kind": "Run", "metadata": {"name": name, "labels": r.get("labels", {})},
            "spec": spec})
    desired = load_tree(root)
    assert not desired.diagnostics, [d.text() for d in desired.diagnostics]
    world = ObservedWorld(at=NOW)
    for name in case["machines"]:
        world.machines[name] = ObservedMachine(name)
    used: dict[str, int] = {}
    previous = {}
    for run, spec in (case.get("busy") or {}).items():
        machine, n = spec[0], spec[1]
        ran = spec[2] if len(spec) > 2 else 3600
        first = used.get(machine, 0)
        ident = make(run, 1, 1)
        entry = desired.runs.get(run)
        world.machines[machine].runs[ident] = ObservedRun(
            ident, machine, "running", gpus=list(range(first, first + n)), started_at=NOW - ran,
            spec_digest=entry.digest if entry else None)
        used[machine] = first + n
        if entry is not None:
            previous[run] = RunStatus(name=run, phase="Running", generation=1, attempt=1,
                                      spec={"digest": entry.digest}, handle={"machine": machine, "identity": ident},
                                      history=[Transition(time="2026-12-01T00:00:00Z", phase="Running")])
    for run, p in (case.get("previous") or {}).items():
        previous[run] = RunStatus(name=run, phase=p["phase"], history=[Transition(time=p["since"], phase=p["phase"])])
    return desired, world, previous


def render(plan) -> str:
    lines = []
    for c in plan.changes:
        where = c.machine or (f"{c.rental['provider']}/{c.rental['offer']}" if c.rental else "-")
        lines.append(f"{c.name}: {c.action} {c.code} {where}")
        lines.append(f"  {c.reason}")
        lines += [f"    {x}" for x in c.considered]
        lines += [f"    stop {k.identity} on {k.machine} (grace {k.grace:g}s)" for k in c.kill if k.grace is not None]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("path", sorted(CASES.glob("*.yaml")), ids=lambda p: p.stem)
def test_scheduling_case(path: Path, tmp_path) -> None:
    case = yaml.safe_load(path.read_text())
    desired, world, previous = build(case, tmp_path)
    out = render(make_plan(desired, world, previous, NOW, PlanSettings(namespace="ns")))
    again = render(make_plan(*build(case, tmp_path / "again"), NOW, PlanSettings(namespace="ns")))
    assert out == again  # the same inputs, the same placement
    header = "".join(line + "\n" for line in path.read_text().splitlines() if line.startswith("#"))
    expected = path.with_suffix(".txt")
    if os.environ.get("UPDATE_SCHEDULING_CASES"):
        expected.write_text(header + out)
    assert expected.exists(), f"{expected.name} is missing: write it with UPDATE_SCHEDULING_CASES=1"
    assert header + out == expected.read_text()
