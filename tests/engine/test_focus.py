"""A daemon's pass woken by an edit looks afresh only at what the edit concerns on this machine,
and still sees what a full look would: a run killed outside the reconciler, a look-alike that
appeared, a lingering attempt, the fence of an edited run's earlier attempt; and anything it
would do to another run is planned on a full look (engine/focus.py, machines/local_memo.py).

Real processes and a real git repository; the reconciler is kept between passes as the daemon
keeps it."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from reconciler.core import config as configs
from reconciler.engine import focus
from reconciler.engine.loop import Reconciler
from reconciler.machines import local_launch, local_memo
from reconciler.runtime import probe, readings
from tests.repo_helpers import (
    group_alive, kill_group, make_repo, pass_until, pgid_of, processes_with, result_of, run_spec, status_of,
    wait_for, workspace,
)

SLEEP = ["sh", "-c", "sleep 300"]


def daemon_like(repo, ws_root, **flags) -> Reconciler:
    base = {"workspace_root": str(ws_root), "namespace": "test", "terminate_grace": 3.0, "allow_dirty": True}
    base.update(flags)
    return Reconciler(configs.load(str(repo), flags=base), keep_connections=True)


@pytest.fixture
def scans(monkeypatch):
    """How many scans of every process on the host were made, and how many of them before the
    pass's first wrapper started (``at_launch``)."""
    seen = {"n": 0, "at_launch": None}

    def counted(fn):
        def wrapper(*args, **kwargs):
            seen["n"] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(readings, "pids", counted(readings.pids))
    monkeypatch.setattr(probe, "_process_groups", counted(probe._process_groups))
    start = local_launch.start_host

    def starting(*args, **kwargs):
        if seen["at_launch"] is None:
            seen["at_launch"] = seen["n"]
        return start(*args, **kwargs)

    monkeypatch.setattr(local_launch, "start_host", starting)

    def reset():
        seen["n"], seen["at_launch"] = 0, None
    seen["reset"] = reset
    return seen


def add(repo, name: str, argv=SLEEP, **kw) -> None:
    (repo / "specs" / "runs" / f"{name}.yaml").write_text(run_spec(name, argv, **kw))


def test_a_new_spec_starts_without_a_scan_of_every_process(tmp_path, ws_root, scans):
    repo = make_repo(tmp_path / "repo", {"a": run_spec("a", SLEEP)})
    rec = daemon_like(repo, ws_root)
    pass_until(rec, "a", "Running")
    scans["reset"]()
    rec.run_pass()  # nothing changed: a full look, which scans
    assert scans["n"] >= 1
    scans["reset"]()
    add(repo, "b")
    result = rec.run_pass()
    assert scans["at_launch"] == 0, "the edit's pass scanned every process before its launch"
    assert rec.focus.focus == {"b"}  # the pass looked afresh at b alone
    assert status_of(repo, "b").phase == "Running" and pgid_of(ws_root, "b-g1-a1")
    assert result.world.find("a-g1-a1").alive  # the other run, from the kept look
    assert scans["n"] >= 1  # the pass acted here: it looked in full again at its end


def test_reconcile_once_never_focuses(tmp_path, ws_root, scans):
    repo = make_repo(tmp_path / "repo", {"a": run_spec("a", SLEEP)})
    rec = Reconciler(configs.load(str(repo), flags={"workspace_root": str(ws_root), "namespace": "test",
                                                    "allow_dirty": True}))
    pass_until(rec, "a", "Running")
    add(repo, "b")
    scans["reset"]()
    rec.run_pass()
    assert scans["at_launch"] >= 1 and pgid_of(ws_root, "b-g1-a1")


def test_a_run_killed_outside_the_reconciler_is_seen_by_the_next_edit_pass(tmp_path, ws_root):
    repo = make_repo(tmp_path / "repo", {"a": run_spec("a", SLEEP, max_retries=1)})
    rec = daemon_like(repo, ws_root)
    pass_until(rec, "a", "Running")
    pgid = pgid_of(ws_root, "a-g1-a1")
    kill_group(pgid)  # the wrapper too: no result is written
    wait_for(lambda: not group_alive(pgid), what="a's group gone")
    add(repo, "b")
    result = rec.run_pass()
    assert result.world.find("a-g1-a1").state == "lost"
    assert {c.name: c.action for c in result.plan.changes}["a"] == "relaunch"
    assert status_of(repo, "a").handle.identity == "a-g1-a2" and pgid_of(ws_root, "a-g1-a2")
    assert status_of(repo, "b").phase == "Running"


