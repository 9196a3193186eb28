"""Reading a checkout without git's library: HEAD from loose and packed refs, detached, unborn, and
in a linked worktree, each as git itself answers (``git rev-parse``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from reconciler.gitops import repo as gitops


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=T", "-c", "user.email=t@example.invalid", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def _repo(root: Path) -> Path:
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    return root


def test_head_as_git_reads_it(tmp_path):
    root = _repo(tmp_path / "r")
    repo = gitops.open_repo(root)
    assert repo is not None and repo.working_tree_dir == str(root)
    assert gitops.head(repo) is None and gitops.head_ref(repo) == "refs/heads/main"  # no commit yet
    (root / "a").write_text("a")
    _git(root, "add", "a")
    _git(root, "commit", "-qm", "one")
    assert gitops.head(repo) == _git(root, "rev-parse", "HEAD")
    _git(root, "pack-refs", "--all")  # the branch only in packed-refs now
    assert not (root / ".git" / "refs" / "heads" / "main").exists()
    assert gitops.head(repo) == _git(root, "rev-parse", "HEAD")
    _git(root, "checkout", "-q", "--detach")
    assert gitops.head(repo) == _git(root, "rev-parse", "HEAD") and gitops.head_ref(repo) == "HEAD"


def test_a_linked_worktree_and_what_is_not_a_checkout(tmp_path):
    root = _repo(tmp_path / "r")
    (root / "a").write_text("a")
    _git(root, "add", "a")
    _git(root, "commit", "-qm", "one")
    _git(root, "worktree", "add", "-q", "-b", "side", str(tmp_path / "wt"))
    wt = gitops.open_repo(tmp_path / "wt")
    assert wt is not None and gitops.head_ref(wt) == "refs/heads/side"
    assert gitops.head(wt) == _git(tmp_path / "wt", "rev-parse", "HEAD")
    (tmp_path / "wt" / "b").write_text("b")
    _git(tmp_path / "wt", "add", "b")
    _git(tmp_path / "wt", "commit", "-qm", "two")
    assert gitops.head(wt) == _git(tmp_path / "wt", "rev-parse", "HEAD") != gitops.head(gitops.open_repo(root))
    assert gitops.open_repo(root / "sub") is None and gitops.open_repo(tmp_path) is None
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / ".git").write_text("not a gitdir line\n")
    assert gitops.open_repo(tmp_path / "fake") is None
