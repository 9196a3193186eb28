"""The reconcile loop on this machine, with real processes and a real git repository."""

from __future__ import annotations

import json
import os
import signal

import git

from tests.repo_helpers import (
    commit_all, group_alive, kill_group, make_repo, pass_until, pgid_of, processes_with, reconcile_cli, reconciler,
    result_of, run_spec, status_of, wait_for, workspace,
)

# A job with a child of its own: killing the process group must take the child too.
LONG = ["sh", "-c", "sleep 300 & echo child=$!; sleep 300; wait"]


def test_launch_running_succeeded_with_status_commits(tmp_path, ws_root):
    repo_dir = make_repo(tmp_path / "repo", {"hello": run_spec("hello", ["sh", "-c", "echo hi; sleep 0.5"])})
    rec = reconciler(repo_dir, ws_root)
    first = rec.run_pass()
    assert [c.action for c in first.plan.changes] == ["launch"]
    st = status_of(repo_dir, "hello")
    assert st.phase == "Running" and st.handle.identity == "hello-g1-a1" and st.handle.pid
    st = pass_until(rec, "hello", "Succeeded")
    assert st.exit_code == 0
    assert (workspace(ws_root, "hello-g1-a1") / "artifacts" / "stdout.log").read_text() == "hi\n"
    assert (workspace(ws_root, "hello-g1-a1") / "artifacts" / "manifest.json").is_file()
    log = git.Repo(repo_dir).git.log("--format=%s%n%b", "--", "status/hello.yaml")
    assert "hello: - → Running [hello-g1-a1] new run" in log
    assert "hello: Running → Succeeded [hello-g1-a1]" in log
    # Nothing changed: no new commit, byte-identical status file.
    head = git.Repo(repo_dir).head.commit.hexsha
    before = (repo_dir / "status" / "hello.yaml").read_bytes()
    again = rec.run_pass()
    assert again.commit is None and not again.written
    assert git.Repo(repo_dir).head.commit.hexsha == head
    assert (repo_dir / "status" / "hello.yaml").read_bytes() == before


def test_second_pass_right_after_first_plans_no_launch(tmp_path, ws_root):
    repo_dir = make_repo(tmp_path / "repo", {"long": run_spec("long", LONG)})
    rec = reconciler(repo_dir, ws_root)
    rec.run_pass()
    second = rec.run_pass()
    assert [c.action for c in second.plan.changes] == ["none"]
    assert len(processes_with("RECONCILER_IDENTITY=long-g1-a1", within=ws_root)) >= 1
    assert not (workspace(ws_root, "long-g1-a2")).exists()


def test_exit_3_is_relaunched_max_retries_then_failed(tmp_path, ws_root):
    repo_dir = make_repo(tmp_path / "repo", {"flaky": run_spec("flaky", ["sh", "-c", "exit 3"], max_retries=2,
                                                                backoff=30)})
    rec = reconciler(repo_dir, ws_root)
    rec.run_pass()
    for attempt in (1, 2):
        ident = f"flaky-g1-a{attempt}"
        res = wait_for(lambda: result_of(ws_root, ident), what=f"{ident} result")
        assert res["state"] == "failed" and res["exit_code"] == 3
        finished = res["finished_ts"]
        # Within the backoff: the plan waits, and says how long.
        early = rec.run_pass(now=finished + 10)
        change = early.plan.for_run("flaky")
        assert change.code == "BackOff" and 19 <= change.retry_after <= 21
        assert status_of(repo_dir, "flaky").phase == "Pending"
        assert not workspace(ws_root, f"flaky-g1-a{attempt + 1}").exists()
        # After the backoff: relaunched as the next attempt.
        late = rec.run_pass(now=finished + 31)
        change = late.plan.for_run("flaky")
        assert change.action == "relaunch" and change.identity == f"flaky-g1-a{attempt + 1}"
        assert status_of(repo_dir, "flaky").attempt == attempt + 1
    res = wait_for(lambda: result_of(ws_root, "flaky-g1-a3"), what="attempt 3 result")
    final = rec.run_pass(now=res["finished_ts"] + 100)
    assert final.plan.for_run("flaky").phase == "Failed"
    st = status_of(repo_dir, "flaky")
    assert (st.phase, st.exit_code, st.attempt) == ("Failed", 3, 3)
    assert not workspace(ws_root, "flaky-g1-a4").exists()
    # Failed is final: later passes do nothing.
    assert [c.action for c in rec.run_pass(now=res["finished_ts"] + 1000).plan.changes] == ["none"]


