"""A pass over a fleet at rest takes the last pass's plan (engine/steady.py), with real processes
on this machine, against each case the shortcut must not swallow: a job that dies, a spec edit,
a stall rule judged against the clock, an instance no run keeps, and every note of the world the
plan was computed from."""

from __future__ import annotations

import copy
import dataclasses
import signal
import time

import pytest

from reconciler.core import config as configs
from reconciler.engine import steady
from reconciler.engine.loop import Reconciler
from tests.repo_helpers import (
    commit_all, group_alive, kill_group, make_repo, pass_until, pgid_of, processes_with, run_spec, status_of,
    wait_for,
)

LONG = ["sleep", "300"]


def _daemon_like(repo, ws_root, **flags) -> Reconciler:
    """A long-lived reconciler, as the daemon keeps one (its connections and memos across passes)."""
    cfg = configs.load(str(repo), flags={"workspace_root": str(ws_root), "namespace": "test",
                                         "terminate_grace": 3.0, **flags})
    return Reconciler(cfg, keep_connections=True)


def _at_rest(rec, names, now=None):
    """Passes until every run is Running and a pass took the last plan; that pass's result."""
    for name in names:
        pass_until(rec, name, "Running")
    for _ in range(5):
        result = rec.run_pass(now=now)
        if result.plan_reused:
            return result
    raise AssertionError("no pass over the fleet at rest took the last plan")


def _decisions(plan):
    return [dataclasses.asdict(c) for c in plan.changes], list(plan.warnings)


def test_a_fleet_at_rest_takes_the_last_plan_and_sees_a_job_die_and_a_spec_edit(tmp_path, ws_root):
    repo = make_repo(tmp_path / "repo", {"a": run_spec("a", LONG, max_retries=1), "b": run_spec("b", LONG)})
    rec = _daemon_like(repo, ws_root)
    rested = _at_rest(rec, ["a", "b"])  # from here on the record is renewed by each pass that takes it
    assert [(c.name, c.action, c.phase) for c in rested.plan.changes] == [("a", "none", "Running"),
                                                                          ("b", "none", "Running")]
    assert rested.written == [] and rested.commit is None
    # The job of a dies: the next pass plans afresh, at once, and relaunches it.
    pgid = wait_for(lambda: pgid_of(ws_root, "a-g1-a1"), what="a's process group")
    kill_group(pgid, signal.SIGKILL)
    wait_for(lambda: not group_alive(pgid), what="a's group to die")
    result = rec.run_pass()
    assert not result.plan_reused
    change = result.plan.for_run("a")
    assert (change.action, change.identity) == ("relaunch", "a-g1-a2")
    assert (status_of(repo, "a").attempt, status_of(repo, "a").phase) == (2, "Running")
    # At rest again; then b's spec says Stopped: its process is stopped by the next pass.
    _at_rest(rec, ["a", "b"])
    (repo / "specs" / "runs" / "b.yaml").write_text(run_spec("b", LONG, desired="Stopped"))
    commit_all(repo, "stop b")
    result = rec.run_pass()
    assert not result.plan_reused and result.plan.for_run("b").action == "terminate"
    assert status_of(repo, "b").phase == "Terminated"
    assert processes_with("RECONCILER_IDENTITY=b-g1-a1", within=ws_root) == []
    assert processes_with("RECONCILER_IDENTITY=a-g1-a2", within=ws_root)


def test_the_taken_plan_is_the_one_planning_again_gives(tmp_path, ws_root):
    repo = make_repo(tmp_path / "repo", {n: run_spec(n, LONG) for n in ("a", "b", "c")})
    rec = _daemon_like(repo, ws_root)
    rested = _at_rest(rec, ["a", "b", "c"])
    for _ in range(2):  # the record stands for the passes that take it, one after another
        again = rec.run_pass()
        assert again.plan_reused and _decisions(again.plan) == _decisions(rested.plan)
    rec._steady = None  # no record: the same inputs are planned afresh
    again = rec.run_pass()
    assert not again.plan_reused and _decisions(again.plan) == _decisions(rested.plan)


def test_a_run_with_a_stall_rule_is_judged_against_the_clock_every_pass(tmp_path, ws_root):
    stall = "  stall:\n    afterSeconds: 30\n    action: terminate\n"
    repo = make_repo(tmp_path / "repo", {"quiet": run_spec("quiet", LONG, extra=stall), "b": run_spec("b", LONG)})
    rec = _daemon_like(repo, ws_root)
    now = time.time()
    for name in ("quiet", "b"):
        pass_until(rec, name, "Running")
    for _ in range(3):
        assert not rec.run_pass(now=now).plan_reused  # the stall rule reads the clock: never taken
    late = rec.run_pass(now=now + 120)  # no progress for two minutes: stalled, terminated
    change = late.plan.for_run("quiet")
    assert change.action == "terminate" and change.stalled and "no training progress" in change.stalled


