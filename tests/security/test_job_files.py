"""Files a job writes and the control plane reads after it (``result.json``, the precheck's
report, ``job.json``, the GPU audit) hold any bytes: provenance and the bundle's digest read them
through the boundary's parser, leave out what does not fit and say why, and never raise."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from reconciler.artifacts import bundle, provenance

DEEP = b"[" * 100_000 + b"]" * 100_000
HOSTILE_JSON = {
    "array": b"[]",
    "string": b'"x"',
    "huge number": b"1" * 5000,
    "nan": b"NaN",
    "deep": DEEP,
    "not json": b"\xff\xfe{",
    "empty": b"",
    "many strings": b"[" + b",".join([b'"a"'] * 600_000) + b"]",
}


def _strict(text: str):
    def refuse(name):
        raise AssertionError(f"{name} in a manifest")
    return json.loads(text, parse_constant=refuse)


def _bundle(root: Path, job: bytes | None = None) -> Path:
    (root / "runtime").mkdir(parents=True, exist_ok=True)
    (root / "artifacts").mkdir(exist_ok=True)
    (root / "job.json").write_bytes(job if job is not None else json.dumps({"payload": {
        "identity": "p-g1-a1", "name": "p", "spec_digest": "sha256:" + "a" * 64, "gpus": [0],
        "inputs": [{"path": "data", "kind": "file", "sha256": "b" * 64}]}}).encode())
    (root / "runtime" / "started_at").write_text("1700000000")
    return root


@pytest.mark.parametrize("kind", sorted(HOSTILE_JSON))
def test_any_result_or_precheck_gives_a_manifest_with_a_reason(tmp_path, kind):
    root = _bundle(tmp_path / "p-g1-a1")
    (root / "runtime" / "result.json").write_bytes(HOSTILE_JSON[kind])
    (root / "artifacts" / "runtime-precheck.json").write_bytes(HOSTILE_JSON[kind])
    manifest = provenance.write(root, collected_at=1700000100.0)
    written = _strict((root / "artifacts" / "manifest.json").read_text())
    assert written["reproducibility_digest"] == manifest["reproducibility_digest"]
    run = written["run"]
    assert run["result"] == {"state": None, "exit_code": None} and run["precheck"] is None
    assert written["reproducibility"]["environment"] is None
    assert set(run["unreadable"]) == {"runtime/result.json", "artifacts/runtime-precheck.json"}
    assert all(0 < len(why) <= 200 for why in run["unreadable"].values()), run["unreadable"]
    assert run["identity"] == "p-g1-a1" and run["gpus_assigned"] == [0]  # the rest is still there
    assert provenance.summary(written)["inputs"] == 1


def test_wrong_shapes_inside_an_object_leave_only_their_fields_out(tmp_path):
    root = _bundle(tmp_path / "p-g1-a1")
    (root / "runtime" / "result.json").write_text(json.dumps(
        {"state": "failed\u202e\x1b[2J", "exit_code": 10 ** 30, "finished_at": ["x"], "finished_ts": 1e308}))
    (root / "runtime" / "result.json").write_text(
        (root / "runtime" / "result.json").read_text().replace('"failed', '"\\ud800failed'))
    (root / "runtime" / "launched_at").write_text("nan")
    (root / "artifacts" / "runtime-precheck.json").write_text(json.dumps({
        "ok": True, "python": [], "packages": {"torch": "2.5", "peft": {"version": ["x"]}}, "torch": "yes",
        "swift": {"present": True, "version": {"deep": [1]}}, "platform": "linux",
        "checks": [1, "x", {"name": "swift_fork", "fork": []}, {"name": "swift_version", "expected": NAN_TEXT}]},
        allow_nan=True).replace('"NAN_TEXT"', "NaN"))
    (root / "artifacts" / "nvml-audit.jsonl").write_text(
        '[]\n"x"\n{"event": "inventory", "devices": [1, {"name": "H100\\u0000", "index": 1e999}]}\n'
        + "[" * 50_000 + "\n" + '{"event": "sample"}\n')
    manifest = provenance.write(root, collected_at=1700000100.0)
    written = _strict((root / "artifacts" / "manifest.json").read_text())
    assert written == json.loads(json.dumps(manifest))
    run = written["run"]
    state = run["result"]["state"]
    assert state.startswith("failed") and state.isprintable() and "\u202e" not in state  # cleaned
    assert run["result"]["exit_code"] is None  # 10**30: not an exit code
    assert run["timestamps"]["finished_at"] is None and run["timestamps"]["launched_at"] is None
    assert "unreadable" not in run
    env = written["reproducibility"]["environment"]
    assert env["python"] == {"version": None, "implementation": None} and env["torch"] is None
    assert env["packages"]["torch"] is None and env["packages"]["peft"] == ["x"]
    assert env["checks"] == [{"name": "swift_fork", "ok": None, "fork": None, "tree_sha256": None},
                             {"name": "swift_version", "ok": None, "expected": None}]
    inv = run["gpu_inventory"]
    assert inv["available"] is True and inv["devices"] == [{"index": None, "name": "H100", "uuid": None,
                                                            "memory_total_mib": None}]
    assert inv["samples"] == 1


NAN_TEXT = "NAN_TEXT"


def test_a_job_json_of_any_content_gives_no_digest_and_no_error(tmp_path):
    good = _bundle(tmp_path / "good")
    assert bundle.built_digest(good) == "sha256:" + "a" * 64
    for i, raw in enumerate([*HOSTILE_JSON.values(), b'{"payload": []}', b'{"payload": {"spec_digest": 5}}',
                             b'{"payload": {"spec_digest": "\\u001b[2J"}}']):
        root = _bundle(tmp_path / f"bad{i}", job=raw)
        assert bundle.built_digest(root) is None, raw[:40]
        unreadable = provenance.build(root, 1700000100.0)["run"].get("unreadable", {})
        assert ("job.json" in unreadable) == (i < len(HOSTILE_JSON)), (raw[:40], unreadable)
    # A link or a FIFO in its place is never followed nor waited on.
    secret = tmp_path / "elsewhere.json"
    secret.write_text(json.dumps({"payload": {"spec_digest": "sha256:" + "c" * 64}}))
    linked = _bundle(tmp_path / "linked")
    (linked / "job.json").unlink()
    (linked / "job.json").symlink_to(secret)
    assert bundle.built_digest(linked) is None
    fifo = _bundle(tmp_path / "fifo")
    (fifo / "job.json").unlink()
    os.mkfifo(fifo / "job.json")
    assert bundle.built_digest(fifo) is None
