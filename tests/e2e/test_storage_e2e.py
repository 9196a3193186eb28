"""Outputs in object storage, end to end: a run on a rental with a Storage uploads its checkpoints
from the machine while it trains; the rental evaporates; the next attempt, on a new rental,
resumes from the bucket's newest complete checkpoint. Nothing of a checkpoint crosses the
reconciler host, and the Storage's credentials reach no file of the repository, its status, its
logs or a bundle archive. Real parts: ms-swift on the CPU, the local provider's sshd rentals,
``rclone serve s3`` on loopback, the reconciler's passes."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from reconciler.artifacts import bundle as bundles
from tests.e2e.test_swift_e2e import COMMON, DATA, PASSTHROUGH, step_lines, swift_python, tiny_model  # noqa: F401
from tests.rentals.conftest import provider_doc
from tests.world import World, git

pytestmark = [pytest.mark.swift, pytest.mark.e2e]

TEMPLATE = """\
apiVersion: reconciler/v1
kind: ExecutionTemplate
id: rental-swift
placement: {{kind: rental}}
launch_mode: {{kind: host_process}}
defaults:
  python: {python}
  runtime_env: {{HF_HUB_OFFLINE: "1", TOKENIZERS_PARALLELISM: "false", OMP_NUM_THREADS: "1"}}
"""

TASK = """\
  task:
    type: swift-sft
    model: inputs/tiny-qwen2
    dataset: [inputs/sft.jsonl]
    max_steps: 200
    save_steps: 10
