"""A rental that evaporates mid-training: the run resumes on a new rental from the checkpoint
that was copied off the old one while it trained. Real parts: ms-swift on the CPU, the local
provider's sshd rentals, the reconciler's passes."""

from __future__ import annotations

import json
import textwrap
import time

import pytest
import yaml

from tests.e2e.test_swift_e2e import COMMON, DATA, PASSTHROUGH, step_lines, swift_python, tiny_model  # noqa: F401
from tests.rentals.conftest import provider_doc
from tests.world import World

pytestmark = [pytest.mark.swift, pytest.mark.e2e]


def test_an_evaporated_rental_resumes_on_a_new_one_from_the_copied_checkpoint(tmp_path, swift_python, tiny_model):
    import shutil

    w = World(tmp_path / "w", unreachable_grace=1.0)
    try:
        (w.repo / "execution_templates" / "rental-swift.yaml").write_text(textwrap.dedent(f"""\
            apiVersion: reconciler/v1
            kind: ExecutionTemplate
            id: rental-swift
            placement: {{kind: rental}}
            launch_mode: {{kind: host_process}}
            defaults:
              python: {swift_python}
              runtime_env: {{HF_HUB_OFFLINE: "1", TOKENIZERS_PARALLELISM: "false", OMP_NUM_THREADS: "1"}}
            """))
        (w.repo / "specs" / "providers").mkdir()
        # login: self, so that the rental can run this machine's ms-swift environment
        doc = provider_doc(tmp_path / "provider", local={"login": "self"})
        (w.repo / "specs" / "providers" / "local.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        shutil.copy2(DATA / "sft.jsonl", w.repo / "sft.jsonl")
        shutil.copytree(tiny_model, w.repo / "tiny-qwen2")
        task = textwrap.indent(textwrap.dedent("""\
            type: swift-sft
            model: inputs/tiny-qwen2
            dataset: [inputs/sft.jsonl]
            max_steps: 200
            save_steps: 10
        """), "    ")
        run = (textwrap.dedent("""\
            apiVersion: reconciler/v1
            kind: Run
            metadata:
              name: sft
            spec:
              template: rental-swift
              restartPolicy: {maxRetries: 1, backoffSeconds: 0}
              inputs: [sft.jsonl, tiny-qwen2]
            """) + "  task:\n" + task + COMMON + PASSTHROUGH)
        (w.repo / "specs" / "runs" / "sft.yaml").write_text(run)
        git_add = __import__("tests.world", fromlist=["git"]).git
        git_add(w.repo, "add", "-A")
        git_add(w.repo, "commit", "-q", "-m", "sft on a rental")
        rec = w.reconciler()
        store = w.repo / ".reconciler" / "checkpoints" / "sft" / "g1"
        deadline = time.monotonic() + 240
        while not list(store.glob("checkpoint-*")):
            assert time.monotonic() < deadline, w.status("sft")
            rec.run_pass()
            time.sleep(0.5)
        copied = max(int(p.name[11:]) for p in store.glob("checkpoint-*"))
        st = w.status("sft")
        first = st.handle.machine
        assert st.phase == "Running" and first.startswith("local/")
        from reconciler.rentals.providers.local import LocalAdapter
        from reconciler.spec.models.provider import Provider

        LocalAdapter(Provider.model_validate(doc), None).evaporate(first.split("/", 1)[1])
        rec.run_pass()
        rec.run_pass(now=time.time() + 2)  # past the 1 s grace: lost, and a new rental asked for
        deadline = time.monotonic() + 240
        while (st := w.status("sft")).phase not in ("Succeeded", "Failed"):
            assert time.monotonic() < deadline, st
            rec.run_pass()
            time.sleep(0.5)
        assert st.phase == "Succeeded" and st.attempt == 2, st.message
        assert st.handle.machine != first
        bundle = w.bundle("sft-g1-a2")
        job = json.loads((bundle / "job.json").read_text())
        assert job["payload"]["resume_from"].endswith(f"/inputs/.reconciler/resume/checkpoint-{copied}")
        steps = [int(r["global_step/max_steps"].split("/")[0]) for r in
                 step_lines(bundle / "artifacts" / "output" / "logging.jsonl")]
        assert steps[0] > copied and steps[-1] == 200  # resumed after the copied step, not from 0
    finally:
        w.cleanup()
        from reconciler.rentals.providers.local import LocalAdapter
        from reconciler.spec.models.provider import Provider

        a = LocalAdapter(Provider.model_validate(provider_doc(tmp_path / "provider", local={"login": "self"})), None)
        for r in a.inventory():
            a.terminate(r.id)
