"""Provenance over real passes (a real git repository, real processes, the real command line): the
spec commit is the last commit that changed the spec file, as of the launch, whatever status
commits the reconciler made meanwhile; ``reconcile provenance A --diff B`` compares what the runs
are made of, not the repository's HEAD."""

from __future__ import annotations

import json
from pathlib import Path

import git

from reconciler.artifacts import provenance
from tests.repo_helpers import (
    commit_all, make_repo, reconcile_cli, reconciler, result_of, run_spec, status_of, wait_for,
    workspace,
)

# Fails every time, so the run is relaunched once (backoff 0) and two attempts exist to compare.
ARGV = ["sh", "-c", "cat inputs/data/x.txt; exit 3"]


def two_attempts(tmp_path: Path, ws_root: Path, between=None) -> Path:
    """twice-g1-a1 and twice-g1-a2, both collected, with the reconciler's status commits between
    their launches; ``between(repo)`` runs after a1 ends and before a2 is launched."""
    root = tmp_path / "repo"
    (root / "data").mkdir(parents=True)
    (root / "data" / "x.txt").write_text("one\n")
    repo = make_repo(root, {"twice": run_spec("twice", ARGV, max_retries=1, backoff=0,
                                              extra="  inputs: [data/x.txt]\n")})
    rec = reconciler(repo, ws_root)
    rec.run_pass()
    res = wait_for(lambda: result_of(ws_root, "twice-g1-a1"), what="attempt 1 to end")
    if between is not None:
        between(repo)
    rec.run_pass(now=res["finished_ts"] + 1)  # collects a1, relaunches as a2
    assert status_of(repo, "twice").attempt == 2
    res = wait_for(lambda: result_of(ws_root, "twice-g1-a2"), what="attempt 2 to end")
    rec.run_pass(now=res["finished_ts"] + 1)  # collects a2: Failed
    assert status_of(repo, "twice").phase == "Failed"
    return repo


def manifest(ws_root: Path, identity: str) -> dict:
    return json.loads((workspace(ws_root, identity) / "artifacts" / "manifest.json").read_text())


def cli(repo: Path, ws_root: Path, *args: str):
    return reconcile_cli(repo, "provenance", *args, env={"RECONCILER_WORKSPACE_ROOT": str(ws_root),
                                                         "RECONCILER_NAMESPACE": "test"})


def test_status_commits_between_two_launches_make_no_difference(tmp_path, ws_root):
    repo = two_attempts(tmp_path, ws_root)
    g = git.Repo(repo)
    spec_commit = g.git.log("-1", "--format=%H", "--", "specs/runs/twice.yaml")
    a, b = manifest(ws_root, "twice-g1-a1"), manifest(ws_root, "twice-g1-a2")
    # HEAD moved with the status commits; the spec commit did not.
    assert a["run"]["repo_head"] != b["run"]["repo_head"]
    assert g.commit(b["run"]["repo_head"]).message.startswith("status: ")
    assert a["reproducibility"]["spec"]["commit"] == b["reproducibility"]["spec"]["commit"] == spec_commit
    assert a["reproducibility_digest"] == b["reproducibility_digest"]

    p = cli(repo, ws_root, "twice-g1-a1", "--diff", "twice-g1-a2")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "reproducibility: identical (sha256:" in p.stdout
    assert "repo_head" not in p.stdout and "bundle_digest" not in p.stdout
    assert "run.attempt: 1 -> 2" in p.stdout  # the instances' own differences, for information
    p = cli(repo, ws_root, "twice-g1-a1", "--diff", "twice-g1-a2", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["reproducibility"] == []
    assert not [r for r in out["run"] if r["field"] in ("run.repo_head", "run.bundle_digest")]


def test_a_changed_input_is_exactly_the_difference(tmp_path, ws_root):
    def change_input(repo: Path) -> None:
        (repo / "data" / "x.txt").write_text("three\n")  # another content, and another size
        commit_all(repo, "new data")

    repo = two_attempts(tmp_path, ws_root, between=change_input)
    p = cli(repo, ws_root, "twice-g1-a1", "--diff", "twice-g1-a2", "--json")
    assert p.returncode == 1, p.stdout + p.stderr
    rows = json.loads(p.stdout)["reproducibility"]
    assert [r["field"] for r in rows] == ["reproducibility.inputs[data/x.txt].sha256"], rows
    import hashlib

    assert rows[0]["a"] == hashlib.sha256(b"one\n").hexdigest()
    assert rows[0]["b"] == hashlib.sha256(b"three\n").hexdigest()
    p = cli(repo, ws_root, "twice-g1-a1", "--diff", "twice-g1-a2")
    assert p.returncode == 1
    assert "reproducibility: 1 field(s) differ" in p.stdout
    assert "  reproducibility.inputs[data/x.txt].sha256: " in p.stdout


def test_spec_commit_is_never_head(tmp_path):
    """A bundle that does not record the spec commit (built before it was) says so with None; HEAD,
    which job.json records as spec_commit, only ever shows as run.repo_head."""
    root = tmp_path / "b"
    (root / "artifacts").mkdir(parents=True)
    (root / "job.json").write_text(json.dumps({"schema_version": "v1", "payload": {
        "identity": "old-g1-a1", "name": "old", "spec_digest": "sha256:" + "0" * 64, "spec_commit": "c" * 40}}))
    m = provenance.build(root, 1.0)
    assert m["reproducibility"]["spec"] == {"digest": "sha256:" + "0" * 64, "commit": None}
    assert m["run"]["repo_head"] == "c" * 40


def test_unreadable_manifest_is_a_message_not_a_traceback(tmp_path, ws_root):
    repo = make_repo(tmp_path / "repo")
    bad = workspace(ws_root, "x-g1-a1") / "artifacts"
    bad.mkdir(parents=True)
    (bad / "manifest.json").write_text("{not json")
    ok = workspace(ws_root, "x-g1-a2") / "artifacts"
    ok.mkdir(parents=True)
    (ok / "manifest.json").write_text("{}")
    p = cli(repo, ws_root, "x-g1-a2", "--diff", "x-g1-a1")
    assert p.returncode == 1
    assert "Traceback" not in p.stderr and "not a readable manifest" in p.stderr