"""


def storage_doc(s3) -> dict:
    return {"apiVersion": "reconciler/v1", "kind": "Storage", "metadata": {"name": "s3-out"},
            "spec": {"backend": "s3", "options": {"provider": "Rclone", "endpoint": s3.endpoint},
                     "credentials": {"access_key_id": "E2E_S3_KEY", "secret_access_key": "E2E_S3_SECRET"},
                     "bucket": s3.bucket, "prefix": "outputs", "keep_checkpoints": 2, "interval_s": 5}}


def files_holding(root: Path, needles: list[bytes]) -> list[str]:
    """Files under ``root`` (links not followed) whose bytes hold any needle."""
    found = []
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            data = p.read_bytes()
            if any(n in data for n in needles):
                found.append(str(p))
    return found


def manifests(s3, base: str) -> list[int]:
    """Steps of the complete checkpoints in the bucket (a manifest object beside the folder)."""
    return sorted(int(k.rsplit("checkpoint-", 1)[1][:-5]) for k in s3.objects(f"{base}/checkpoints/")
                  if k.endswith(".json") and "/checkpoint-" in k and k.count("/") == base.count("/") + 2)


def test_a_run_resumes_from_the_bucket_on_a_new_rental(tmp_path, swift_python, tiny_model, s3):  # noqa: F811
    from reconciler.rentals.providers.local import LocalAdapter
    from reconciler.spec.models.provider import Provider

    doc = provider_doc(tmp_path / "provider", local={"login": "self"})  # this machine's ms-swift environment
    w = World(tmp_path / "w", unreachable_grace=1.0)
    try:
        (w.repo / "execution_templates" / "rental-swift.yaml").write_text(TEMPLATE.format(python=swift_python))
        for rel, d in (("specs/providers/local.yaml", doc), ("specs/storage/s3-out.yaml", storage_doc(s3))):
            (w.repo / rel).parent.mkdir(parents=True, exist_ok=True)
            (w.repo / rel).write_text(yaml.safe_dump(d, sort_keys=False))
        shutil.copy2(DATA / "sft.jsonl", w.repo / "sft.jsonl")
        shutil.copytree(tiny_model, w.repo / "tiny-qwen2")
        (w.repo / "specs" / "runs" / "sft.yaml").write_text(textwrap.dedent("""\
            apiVersion: reconciler/v1
            kind: Run
            metadata:
              name: sft
            spec:
              template: rental-swift
              restartPolicy: {maxRetries: 1, backoffSeconds: 0}
              inputs: [sft.jsonl, tiny-qwen2]
              outputs: {storage: s3-out}
            """) + TASK + COMMON + PASSTHROUGH)
        git(w.repo, "add", "-A")
        git(w.repo, "commit", "-q", "-m", "sft on a rental, outputs in a bucket")
        rec = w.reconciler()
        secrets = {"E2E_S3_KEY": s3.access_key, "E2E_S3_SECRET": s3.secret_key}
        rec.secret_source = secrets.get
        base = f"outputs/{rec.cfg.repo_namespace}/sft/g1"

        # Training on the first rental: checkpoints reach the bucket, and the status says so.
        deadline = time.monotonic() + 300
        while not ((st := w.status("sft")) and st.outputs and st.outputs["checkpoints"]):
            assert time.monotonic() < deadline, (st, s3.objects())
            rec.run_pass()
            time.sleep(0.5)
        assert st.phase == "Running" and st.outputs["uri"] == f"s3_out:{s3.bucket}/{base}"
        newest = st.outputs["checkpoints"][0]
        assert newest["uri"] == f"s3_out:{s3.bucket}/{base}/checkpoints/{newest['name']}"
        # (error: the machine's last round may have failed on a log that grew while it was copied)
        assert st.outputs["artifacts"] == f"s3_out:{s3.bucket}/{base}/a1"
        first = st.handle.machine
        assert first.startswith("local/")

        LocalAdapter(Provider.model_validate(doc), None).evaporate(first.split("/", 1)[1])
        in_bucket = manifests(s3, base)
        assert in_bucket, s3.objects()
        rec.run_pass()
        rec.run_pass(now=time.time() + 2)  # past the 1 s grace: lost, and a new rental asked for
        deadline = time.monotonic() + 300
        while (st := w.status("sft")).phase not in ("Succeeded", "Failed"):
            assert time.monotonic() < deadline, st
            rec.run_pass()
            time.sleep(0.5)
        assert st.phase == "Succeeded" and st.attempt == 2, st.message
        assert st.handle.machine != first

        bundle = w.bundle("sft-g1-a2")
        config = json.loads((bundle / "scripts" / "storage.json").read_text())
        assert config["resume"] is True and config["base"] == f"{s3.bucket}/{base}" and config["attempt"] == 2
        job = json.loads((bundle / "job.json").read_text())["payload"]
        assert job["resume_from"].endswith("/inputs/.reconciler/resume/latest")
        resumed = st.outputs["resumed_from"]
        step = int(resumed["name"].split("-")[1])
        assert step in in_bucket and step >= max(in_bucket) - 10, (resumed, in_bucket)
        steps = [int(r["global_step/max_steps"].split("/")[0]) for r in
                 step_lines(bundle / "artifacts" / "output" / "logging.jsonl")]
        assert steps[0] > step and steps[-1] == 200  # resumed after the bucket's step, not from 0
        assert st.outputs["artifacts"] == f"s3_out:{s3.bucket}/{base}/a2"
        assert len(st.outputs["checkpoints"]) <= 2 and st.outputs["checkpoints"][0]["name"] == "checkpoint-200"

        # The provenance manifest records the checkpoint URIs, their checksums and the resume.
        manifest = json.loads((bundle / "artifacts" / "manifest.json").read_text())
        outputs = manifest["run"]["outputs"]
        assert outputs["resumed_from"] == resumed and outputs["checkpoints"][0]["manifest_sha256"]

        # Nothing of a checkpoint crossed this host.
        vm_store = w.repo / ".reconciler" / "checkpoints"
        assert not vm_store.exists() or not any(vm_store.rglob("*")), list(vm_store.rglob("*"))
        assert not list((w.repo / ".reconciler" / "bundles").rglob("checkpoint-*"))

        # The credentials reach no file of the repository, status, logs, state or bundles, nor git.
        needles = [s3.secret_key.encode(), s3.access_key.encode()]
        assert files_holding(w.repo, needles) == []
        assert files_holding(tmp_path / "provider", needles) == []  # the rentals' workspaces
        history = subprocess.run(["git", "-C", str(w.repo), "log", "-p", "--all"], capture_output=True).stdout
        assert not any(n in history for n in needles)
        for b in (w.repo / ".reconciler" / "bundles").iterdir():
            if (b / "job.json").is_file():
                assert not any(n in bundles.archive(b) for n in needles)
    finally:
        w.cleanup()
        a = LocalAdapter(Provider.model_validate(provider_doc(tmp_path / "provider", local={"login": "self"})), None)
        for r in a.inventory():
            a.terminate(r.id)