def test_a_look_alike_that_appeared_is_seen(tmp_path, ws_root):
    repo = make_repo(tmp_path / "repo", {"a": run_spec("a", SLEEP)})
    rec = daemon_like(repo, ws_root)
    pass_until(rec, "a", "Running")
    ws = workspace(ws_root, "ghost-g1-a1")
    (ws / "runtime").mkdir(parents=True)
    env = {"PATH": os.environ["PATH"], "RECONCILER_IDENTITY": "ghost-g1-a1", "RECONCILER_BUNDLE": str(ws)}
    ghost = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
    try:
        (ws / "runtime" / "pid").write_text(f"{ghost.pid}\n")
        # Popen returns once the child execs, a moment before the kernel has set up the new
        # program's environment: until then /proc/<pid>/environ reads empty (no identity carried).
        wait_for(lambda: b"RECONCILER_IDENTITY=ghost-g1-a1" in Path(f"/proc/{ghost.pid}/environ").read_bytes(),
                 what="the look-alike's environment")
        add(repo, "b")
        result = rec.run_pass()
        seen = result.world.find("ghost-g1-a1")
        assert seen is not None and seen.alive and seen.live == 1
        assert pgid_of(ws_root, "b-g1-a1")
    finally:
        ghost.kill()
        ghost.wait()


def test_an_attempt_that_ended_leaving_a_worker_is_fenced_by_the_edit_pass(tmp_path, ws_root):
    go = tmp_path / "go"
    job = ["sh", "-c", f"setsid sleep 300 & while [ ! -e {go} ]; do sleep 0.05; done"]
    repo = make_repo(tmp_path / "repo", {"a": run_spec("a", job)})
    rec = daemon_like(repo, ws_root)
    pass_until(rec, "a", "Running")
    rec.run_pass()  # the kept look has a running
    worker = wait_for(lambda: processes_with("RECONCILER_IDENTITY=a-g1-a1", within=ws_root), what="worker")
    go.write_text("")
    wait_for(lambda: result_of(ws_root, "a-g1-a1"), what="a's result")
    add(repo, "b")
    result = rec.run_pass()
    assert result.world.find("a-g1-a1").lingering
    assert any(k.identity == "a-g1-a1" for c in result.plan.changes if c.name == "a" for k in c.kill)
    wait_for(lambda: not any(os.path.exists(f"/proc/{p}") and _alive(p) for p in worker), what="worker stopped")
    assert pgid_of(ws_root, "b-g1-a1")


def test_an_edited_run_stops_its_earlier_attempt_before_the_next_starts(tmp_path, ws_root):
    repo = make_repo(tmp_path / "repo", {"a": run_spec("a", SLEEP)})
    rec = daemon_like(repo, ws_root)
    pass_until(rec, "a", "Running")
    old = pgid_of(ws_root, "a-g1-a1")
    rec.run_pass()
    add(repo, "a", ["sh", "-c", "sleep 301"])
    for _ in range(20):
        rec.run_pass()
        if pgid_of(ws_root, "a-g2-a1"):
            break
    assert not group_alive(old) and not processes_with("RECONCILER_IDENTITY=a-g1-a1", within=ws_root)
    assert status_of(repo, "a").handle.identity == "a-g2-a1"


def test_a_relaunch_planned_on_the_kept_look_is_planned_again_on_a_full_one(tmp_path, ws_root, monkeypatch):
    repo = make_repo(tmp_path / "repo", {"a": run_spec("a", ["sh", "-c", "exit 3"], max_retries=1, backoff=4)})
    rec = daemon_like(repo, ws_root)
    wait_for(lambda: rec.run_pass() and result_of(ws_root, "a-g1-a1"), what="a's first attempt ended")
    rec.run_pass()  # collects it, and records the failure: its backoff runs
    rec.run_pass()  # a full look with a's ended attempt in it, kept
    assert {c.name: c.action for c in rec.run_pass().plan.changes}["a"] == "wait"
    widened = []
    real = focus.widen
    monkeypatch.setattr(focus, "widen", lambda r, plan: widened.append(real(r, plan)) or widened[-1])
    ended = result_of(ws_root, "a-g1-a1")["finished_ts"]
    wait_for(lambda: time.time() > ended + 5, timeout=30, what="a's backoff over")
    add(repo, "b")
    result = rec.run_pass()
    assert widened == [True]  # a's relaunch: not planned on the kept look alone
    assert {c.name: c.action for c in result.plan.changes}["a"] == "relaunch"
    assert status_of(repo, "a").handle.identity == "a-g1-a2" and pgid_of(ws_root, "b-g1-a1")


def test_the_kept_look_is_not_used_once_older_than_the_resync_interval(tmp_path, ws_root, scans):
    repo = make_repo(tmp_path / "repo", {"a": run_spec("a", SLEEP)})
    rec = daemon_like(repo, ws_root, resync_interval=0.5)
    pass_until(rec, "a", "Running")
    rec.run_pass()
    root = str(ws_root / "test")
    wait_for(lambda: (local_memo.age(root) or 0) > 0.5, what="the kept look aged")
    scans["reset"]()
    add(repo, "b")
    rec.run_pass()
    assert scans["at_launch"] >= 1


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
