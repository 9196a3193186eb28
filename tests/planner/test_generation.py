"""A new identity is never picked blind: the rule of planner/fence.py's hold_unseen_launches and
lifecycle's choice among instances of one identity, beyond what the plan text shows."""

from __future__ import annotations

from pathlib import Path

import yaml

from reconciler.core.actions import Action
from reconciler.planner.make import make_plan
from tests.planner.test_plan import build

CASES = Path(__file__).parent / "plan_cases"


def plan_of(stem: str, **over):
    case = yaml.safe_load((CASES / f"{stem}.yaml").read_text())
    case.update(over)
    desired, world, previous, now, settings = build(case)
    return make_plan(desired, world, previous, now, settings)


def test_the_wait_reads_the_same_on_every_pass_until_the_grace_ends():
    stem = "82-generation-new-number-waits-for-a-machine-that-may-hold-an-unrecorded-launch"
    a, b = plan_of(stem, now=1000).changes[0], plan_of(stem, now=1200).changes[0]
    assert a.action == b.action == Action.WAIT and a.code == "MachineUnreachable"
    assert a.reason == b.reason and (a.generation, a.attempt, a.identity) == (2, 1, "remote-g2-a1")
    assert a.spec_digest == "sha256:old"  # the status keeps the spec it records, not the one that waits
    assert [k.identity for k in a.kill] == ["remote-g2-a1"]  # the attempt in sight is still stopped
    late = plan_of(stem, now=1290 + 0.5).changes[0]  # past unreachable_since + grace
    assert late.action == Action.RELAUNCH and late.identity == "remote-g3-a1" and late.machine == "gpu-1"


def test_a_machine_that_answers_again_ends_the_wait():
    stem = "82-generation-new-number-waits-for-a-machine-that-may-hold-an-unrecorded-launch"
    case = yaml.safe_load((CASES / f"{stem}.yaml").read_text())
    case["observed"]["gpu-2"] = {}
    desired, world, previous, now, settings = build(case)
    [c] = make_plan(desired, world, previous, now, settings).changes
    assert c.action == Action.RELAUNCH and c.identity == "remote-g3-a1"


def test_of_one_identity_on_two_machines_the_recorded_one_is_kept_and_the_other_stopped():
    [c] = plan_of("82-generation-one-identity-on-two-machines-keeps-the-recorded-one").changes
    assert c.machine == "gpu-2" and c.identity == "remote-g1-a2"
    assert [(k.machine, k.identity) for k in c.kill] == [("gpu-1", "remote-g1-a2")]


def test_a_local_run_never_waits_for_an_ssh_machine():
    case = yaml.safe_load((CASES / "82-generation-new-number-waits-for-a-machine-that-may-hold-an-unrecorded-launch.yaml")
                          .read_text())
    case["runs"]["remote"]["template"] = "local-host"
    case["observed"]["gpu-1"] = {}
    case["previous"]["remote"]["handle"]["machine"] = "local"
    desired, world, previous, now, settings = build(case)
    [c] = make_plan(desired, world, previous, now, settings).changes
    assert c.action in (Action.LAUNCH, Action.RELAUNCH) and c.identity == "remote-g3-a1"

