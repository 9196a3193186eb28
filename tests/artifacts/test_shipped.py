"""Bundles get the shipped runtime files (artifacts/shipped.py) as files of their own: read once
per process, never shared between bundles, so a job that writes its own scripts/ reaches no other."""

from __future__ import annotations

import os
from pathlib import Path

from reconciler.artifacts import bundle as bundles
from reconciler.artifacts import shipped
from reconciler.spec.load import load_tree
from reconciler.spec.resolve import effective
from tests.repo_helpers import make_repo, run_spec


def _build(repo: Path, dest: Path, identity: str = "x-g1-a1") -> Path:
    desired = load_tree(repo)
    entry, template = desired.runs["x"], desired.templates["local-host"]
    req = bundles.BundleRequest(repo_root=repo, identity=identity, run=entry.run, spec_digest=entry.digest,
                                repo_head=None, template=template, effective=effective(entry.run, template),
                                machine="local")
    return bundles.build(req, dest).path


def test_each_bundle_has_its_own_executable_copy_of_the_package_files(tmp_path):
    repo = make_repo(tmp_path / "repo", {"x": run_spec("x", ["true"])})
    root = tmp_path / "ws"
    one, two = _build(repo, root / "x-g1-a1"), _build(repo, root / "x-g1-a2", "x-g1-a2")
    assert sorted(p.name for p in root.iterdir()) == ["x-g1-a1", "x-g1-a2"]  # nothing shared beside them
    for name, data in shipped.contents():
        a, b = one / "scripts" / name, two / "scripts" / name
        assert a.read_bytes() == b.read_bytes() == data == (shipped.RUNTIME_DIR / name).read_bytes()
        assert os.stat(a).st_nlink == 1 and os.stat(a).st_ino != os.stat(b).st_ino, name
        assert os.access(a, os.X_OK)


def test_a_job_writing_its_own_launch_wrapper_reaches_no_other_bundle(tmp_path):
    repo = make_repo(tmp_path / "repo", {"x": run_spec("x", ["true"])})
    root = tmp_path / "ws"
    one = _build(repo, root / "x-g1-a1")
    two = _build(repo, root / "x-g1-a2", "x-g1-a2")
    (one / "scripts" / "launch.sh").write_text("echo tampered\n")  # what a job of the same user can do
    want = dict(shipped.contents())["launch.sh"]
    assert (two / "scripts" / "launch.sh").read_bytes() == want
    assert (_build(repo, root / "x-g1-a3", "x-g1-a3") / "scripts" / "launch.sh").read_bytes() == want
