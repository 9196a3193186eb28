"""gitops helpers against a real repository."""

from __future__ import annotations

import git

from reconciler.gitops import repo as gitops


def test_head_blobs_reads_files_trees_and_missing_paths_in_one_batch(tmp_path):
    repo = git.Repo.init(tmp_path)
    (tmp_path / "status").mkdir()
    (tmp_path / "status" / "a.yaml").write_text("phase: Running\n")
    (tmp_path / "status" / "b.yaml").write_text("phase: Failed\nünïcode\n")
    repo.index.add(["status/a.yaml", "status/b.yaml"])
    repo.index.commit("status", author=git.Actor("t", "t@e"), committer=git.Actor("t", "t@e"))
    (tmp_path / "status" / "a.yaml").write_text("phase: Succeeded\n")  # the working tree is not HEAD

    found = gitops.head_blobs(repo, ["status/a.yaml", "status/none.yaml", "status", "status/b.yaml"])

    # A tree's bytes in the batch output must be skipped, or every file after it is misread.
    assert found == {"status/a.yaml": "phase: Running\n", "status/none.yaml": None, "status": None,
                     "status/b.yaml": "phase: Failed\nünïcode\n"}


def test_head_blobs_before_the_first_commit(tmp_path):
    repo = git.Repo.init(tmp_path)
    assert gitops.head_blobs(repo, ["status/a.yaml"]) == {"status/a.yaml": None}
    assert gitops.head_blobs(repo, []) == {}


# ---------------------------------------------------------------- status commits

import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from reconciler.core.errors import TemporaryError  # noqa: E402

AUTHOR = gitops.Author("reconciler", "reconciler@localhost")


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout


