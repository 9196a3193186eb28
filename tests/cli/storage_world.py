"""A run whose outputs are in a real bucket, for the commands over object storage.

A real ``rclone serve s3`` on loopback (tests/infra/storage.py) holds a run generation's base laid
out as the machine side writes it (``checkpoints/checkpoint-N/...``, ``checkpoints/checkpoint-N.json``
uploaded last, ``a<attempt>/...``), written with rclone here; the run's status records the
``outputs`` the control plane would. The run itself really ran (tests/cli/conftest.py's ``world``):
its provenance manifest is the one collection wrote.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.infra.storage import S3Server, rclone_binary

KEY_SECRET, SECRET_SECRET = "T_ARTIFACTS_S3_KEY", "T_ARTIFACTS_S3_SECRET"
STORAGE = "team-store"
REMOTE = "team_store"  # the Storage's name in URIs: rclone finds no remote with '-' in its variables' names
BUCKET, PREFIX, REPO_ID = "runs-bucket", "team", "test"  # the repository id: the world's namespace


UPLOADED = 1795600000  # 2026-11-25T09:46:40Z


def storage_spec(endpoint: str) -> str:
    return f"""\
apiVersion: reconciler/v1
kind: Storage
metadata:
  name: {STORAGE}
spec:
  backend: s3
  options:
    provider: Rclone
    endpoint: {endpoint}
  credentials:
    access_key_id: {KEY_SECRET}
    secret_access_key: {SECRET_SECRET}
  bucket: {BUCKET}
  prefix: {PREFIX}
"""


def base_of(run: str, generation: int = 1) -> str:
    return f"{BUCKET}/{PREFIX}/{REPO_ID}/{run}/g{generation}"


@dataclass
class Bucket:
    """The server, the client's environment and the objects written so far (key → bytes)."""

    server: S3Server
    objects: dict

    def env(self) -> dict[str, str]:
        return {KEY_SECRET: self.server.access_key, SECRET_SECRET: self.server.secret_key}

    def put(self, key: str, data: bytes) -> None:
        """Write one object with rclone, as a client of the server."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **self.server.env("t")}
        subprocess.run([rclone_binary(), "rcat", "--config", os.devnull, f"t:{key}"], input=data, env=env,
                       check=True, capture_output=True, timeout=30)
        self.objects[key] = data

    def delete(self, key: str) -> None:
        """Remove one object through the server (its listing cache then knows)."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **self.server.env("t")}
        subprocess.run([rclone_binary(), "deletefile", "--config", os.devnull, f"t:{key}"], env=env, check=True,
                       capture_output=True, timeout=30)
        self.objects.pop(key, None)


def checkpoint(bucket: Bucket, run: str, step: int, files: dict[str, bytes], attempt: int = 1) -> str:
    """Upload checkpoint-STEP as the machine does (files, then the manifest); its manifest's sha256."""
    base = base_of(run)
    name = f"checkpoint-{step}"
    for rel, data in files.items():
        bucket.put(f"{base}/checkpoints/{name}/{rel}", data)
    manifest = json.dumps({"schema_version": 1, "checkpoint": name, "step": step,
                           "files": [{"path": rel, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
                                     for rel, d in sorted(files.items())],
                           "uploaded_at": UPLOADED + step, "attempt": attempt},  # unix seconds, as machines write
                          sort_keys=True).encode()
    bucket.put(f"{base}/checkpoints/{name}.json", manifest)
    return hashlib.sha256(manifest).hexdigest()


def record_outputs(repo: Path, run: str, checkpoints: list[tuple[str, str]]) -> None:
    """Add ``outputs`` to the run's status file, as the control plane records them."""
    path = repo / "status" / f"{run}.yaml"
    doc = yaml.safe_load(path.read_text())
    uri = f"{REMOTE}:{base_of(run, doc.get('generation', 1))}"
    doc["outputs"] = {"storage": STORAGE, "uri": uri,
                      "checkpoints": [{"name": n, "uri": f"{uri}/checkpoints/{n}", "manifest_sha256": sha,
                                       "bytes": 1, "uploaded_at": "2026-11-25T10:00:00Z"}
                                      for n, sha in checkpoints],
                      "artifacts": f"{uri}/a1", "resumed_from": None, "error": None}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def stored_world(repo: Path, scratch: Path, run: str = "hello") -> Bucket:
    """Start the server, add the Storage to ``repo``, upload two checkpoints and attempt 1's
    artifacts of ``run``, and record them in its status."""
    server = S3Server(scratch).start()
    bucket = Bucket(server, {})
    (repo / "specs" / "storage").mkdir(parents=True, exist_ok=True)
    (repo / "specs" / "storage" / f"{STORAGE}.yaml").write_text(storage_spec(server.endpoint))
    shas = [(f"checkpoint-{s}", checkpoint(bucket, run, s, {"model.bin": bytes([s]) * (100 * s),
                                                           "trainer_state.json": b'{"global_step": %d}' % s}))
            for s in (10, 20)]
    base = base_of(run)
    bucket.put(f"{base}/a1/stdout.log", b"line 1\nline 2\n")
    bucket.put(f"{base}/a1/manifest.json", b'{"schema": "x"}\n')
    # Another run's outputs beside this one's: never reachable through this run's base.
    bucket.put(f"{base_of('other')}/a1/secret.txt", b"not yours\n")
    record_outputs(repo, run, shas[::-1])
    return bucket
