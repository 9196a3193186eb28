"""Only committed spec content is launched; ``--allow-dirty`` launches an edit and says so."""

from __future__ import annotations

import git

from tests.cli.test_cli import run
from tests.repo_helpers import commit_all, make_repo, pass_until, reconciler as make_reconciler, run_spec, status_of, \
    wait_for

ENV = {"RECONCILER_ALLOW_DIRTY": "false", "RECONCILER_NAMESPACE": "test"}


def test_an_uncommitted_spec_is_held_with_the_reason_and_nothing_runs(tmp_path):
    repo = make_repo(tmp_path / "repo")
    (repo / "specs/runs/fresh.yaml").write_text(run_spec("fresh", ["true"]))
    env = {**ENV, "RECONCILER_WORKSPACE_ROOT": str(tmp_path / "ws")}
    r = run("--once", "--repo", str(repo), env=env)
    assert r.returncode == 0, r.stderr
    assert "UncommittedSpec" in r.stdout and "specs/runs/fresh.yaml has uncommitted changes" in r.stdout
    assert status_of(repo, "fresh") is None and not (tmp_path / "ws").exists()
    ok = run("--once", "--allow-dirty", "--repo", str(repo), env=env)
    assert ok.returncode == 0, ok.stderr
    st = status_of(repo, "fresh")
    assert st.spec.dirty is True and st.spec.commit is None and st.spec.digest.startswith("sha256:")


def test_an_edit_of_a_running_run_waits_for_its_commit_and_the_old_one_keeps_running(tmp_path):
    repo = make_repo(tmp_path / "repo", {"a": run_spec("a", ["sh", "-c", "sleep 30"])})
    rec = make_reconciler(repo, tmp_path / "ws", allow_dirty=False)
    pass_until(rec, "a", "Running")
    (repo / "specs/runs/a.yaml").write_text(run_spec("a", ["sh", "-c", "sleep 31"]))
    held = rec.run_pass()
    assert [(c.action, c.code) for c in held.plan.changes if c.name == "a"] == [("wait", "UncommittedSpec")]
    st = status_of(repo, "a")
    assert (st.generation, st.phase) == (1, "Running")
    commit_all(repo, "sleep longer")
    sha = git.Repo(repo).head.commit.hexsha
    for _ in range(40):
        rec.run_pass()
        st = status_of(repo, "a")
        if st.generation == 2 and st.phase == "Running":
            break
    assert st.generation == 2 and st.spec.commit == sha and not st.spec.dirty
    (repo / "specs/runs/a.yaml").write_text(run_spec("a", ["true"], desired="Stopped"))
    commit_all(repo, "stop")
    rec.run_pass()


def test_git_is_asked_once_per_change_started_right_after_the_load(tmp_path):
    from reconciler.engine.uncommitted import Uncommitted, uncommitted_specs

    repo = make_repo(tmp_path / "repo", {"a": run_spec("a", ["true"])})
    gitrepo = git.Repo(repo)
    u = Uncommitted()
    assert u.specs(gitrepo, True, []) == set() and u.asked == 1
    (repo / "specs/runs/b.yaml").write_text(run_spec("b", ["true"]))
    ignores: list = []
    u.prefetch(gitrepo, True, ignores)
    # git runs while the pass observes, started by a thread of its own
    wait_for(lambda: u._early[1].proc is not None, timeout=10, what="git started")
    assert u._early[1].proc.args[:2] == ["git", "-C"]
    assert u.specs(gitrepo, True, ignores) == {"specs/runs/b.yaml"} == uncommitted_specs(repo) and u.asked == 2
    u.prefetch(gitrepo, True, [])  # another load's (another list): its answer is not taken for this one
    (repo / "specs/runs/c.yaml").write_text(run_spec("c", ["true"]))
    assert u.specs(gitrepo, True, ignores) == {"specs/runs/b.yaml", "specs/runs/c.yaml"} and u.asked == 3
    u.prefetch(gitrepo, False, ignores)  # nothing it depends on moved: git is not asked at all
    assert u.specs(gitrepo, False, ignores) == {"specs/runs/b.yaml", "specs/runs/c.yaml"} and u.asked == 3