def test_editing_the_spec_kills_old_group_and_launches_next_generation(tmp_path, ws_root):
    repo_dir = make_repo(tmp_path / "repo", {"train": run_spec("train", LONG)})
    rec = reconciler(repo_dir, ws_root)
    rec.run_pass()
    pgid = wait_for(lambda: pgid_of(ws_root, "train-g1-a1"), what="train-g1-a1 to record its process group")
    wait_for(lambda: len(processes_with("RECONCILER_IDENTITY=train-g1-a1", within=ws_root)) >= 3,
             what="job and its child")
    (repo_dir / "specs" / "runs" / "train.yaml").write_text(run_spec("train", LONG + ["edited"]))
    commit_all(repo_dir, "edit train")
    result = rec.run_pass()
    change = result.plan.for_run("train")
    assert change.action == "relaunch" and change.code == "SpecChanged" and change.identity == "train-g2-a1"
    assert not group_alive(pgid), "old process group still alive"
    assert processes_with("RECONCILER_IDENTITY=train-g1-a1", within=ws_root) == []
    assert result_of(ws_root, "train-g1-a1")["state"] == "terminated"
    st = status_of(repo_dir, "train")
    assert (st.generation, st.attempt, st.phase, st.handle.identity) == (2, 1, "Running", "train-g2-a1")
    assert wait_for(lambda: processes_with("RECONCILER_IDENTITY=train-g2-a1", within=ws_root))


def test_deleting_the_spec_kills_the_group_and_its_children(tmp_path, ws_root):
    repo_dir = make_repo(tmp_path / "repo", {"gone": run_spec("gone", LONG)})
    rec = reconciler(repo_dir, ws_root)
    rec.run_pass()
    wait_for(lambda: len(processes_with("RECONCILER_IDENTITY=gone-g1-a1", within=ws_root)) >= 3,
             what="job and its child")
    children = processes_with("RECONCILER_IDENTITY=gone-g1-a1", within=ws_root)
    (repo_dir / "specs" / "runs" / "gone.yaml").unlink()
    commit_all(repo_dir, "remove gone")
    result = rec.run_pass()
    assert result.plan.for_run("gone").action == "terminate"
    assert processes_with("RECONCILER_IDENTITY=gone-g1-a1", within=ws_root) == []
    for pid in children:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split(") ")[1][0] in "ZX"
    st = status_of(repo_dir, "gone")
    assert st.phase == "Terminated"
    assert (repo_dir / "status" / "gone.yaml").exists()
    assert [c.action for c in rec.run_pass().plan.changes] == ["none"]


def test_stopped_desired_state_terminates(tmp_path, ws_root):
    repo_dir = make_repo(tmp_path / "repo", {"pause": run_spec("pause", LONG)})
    rec = reconciler(repo_dir, ws_root)
    rec.run_pass()
    wait_for(lambda: processes_with("RECONCILER_IDENTITY=pause-g1-a1", within=ws_root))
    (repo_dir / "specs" / "runs" / "pause.yaml").write_text(run_spec("pause", LONG, desired="Stopped"))
    commit_all(repo_dir, "stop pause")
    rec.run_pass()
    assert processes_with("RECONCILER_IDENTITY=pause-g1-a1", within=ws_root) == []
    assert status_of(repo_dir, "pause").phase == "Terminated"


def test_kill_9_of_the_job_is_lost_and_relaunched(tmp_path, ws_root):
    repo_dir = make_repo(tmp_path / "repo", {"victim": run_spec("victim", LONG, max_retries=1, backoff=0)})
    rec = reconciler(repo_dir, ws_root)
    rec.run_pass()
    pgid = wait_for(lambda: pgid_of(ws_root, "victim-g1-a1"), what="victim-g1-a1 to record its process group")
    kill_group(pgid, signal.SIGKILL)
    wait_for(lambda: not group_alive(pgid), what="group to die")
    result = rec.run_pass()
    change = result.plan.for_run("victim")
    assert change.action == "relaunch" and change.identity == "victim-g1-a2"
    assert "lost" in change.reason
    # Nothing wrote a result: it was lost, not failed. Its logs were still collected.
    assert result_of(ws_root, "victim-g1-a1") is None
    assert (workspace(ws_root, "victim-g1-a1") / "artifacts" / "manifest.json").is_file()
    st = status_of(repo_dir, "victim")
    assert (st.attempt, st.phase) == (2, "Running")
    assert wait_for(lambda: processes_with("RECONCILER_IDENTITY=victim-g1-a2", within=ws_root))