def _repo(root: Path) -> git.Repo:
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    for k, v in (("user.name", "user"), ("user.email", "user@localhost")):
        _git(root, "config", k, v)
    (root / "status").mkdir()
    (root / "notes.txt").write_text("v1\n")
    (root / "status" / "old.yaml").write_text("phase: Running\n")
    (root / "status" / "gone.yaml").write_text("phase: Failed\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "initial")
    return git.Repo(root)


def _spawned(monkeypatch) -> list[list[str]]:
    """Every process started, as its argv: the commit's process count is part of its contract."""
    seen: list[list[str]] = []
    init = subprocess.Popen.__init__

    def counting(popen, args, *rest, **kwargs):
        seen.append(list(args))
        init(popen, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", counting)
    return seen


def test_status_commit_is_one_import_keeps_user_staging_and_leaves_the_index_clean(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    repo = _repo(root)
    before = _git(root, "rev-parse", "HEAD").strip()
    (root / "notes.txt").write_text("v2, staged by the user\n")
    _git(root, "add", "notes.txt")
    (root / "status" / "old.yaml").write_text("phase: Succeeded\n")
    (root / "status" / "new.yaml").write_text("phase: Pending\n")
    (root / "status" / 'sp ace "q".yaml').write_text("phase: Pending\n")
    (root / "status" / "gone.yaml").unlink()
    (root / "status" / "README.md").write_text("| run |\n")
    (root / "status" / "nested").mkdir()
    (root / "status" / "nested" / "deep.yaml").write_text("not ours\n")
    # Whether commits are signed is read once, and again only when git's configuration changes.
    assert gitops.signing.signs(root, repo.git_dir, gitops.git_env()) is False
    spawned = _spawned(monkeypatch)

    made = gitops.commit_status(repo, lambda paths: f"status: {len(paths)} file(s)", AUTHOR)

    assert made is not None and made.paths == ["status/gone.yaml", "status/new.yaml", "status/old.yaml",
                                               'status/sp ace "q".yaml']
    assert [a[a.index("-C") + 2:][:1] if "-C" in a else a for a in spawned] == [
        ["status"], ["-c"], ["update-ref"], ["update-index"]]
    assert "fast-import" in spawned[1]
    assert _git(root, "rev-parse", "HEAD").strip() == made.sha
    assert _git(root, "rev-parse", "HEAD^").strip() == before
    assert _git(root, "log", "-1", "--format=%an <%ae>|%cn <%ce>|%B", made.sha) == (
        "reconciler <reconciler@localhost>|reconciler <reconciler@localhost>|status: 4 file(s)\n\n")
    changed = _git(root, "show", "--name-status", "--format=", made.sha).splitlines()
    assert sorted(changed) == sorted(["A\tstatus/README.md", "D\tstatus/gone.yaml", "A\tstatus/new.yaml",
                                      "M\tstatus/old.yaml", 'A\t"status/sp ace \\"q\\".yaml"'])
    assert _git(root, "show", f"{made.sha}:status/old.yaml") == "phase: Succeeded\n"
    # The user's staged change is still staged, and not in the commit; status/ is clean.
    assert _git(root, "status", "--porcelain", "--untracked-files=no") == "M  notes.txt\n"
    assert _git(root, "diff", "--cached", "--name-only") == "notes.txt\n"
    assert "refs/reconciler" not in _git(root, "for-each-ref")  # fast-import's branch never became a ref
    assert gitops.commit_status(repo, "status: again", AUTHOR) is None  # nothing differs from HEAD now


def test_status_commit_refuses_when_the_branch_moved(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    repo = _repo(root)
    (root / "status" / "old.yaml").write_text("phase: Succeeded\n")
    real_import = gitops.import_commit

    def user_commits_meanwhile(*args, **kwargs):
        made = real_import(*args, **kwargs)
        (root / "notes.txt").write_text("v3\n")
        _git(root, "commit", "-q", "-m", "the user's commit", "--", "notes.txt")
        return made

    monkeypatch.setattr(gitops, "import_commit", user_commits_meanwhile)
    with pytest.raises(TemporaryError, match="the branch moved"):
        gitops.commit_status(repo, "status: x", AUTHOR)
    assert _git(root, "log", "-1", "--format=%s") == "the user's commit\n"
    assert _git(root, "show", "HEAD:status/old.yaml") == "phase: Running\n"
    # The status file is still to be committed, by the next pass.
    monkeypatch.setattr(gitops, "import_commit", real_import)
    assert gitops.dirty_status_paths(repo) == ["status/old.yaml"]
    made = gitops.commit_status(repo, "status: x", AUTHOR)
    assert made is not None and _git(root, "log", "-1", "--format=%s") == "status: x\n"
    assert _git(root, "status", "--porcelain") == ""


def test_first_status_commit_of_an_empty_repository(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    (root / "status").mkdir()
    (root / "status" / "a.yaml").write_text("phase: Running\n")
    made = gitops.commit_status(git.Repo(root), "status: first", AUTHOR)
    assert made is not None and made.paths == ["status/a.yaml"]
    assert _git(root, "rev-list", "--count", "HEAD") == "1\n"
    assert _git(root, "log", "-1", "--format=%B") == "status: first\n\n"  # the line completed, as commit-tree does
    assert _git(root, "status", "--porcelain") == ""


def test_a_status_staged_and_undone_makes_no_commit(tmp_path):
    root = tmp_path / "repo"
    repo = _repo(root)
    (root / "status" / "old.yaml").write_text("phase: Succeeded\n")
    _git(root, "add", "status/old.yaml")
    (root / "status" / "old.yaml").write_text("phase: Running\n")  # as HEAD has it; the index does not
    head = _git(root, "rev-parse", "HEAD")
    assert gitops.dirty_status_paths(repo) == ["status/old.yaml"]
    assert gitops.commit_status(repo, "status: x", AUTHOR) is None
    assert _git(root, "rev-parse", "HEAD") == head


def test_author_text_cannot_break_the_import_stream(tmp_path):
    root = tmp_path / "repo"
    repo = _repo(root)
    (root / "status" / "old.yaml").write_text("phase: Succeeded\n")
    made = gitops.commit_status(repo, "status: x", gitops.Author("ops <team>\ncommitter evil", " a@b\n"))
    assert made is not None
    assert _git(root, "log", "-1", "--format=%an|%ae") == "ops teamcommitter evil|a@b\n"


def test_a_link_under_status_is_never_followed_into_a_commit(tmp_path):
    root = tmp_path / "repo"
    repo = _repo(root)
    secret = tmp_path / "secret.txt"
    secret.write_text("TOKEN=hunter2\n")
    (root / "status" / "leak.yaml").symlink_to(secret)
    (root / "status" / "old.yaml").write_text("phase: Succeeded\n")
    made = gitops.commit_status(repo, lambda paths: f"status: {len(paths)} file(s)", AUTHOR)
    assert made is not None and made.paths == ["status/old.yaml"]
    assert _git(root, "log", "-1", "--format=%s") == "status: 1 file(s)\n"
    assert "leak.yaml" not in _git(root, "ls-tree", "-r", "--name-only", "HEAD")
    assert "hunter2" not in _git(root, "log", "-p", "--all")
    assert gitops.commit_status(repo, "status: x", AUTHOR) is None  # the link alone: nothing to commit


def _signing_repo(tmp_path: Path) -> tuple[Path, git.Repo, Path]:
    """A checkout whose git signs every commit with an ssh key (gpg.format=ssh, git-config(1)),
    as an operator sets it up for a branch that requires signed commits."""
    root = tmp_path / "repo"
    repo = _repo(root)
    key = tmp_path / "signing"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "reconciler", "-f", str(key)], check=True)
    for k, v in (("gpg.format", "ssh"), ("user.signingKey", f"{key}.pub"), ("commit.gpgSign", "true")):
        _git(root, "config", k, v)
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f"reconciler@localhost {(key.with_suffix('.pub')).read_text().strip()}\n")
    _git(root, "config", "gpg.ssh.allowedSignersFile", str(allowed))
    return root, repo, key


def test_a_checkout_that_signs_its_commits_gets_signed_status_commits(tmp_path, monkeypatch):
    root, repo, _ = _signing_repo(tmp_path)
    before = _git(root, "rev-parse", "HEAD").strip()
    (root / "status" / "old.yaml").write_text("phase: Succeeded\n")
    spawned = _spawned(monkeypatch)

    made = gitops.commit_status(repo, "status: 1 transition(s)", AUTHOR)
    started = [a[3] for a in spawned]

    assert started == ["status", "-c", "config", "commit-tree", "update-ref", "update-index"]  # -c: fast-import
    assert "-S" in spawned[3]
    assert made is not None and _git(root, "rev-parse", "HEAD").strip() == made.sha
    verified = subprocess.run(["git", "-C", str(root), "verify-commit", made.sha], capture_output=True, text=True)
    assert verified.returncode == 0 and 'Good "git" signature for reconciler@localhost' in verified.stderr
    assert _git(root, "log", "-1", "--format=%an <%ae>|%cn <%ce>|%B|%P", made.sha) == (
        f"reconciler <reconciler@localhost>|reconciler <reconciler@localhost>|status: 1 transition(s)\n|{before}\n")
    assert _git(root, "show", f"{made.sha}:status/old.yaml") == "phase: Succeeded\n"
    assert _git(root, "status", "--porcelain") == ""
    # The setting is read again only when a config file changed: not for the next commit.
    (root / "status" / "old.yaml").write_text("phase: Failed\n")
    spawned.clear()
    assert gitops.commit_status(repo, "status: again", AUTHOR) is not None
    assert [a[3] for a in spawned] == ["status", "-c", "commit-tree", "update-ref", "update-index"]
    # Turned off: the next commit is fast-import's own, unsigned.
    _git(root, "config", "commit.gpgSign", "false")
    (root / "status" / "old.yaml").write_text("phase: Running\n")
    unsigned = gitops.commit_status(repo, "status: unsigned", AUTHOR)
    assert "gpgsig" not in _git(root, "cat-file", "commit", unsigned.sha)


def test_a_signature_that_cannot_be_made_fails_the_commit_and_moves_nothing(tmp_path):
    root, repo, key = _signing_repo(tmp_path)
    key.unlink()  # the private key is gone: ssh-keygen -Y sign fails
    _git(root, "config", "user.signingKey", str(key))
    before = _git(root, "rev-parse", "HEAD").strip()
    (root / "status" / "old.yaml").write_text("phase: Succeeded\n")
    with pytest.raises(TemporaryError, match="commit.gpgSign is set but the status commit could not be signed"):
        gitops.commit_status(repo, "status: 1 file(s)", AUTHOR)
    assert _git(root, "rev-parse", "HEAD").strip() == before
    assert _git(root, "status", "--porcelain") == " M status/old.yaml\n"  # kept for the next pass