def test_an_instance_no_run_keeps_is_planned_every_pass(tmp_path, ws_root):
    repo = make_repo(tmp_path / "repo", {"a": run_spec("a", LONG), "ghost": run_spec("ghost", LONG)})
    rec = _daemon_like(repo, ws_root, orphan_grace=60.0)
    _at_rest(rec, ["a", "ghost"])
    # ghost's spec goes and its status with it: its process is an instance no run keeps (an orphan).
    (repo / "specs" / "runs" / "ghost.yaml").unlink()
    (repo / "status" / "ghost.yaml").unlink()
    commit_all(repo, "forget ghost")
    t0 = time.time()
    for _ in range(3):
        result = rec.run_pass(now=t0)
        assert not result.plan_reused and any("ghost-g1-a1" in w for w in result.plan.warnings)
    due = rec.run_pass(now=t0 + 120)  # its orphan grace is over
    assert [(c.action, c.code) for c in due.plan.changes if c.name == "ghost"] == [("terminate", "Fenced")]


def _mutations():
    def unreachable(world):
        m = world.machines["local"]
        m.reachable, m.error = False, "no answer"

    def noted(world):
        world.machines["local"].error = "disk full"

    def draining(world):
        world.machines["local"].draining = "maintenance"

    def foreign(world):
        world.machines["local"].foreign_gpus = [0]

    def refused(world):
        world.machines["local"].rejected = ["x-g1-a1: not hosted here"]

    def other_runs(world):
        world.machines["local"].same_runs = False

    def new_machine(world):
        world.machines["m2"] = copy.deepcopy(world.machines["local"])

    def seen_first(world):
        world.first_seen = {"local a-g1-a1": 1.0}

    return [unreachable, noted, draining, foreign, refused, other_runs, new_machine, seen_first]


@pytest.mark.parametrize("mutate", _mutations(), ids=lambda f: f.__name__)
def test_any_note_of_the_world_that_moved_makes_the_pass_plan_afresh(tmp_path, ws_root, mutate):
    repo = make_repo(tmp_path / "repo", {"a": run_spec("a", LONG)})
    rec = _daemon_like(repo, ws_root)
    rested = _at_rest(rec, ["a"])
    record = rec._steady
    assert record is not None
    args = dict(desired=rested.desired, previous=dict(record.previous), skipped=set(record.skipped),
                missing=dict(record.missing), settings=record.settings, now=time.time())
    rec.parse_memo.observations += 1  # the observation after the recorded one
    same = copy.deepcopy(rested.world)
    taken = steady.take(rec, world=same, **args)
    assert taken is not None and _decisions(taken[0]) == _decisions(record.plan)
    assert rec._steady is None  # one pass may use a record, only the next
    rec._steady = record
    moved = copy.deepcopy(rested.world)
    mutate(moved)
    assert steady.take(rec, world=moved, **args) is None
    rec._steady = record
    rec.parse_memo.observations += 1  # an observation in between: the replies were compared with it
    assert steady.take(rec, world=copy.deepcopy(rested.world), **args) is None


def test_an_ended_attempt_whose_process_is_back_makes_the_pass_plan_afresh(tmp_path, ws_root):
    repo = make_repo(tmp_path / "repo", {"a": run_spec("a", LONG, max_retries=1)})
    rec = _daemon_like(repo, ws_root)
    _at_rest(rec, ["a"])
    pgid = wait_for(lambda: pgid_of(ws_root, "a-g1-a1"), what="a's process group")
    kill_group(pgid, signal.SIGKILL)
    wait_for(lambda: not group_alive(pgid), what="a's group to die")
    rested = _at_rest(rec, ["a"])  # attempt 2 runs; attempt 1's ended workspace is still in sight
    record = rec._steady
    assert record is not None and record.ended == [("local", "a-g1-a1")]
    args = dict(desired=rested.desired, previous=dict(record.previous), skipped=set(record.skipped),
                missing=dict(record.missing), settings=record.settings, now=time.time())
    rec.parse_memo.observations += 1
    back = copy.deepcopy(rested.world)
    back.machines["local"].runs["a-g1-a1"].live = 1  # a process of attempt 1 is found again: stopped
    assert steady.take(rec, world=back, **args) is None
