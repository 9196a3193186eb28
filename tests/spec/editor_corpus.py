"""The corpus, the examples and the docs' examples laid out as one workspace, for the editor and
check-jsonschema tests (tests/spec/test_editor.py).

The workspace mirrors what a user's repository gives an editor: ``schemas/``, ``specs/`` and
``execution_templates/`` at its root (the examples, whose modelines name ``../../schemas/...``),
plus every corpus case under ``cases/<name>/repo/`` (the mapping's globs, ``specs/**/*.yaml``,
match at any depth, as yaml-language-server prefixes them with ``**/``).
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from tests.spec.helpers import REPO
from tests.spec.test_corpus import CASES, prepare

SETTINGS = REPO / ".vscode" / "settings.json"
DOCS = REPO / "docs" / "specs.md"
# Files too big to be worth an editor's time here: the oversized case (1.1 MB of comments).
SKIP_SETUP = {"oversized"}


def settings() -> dict:
    """The ``yaml.*`` settings of the shipped .vscode/settings.json, as a client sends them."""
    flat = json.loads(SETTINGS.read_text(encoding="utf-8"))
    out: dict = {}
    for key, value in flat.items():
        if key.startswith("yaml."):
            out[key.removeprefix("yaml.")] = value
    return out


def docs_examples() -> list[str]:
    """The YAML blocks of docs/specs.md that are whole objects (they start with apiVersion)."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.S)
    return [b for b in blocks if re.match(r"(#[^\n]*\n)*apiVersion: reconciler/v1\n", b)]


def example_files(root: Path = REPO) -> list[Path]:
    out = []
    for top in ("specs", "execution_templates", "examples"):
        out += sorted(p for p in (root / top).rglob("*") if p.suffix in (".yaml", ".yml"))
    return out


@dataclass
class Expected:
    case: str
    file: Path
    line: int  # 1-based, where the editor should mark it
    message: str
    path: str  # the dotted path the code reports ('' when its message has none)


@dataclass
class Workspace:
    root: Path
    schema_errors: list[Expected] = field(default_factory=list)  # what the schema must refuse
    invalid: dict[Path, str] = field(default_factory=dict)  # every file with an expected error → its case
    valid: list[Path] = field(default_factory=list)  # files nothing should be reported for
    all_schema: set[Path] = field(default_factory=set)  # files whose every expected error is a schema one


def build(root: Path) -> Workspace:
    """Copy the schemas, the examples (as they are, and without their modelines, so the settings
    mapping is what applies), the docs' examples and every corpus case into ``root``."""
    ws = Workspace(root)
    shutil.copytree(REPO / "schemas", root / "schemas")
    for path in example_files():
        rel = path.relative_to(REPO)
        for base, strip in ((root, False), (root / "bare", True)):
            dst = base / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            text = path.read_text(encoding="utf-8")
            if strip:
                text = re.sub(r"\A# yaml-language-server:[^\n]*\n", "", text)
            dst.write_text(text, encoding="utf-8")
            ws.valid.append(dst)
    for i, text in enumerate(docs_examples()):
        dst = root / "docs" / "specs" / f"example-{i}.yaml"
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(text, encoding="utf-8")
        ws.valid.append(dst)
    for name, case in CASES.items():
        if case.get("setup") in SKIP_SETUP:
            continue
        repo = prepare(name, root / "cases" / name)
        expected: dict[Path, list[dict]] = {}
        for e in case["expect"]:
            expected.setdefault(repo / e["file"], []).append(e)
        spec_files = [p for top in ("specs", "execution_templates") for p in sorted((repo / top).rglob("*"))
                      if p.suffix in (".yaml", ".yml") and p.is_file()]
        for path in spec_files:
            if path not in expected:
                ws.valid.append(path)
        for path, es in expected.items():
            ws.invalid[path] = name
            if all(e.get("schema") for e in es):
                ws.all_schema.add(path)
            for e in es:
                if e.get("schema"):
                    where = re.match(r"^([\w.\[\]-]+): ", e["message"])
                    ws.schema_errors.append(Expected(name, path, e.get("editor_line", e["line"]), e["message"],
                                                     where.group(1) if where else ""))
    return ws


def schema_cases() -> list[str]:
    return sorted({n for n, c in CASES.items() if any(e.get("schema") for e in c["expect"])})

