"""A run's spec digest decides its generation: a reconciler upgrade that moved the digest of an
unchanged spec would relaunch every run it manages as a new generation. These digests were taken
with an earlier release; a model change (a new field, a field's type) must leave them as they are
(new fields go into ``spec.load.ADDED_LATER`` while unset; a retyped field serializes as before)."""

from __future__ import annotations

import shutil
from pathlib import Path

from reconciler.spec.load import load_tree

REPO = Path(__file__).resolve().parents[2]
SFT = 'apiVersion: reconciler/v1\nkind: Run\nmetadata: {name: sft}\nspec:\n  template: local-host\n  inputs: [data/sft.jsonl]\n  task:\n    type: swift-sft\n    model: Qwen/Qwen2-0.5B\n    model_type: qwen2\n    template: qwen\n    dataset: [inputs/data/sft.jsonl]\n    tuner_type: lora\n    lora_rank: 8\n    lora_alpha: 32\n    max_steps: 10\n    save_steps: 5\n    eval_steps: 5\n    learning_rate: 1.0e-4\n    num_train_epochs: 1\n    args: {dataloader_num_workers: 0}\n'
DPO = 'apiVersion: reconciler/v1\nkind: Run\nmetadata: {name: dpo}\nspec:\n  template: local-host\n  task:\n    type: swift-rlhf\n    rlhf_type: dpo\n    model: Qwen/Qwen2-0.5B\n    dataset: [inputs/data/sft.jsonl]\n    beta: 0.1\n    tuner_type: lora\n    lora_alpha: 16\n    max_steps: 10\n    save_steps: 5\n    learning_rate: 1.0e-5\n    per_device_train_batch_size: 2\n    gradient_accumulation_steps: 4\n    max_length: 1024\n    torch_dtype: bfloat16\n    lora_rank: 8\n    logging_steps: 1\n    save_total_limit: 2\n    seed: 42\n  inputs: [data/sft.jsonl]\n'
PINNED = {"sft": "sha256:a9d510eb84d4a97058195ae1b2445c8057b6ba8c4ecc87f9718357898112aaff",
          "dpo": "sha256:5542e631706e9a9dbe412c977048fef13991144f7ddc521687ae4507385262e6"}


def test_unchanged_specs_keep_their_digest_across_releases(tmp_path):
    (tmp_path / "specs" / "runs").mkdir(parents=True)
    (tmp_path / "execution_templates").mkdir()
    shutil.copy(REPO / "execution_templates" / "local-host.yaml", tmp_path / "execution_templates")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "sft.jsonl").write_text("")
    (tmp_path / "specs" / "runs" / "sft.yaml").write_text(SFT)
    (tmp_path / "specs" / "runs" / "dpo.yaml").write_text(DPO)
    desired = load_tree(tmp_path)
    assert not desired.diagnostics, [d.text() for d in desired.diagnostics]
    assert {n: e.digest for n, e in desired.runs.items()} == PINNED
