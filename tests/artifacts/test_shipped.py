"""Bundles get the shipped runtime files (artifacts/shipped.py) as files of their own: read once
per process, never shared between bundles, so a job that writes its own scripts/ reaches no other."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reconciler.artifacts import bundle as bundles
from reconciler.artifacts import shipped
from reconciler.spec.load import load_tree
from reconciler.spec.resolve import effective
from tests.repo_helpers import make_repo, run_spec


def _build(repo: Path, dest: Path, identity: str = "x-g1-a1", storage: dict | None = None) -> Path:
    desired = load_tree(repo)
    entry, template = desired.runs["x"], desired.templates["local-host"]
    req = bundles.BundleRequest(repo_root=repo, identity=identity, run=entry.run, spec_digest=entry.digest,
                                repo_head=None, template=template, effective=effective(entry.run, template),
                                machine="local", storage=storage, storage_name="store" if storage else None)
    return bundles.build(req, dest).path


def test_each_bundle_has_its_own_executable_copy_of_the_package_files(tmp_path):
    repo = make_repo(tmp_path / "repo", {"x": run_spec("x", ["true"])})
    root = tmp_path / "ws"
    one, two = _build(repo, root / "x-g1-a1"), _build(repo, root / "x-g1-a2", "x-g1-a2")
    assert sorted(p.name for p in root.iterdir()) == ["x-g1-a1", "x-g1-a2"]  # nothing shared beside them
    for name, data in shipped.contents():
        a, b = one / "scripts" / name, two / "scripts" / name
        if name not in shipped.ALWAYS:  # a command run without a Storage runs neither the precheck nor the sync
            assert not a.exists() and not b.exists(), name
            continue
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


def test_a_run_ships_the_runtime_files_it_uses_and_no_others():
    assert shipped.needed() == frozenset({"launch.sh", "gpu_sampler.py", "log_stamp.py"})
    assert shipped.needed(("precheck.py", "precheck_gpus.py")) == shipped.needed() | {"precheck.py", "precheck_gpus.py"}
    assert shipped.needed(storage=True) == shipped.needed() | {"storage_sync.py", "storage_fetch.py", "storage_common.py"}
    with pytest.raises(ValueError, match="entrypoint.sh"):
        shipped.needed(("entrypoint.sh",))  # rendered per run, never one of the package's files


def test_a_run_with_a_storage_ships_its_sync_program_beside_storage_json(tmp_path):
    repo = make_repo(tmp_path / "repo", {"x": run_spec("x", ["true"])})
    plain = _build(repo, tmp_path / "ws" / "x-g1-a1")
    stored = _build(repo, tmp_path / "ws" / "x-g1-a2", "x-g1-a2", storage={"base": "bucket/prefix"})
    scripts = {p.name for p in (stored / "scripts").iterdir()}
    assert {"storage.json", *shipped.STORAGE} <= scripts and not set(shipped.PRECHECK) & scripts
    assert not {"storage.json", *shipped.STORAGE} & {p.name for p in (plain / "scripts").iterdir()}


def test_every_shipped_file_is_one_of_the_package_runtime_files_named_once():
    assert all((shipped.RUNTIME_DIR / name).is_file() for name in shipped.SHIPPED_SCRIPTS)
    assert len(set(shipped.SHIPPED_SCRIPTS)) == len(shipped.SHIPPED_SCRIPTS) == 8
