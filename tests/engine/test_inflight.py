"""Launches a killed reconciler left in flight (engine/inflight.py, planner/fence.py
``hold_predecessor_launches``), and a final collection that a killed pass cannot turn into a loss
(engine/endclean.py): real git, real processes, a real sshd on loopback."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from reconciler.core import config
from reconciler.core.errors import TemporaryError
from reconciler.engine.inflight import FILE, Journal
from reconciler.engine.loop import Reconciler
from reconciler.machines import launchers
from reconciler.machines.base import LaunchSpec, MachineInfo
from reconciler.machines.local import LocalTransport
from reconciler.spec.load import load_tree
from reconciler.status.store import load_all
from tests.repo_helpers import reconcile_cli
from tests.world import World, fleet, git, machine, run_spec

FAST = {"launch_ttl": 1.5, "launch_clock_margin": 0.5}


def env_of(w: World, **more: str) -> dict[str, str]:
    return {"RECONCILER_WORKSPACE_ROOT": str(w.local_root), "RECONCILER_NAMESPACE": "test",
            "RECONCILER_PUSH": "false", "RECONCILER_TERMINATE_GRACE": "0.5",
            "RECONCILER_LAUNCH_TTL": "1.5", "RECONCILER_LAUNCH_CLOCK_MARGIN": "0.5", **more}


def cfg_for(repo: Path, w: World, **flags) -> config.Config:
    return config.load(str(repo), flags={**w.flags, **FAST, **flags})


def test_the_journal_records_until_answered_and_expires_by_its_deadline(tmp_path):
    cfg = config.load(str(tmp_path), flags=FAST)
    never = Journal(cfg)
    never.begin(100.0, history=False)
    assert never.holds(100.0) == ({}, None)  # a repository no reconciler ever wrote a status to
    (tmp_path / ".reconciler" / FILE).unlink()
    fresh = Journal(cfg)
    assert not fresh.proven and fresh.holds(100.0) == ({}, None)  # before its first pass
    fresh.begin(100.0, history=True)
    assert fresh.holds(100.0)[1] == 102.0  # no journal before it: one TTL plus the margin
    fresh.begin(150.0, history=True)
    assert fresh.holds(101.0)[1] == 102.0  # counted from the process's first pass only
    not_after = fresh.issue("a", "lab-1", "a-g1-a1", now=101.0)
    fresh.issue("b", "lab-1", "b-g1-a1", now=101.0)
    fresh.answered("b", "lab-1", "b-g1-a1")
    assert not_after == 102.5
    assert list(Journal(cfg).holds(102.0)[0]) == ["a", "b"]  # an answer is written with the next write
    fresh.flush()  # (the pass's end)
    # The next process on this checkout knows exactly what to hold, and until when.
    after = Journal(cfg)
    assert after.proven
    after.begin(102.0, history=True)
    per_run, blanket = after.holds(102.0)
    assert blanket is None and list(per_run) == ["a"] and per_run["a"].not_after == 102.5
    assert after.holds(103.0) == ({}, None)  # its deadline and the margin are past
    (tmp_path / ".reconciler" / FILE).write_text("{not json")
    assert not Journal(cfg).proven  # unreadable: nothing can be proven


def test_a_predecessor_killed_mid_launch_is_waited_for_and_its_generation_never_reused(tmp_path):
    with World(tmp_path, terminate_grace=0.5, **FAST) as w:
        w.add_run(run_spec("gen", "local-host", ["sh", "-c", "sleep 60; exit 1"]))
        first = w.until("gen", lambda s: s.phase == "Running")
        assert first.handle.identity == "gen-g1-a1"
        # The second spec: a reconciler stages gen-g2-a1 and is killed before it starts it ...
        w.add_run(run_spec("gen", "local-host", ["sh", "-c", "sleep 60; exit 2"]))
        second = load_tree(w.repo).runs["gen"].digest
        crashed = reconcile_cli(w.repo, "--once", env=env_of(w), crash_after="stage", timeout=60)
        assert crashed.returncode == 137, crashed.stderr[-2000:]
        ws = w.local_root / "test" / "gen-g2-a1"
        assert ws.is_dir() and w.status("gen").generation == 1
        # ... while its launch was on its way: not on the machine yet (set aside here), and in the
        # journal it wrote before issuing it.
        aside = tmp_path / "in-flight"
        shutil.move(str(ws), aside)
        deadline = time.time() + 1.5
        journal = w.repo / ".reconciler" / FILE
        journal.write_text(json.dumps({"version": 1, "launches": [
            {"run": "gen", "machine": "local", "identity": "gen-g2-a1", "not_after": deadline}]}))
        # The spec changes again; the next reconciler (the daemon: it holds across passes) waits.
        w.add_run(run_spec("gen", "local-host", ["sh", "-c", "sleep 60; exit 3"]))
        third = load_tree(w.repo).runs["gen"].digest
        rec = Reconciler(cfg_for(w.repo, w), keep_connections=True)
        change = rec.run_pass().plan.for_run("gen")
        assert change.action == "wait" and change.code == "LaunchInFlight", change
        st = w.status("gen")
        assert "gen-g2-a1 on local got no answer and may still land until" in st.message, st.message
        assert st.generation == 1 and not ws.exists()
        # The lost launch lands before its deadline, under its own spec.
        shutil.move(str(aside), ws)
        t = LocalTransport(MachineInfo("local", str(w.local_root / "test")))
        started = launchers.launch(t, LaunchSpec("gen-g2-a1", "gen", str(ws), "host_process", spec_digest=second),
                                   not_after=deadline)
        assert not started.adopted
        # Once the hold is over, the landed launch is in sight: stopped, and numbered past.
        st = w.until("gen", lambda s: s.phase == "Running" and s.generation > 2, timeout=30, **FAST)
        assert st.handle.identity == "gen-g3-a1" and st.spec.digest == third
        assert json.loads((ws / "job.json").read_text())["payload"]["spec_digest"] == second
        assert (w.local_root / "test" / ".gen-g2-a1.claim").read_text().strip() == second


def test_a_launch_that_lands_after_its_deadline_is_refused(tmp_path):
    with World(tmp_path, **FAST) as w:
        w.add_run(run_spec("late", "local-host", ["sh", "-c", "sleep 60"]))
        crashed = reconcile_cli(w.repo, "--once", env=env_of(w), crash_after="stage", timeout=60)
        assert crashed.returncode == 137
        ws = w.local_root / "test" / "late-g1-a1"
        t = LocalTransport(MachineInfo("local", str(w.local_root / "test")))
        digest = load_tree(w.repo).runs["late"].digest
        try:
            launchers.launch(t, LaunchSpec("late-g1-a1", "late", str(ws), "host_process", spec_digest=digest),
                             not_after=time.time() - 1)
            raise AssertionError("a late launch started")
        except TemporaryError as e:
            assert "after its deadline" in str(e)
        assert not (ws / "runtime" / "pid").exists()
        # The staged bundle is in sight: the next pass starts that same identity, with a new deadline.
        st = w.until("late", lambda s: s.phase == "Running", **FAST)
        assert st.handle.identity == "late-g1-a1"


def test_a_fresh_clone_holds_new_starts_once_and_once_still_makes_progress(tmp_path):
    with World(tmp_path, **FAST) as w:
        w.add_run(run_spec("a", "local-host", ["true"]))
        w.until("a", lambda s: s.phase == "Succeeded", **FAST)
        w.add_run(run_spec("b", "local-host", ["sh", "-c", "sleep 60"]))
        # The daemon on a fresh clone: no journal, so nothing proves its predecessor's launches.
        daemon_clone = tmp_path / "clone-daemon"
        git(tmp_path, "clone", "-q", str(w.repo), str(daemon_clone))
        rec = Reconciler(cfg_for(daemon_clone, w, commit=False), keep_connections=True)
        change = rec.run_pass().plan.for_run("b")
        assert change.code == "LaunchInFlight" and "no launch journal" in change.reason, change
        assert not (w.local_root / "test" / "b-g1-a1").exists()
        # The next process on that clone has the journal its first pass wrote: nothing to hold.
        again = Reconciler(cfg_for(daemon_clone, w, commit=False), keep_connections=True)
        assert again.run_pass(dry_run=True).plan.for_run("b").action == "launch"
        # --once on a fresh clone (cron from a CI checkout) waits the hold out inside its pass.
        once_clone = tmp_path / "clone-once"
        git(tmp_path, "clone", "-q", str(w.repo), str(once_clone))
        t0 = time.monotonic()
        done = reconcile_cli(once_clone, "--once", "--json", env=env_of(w), timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        assert time.monotonic() - t0 >= 1.5
        out = json.loads(done.stdout)
        assert [c["action"] for c in out["changes"] if c["name"] == "b"] == ["launch"]
        assert load_all(once_clone / "status")["b"].phase == "Running"


def test_a_pass_killed_after_the_final_collection_never_loses_the_success(tmp_path, sshd):
    lab = machine(sshd, "lab-1")
    with World(tmp_path, [fleet([lab])], **FAST) as w:
        origin = tmp_path / "origin.git"
        git(tmp_path, "clone", "-q", "--bare", str(w.repo), str(origin))
        git(w.repo, "remote", "add", "origin", str(origin))
        git(w.repo, "fetch", "-q", "origin")
        w.add_run(run_spec("done", "ssh-host", ["sh", "-c", "echo trained"]))
        st = w.until("done", lambda s: s.phase in ("Running", "Succeeded"), **FAST)
        assert st.phase == "Running", "the run ended within its launching pass"
        git(w.repo, "push", "-q", "origin", "main")
        ws = Path(lab["workspace_root"], "test", "done-g1-a1")
        deadline = time.monotonic() + 20
        while not (ws / "runtime" / "result.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        # The pass that collects the end is killed before its status is written.
        crashed = reconcile_cli(w.repo, "--once", env=env_of(w), crash_after="apply", timeout=60)
        assert crashed.returncode == 137, crashed.stderr[-2000:]
        assert (ws / "runtime" / "collected").exists()  # collected, and still there: the end's only record
        # A fresh clone records the success, not a loss.
        clone = tmp_path / "clone"
        git(tmp_path, "clone", "-q", str(origin), str(clone))
        rec = Reconciler(cfg_for(clone, w))
        rec.run_pass()
        st = load_all(clone / "status")["done"]
        assert (st.phase, st.exit_code, st.attempt) == ("Succeeded", 0, 1), st
        rec.run_pass()
        assert ws.is_dir()  # the end is committed here but not on the remote: the workspace stays
        git(clone, "push", "-q", "origin", "main")
        change = [c for c in rec.run_pass().plan.changes if c.code == "EndRecorded"]
        assert [c.identity for c in change] == ["done-g1-a1"]
        assert not ws.exists()


def test_launches_issued_at_once_share_writes_and_each_is_on_disk_when_issued(tmp_path):
    import threading

    cfg = config.load(str(tmp_path), flags=FAST)
    j = Journal(cfg)
    j.begin(time.time(), history=False)
    writes = []
    real = j._write
    j._write = lambda doc: (writes.append(len(doc["launches"])), time.sleep(0.01), real(doc))
    missing: list[str] = []
    go = threading.Barrier(8)

    def launch(k: int) -> None:
        go.wait()
        j.issue(f"r{k}", "local", f"r{k}-g1-a1")
        on_disk = json.loads((tmp_path / ".reconciler" / FILE).read_text())["launches"]
        if f"r{k}-g1-a1" not in {e["identity"] for e in on_disk}:
            missing.append(f"r{k}")

    threads = [threading.Thread(target=launch, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert missing == [] and len(writes) < 8  # every entry on disk before its launch; fewer writes than launches
    for k in range(8):
        j.answered(f"r{k}", "local", f"r{k}-g1-a1")
    n = len(writes)
    j.flush()
    j.flush()
    assert len(writes) == n + 1 and Journal(cfg).entries == {}  # the answers: one write