def test_crash_between_launch_and_commit_is_adopted_never_launched_twice(tmp_path, ws_root):
    repo_dir = make_repo(tmp_path / "repo", {"solo": run_spec("solo", LONG)})
    env = {"RECONCILER_WORKSPACE_ROOT": str(ws_root), "RECONCILER_NAMESPACE": "test"}
    crashed = reconcile_cli(repo_dir, "--once", env=env, crash_after="apply")
    assert crashed.returncode == 137
    assert not (repo_dir / "status" / "solo.yaml").exists()  # the crash came before any status
    assert len(git.Repo(repo_dir).git.log("--oneline").splitlines()) == 1
    wait_for(lambda: processes_with("RECONCILER_IDENTITY=solo-g1-a1", within=ws_root))
    again = reconcile_cli(repo_dir, "--once", "--json", env=env)
    assert again.returncode == 0, again.stderr
    st = status_of(repo_dir, "solo")
    assert st.phase == "Running" and st.handle.identity == "solo-g1-a1" and st.attempt == 1
    assert "adopt" in st.history[-1].reason
    leaders = [p for p in processes_with("solo-g1-a1", within=ws_root)
               if _pgrp(p) == p]
    assert len(set(leaders)) == 1, "launched twice"
    assert "solo: - → Running" in git.Repo(repo_dir).head.commit.message


def _pgrp(pid: int) -> int | None:
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2:].split()[2])


def test_invalid_spec_is_marked_and_others_run(tmp_path, ws_root):
    bad = run_spec("broken", ["true"]).replace("template: local-host", "template: local-host\n  colour: blue")
    repo_dir = make_repo(tmp_path / "repo", {"ok": run_spec("ok", ["true"]), "broken": bad})
    rec = reconciler(repo_dir, ws_root)
    rec.run_pass()
    st = status_of(repo_dir, "broken")
    assert st.phase == "Invalid"
    assert "specs/runs/broken.yaml:7:3: spec.colour: unknown key 'colour'" in st.message
    assert status_of(repo_dir, "ok").phase in ("Running", "Succeeded")
    assert not workspace(ws_root, "broken-g1-a1").exists()


def test_commit_touches_status_only_and_keeps_user_edits(tmp_path, ws_root):
    repo_dir = make_repo(tmp_path / "repo", {"a": run_spec("a", ["true"])})
    (repo_dir / "notes.txt").write_text("work in progress\n")
    repo = git.Repo(repo_dir)
    repo.git.add("notes.txt")  # staged by the user
    (repo_dir / "specs" / "runs" / "a.yaml").write_text(run_spec("a", ["true"]) + "# edited, uncommitted\n")
    result = reconciler(repo_dir, ws_root).run_pass()
    assert result.commit is not None
    files = repo.git.show("--name-only", "--format=", result.commit).split()
    assert files == ["status/README.md", "status/a.yaml"]  # the status file and the ledger
    porcelain = repo.git.status("--porcelain")
    assert "A  notes.txt" in porcelain and " M specs/runs/a.yaml" in porcelain
    assert "status/" not in porcelain


def test_dry_run_changes_nothing(tmp_path, ws_root):
    repo_dir = make_repo(tmp_path / "repo", {"a": run_spec("a", ["true"])})
    env = {"RECONCILER_WORKSPACE_ROOT": str(ws_root), "RECONCILER_NAMESPACE": "test"}
    out = reconcile_cli(repo_dir, "--once", "--dry-run", env=env)
    assert out.returncode == 0
    assert "+ launch" in out.stdout and "a-g1-a1 on local" in out.stdout
    same = reconcile_cli(repo_dir, "plan", env=env)
    assert same.stdout == out.stdout
    assert not (repo_dir / "status").exists() and not ws_root.exists()
    js = reconcile_cli(repo_dir, "plan", "--json", env=env)
    plan = json.loads(js.stdout)
    assert plan["changes"][0]["action"] == "launch" and plan["changes"][0]["reason"] == "new run"
