"""A long-lived reconciler lets finished runs go from memory, and takes them back when touched."""

from __future__ import annotations

import subprocess

from tests.repo_helpers import (
    commit_all, make_repo, pass_until, reconciler, run_spec, status_of, wait_for, workspace,
)


def test_finished_runs_settle_and_come_back_when_touched(tmp_path, ws_root):
    repo_dir = make_repo(tmp_path / "repo", {"a": run_spec("a", ["true"]), "b": run_spec("b", ["true"])})
    rec = reconciler(repo_dir, ws_root)
    pass_until(rec, "a", "Succeeded")
    pass_until(rec, "b", "Succeeded")
    rec.run_pass()
    assert set(rec.settled) == {"a", "b"}
    quiet = rec.run_pass()
    assert quiet.plan.changes == [] and not quiet.written  # nothing planned, nothing parsed
    assert rec.phase_counts["Succeeded"] == 2

    # 1. A new spec digest: planned again (a new generation).
    (repo_dir / "specs" / "runs" / "a.yaml").write_text(run_spec("a", ["sh", "-c", "exit 0"]))
    commit_all(repo_dir, "edit a")
    again = rec.run_pass()
    assert [c.name for c in again.plan.changes] == ["a"] and again.plan.changes[0].identity == "a-g2-a1"
    assert "b" in rec.settled

    # 2. A status file rewritten from outside (here: restored from git to an older version).
    before = (repo_dir / "status" / "b.yaml").read_text()
    subprocess.run(["git", "-C", str(repo_dir), "checkout", "HEAD~3", "--", "status/b.yaml"], check=True,
                   capture_output=True)
    assert (repo_dir / "status" / "b.yaml").read_text() != before
    back = rec.run_pass()
    assert "b" in [c.name for c in back.plan.changes]
    assert status_of(repo_dir, "b").phase == "Succeeded"

    # 3. An instance of a settled run shows up on a machine: it is looked at, and fenced.
    pass_until(rec, "a", "Succeeded")
    rec.run_pass()
    assert "b" in rec.settled
    stray = workspace(ws_root, "b-g9-a1")
    (stray / "runtime").mkdir(parents=True)
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True, env={"RECONCILER_IDENTITY": "b-g9-a1"})
    (stray / "runtime" / "pid").write_text(str(proc.pid))
    fenced = rec.run_pass()
    assert any(c.action == "terminate" and c.kill and c.kill[0].identity == "b-g9-a1" for c in fenced.plan.changes)
    wait_for(lambda: proc.poll() is not None, what="stray instance to be fenced")
