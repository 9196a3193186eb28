"""The engine's side of a Storage: real passes over a run whose outputs go to a bucket (``rclone
serve s3`` on loopback, or a loopback sshd as an SFTP remote), and the binding of what a machine
reports to the run's own folder."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from reconciler.core.observed import ObservedMachine, ObservedRun, ObservedWorld
from reconciler.engine import outputs
from reconciler.spec.load import load_tree
from tests.world import World, fleet, machine, run_spec

SHA = "ab" * 32
# A job that saves one checkpoint as ms-swift does (trainer_state.json last) and keeps running a bit.
SAVE = ("mkdir -p artifacts/output/v0/checkpoint-3 && head -c 4096 /dev/zero > artifacts/output/v0/checkpoint-3/w.bin"
        " && echo '{}' > artifacts/output/v0/checkpoint-3/trainer_state.json && echo done > artifacts/metrics.txt"
        " && sleep 2")


def s3_storage(s3, name: str = "s3-out") -> dict:
    return {"apiVersion": "reconciler/v1", "kind": "Storage", "metadata": {"name": name},
            "spec": {"backend": "s3", "options": {"provider": "Rclone", "endpoint": s3.endpoint},
                     "credentials": {"access_key_id": "ENG_S3_KEY", "secret_access_key": "ENG_S3_SECRET"},
                     "bucket": s3.bucket, "prefix": "p", "interval_s": 5}}


def add_storage(w: World, doc: dict) -> None:
    path = w.repo / "specs" / "storage" / f"{doc['metadata']['name']}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def drive(w: World, rec, name: str, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while (st := w.status(name)) is None or st.phase not in ("Succeeded", "Failed"):
        assert time.monotonic() < deadline, st
        rec.run_pass()
        time.sleep(0.3)
    return st


def test_a_local_run_uploads_to_its_storage_and_nothing_comes_to_the_vm(tmp_path, s3) -> None:
    w = World(tmp_path)
    add_storage(w, s3_storage(s3))
    w.add_run(run_spec("job", "local-host", ["sh", "-c", SAVE], outputs={"storage": "s3-out"}))
    rec = w.reconciler()
    rec.secret_source = {"ENG_S3_KEY": s3.access_key, "ENG_S3_SECRET": s3.secret_key}.get
    st = drive(w, rec, "job")
    assert st.phase == "Succeeded", st.message
    base = f"p/{rec.cfg.repo_namespace}/job/g1"
    # The final upload happens before the wrapper exits: a later pass sees it.
    deadline = time.monotonic() + 30
    while not (st.outputs and st.outputs["checkpoints"]) and time.monotonic() < deadline:
        rec.run_pass()
        st = w.status("job")
    assert st.outputs["storage"] == "s3-out" and st.outputs["uri"] == f"s3_out:{s3.bucket}/{base}"
    [ck] = st.outputs["checkpoints"]
    assert ck["name"] == "checkpoint-3" and ck["uri"] == f"s3_out:{s3.bucket}/{base}/checkpoints/checkpoint-3"
    assert ck["bytes"] >= 4096 and len(ck["manifest_sha256"]) == 64
    assert s3.path(f"{base}/checkpoints/checkpoint-3/w.bin").stat().st_size == 4096
    assert s3.path(f"{base}/checkpoints/checkpoint-3.json").is_file()
    ws = w.local_root / rec.cfg.repo_namespace / "job-g1-a1"
    cfg = json.loads((ws / "scripts" / "storage.json").read_text())
    assert cfg["base"] == f"{s3.bucket}/{base}" and cfg["resume"] is False and cfg["pinned"] is None
    assert not (ws / "runtime" / "storage.env").exists()  # read once and deleted by the wrapper
    text = (w.repo / "status" / "job.yaml").read_text()
    assert s3.secret_key not in text and s3.access_key not in text
    assert not (w.repo / ".reconciler" / "checkpoints").exists()


def test_a_run_whose_storage_secret_is_missing_waits_and_leaves_nothing(tmp_path, s3) -> None:
    w = World(tmp_path)
    add_storage(w, s3_storage(s3))
    w.add_run(run_spec("job", "local-host", ["true"], outputs={"storage": "s3-out"}))
    rec = w.reconciler()
    rec.secret_source = {"ENG_S3_KEY": s3.access_key}.get
    rec.run_pass()
    st = w.status("job")
    assert st.phase != "Succeeded" and "ENG_S3_SECRET" in st.message, st.message
    assert s3.access_key not in st.message
    assert not (w.local_root / rec.cfg.repo_namespace / "job-g1-a1" / "runtime" / "launched_at").exists()


def test_a_run_without_a_storage_keeps_todays_behaviour(tmp_path, s3) -> None:
    w = World(tmp_path)
    add_storage(w, s3_storage(s3))  # there, but not named by the run nor the Policy
    w.add_run(run_spec("plain", "local-host", ["sh", "-c", SAVE]))
    rec = w.reconciler()
    st = drive(w, rec, "plain")
    assert st.phase == "Succeeded" and st.outputs is None
    ws = w.local_root / rec.cfg.repo_namespace / "plain-g1-a1"
    assert not (ws / "scripts" / "storage.json").exists() and s3.objects() == []


def test_an_sftp_storage_on_a_fleet_machine(tmp_path, sshd) -> None:
    """A fleet machine over SSH uploads to an SFTP Storage (the same loopback sshd): rclone is
    installed on the machine, the private key reaches it only in runtime/storage.env."""
    key = sshd.identity_file.read_text().strip().replace("\n", "\\n")
    known = sshd.public_dir / "known_hosts"  # where the machine's login (the uploader) can read it
    known.write_text(sshd.known_hosts_line + "\n")
    known.chmod(0o644)
    w = World(tmp_path, fleets=[fleet([machine(sshd)], known_hosts=sshd.known_hosts_line)])
    add_storage(w, {"apiVersion": "reconciler/v1", "kind": "Storage", "metadata": {"name": "lab-sftp"},
                    "spec": {"backend": "sftp", "bucket": "sftp-outputs", "interval_s": 5,
                             "options": {"host": sshd.host, "port": str(sshd.port), "user": sshd.user,
                                         "known_hosts_file": str(known)},
                             "credentials": {"key_pem": "ENG_SFTP_KEY"}}})
    w.add_run(run_spec("remote", "ssh-host", ["sh", "-c", SAVE], outputs={"storage": "lab-sftp"}))
    rec = w.reconciler()
    rec.secret_source = {"ENG_SFTP_KEY": key}.get
    st = drive(w, rec, "remote", timeout=120)
    assert st.phase == "Succeeded", st.message
    deadline = time.monotonic() + 30
    while not (st.outputs and st.outputs["checkpoints"]) and time.monotonic() < deadline:
        rec.run_pass()
        st = w.status("remote")
    assert st.outputs["checkpoints"][0]["uri"].startswith("lab_sftp:sftp-outputs/")
    base = f"sftp-outputs/{rec.cfg.repo_namespace}/remote/g1"
    assert sshd.run(f"cat {base}/checkpoints/checkpoint-3/trainer_state.json").stdout.strip() == "{}"
    assert "BEGIN" not in (w.repo / "status" / "remote.yaml").read_text()


# ---------------------------------------------------------------- binding, without machines


def desired_with_storage(tmp_path):
    root = tmp_path / "repo"
    w = World(tmp_path)
    add_storage(w, {"apiVersion": "reconciler/v1", "kind": "Storage", "metadata": {"name": "s3-out"},
                    "spec": {"backend": "s3", "bucket": "bk", "prefix": "p", "keep_checkpoints": 2}})
    w.add_run(run_spec("job", "local-host", ["true"], outputs={"storage": "s3-out"}))
    w.add_run(run_spec("plain", "local-host", ["true"]))
    return load_tree(root)


def uploads(base: str, names: list[str]) -> dict:
    return {"schema_version": 1, "error": None, "resumed_from": None,
            "artifacts": {"uri": f"store:{base}/a1", "uploaded_at": None, "final": False},
            "checkpoints": [{"name": n, "uri": f"store:{base}/checkpoints/{n}", "manifest_sha256": SHA,
                             "bytes": 1, "files": 1, "uploaded_at": 1} for n in names]}


def world_of(*runs: ObservedRun) -> ObservedWorld:
    return ObservedWorld(machines={"local": ObservedMachine("local", runs={r.identity: r for r in runs})})


def test_bind_keeps_reports_to_their_own_run(tmp_path) -> None:
    desired = desired_with_storage(tmp_path)
    own = "bk/p/ns/job/g1"
    good = ObservedRun("job-g1-a1", "local", "running", uploads=uploads(own, ["checkpoint-1", "checkpoint-2"]))
    world = world_of(good)
    outputs.bind(desired, "ns", world, {})
    assert [c["name"] for c in good.outputs["checkpoints"]] == ["checkpoint-2", "checkpoint-1"]
    assert good.outputs["checkpoints"][0]["uri"] == "s3_out:bk/p/ns/job/g1/checkpoints/checkpoint-2"
    thief = ObservedRun("job-g1-a1", "local", "running", uploads=uploads("bk/p/ns/plain/g1", ["checkpoint-1"]))
    outputs.bind(desired, "ns", world_of(thief), {})
    assert thief.uploads is None and "outside this run's folder" in thief.outputs["error"]
    assert thief.outputs["checkpoints"] == []


def test_earlier_checkpoints_of_the_generation_are_kept_up_to_keep() -> None:
    new = {"uri": "s3_out:bk/g1", "checkpoints": [{"name": "checkpoint-30"}]}
    prev = {"uri": "s3_out:bk/g1", "checkpoints": [{"name": "checkpoint-20"}, {"name": "checkpoint-10"}]}
    assert [c["name"] for c in outputs.merged(prev, new, 2)["checkpoints"]] == ["checkpoint-30", "checkpoint-20"]
    other = dict(prev, uri="s3_out:bk/g0")  # another generation's folder: not this one's
    assert [c["name"] for c in outputs.merged(other, new, 2)["checkpoints"]] == ["checkpoint-30"]


@pytest.mark.parametrize("origin", [
    "again",
    "origin",
])
def test_a_run_pinned_to_a_checkpoint_starts_from_it(tmp_path, s3, origin: str) -> None:
    """spec.outputs.start_from (what `reconcile reproduce --checkpoint` writes): the first attempt
    downloads exactly that checkpoint, verified against the pinned manifest checksum; from the
    run's own folder, or another run's."""
    import hashlib

    w = World(tmp_path)
    add_storage(w, s3_storage(s3))
    rec = w.reconciler()
    ns = rec.cfg.repo_namespace
    src = f"p/{ns}/{origin}/g1/checkpoints"
    s3.path(f"{src}/checkpoint-7").mkdir(parents=True)
    s3.path(f"{src}/checkpoint-7/w.bin").write_bytes(b"weights")
    manifest = json.dumps({"schema_version": 1, "checkpoint": "checkpoint-7", "step": 7, "files": [
        {"path": "w.bin", "size": 7, "sha256": hashlib.sha256(b"weights").hexdigest()}]}).encode()
    s3.path(f"{src}/checkpoint-7.json").write_bytes(manifest)
    uri = f"s3_out:{s3.bucket}/{src}/checkpoint-7"
    check = "test \"$(cat inputs/.reconciler/resume/latest/w.bin)\" = weights"
    w.add_run(run_spec("again", "local-host", ["sh", "-c", check], outputs={
        "storage": "s3-out", "start_from": {"checkpoint": "checkpoint-7", "uri": uri,
                                            "manifest_sha256": hashlib.sha256(manifest).hexdigest()}}))
    rec = w.reconciler()
    rec.secret_source = {"ENG_S3_KEY": s3.access_key, "ENG_S3_SECRET": s3.secret_key}.get
    st = drive(w, rec, "again")
    assert st.phase == "Succeeded", st.message
    ws = w.local_root / ns / "again-g1-a1"
    cfg = json.loads((ws / "scripts" / "storage.json").read_text())
    assert cfg["pinned"]["uri"] == f"store:{s3.bucket}/{src}/checkpoint-7" and cfg["resume"] is False
    assert st.outputs["resumed_from"] == {"name": "checkpoint-7", "uri": uri,
                                          "manifest_sha256": hashlib.sha256(manifest).hexdigest()}
    manifest_doc = json.loads((ws / "artifacts" / "manifest.json").read_text())
    assert manifest_doc["reproducibility"]["start_from"]["uri"] == uri
    assert manifest_doc["run"]["outputs"]["resumed_from"]["uri"] == uri


def test_the_policy_default_applies_to_runs_that_name_none(tmp_path) -> None:
    w = World(tmp_path)
    add_storage(w, {"apiVersion": "reconciler/v1", "kind": "Storage", "metadata": {"name": "s3-out"},
                    "spec": {"backend": "s3", "bucket": "bk"}})
    (w.repo / "specs" / "policy.yaml").write_text("apiVersion: reconciler/v1\nkind: Policy\nmetadata: {name: policy}\n"
                                                  "spec: {defaultStorage: s3-out}\n")
    w.add_run(run_spec("job", "local-host", ["true"]))
    desired = load_tree(w.repo)
    assert desired.diagnostics == []
    assert outputs.run_storage(desired, desired.runs["job"].run).metadata.name == "s3-out"
    assert outputs.has_storage(desired, "job") and not outputs.has_storage(desired, "nobody")
    desired.policy = None  # no Policy, no default: the VM store, as before
    assert outputs.run_storage(desired, desired.runs["job"].run) is None
