"""JSON Schemas generated from the models, so editors and CI check specs against the same truth.

Schemas are never edited by hand: ``reconcile schema`` writes them and ``reconcile schema --check``
fails when the committed files drifted from the models.
"""

from __future__ import annotations

import json
from pathlib import Path

from .models import KINDS

FILE_NAMES = {"Run": "run", "ExecutionTemplate": "execution-template", "Fleet": "fleet"}
SCHEMA_BASE = "https://reconciler.dev/schemas/v1/"


def generate() -> dict[str, str]:
    """File name → schema text (stable: sorted keys, trailing newline)."""
    out = {}
    for kind, model in KINDS.items():
        schema = model.model_json_schema(mode="validation")
        schema = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": SCHEMA_BASE + f"{FILE_NAMES[kind]}.schema.json",
            **schema,
        }
        out[f"{FILE_NAMES[kind]}.schema.json"] = json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    return out


def _stale(directory: Path) -> dict[str, str]:
    """File name → schema text, for the files that are missing or differ from what the models generate."""
    return {name: text for name, text in generate().items()
            if not (path := directory / name).exists() or path.read_text(encoding="utf-8") != text}


def write(directory: Path) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    stale = _stale(directory)
    for name, text in stale.items():
        tmp = (directory / name).with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(directory / name)
    return list(stale)


def drift(directory: Path) -> list[str]:
    """Names of schema files that are missing or differ from what the models generate."""
    return list(_stale(directory))
