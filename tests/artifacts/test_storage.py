"""The control plane's side of a Storage, against real servers: ``rclone serve s3`` and a loopback
sshd as an SFTP remote. Listings, the remote's environment, where a run's outputs go."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from reconciler.artifacts import storage as st
from reconciler.core.errors import PermanentError, TemporaryError
from reconciler.spec.models.storage import Storage


def s3_storage(s3, name: str = "s3-out", prefix: str = "team") -> Storage:
    return Storage.model_validate({
        "apiVersion": "reconciler/v1", "kind": "Storage", "metadata": {"name": name},
        "spec": {"backend": "s3", "options": {"provider": "Rclone", "endpoint": s3.endpoint},
                 "credentials": {"access_key_id": "T_S3_KEY", "secret_access_key": "T_S3_SECRET"},
                 "bucket": s3.bucket, "prefix": prefix}})


def secrets_of(s3) -> dict[str, str]:
    return {"T_S3_KEY": s3.access_key, "T_S3_SECRET": s3.secret_key}


def test_run_base_and_uris() -> None:
    s = Storage.model_validate({"apiVersion": "reconciler/v1", "kind": "Storage", "metadata": {"name": "a-b"},
                                "spec": {"backend": "s3", "bucket": "bk", "prefix": "p/q"}})
    assert st.run_base(s, "r-0123", "sft", 3) == "bk/p/q/r-0123/sft/g3"
    assert st.remote_name(s) == "a_b"
    assert st.to_status_uri(s, "store:bk/p/x") == "a_b:bk/p/x"
    assert st.to_machine_uri(s, "a_b:bk/p/x") == st.to_machine_uri(s, "a-b:bk/p/x") == "store:bk/p/x"
    with pytest.raises(ValueError):
        st.to_machine_uri(s, "other:bk/p/x")
    no_prefix = s.model_copy(update={"spec": s.spec.model_copy(update={"prefix": ""})})
    assert st.run_base(no_prefix, "r-0123", "sft", 1) == "bk/r-0123/sft/g1"


def test_rclone_env_names_the_remote_and_resolves_credentials(s3) -> None:
    s = s3_storage(s3)
    env = st.rclone_env(s, secrets_of(s3))
    assert env["RCLONE_CONFIG_S3_OUT_TYPE"] == "s3"
    assert env["RCLONE_CONFIG_S3_OUT_SECRET_ACCESS_KEY"] == s3.secret_key
    machine = st.machine_env(s, secrets_of(s3).get)
    assert set(machine) == {k.replace("S3_OUT", "STORE") for k in env}
    with pytest.raises(TemporaryError) as e:
        st.rclone_env(s, {"T_S3_KEY": "k"})
    assert "T_S3_SECRET" in str(e.value) and s3.access_key not in str(e.value)


def test_status_uris_work_with_rclone_env(s3) -> None:
    """What a status names (``s3_out:<path>``) is usable as it is with rclone_env's variables."""
    s = s3_storage(s3)
    s3.path("team/r-x/sft/g1/a1/metrics.json").parent.mkdir(parents=True)
    s3.path("team/r-x/sft/g1/a1/metrics.json").write_text("{}")
    base = st.run_base(s, "r-x", "sft", 1)
    env = {"PATH": os.environ["PATH"], **st.rclone_env(s, secrets_of(s3))}
    p = subprocess.run([st.find_rclone(), "--config", "", "cat", st.status_uri(s, f"{base}/a1/metrics.json")],
                       env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stdout == "{}", p.stderr


def test_list_objects_lists_with_hashes(s3) -> None:
    s = s3_storage(s3)
    ck = s3.path("team/r-x/sft/g1/checkpoints/checkpoint-10")
    ck.mkdir(parents=True)
    (ck / "model.bin").write_bytes(b"\0" * 1000)
    (ck.parent / "checkpoint-10.json").write_text(json.dumps({"schema_version": 1}))
    got = st.list_objects(s, secrets_of(s3), st.run_base(s, "r-x", "sft", 1))
    assert [(e["path"], e["size"], e["is_dir"]) for e in got] == [
        ("checkpoints/checkpoint-10.json", 21, False), ("checkpoints/checkpoint-10/model.bin", 1000, False)]
    assert got[1]["hashes"]["md5"] == "ede3d3b685b4e137ba4cb2521329a75e"
    shallow = st.list_objects(s, secrets_of(s3), f"{s3.bucket}/team/r-x/sft/g1/checkpoints", recursive=False)
    assert {(e["path"], e["is_dir"]) for e in shallow} == {("checkpoint-10", True), ("checkpoint-10.json", False)}
    assert st.list_objects(s, secrets_of(s3), f"{s3.bucket}/team/nothing-here") == []


def test_list_objects_refuses_paths_and_keeps_the_hosts_environment_out(s3, monkeypatch) -> None:
    s = s3_storage(s3)
    for bad in ("/etc", "team/../..", "other:bucket"):
        with pytest.raises(PermanentError):
            st.list_objects(s, secrets_of(s3), bad)
    # A remote of the same name defined in this host's environment must not stand in for the Storage.
    monkeypatch.setenv("RCLONE_CONFIG_S3_OUT_ENDPOINT", "http://127.0.0.1:9")
    assert st.list_objects(s, secrets_of(s3), f"{s3.bucket}/team") == []  # the Storage's own endpoint answered
    with pytest.raises(TemporaryError) as e:  # wrong keys: rclone's refusal, one line, no secret
        st.list_objects(s, {"T_S3_KEY": s3.access_key, "T_S3_SECRET": "wrong-secret-value"}, f"{s3.bucket}/team")
    assert "wrong-secret-value" not in str(e.value) and "\n" not in str(e.value)


def test_a_listing_over_its_bound_is_refused(s3) -> None:
    s = s3_storage(s3)
    folder = s3.path("team/many")
    folder.mkdir(parents=True)
    for i in range(40):
        (folder / f"f{i}").write_text("x")
    with pytest.raises(TemporaryError) as e:
        st.list_objects(s, secrets_of(s3), f"{s3.bucket}/team/many", max_bytes=2000)
    assert "larger than 2000 bytes" in str(e.value)


@pytest.mark.parametrize("raw", [b"{}", b"[1]", b"not json", b'[{"Path": "a", "Size": "1", "IsDir": false}]',
                                 b'[{"Path": "", "Size": 1, "IsDir": false}]',
                                 b'[{"Path": "a", "Size": 1, "IsDir": false, "Hashes": {"md5": "$(x)"}}]'])
def test_listings_not_shaped_as_rclone_writes_them_are_refused(raw: bytes) -> None:
    with pytest.raises(TemporaryError):
        st.parse_listing(raw)


def test_an_sftp_storage_lists_over_a_loopback_sshd(sshd, tmp_path) -> None:
    """SFTP as a Storage: the private key is a credential (key_pem, one line with \\n escapes, as
    rclone reads it), the host key is checked against a known_hosts file."""
    folder = "outputs/team/r-x/sft/g1/checkpoints"
    sshd.run(f"mkdir -p {folder}/checkpoint-5 && echo hi > {folder}/checkpoint-5/w.bin && echo '{{}}' > "
             f"{folder}/checkpoint-5.json")
    s = Storage.model_validate({
        "apiVersion": "reconciler/v1", "kind": "Storage", "metadata": {"name": "lab-sftp"},
        "spec": {"backend": "sftp", "options": {"host": sshd.host, "port": str(sshd.port), "user": sshd.user,
                                                "known_hosts_file": str(sshd.known_hosts_file)},
                 "credentials": {"key_pem": "T_SFTP_KEY"}, "bucket": "outputs", "prefix": "team"}})
    key = sshd.identity_file.read_text().strip().replace("\n", "\\n")
    got = st.list_objects(s, {"T_SFTP_KEY": key}, "outputs/team/r-x/sft/g1/checkpoints")
    assert [(e["path"], e["size"]) for e in got] == [("checkpoint-5.json", 3), ("checkpoint-5/w.bin", 3)]
    assert st.rclone_env(s, {"T_SFTP_KEY": key})["RCLONE_CONFIG_LAB_SFTP_TYPE"] == "sftp"


def test_storage_json_holds_no_secret(s3) -> None:
    s = s3_storage(s3)
    doc = st.storage_json(s, st.run_base(s, "r-x", "sft", 2), 3, "/opt/rclone", True, None,
                          {"checkpoint": "checkpoint-4", "uri": "store:x/checkpoints/checkpoint-4",
                           "manifest_sha256": "0" * 64})
    assert doc == {"schema_version": 1, "remote": "store", "base": f"{s3.bucket}/team/r-x/sft/g2", "attempt": 3,
                   "keep_checkpoints": 2, "interval_s": 30, "bwlimit": "", "rclone": "/opt/rclone", "resume": True,
                   "pinned": {"checkpoint": "checkpoint-4", "uri": "store:x/checkpoints/checkpoint-4",
                              "manifest_sha256": "0" * 64}}
    text = json.dumps(doc)
    assert s3.secret_key not in text and s3.access_key not in text
