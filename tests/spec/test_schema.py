"""The JSON Schemas: generated from the models, committed, checked for drift, and usable on their own
(an editor or CI with only jsonschema must accept the repository's examples and refuse bad specs)."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from reconciler.spec import schema
from tests.spec.helpers import REPO, read_yaml, reconcile

EXAMPLES = sorted((REPO / "specs").rglob("*.yaml")) + sorted((REPO / "execution_templates").glob("*.yaml"))


def validator(kind: str) -> Draft202012Validator:
    doc = json.loads((REPO / "schemas" / f"{schema.FILE_NAMES[kind]}.schema.json").read_text(encoding="utf-8"))
    return Draft202012Validator(doc)


def test_generation_is_stable() -> None:
    assert schema.generate() == schema.generate()
    assert set(schema.generate()) == {f"{n}.schema.json" for n in schema.FILE_NAMES.values()}


def test_committed_schemas_match_the_models() -> None:
    assert schema.drift(REPO / "schemas") == []


@pytest.mark.parametrize("name", sorted(schema.generate()))
def test_schemas_are_valid_draft_2020_12(name: str) -> None:
    doc = json.loads(schema.generate()[name])
    assert doc["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert doc["$id"].endswith(name)
    Draft202012Validator.check_schema(doc)


def test_schema_check_cli_on_the_repository() -> None:
    r = reconcile("schema", "--check", cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok" in r.stdout


@pytest.fixture
def schema_copy(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "schemas", tmp_path / "schemas")
    return tmp_path


def test_schema_check_fails_after_a_hand_edit(schema_copy: Path) -> None:
    p = schema_copy / "schemas" / "run.schema.json"
    doc = json.loads(p.read_text())
    doc["description"] = "edited by hand"
    p.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    r = reconcile("schema", "--check", "--repo", str(schema_copy), cwd=schema_copy)
    assert r.returncode == 1
    assert "schemas/run.schema.json: differs from the models" in r.stdout
    assert "fleet.schema.json" not in r.stdout
    # Whitespace counts too: the files are byte-for-byte what the models generate.
    p.write_text(schema.generate()["run.schema.json"] + "\n")
    assert reconcile("schema", "--check", "--repo", str(schema_copy), cwd=schema_copy).returncode == 1
    # Regenerating repairs it.
    r = reconcile("schema", "--repo", str(schema_copy), cwd=schema_copy)
    assert r.returncode == 0 and "wrote schemas/run.schema.json" in r.stdout
    assert reconcile("schema", "--check", "--repo", str(schema_copy), cwd=schema_copy).returncode == 0


def test_schema_check_fails_when_a_file_is_missing(schema_copy: Path) -> None:
    (schema_copy / "schemas" / "fleet.schema.json").unlink()
    r = reconcile("schema", "--check", "--repo", str(schema_copy), cwd=schema_copy)
    assert r.returncode == 1 and "fleet.schema.json" in r.stdout


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(REPO)))
def test_examples_validate_against_the_committed_schemas(path: Path) -> None:
    doc = read_yaml(path)
    errors = sorted(validator(doc["kind"]).iter_errors(doc), key=str)
    assert errors == [], [e.message for e in errors]


def test_examples_cover_every_kind() -> None:
    assert {read_yaml(p)["kind"] for p in EXAMPLES} == set(schema.FILE_NAMES)


def test_examples_point_editors_at_existing_schemas() -> None:
    for p in EXAMPLES:
        first = p.read_text().splitlines()[0]
        if first.startswith("# yaml-language-server: $schema="):
            target = (p.parent / first.split("=", 1)[1]).resolve()
            assert target.is_file(), f"{p}: {target}"


def _example(kind: str) -> dict:
    return next(read_yaml(p) for p in EXAMPLES if read_yaml(p)["kind"] == kind)


def _mutations() -> list[tuple[str, str, callable]]:
    def at(path, value):
        def f(doc):
            node = doc
            for part in path[:-1]:
                node = node[part]
            node[path[-1]] = value
        return f

    def drop(path):
        def f(doc):
            node = doc
            for part in path[:-1]:
                node = node[part]
            del node[path[-1]]
        return f

    return [
        ("Run", "unknown top-level key", at(("spce",), {})),
        ("Run", "unknown key in spec", at(("spec", "tempalte"), "x")),
        ("Run", "unknown key in task", at(("spec", "task", "argvv"), ["x"])),
        ("Run", "string for an int", at(("spec", "restartPolicy", "maxRetries"), "2")),
        ("Run", "bad name", at(("metadata", "name"), "Hello")),
        ("Run", "name too long", at(("metadata", "name"), "a" * 64)),
        ("Run", "missing task", drop(("spec", "task"))),
        ("Run", "unknown task type", at(("spec", "task", "type"), "shell")),
        ("Run", "empty argv", at(("spec", "task", "argv"), [])),
        ("Run", "bad desiredState", at(("spec", "desiredState"), "Paused")),
        ("Run", "bad apiVersion", at(("apiVersion",), "reconciler/v2")),
        ("Run", "bad secret name", at(("spec", "secrets"), ["hf-token"])),
        ("ExecutionTemplate", "unknown key", at(("defaults", "imagee"), "x")),
        ("ExecutionTemplate", "unknown placement", at(("placement", "kind"), "rental")),
        ("ExecutionTemplate", "unknown override key", at(("allow_overrides",), ["command"])),
        ("ExecutionTemplate", "gpu_count too big", at(("defaults", "resources"), {"gpu_count": 65})),
        ("Fleet", "unknown machine key", lambda d: d["spec"]["machines"][0].update(hostname="x")),
        ("Fleet", "port out of range", lambda d: d["spec"]["machines"][0]["ssh"].update(port=70000)),
        ("Fleet", "no machines", at(("spec", "machines"), [])),
    ]


@pytest.mark.parametrize("kind,what,mutate", _mutations(), ids=[f"{k}: {w}" for k, w, _ in _mutations()])
def test_schemas_refuse_bad_specs(kind: str, what: str, mutate) -> None:
    doc = copy.deepcopy(_example(kind))
    assert validator(kind).is_valid(doc)
    mutate(doc)
    assert not validator(kind).is_valid(doc), what


def test_swift_task_schema() -> None:
    doc = _example("Run")
    doc = copy.deepcopy(doc)
    doc["spec"]["task"] = {"type": "swift-rlhf", "model": "m", "dataset": ["d"], "rlhf_type": "dpo", "learning_rate": 1e-4}
    assert validator("Run").is_valid(doc)
    doc["spec"]["task"]["rlhf_type"] = "dppo"
    assert not validator("Run").is_valid(doc)
