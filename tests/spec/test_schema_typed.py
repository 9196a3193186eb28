"""The JSON Schema and ``reconcile validate`` give every typed ms-swift field the same verdict.

ms-swift reads its arguments as command-line words, so ``max_steps: "10"`` is as good as
``max_steps: 10`` to it and to validate; an editor using the schema must not flag it, and must
flag what validate refuses. Every typed field of both swift task types gets a sample of values,
written as one run file each; one ``reconcile validate --format json`` judges them all, and the
committed schema must agree file by file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from reconciler.spec.models.tasks import SWIFT_OWN, SwiftRlhfTask, SwiftSftTask
from reconciler.tasks.swift import swift_argument_specs
from tests.spec.helpers import REPO, TEMPLATE, reconcile, write

SCALARS = [0, 10, -5, 2**70, 1e-05, -1e-05, -0.0001, 0.5, 10.5, True, False, None, "", "10", " 10 ", "+10", "1_000",
           "-5", "-5 ", "-1_0", "-1_0 ", "\t7\n", "007", "0x10", "1__0", "_1", "-", "ten", "10.0", "1e3", "1E5", ".5",
           "5.", "-.5", "-5.", "1_0.5", "1e1_0", "inf", "-inf", " -inf", "Infinity", "nan", "1e-5", "-1e-5", " -1e-5",
           "None", "none", "-x", "a b", "-a b", "m", "bfloat16", "float16", "dpo", "grpo", "Dpo"]
SAMPLES = SCALARS + [[], {}, [10], ["10"], [1, 2], ["a", "b"], ["-x"], [None], ["bfloat16"], ["dpo"], [[1]], {"a": 1},
                     [{"a": 1}]]
# JSON has one number type: 10.0 is an integer to JSON Schema, while validate reads "10.0" as
# ms-swift does and refuses it for an int. The one value no schema can tell apart.
UNTELLABLE = {("int", 10.0)}


def _typed_fields() -> list[tuple[str, str, str]]:
    out = []
    for task_type, model in (("swift-sft", SwiftSftTask), ("swift-rlhf", SwiftRlhfTask)):
        specs = swift_argument_specs(model.command())
        out += [(task_type, name, specs[name].get("type", "str")) for name in model.model_fields
                if name not in SWIFT_OWN and name in specs]
    return out


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory) -> tuple[dict, dict, dict]:
    """file stem → (task type, field, value); validate's and the schema's verdicts per stem."""
    root = tmp_path_factory.mktemp("typed")
    write(root, "execution_templates/local-host.yaml", TEMPLATE)
    cases, docs = {}, {}
    for task_type, name, _ in _typed_fields():
        for i, value in enumerate(SAMPLES):
            stem = f"{task_type}-{name.replace('_', '-')}-{i}"
            task = {"type": task_type, "model": "m", "dataset": ["d"], name: value}
            doc = {"apiVersion": "reconciler/v1", "kind": "Run", "metadata": {"name": stem},
                   "spec": {"template": "local-host", "task": task}}
            write(root, f"specs/runs/{stem}.yaml", json.dumps(doc))  # JSON is YAML: the values keep their types
            cases[stem], docs[stem] = (task_type, name, value), doc
    r = reconcile("validate", "--repo", str(root), "--format", "json", cwd=root)
    assert r.returncode in (0, 1), r.stderr
    refused = {Path(e["path"]).stem for e in json.loads(r.stdout)["errors"]}
    by_validate = {stem: stem not in refused for stem in cases}
    schema = Draft202012Validator(json.loads((REPO / "schemas" / "run.schema.json").read_text(encoding="utf-8")))
    by_schema = {stem: schema.is_valid(doc) for stem, doc in docs.items()}
    return cases, by_validate, by_schema


def test_every_typed_field_is_sampled() -> None:
    kinds = {kind for _, _, kind in _typed_fields()}
    assert kinds == {"int", "float", "str", "choice"}, kinds
    assert len(_typed_fields()) > 20


def test_the_schema_and_validate_agree_on_every_typed_field(verdicts) -> None:
    cases, by_validate, by_schema = verdicts
    disagree = [f"{t}.{name} = {value!r}: validate {by_validate[stem]}, schema {by_schema[stem]}"
                for stem, (t, name, value) in cases.items() if by_validate[stem] != by_schema[stem]]
    assert disagree == []
    # Both verdicts occur for every field: the sample tells something of each.
    for task_type, name, _ in _typed_fields():
        seen = {by_validate[s] for s, (t, n, _) in cases.items() if (t, n) == (task_type, name)}
        assert seen == {True, False}, (task_type, name)


def test_an_editor_no_longer_flags_a_number_written_as_a_string(verdicts) -> None:
    cases, by_validate, by_schema = verdicts
    wanted = {("max_steps", "10"), ("learning_rate", "1e-5"), ("seed", " 10 "), ("torch_dtype", "bfloat16"),
              ("save_steps", ".5")}
    hits = [by_schema[s] and by_validate[s] for s, (_, n, v) in cases.items() if isinstance(v, str) and (n, v) in wanted]
    assert hits and all(hits)
    refused = {("max_steps", "ten"), ("max_steps", "10.0"), ("learning_rate", "-1e-5"), ("torch_dtype", "none")}
    hits = [by_schema[s] or by_validate[s] for s, (_, n, v) in cases.items() if isinstance(v, str) and (n, v) in refused]
    assert hits and not any(hits)


def test_the_untellable_value_is_the_only_gap() -> None:
    schema = Draft202012Validator(json.loads((REPO / "schemas" / "run.schema.json").read_text(encoding="utf-8")))
    doc = {"apiVersion": "reconciler/v1", "kind": "Run", "metadata": {"name": "x"},
           "spec": {"template": "t", "task": {"type": "swift-sft", "model": "m", "dataset": ["d"], "max_steps": 10.0}}}
    assert ("int", 10.0) in UNTELLABLE and schema.is_valid(doc)
