"""gitops.Remote against real repositories: fast-forward, rebase of status commits, recovery from a
failed rebase, and a rejected push."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.gitops import repo as gitops

from .conftest import git


@pytest.fixture
def repos(tmp_path: Path):
    origin, user, mine = tmp_path / "origin.git", tmp_path / "user", tmp_path / "mine"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(origin))
    git(tmp_path, "clone", "-q", str(origin), str(user))
    (user / "specs").mkdir()
    (user / "specs" / "a.yaml").write_text("a: 1\n")
    git(user, "add", "-A")
    git(user, "commit", "-q", "-m", "init")
    git(user, "push", "-q", "origin", "HEAD:main")
    git(tmp_path, "clone", "-q", str(origin), str(mine))
    remote = gitops.Remote(mine, "origin", "main", gitops.Author("reconciler", "r@localhost"))
    return origin, user, mine, remote


def commit(path: Path, rel: str, text: str, message: str) -> str:
    (path / rel).parent.mkdir(parents=True, exist_ok=True)
    (path / rel).write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", message)
    return git(path, "rev-parse", "HEAD")


def test_fast_forward(repos):
    origin, user, mine, remote = repos
    new = commit(user, "specs/b.yaml", "b: 1\n", "add b")
    git(user, "push", "-q", "origin", "HEAD:main")
    assert remote.fetch() == new
    res = remote.integrate()
    assert res.action == "fast-forward" and res.moved and res.head_after == new
    assert (mine / "specs" / "b.yaml").read_text() == "b: 1\n"


def test_own_status_commit_is_rebased_never_merged(repos):
    origin, user, mine, remote = repos
    commit(mine, "status/a.yaml", "phase: Running\n", "status: 1 change(s)")
    theirs = commit(user, "specs/b.yaml", "b: 1\n", "add b")
    git(user, "push", "-q", "origin", "HEAD:main")
    with pytest.raises(gitops.PushRejected):
        remote.push()
    remote.fetch()
    res = remote.integrate()
    assert res.action == "rebase" and res.ahead == 1
    assert git(mine, "rev-parse", "HEAD~1") == theirs
    remote.push()
    assert git(origin, "rev-list", "--merges", "main") == ""
    assert git(origin, "show", "main:status/a.yaml") == "phase: Running"
    assert remote.ahead() == 0


def test_failed_rebase_is_aborted_and_status_taken_from_the_remote(repos):
    origin, user, mine, remote = repos
    commit(mine, "status/a.yaml", "phase: Running\n", "status: mine")
    commit(mine, "status/only-mine.yaml", "phase: Pending\n", "status: mine too")
    # Abnormal: someone edited status/ by hand and pushed. The rebase of ours conflicts.
    theirs = commit(user, "status/a.yaml", "phase: Failed\n", "hand edit")
    git(user, "push", "-q", "origin", "HEAD:main")
    remote.fetch()
    res = remote.integrate()
    assert res.action == "reset" and res.error
    assert git(mine, "rev-parse", "HEAD") == theirs
    assert (mine / "status" / "a.yaml").read_text() == "phase: Failed\n"
    assert not (mine / "status" / "only-mine.yaml").exists()
    assert not (mine / ".git" / "rebase-merge").exists() and not (mine / ".git" / "rebase-apply").exists()
    assert git(mine, "status", "--porcelain") == ""


def test_local_spec_edit_survives_a_rebase(repos):
    origin, user, mine, remote = repos
    commit(mine, "status/a.yaml", "phase: Running\n", "status")
    (mine / "specs" / "a.yaml").write_text("a: 2\n")  # an operator's uncommitted edit on the daemon host
    commit(user, "specs/b.yaml", "b: 1\n", "add b")
    git(user, "push", "-q", "origin", "HEAD:main")
    remote.fetch()
    assert remote.integrate().action == "rebase"
    assert (mine / "specs" / "a.yaml").read_text() == "a: 2\n"
    assert (mine / "specs" / "b.yaml").exists()


def test_empty_remote_gets_the_first_push(tmp_path):
    origin, mine = tmp_path / "origin.git", tmp_path / "mine"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(origin))
    git(tmp_path, "clone", "-q", str(origin), str(mine))
    commit(mine, "specs/a.yaml", "a: 1\n", "init")
    remote = gitops.Remote(mine, "origin", "main", gitops.Author("r", "r@localhost"))
    assert remote.fetch() is None
    assert remote.integrate().action == "no-upstream"
    remote.push()
    assert git(origin, "rev-parse", "main") == git(mine, "rev-parse", "HEAD")
