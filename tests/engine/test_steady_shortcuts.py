"""The shortcuts a steady pass takes, each against the case it must not swallow: the shared-login
warnings kept from the last plan (planner/exposure.py), the collector held off during a pass
(engine/collector.py), and the expected workspace worked out only when a report needs it
(engine/observe.py)."""

from __future__ import annotations

import gc
import os
import weakref
from types import SimpleNamespace

import yaml

from reconciler.core import boundary
from reconciler.core.observed import ObservedMachine, ObservedRun, ObservedWorld
from reconciler.core.plan import Change, Plan
from reconciler.engine import collector
from reconciler.engine.observe import _bind
from reconciler.planner import exposure
from reconciler.spec.load import SpecCache, load_tree
from tests.repo_helpers import make_repo, reconciler, run_spec

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICqRT6LKgEqdobuvittBCu1add1q6i1ofysL9m5i7d6G"


def _labelled(name: str, team: str) -> str:
    return run_spec(name, ["true"]).replace(f"  name: {name}\n", f"  name: {name}\n  labels: {{team: {team}}}\n", 1)


def _fleet_repo(tmp_path):
    repo = make_repo(tmp_path / "repo", {"a": _labelled("a", "nlp"), "b": _labelled("b", "nlp")})
    machines = [{"name": n, "ssh": {"host": "gpu1.lab", "user": "shared", "host_key": KEY}} for n in ("m1", "m2")]
    (repo / "specs" / "lab.yaml").write_text(yaml.safe_dump(
        {"apiVersion": "reconciler/v1", "kind": "Fleet", "metadata": {"name": "lab"}, "spec": {"machines": machines}}))
    return repo


def _live(placements: dict[str, str]) -> ObservedWorld:
    world = ObservedWorld()
    for name, machine in placements.items():
        ident = f"{name}-g1-a1"
        world.machines.setdefault(machine, ObservedMachine(machine)).runs[ident] = ObservedRun(ident, machine, "running")
    return world


def test_login_warnings_follow_a_team_label_edit_and_a_new_placement(tmp_path):
    repo = _fleet_repo(tmp_path)
    cache = SpecCache()
    desired = load_tree(repo, cache)
    world = _live({"a": "m1", "b": "m2"})
    assert exposure.shared_login_warnings(desired, world, Plan()) == []
    assert exposure.shared_login_warnings(desired, _live({"a": "m1", "b": "m2"}), Plan()) == []  # kept
    # The same placements, but b's spec now names another team: read again, said.
    (repo / "specs" / "runs" / "b.yaml").write_text(_labelled("b", "vision"))
    desired = load_tree(repo, cache)
    [warning] = exposure.shared_login_warnings(desired, _live({"a": "m1", "b": "m2"}), Plan())
    assert "shared@gpu1.lab" in warning and "nlp: a; vision: b" in warning
    # b stops (nothing of it lives): no longer shared. A launch of it onto m1: shared again.
    assert exposure.shared_login_warnings(desired, _live({"a": "m1"}), Plan()) == []
    launch = Plan(changes=[Change("b", "launch", "NewRun", "", "Running", machine="m1")])
    [again] = exposure.shared_login_warnings(desired, _live({"a": "m1"}), launch)
    assert again == warning.replace("machine m1, m2", "machine m1")
    # Two entries of the Fleet become two logins: read again, not shared.
    machines = [{"name": n, "ssh": {"host": "gpu1.lab", "user": u, "host_key": KEY}} for n, u in (("m1", "x"), ("m2", "y"))]
    (repo / "specs" / "lab.yaml").write_text(yaml.safe_dump(
        {"apiVersion": "reconciler/v1", "kind": "Fleet", "metadata": {"name": "lab"}, "spec": {"machines": machines}}))
    desired = load_tree(repo, cache)
    assert exposure.shared_login_warnings(desired, _live({"a": "m1", "b": "m2"}), Plan()) == []


def test_the_collector_is_off_during_a_later_pass_and_on_after_it(tmp_path, ws_root):
    repo = make_repo(tmp_path / "repo", {"hello": run_spec("hello", ["true"])})
    rec = reconciler(repo, ws_root)
    seen: list[bool] = []
    observe = rec._observe_world

    def spying(*args, **kwargs):
        seen.append(gc.isenabled())
        return observe(*args, **kwargs)

    rec._observe_world = spying
    assert gc.isenabled()
    rec.run_pass()  # a first pass parses everything: the collector stays on
    rec.run_pass()
    assert seen == [True, False] and gc.isenabled()
    # A caller that turned it off itself keeps it off.
    gc.disable()
    try:
        with collector.paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


class _Node:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def _cycle() -> weakref.ref:
    return weakref.ref(_Node())  # the cycle is garbage at once; the weak reference tells when it goes


def test_a_pass_that_worked_collects_its_cycles():
    was = gc.isenabled()
    gc.disable()  # as during a pass: nothing collects behind the test's back
    try:
        idle = _cycle()
        collector.after_pass(2, 10, busy=False)
        assert idle() is not None  # a steady pass makes no cycle: nothing walked, what is left frozen
        worked = _cycle()
        collector.after_pass(3, 10, busy=True)
        assert worked() is None
        assert idle() is not None  # frozen by the pass before: out of the collector's sight
        collector.after_pass(collector.FULL_GC_EVERY, 10, busy=False)
        assert idle() is None  # every so many passes everything is looked at, the frozen too
    finally:
        gc.unfreeze()
        gc.collect()
        if was:
            gc.enable()


def test_a_report_no_status_records_is_still_held_to_its_workspace(tmp_path):
    """The expected workspace is skipped only where a status records the attempt on the reporting
    machine: a report of an attempt nobody recorded is refused unless it sits at <root>/<identity>,
    and one recorded on another machine is refused whatever its workspace."""
    root = str(tmp_path / "ws")
    ident = "ghost-g1-a1"

    class Transport:
        _root = root

        def workspace(self, identity: str) -> str:
            return os.path.join(self._root, identity)

    def bound(workspace: str, handle) -> ObservedMachine:
        reply = boundary.ProbeReply()
        reply.runs[ident] = boundary.parse_run(ident, {"state": "running", "workspace": workspace, "pid": 1})
        m = ObservedMachine("lab-a")
        _bind(m, Transport(), reply, lambda i: handle)
        return m

    outside = bound(str(tmp_path / "elsewhere" / ident), None)
    assert ident not in outside.runs and "is not" in outside.error
    at_root = bound(os.path.join(root, ident), None)
    assert at_root.runs[ident].machine == "lab-a"
    here = SimpleNamespace(identity=ident, machine="lab-a", nodes=None)
    assert ident in bound(str(tmp_path / "anywhere"), here).runs  # its status says where it runs
    there = bound(os.path.join(root, ident), SimpleNamespace(identity=ident, machine="lab-b", nodes=None))
    assert ident not in there.runs and "recorded on lab-b" in there.error
