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
