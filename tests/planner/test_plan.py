"""Table-driven plan cases: desired + observed + previous status → the expected plan text.

Each case is a YAML file in tests/planner/plan_cases/; its expected plan is the matching ``.plan`` file.
The planner is pure, so these run in milliseconds with no process, machine or repository.
To regenerate the expected files after an intended change: ``UPDATE_PLAN_CASES=1 pytest tests/planner/test_plan.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from reconciler.core.actions import Action
from reconciler.core.identity import parse
from reconciler.core.observed import ObservedMachine, ObservedRun, ObservedWorld
from reconciler.core.plan import Change, Plan, PlanSettings
from reconciler.planner.make import make_plan
from reconciler.planner.render import SYMBOL, text
from reconciler.spec.load import DesiredState, RunEntry, run_digest
from reconciler.spec.models.fleet import Fleet
from reconciler.spec.models.run import Run
from reconciler.spec.models.template import ExecutionTemplate
from reconciler.core.runstatus import RunStatus

CASES = sorted((Path(__file__).parent / "plan_cases").glob("*.yaml"))
TEMPLATES = {
    "local-host": {"placement": {"kind": "local"}, "launch_mode": {"kind": "host_process"},
                   "allow_overrides": ["resources"]},
    "ssh-host": {"placement": {"kind": "ssh"}, "launch_mode": {"kind": "host_process"},
                 "defaults": {"target": "lab"}, "allow_overrides": ["resources"]},
}


def build(case: dict) -> tuple[DesiredState, ObservedWorld, dict[str, RunStatus], float, PlanSettings]:
    desired = DesiredState()
    for tid, body in TEMPLATES.items():
        desired.templates[tid] = ExecutionTemplate.model_validate(
            {"apiVersion": "reconciler/v1", "kind": "ExecutionTemplate", "id": tid, **body})
    gpus = case.get("fleet_gpus", {})
    max_tasks = case.get("fleet_max_tasks", {})
    machines = []
    for m in ("gpu-1", "gpu-2"):
        res = {"gpus": [{"type": "H100", "count": gpus[m]}]} if gpus.get(m) else {}
        machines.append({"name": m, "ssh": {"host": "127.0.0.1", "user": "u", "host_key": "ssh-ed25519 AAAA"},
                         "resources": res, "max_tasks": max_tasks.get(m, 2)})
    desired.fleets["lab"] = Fleet.model_validate({"apiVersion": "reconciler/v1", "kind": "Fleet",
                                                  "metadata": {"name": "lab"}, "spec": {"machines": machines}})
    for name, spec in (case.get("runs") or {}).items():
        spec = {"template": "local-host", **spec}
        run = Run.model_validate({"apiVersion": "reconciler/v1", "kind": "Run", "metadata": {"name": name},
                                  "spec": spec})
        desired.runs[name] = RunEntry(run, f"specs/runs/{name}.yaml", run_digest(run))
    desired.invalid.update(case.get("invalid") or {})
    world = ObservedWorld(at=case.get("now", 1000.0))
    world.machines["local"] = ObservedMachine("local")
    for mname, mdata in (case.get("observed") or {}).items():
        m = ObservedMachine(mname, reachable=mdata.get("reachable", True), error=mdata.get("error", ""),
                            unreachable_since=mdata.get("unreachable_since"), draining=mdata.get("draining"),
                            foreign_gpus=mdata.get("foreign_gpus", []))
        for ident, r in (mdata.get("runs") or {}).items():
            r = dict(r)
            # An instance is built from the desired spec unless the case says otherwise.
            p = parse(ident)
            entry = desired.runs.get(p.name) if p else None
            if r.get("spec_digest", "auto") == "auto":
                r["spec_digest"] = entry.digest if entry else "sha256:other"
            m.runs[ident] = ObservedRun(identity=ident, machine=mname, workspace=f"/ws/{ident}", **r)
        world.machines[mname] = m
    world.provider_errors.update(case.get("provider_errors") or {})
    previous = {}
    for name, st in (case.get("previous") or {}).items():
        st = json.loads(json.dumps(st))
        if st.get("spec", {}).get("digest") == "auto":
            st["spec"]["digest"] = desired.runs[name].digest
        previous[name] = RunStatus.model_validate({"name": name, **st})
    settings = PlanSettings(unreachable_grace=case.get("grace", 300.0))
    return desired, world, previous, float(case.get("now", 1000.0)), settings


@pytest.mark.parametrize("case_file", CASES, ids=[c.stem for c in CASES])
def test_plan_case(case_file: Path):
    case = yaml.safe_load(case_file.read_text())
    desired, world, previous, now, settings = build(case)
    plan = make_plan(desired, world, previous, now, settings, missing_secrets=case.get("missing_secrets"))
    got = f"# {case['description']}\n" + text(plan) + "\n"
    expected_file = case_file.with_suffix(".plan")
    if os.environ.get("UPDATE_PLAN_CASES"):
        expected_file.write_text(got)
    assert expected_file.exists(), f"{expected_file.name} is missing: write it with UPDATE_PLAN_CASES=1"
    assert got == expected_file.read_text()
    # The plan is a value: it survives a JSON round trip unchanged.
    assert json.loads(json.dumps(plan.to_json())) == plan.to_json()


def test_plan_is_deterministic():
    case = yaml.safe_load(CASES[0].read_text())
    a = make_plan(*build(case)).to_json()
    b = make_plan(*build(case)).to_json()
    assert a == b


def test_a_gpu_in_use_outside_the_reconciler_is_not_handed_out():
    case = yaml.safe_load((Path(__file__).parent / "plan_cases" / "28-foreign-gpu-use.yaml").read_text())
    plan = make_plan(*build(case))
    assert plan.for_run("a").gpus == [1]
    assert "(1 in use outside the reconciler)" in plan.for_run("b").reason


def test_every_action_renders_as_its_plain_value():
    # The text plan looks each action up in SYMBOL: a member missing there would crash rendering.
    assert set(SYMBOL) == set(Action)
    for a in Action:
        assert f"{a}" == f"{a:<12}".rstrip() == str(a) == "%s" % a == a.value
        assert json.dumps(a) == json.dumps(a.value)
        assert json.dumps({a: 1}) == json.dumps({a.value: 1})
        assert yaml.safe_dump(str(a)) == yaml.safe_dump(a.value)
        shown = text(Plan([Change("r", a, "Code", "why", None)]), verbose=True)
        assert f"  {SYMBOL[a]} {a.value:<12} r  " in shown
    assert sorted(Action) == sorted(Action, key=lambda a: a.value)
