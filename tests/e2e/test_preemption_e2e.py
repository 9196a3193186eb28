"""Preemption on real parts: a low-priority ms-swift run on this machine is stopped for an urgent
run, waits, and then resumes from its last checkpoint without spending a retry."""

from __future__ import annotations

import json
import shutil
import textwrap
import time

import pytest
import yaml

from tests.e2e.test_swift_e2e import COMMON, DATA, PASSTHROUGH, step_lines, swift_python, tiny_model  # noqa: F401
from tests.world import World, git, run_spec

pytestmark = [pytest.mark.swift, pytest.mark.e2e]


def test_a_low_priority_run_is_preempted_and_resumes_from_its_checkpoint(tmp_path, swift_python, tiny_model):
    w = World(tmp_path / "w", local_max_tasks=1)
    try:
        (w.repo / "execution_templates" / "local-swift.yaml").write_text(textwrap.dedent(f"""\
            apiVersion: reconciler/v1
            kind: ExecutionTemplate
            id: local-swift
            placement: {{kind: local}}
            launch_mode: {{kind: host_process}}
            defaults:
              python: {swift_python}
              runtime_env: {{HF_HUB_OFFLINE: "1", TOKENIZERS_PARALLELISM: "false", OMP_NUM_THREADS: "1"}}
            """))
        (w.repo / "specs" / "policy.yaml").write_text(yaml.safe_dump({
            "apiVersion": "reconciler/v1", "kind": "Policy", "metadata": {"name": "policy"},
            "spec": {"priorityClasses": [{"name": "urgent", "value": 100}, {"name": "batch", "value": 1,
                                                                             "default": True}],
                     "preemption": {"enabled": True, "graceSeconds": 5, "minRuntimeSeconds": 0}}}))
        shutil.copy2(DATA / "sft.jsonl", w.repo / "sft.jsonl")
        shutil.copytree(tiny_model, w.repo / "tiny-qwen2")
        task = textwrap.indent("type: swift-sft\nmodel: inputs/tiny-qwen2\ndataset: [inputs/sft.jsonl]\n"
                               "max_steps: 200\nsave_steps: 10\n", "    ")
        (w.repo / "specs" / "runs" / "low.yaml").write_text(textwrap.dedent("""\
            apiVersion: reconciler/v1
            kind: Run
            metadata:
              name: low
            spec:
              template: local-swift
              inputs: [sft.jsonl, tiny-qwen2]
            """) + "  task:\n" + task + COMMON + PASSTHROUGH)
        git(w.repo, "add", "-A")
        git(w.repo, "commit", "-q", "-m", "low")
        rec = w.reconciler()
        ws = w.local_root / "test" / "low-g1-a1"
        deadline = time.monotonic() + 240
        while not list((ws / "artifacts" / "output").glob("checkpoint-*/trainer_state.json")):
            assert time.monotonic() < deadline, w.status("low")
            rec.run_pass()
            time.sleep(0.5)
        w.add_run(run_spec("high", "local-swift", ["sh", "-c", "echo urgent work"], priority="urgent"))
        first = rec.run_pass().plan
        assert (first.for_run("high").code, first.for_run("low").code) == ("Preempting", "Preempted")
        low = w.status("low")
        assert low.phase == "Pending" and low.condition("Preempted").status == "True" and low.preemptions == 1
        saved = max(int(p.parent.name[11:]) for p in (ws / "artifacts" / "output").glob("checkpoint-*/trainer_state.json"))
        high = w.until("high", lambda s: s.phase == "Succeeded", timeout=60)
        assert high.attempt == 1
        low = w.until("low", lambda s: s.phase == "Succeeded", timeout=240)
        assert (low.attempt, low.preemptions) == (2, 1)  # relaunched once, no retry spent (maxRetries 0)
        job = json.loads((w.local_root / "test" / "low-g1-a2" / "job.json").read_text())
        assert job["payload"]["resume_from"].endswith(f"low-g1-a1/artifacts/output/checkpoint-{saved}")
        steps = [int(r["global_step/max_steps"].split("/")[0])
                 for r in step_lines(w.local_root / "test" / "low-g1-a2" / "artifacts" / "output" / "logging.jsonl")]
        assert steps[0] > saved and steps[-1] == 200
    finally:
        w.cleanup()
