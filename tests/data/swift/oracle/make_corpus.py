#!/usr/bin/env python3
"""Write corpus.json: `swift sft` / `swift rlhf` invocations for the ms-swift parity oracle.

Run with the execution plane's python (it reads the installed ms-swift):

    /opt/reconciler-swift-venv/bin/python tests/data/swift/oracle/make_corpus.py --write

Where the invocations come from. The ms-swift wheel ships neither its examples/ folder nor its docs,
so the corpus is built from what the installed package does carry:

- the commands of its README (the wheel's METADATA): the quick-start `swift sft`, the fine-tuning,
  DPO and GRPO commands, parsed as written (environment prefixes and `...` dropped);
- the options its argument dataclasses declare: every choice of every option that has choices
  (field metadata or Literal, and the enums TrainingArguments converts), each built-in tuner
  (``get_supported_tuners``), each ``rlhf_type``, quantization methods and bits, dataset forms;
- the cases users reported (GRPO with ``beta 0`` or without ``reward_funcs``, ``cached_dataset``
  without ``dataset``, ``save_total_limit -1``, plugin tuner names);
- deliberately wrong values: a typo'd choice for every option with choices, a word for a float,
  ``1.5`` for an int, ``maybe`` for a bool, misspelt argument names, an option given no value.

Each entry: ``id``, ``command`` (sft or rlhf), ``pairs`` (``[name, [words...]]`` in order: the
command line is ``--name words...`` for each) and ``source``. Output is stable (no randomness).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shlex
import sys
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGET = HERE / "corpus.json"
MANAGED = {"output_dir", "add_version", "resume_from_checkpoint"}  # the reconciler sets them: left out


def readme_commands() -> list[tuple[str, list]]:
    """(command, pairs) of each `swift sft|rlhf` block in the installed README."""
    text = metadata.metadata("ms-swift").get_payload() or ""
    out = []
    for block in re.findall(r"```shell\n(.*?)```", text, re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            m = re.search(r"\bswift (sft|rlhf)\b(.*)", line)
            if not m:
                continue
            words = [w for w in shlex.split(m.group(2)) if w != "..."]
            out.append((m.group(1), pairs_of(words)))
    return out


def pairs_of(words: list[str]) -> list:
    pairs: list = []
    for w in words:
        if w.startswith("--"):
            pairs.append([w[2:], []])
        elif pairs:
            pairs[-1][1].append(w)
    return [p for p in pairs if p[0] not in MANAGED]


def with_(base: list, **changes) -> list:
    """``base`` with some options set (a list value: several words) or removed (None)."""
    out = [list(p) for p in base if p[0] not in changes]
    for name, value in changes.items():
        if value is not None:
            out.append([name, [str(v) for v in value] if isinstance(value, list) else [str(value)]])
    return out


def typo(word: str) -> str:
    return word[:-1] + ("x" if not word.endswith("x") else "y") if len(word) > 2 else word + "x"


class Corpus:
    def __init__(self) -> None:
        self.entries: list[dict] = []

    def add(self, ident: str, command: str, pairs: list, source: str) -> None:
        self.entries.append({"id": ident, "command": command, "pairs": pairs, "source": source})


def build() -> list[dict]:
    with contextlib.redirect_stdout(sys.stderr):
        sys.path.insert(0, str(HERE.parents[3] / "scripts"))
        import swift_args  # scripts/swift_args.py: the same reading of ms-swift's parser

        data = {c: swift_args.describe(cls) for c, cls in swift_args.argument_classes().items()}
        tuners = swift_args.supported_tuners()
    c = Corpus()
    readme = readme_commands()
    for i, (command, pairs) in enumerate(readme):
        c.add(f"readme-{i}-{command}", command, pairs, "README (wheel METADATA)")
    sft = next(p for cmd, p in readme if cmd == "sft")
    rlhf = next(p for cmd, p in readme if cmd == "rlhf")
    _documented(c, sft, rlhf, data, tuners)
    _reported(c, sft, rlhf)
    _wrong(c, sft, rlhf, data)
    return c.entries


def _documented(c: Corpus, sft: list, rlhf: list, data: dict, tuners: list[str]) -> None:
    for t in tuners:
        c.add(f"tuner-{t}", "sft", with_(sft, tuner_type=t), "tuner_type help: get_supported_tuners()")
    for r in data["rlhf"]["rlhf_type"]["choices"]:
        extra = {"reward_funcs": ["accuracy", "format"]} if r == "grpo" else {}
        c.add(f"rlhf-{r}", "rlhf", with_(rlhf, rlhf_type=r, **extra), "RLHFArguments.rlhf_type (Literal)")
        c.add(f"rlhf-{r}-beta", "rlhf", with_(rlhf, rlhf_type=r, beta=0.1, **extra), "RLHFArguments.beta")
    for method in data["sft"]["quant_method"]["choices"]:
        for bits in data["sft"]["quant_bits"]["choices"]:
            c.add(f"quant-{method}-{bits}", "sft", with_(sft, quant_method=method, quant_bits=bits),
                  "QuantizeArguments: quant_method x quant_bits")
    for command, base in (("sft", sft), ("rlhf", rlhf)):
        for name, spec in data[command].items():
            values = spec.get("choices") or spec.get("enum") or []
            if command == "rlhf" and name in data["sft"]:
                values = values[:1]  # the sft pass covers the shared options' every choice
            for v in values:
                if v is None or name in ("rlhf_type", "quant_method", "quant_bits"):
                    continue
                c.add(f"choice-{command}-{name}-{v}", command, with_(base, **{name: v}),
                      f"choices of {name}")
    datasets = [
        ("dataset-sample", {"dataset": ["AI-ModelScope/alpaca-gpt4-data-zh#500", "swift/self-cognition#500"]}),
        ("dataset-subset", {"dataset": ["AI-ModelScope/alpaca-gpt4-data-en:default#100"]}),
        ("dataset-local", {"dataset": ["inputs/data/train.jsonl"], "val_dataset": ["inputs/data/val.jsonl"]}),
        ("dataset-streaming", {"streaming": "true", "max_steps": 1000}),
        ("dataset-split", {"split_dataset_ratio": 0.01, "dataset_num_proc": 4}),
        ("dataset-packing", {"packing": "true", "packing_strategy": "binpack"}),
        ("dataset-lazy", {"lazy_tokenize": "true", "dataloader_num_workers": 0}),
        ("lr-kwargs", {"lr_scheduler_type": "cosine_with_min_lr", "lr_scheduler_kwargs": '{"min_lr": 1e-6}'}),
        ("deepspeed", {"deepspeed": "zero2", "gradient_checkpointing": "true"}),
        ("target-modules", {"target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.05}),
        ("bool-words", {"gradient_checkpointing": "yes", "use_hf": "0", "streaming": "False"}),
        ("epochs-float", {"num_train_epochs": 0.5, "save_steps": 0.25, "eval_steps": 0.1}),
        ("torch-dtype", {"torch_dtype": "float16", "lora_dtype": "bfloat16"}),
    ]
    for ident, changes in datasets:
        c.add(ident, "sft", with_(sft, **changes), "DataArguments / TrainArguments documented options")


def _reported(c: Corpus, sft: list, rlhf: list) -> None:
    grpo = with_(rlhf, rlhf_type="grpo")
    c.add("grpo-beta-0", "rlhf", with_(grpo, beta=0, reward_funcs=["accuracy"]), "reported: GRPO beta 0")
    c.add("grpo-teacher", "rlhf", with_(grpo, teacher_model="Qwen/Qwen3-8B"), "reported: GRPO without reward_funcs")
    c.add("grpo-gym", "rlhf", with_(grpo, use_gym_env="true"), "reported: GRPO gym environment")
    c.add("cached-dataset", "sft", with_(sft, dataset=None, cached_dataset=["cached/train"]),
          "reported: cached_dataset without dataset")
    c.add("save-total-limit-minus-1", "sft", with_(sft, save_total_limit=-1), "reported: save_total_limit -1")
    c.add("plugin-tuner", "sft", with_(sft, tuner_type="my_plugin_tuner"), "reported: plugin tuner")
    c.add("max-steps-minus-1", "sft", with_(sft, max_steps=-1), "TrainingArguments default: -1 means unset")
    c.add("lr-large", "sft", with_(sft, learning_rate=2), "a learning rate ms-swift does not bound")
    c.add("dpo-ref-model", "rlhf", with_(rlhf, ref_model="Qwen/Qwen3-4B-Instruct-2507"), "RLHFArguments.ref_model")


def _wrong(c: Corpus, sft: list, rlhf: list, data: dict) -> None:
    c.add("bad-warmup-words", "sft", with_(sft, warmup_ratio="five percent"), "reported: a word for a float")
    c.add("bad-lr-scheduler", "sft", with_(sft, lr_scheduler_type="cosinee"), "reported: a typo'd scheduler")
    c.add("bad-negative-lr", "sft", with_(sft, learning_rate="-1e-5"), "'-1e-5' reads as an option to argparse")
    c.add("bad-no-value", "sft", with_(sft, target_modules=[]), "an option given no value")
    c.add("bad-two-values", "sft", with_(sft, max_length=[1024, 2048]), "two values for a single-value option")
    for name in ("lora_rank", "learning_rate", "lora_dropout", "warmup_ratio", "tuner_backend", "gradient_checkpointing",
                 "max_length", "save_total_limit", "dataloader_num_workers", "torch_dtype"):
        c.add(f"bad-name-{name}", "sft", with_(sft, **{typo(name): "1"}), "a misspelt argument name")
    c.add("bad-name-rlhf-in-sft", "sft", with_(sft, beta=0.1), "an rlhf-only argument in sft")
    bad = {"int": "1.5", "float": "five percent", "bool": "maybe"}
    for command, base in (("sft", sft), ("rlhf", rlhf)):
        for name, spec in data[command].items():
            if name in MANAGED or (command == "rlhf" and name in data["sft"]):
                continue
            values = spec.get("choices") or spec.get("enum")
            if values:
                word = typo(str(next(v for v in values if v is not None)))
                if word not in [str(v) for v in values]:
                    c.add(f"bad-choice-{command}-{name}", command, with_(base, **{name: word}), f"a typo'd {name}")
            elif spec["type"] in bad and (command == "rlhf" or sum(ch.isalpha() for ch in name) % 3 == 0):
                # a third of sft's typed options (chosen by name, so the set is stable), every rlhf-only one
                c.add(f"bad-{spec['type']}-{command}-{name}", command, with_(base, **{name: bad[spec["type"]]}),
                      f"a wrong type for {name}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="write corpus.json next to this script")
    args = p.parse_args(argv)
    entries = build()
    ids = [e["id"] for e in entries]
    assert len(ids) == len(set(ids)), "duplicate ids"
    text = '{"entries": [\n' + ",\n".join(json.dumps(e, ensure_ascii=False) for e in entries) + "\n]}\n"
    if args.write:
        TARGET.write_text(text, encoding="utf-8")
        print(f"wrote {len(entries)} invocations to {TARGET}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
