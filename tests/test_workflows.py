"""The GitHub workflows: valid against the workflow JSON Schema (the copy vendored inside the
check-jsonschema package, so no network), and every action pinned to something that cannot move."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

import pytest
from jsonschema import validators

# read_yaml reads YAML 1.2, as GitHub does: `on:` is the string "on", not the boolean YAML 1.1 makes of it.
from tests.spec.helpers import REPO, read_yaml

WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.y*ml"))
PINNED = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_./-]+@(?:[0-9a-f]{40}|v\d+\.\d+\.\d+)$")


def workflow_schema() -> dict:
    check_jsonschema = pytest.importorskip("check_jsonschema")
    vendor = Path(check_jsonschema.__file__).parent / "builtin_schemas" / "vendor"
    path = next((p for name in ("github-workflows.json", "github-workflow.json") if (p := vendor / name).is_file()), None)
    assert path is not None, f"no GitHub workflow schema under {vendor}"
    return json.loads(path.read_text(encoding="utf-8"))


def uses(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "uses" and isinstance(v, str):
                yield v
            else:
                yield from uses(v)
    elif isinstance(node, list):
        for v in node:
            yield from uses(v)


def test_workflows_exist() -> None:
    assert {p.name for p in WORKFLOWS} >= {"validate.yml", "tests.yml"}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_matches_the_schema(path: Path) -> None:
    schema = workflow_schema()
    cls = validators.validator_for(schema)
    cls.check_schema(schema)
    doc = read_yaml(path)
    assert "on" in doc and True not in doc
    errors = sorted(cls(schema).iter_errors(doc), key=lambda e: list(e.absolute_path))
    assert errors == [], [f"{list(e.absolute_path)}: {e.message}" for e in errors]


def test_the_schema_catches_a_broken_workflow() -> None:
    schema = workflow_schema()
    cls = validators.validator_for(schema)
    doc = read_yaml(REPO / ".github" / "workflows" / "tests.yml")
    doc["jobs"]["tests"]["stepz"] = doc["jobs"]["tests"].pop("steps")
    assert not cls(schema).is_valid(doc)


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_action_is_pinned(path: Path) -> None:
    refs = list(uses(read_yaml(path)))
    assert refs, "no actions used?"
    for ref in refs:
        if ref.startswith(("./", "docker://")):
            continue
        assert PINNED.match(ref), f"{path.name}: '{ref}' is not pinned to a full commit SHA or an exact vX.Y.Z tag"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_sha_pins_say_which_version(path: Path) -> None:
    for line in path.read_text().splitlines():
        m = re.search(r"uses:\s*\S+@([0-9a-f]{40})(.*)$", line)
        if m:
            assert re.search(r"#\s*v\d+\.\d+\.\d+", m.group(2)), f"{path.name}: add a '# vX.Y.Z' comment: {line.strip()}"


@pytest.mark.parametrize("ref,ok", [
    ("actions/checkout@11bd71901bbe5b1630ceea73d27597364c9af683", True),
    ("actions/checkout@v4.2.2", True),
    ("actions/checkout@v4", False),
    ("actions/checkout@main", False),
    ("actions/checkout@11bd719", False),
    ("actions/checkout", False),
])
def test_pin_rule(ref: str, ok: bool) -> None:
    assert bool(PINNED.match(ref)) is ok


def test_validate_workflow_runs_what_the_design_says() -> None:
    doc = read_yaml(REPO / ".github" / "workflows" / "validate.yml")
    assert set(doc["on"]) == {"pull_request"}
    assert set(doc["on"]["pull_request"]["paths"]) == {"specs/**", "execution_templates/**", "schemas/**"}
    steps = [s for job in doc["jobs"].values() for s in job["steps"]]
    runs = [s.get("run", "") for s in steps]
    assert "pip install ." in runs
    assert "reconcile validate --format github" in runs
    assert "reconcile schema --check" in runs
    py = next(s for s in steps if s.get("uses", "").startswith("actions/setup-python@"))
    assert str(py["with"]["python-version"]) == "3.11"


def test_tests_workflow_runs_ci_run() -> None:
    doc = read_yaml(REPO / ".github" / "workflows" / "tests.yml")
    assert set(doc["on"]) == {"push", "pull_request"}
    runs = [s.get("run", "") for job in doc["jobs"].values() for s in job["steps"]]
    # GitHub's runner is not root; .ci/run needs root for sshd, dockerd and the test user.
    assert any(r.endswith("bash .ci/run") for r in runs), runs
