"""Parity with ms-swift: every invocation ms-swift's parser accepts validates, every one it refuses is refused.

The corpus (``tests/data/swift/oracle/corpus.json``, written by ``make_corpus.py`` from ms-swift's
README and argument dataclasses) holds `swift sft` / `swift rlhf` command lines, good and bad. Each
is parsed by ms-swift itself (``parse_corpus.py``, one process in the ms-swift environment) and turned
into a Run spec, the typed fields where they apply and ``args`` for the rest, one key per line; the
whole tree is then checked by one ``reconcile validate``. Accepted by ms-swift must mean no error;
refused must mean an error on the line of the argument ms-swift refused.

How a command line becomes a spec: the words after ``--name`` become the value, a list when the
option takes several or was given several, ``true`` for a bare flag; a word an int/float/bool option
reads becomes that YAML scalar (``--max_steps 10`` -> ``max_steps: 10``), anything else stays a
string, so ms-swift receives the same words back from the rendered config. ``output_dir`` and the
other keys the reconciler manages are not in the corpus (the reconciler sets them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from reconciler.spec.models.swift_values import value_problem
from reconciler.spec.models.tasks import SWIFT_OWN, SwiftRlhfTask, SwiftSftTask
from reconciler.tasks.swift import swift_argument_specs

pytestmark = pytest.mark.swift

ROOT = Path(__file__).resolve().parents[2]
ORACLE = ROOT / "tests" / "data" / "swift" / "oracle"
TEMPLATE = """\
apiVersion: reconciler/v1
kind: ExecutionTemplate
id: local-swift
placement: {kind: local}
launch_mode: {kind: host_process}
"""
# Staged data the corpus names as inputs/data/... (the reconciler refuses a path nothing stages).
HEADER = "apiVersion: reconciler/v1\nkind: Run\nmetadata: {{name: {name}}}\nspec:\n  template: local-swift\n" \
         "  inputs: [data]\n  task:\n    type: {type}\n"


def _value(spec: dict | None, words: list[str]):
    """The YAML value a user writes for ``--name words...`` (see the module docstring)."""
    if spec is None:  # not an argument: its value does not matter, the name is refused
        return words[0] if len(words) == 1 else words
    if not words:
        return True if spec.get("nargs") == "?" else []
    if spec.get("nargs") != "+" and len(words) == 1:
        word = words[0]
        if spec["type"] in ("int", "float", "bool") and value_problem("x", spec, word)[0] is None:
            return value_problem("x", spec, word)[1][0]
        return word
    return list(words)


def spec_text(entry: dict) -> tuple[str, dict[str, int]]:
    """The Run spec of one invocation, and the line each argument is written on."""
    command = entry["command"]
    model = SwiftSftTask if command == "sft" else SwiftRlhfTask
    typed = set(model.model_fields) - set(SWIFT_OWN)
    specs = swift_argument_specs(command)
    lines = HEADER.format(name=entry["name"], type="swift-" + command).splitlines()
    where: dict[str, int] = {}
    args = []
    for key, words in entry["pairs"]:
        value = _value(specs.get(key), words)
        if key in typed:
            lines.append(f"    {key}: {json.dumps(value)}")
            where[key] = len(lines)
        else:
            args.append((key, value))
    if args:
        lines.append("    args:")
        for key, value in args:
            lines.append(f"      {json.dumps(key)}: {json.dumps(value)}")
            where[key] = len(lines)
    return "\n".join(lines) + "\n", where


@pytest.fixture(scope="module")
def verdicts(swift_python: str) -> dict:
    p = subprocess.run([swift_python, str(ORACLE / "parse_corpus.py")], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


def test_validate_accepts_what_ms_swift_accepts_and_refuses_what_it_refuses(verdicts: dict, tmp_path: Path):
    corpus = json.loads((ORACLE / "corpus.json").read_text(encoding="utf-8"))["entries"]
    assert len(corpus) >= 150 and {e["command"] for e in corpus} == {"sft", "rlhf"}
    repo = tmp_path / "repo"
    (repo / "execution_templates").mkdir(parents=True)
    (repo / "execution_templates" / "local-swift.yaml").write_text(TEMPLATE)
    (repo / "specs").mkdir()
    (repo / "data").mkdir()
    for name in ("train.jsonl", "val.jsonl"):
        (repo / "data" / name).write_text('{"messages": []}\n')
    lines_of = {}
    for i, entry in enumerate(corpus):
        entry["name"] = f"oracle-{i:04d}"  # ids are not all valid run names
        text, lines_of[entry["id"]] = spec_text(entry)
        (repo / "specs" / f"{entry['name']}.yaml").write_text(text)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "reconciler", "validate", "--repo", str(repo), "--format", "json"],
                       capture_output=True, text=True, timeout=300, cwd=repo, env=env)
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    errors: dict[str, list[dict]] = {}
    for e in json.loads(r.stdout)["errors"]:
        errors.setdefault(Path(e["path"]).stem, []).append(e)
    counts, disagreements = Counter(), []
    for entry in corpus:
        v = verdicts["verdicts"][entry["id"]]
        mine = errors.get(entry["name"], [])
        counts["ms-swift accepts" if v["ok"] else "ms-swift refuses"] += 1
        counts["validate accepts" if not mine else "validate refuses"] += 1
        if v["ok"] and mine:
            disagreements.append(f"{entry['id']}: ms-swift accepts, validate says {[e['message'] for e in mine]}")
        elif not v["ok"]:
            line = lines_of[entry["id"]].get(v["arg"])
            if not any(e["line"] == line for e in mine):
                disagreements.append(f"{entry['id']}: ms-swift refuses {v['arg']} ({v['reason'][:160]}) at line "
                                     f"{line}; validate says {[(e['line'], e['message']) for e in mine]}")
    assert counts["ms-swift accepts"] >= 100 and counts["ms-swift refuses"] >= 100, counts  # both sides exercised
    counts["agreements"] = len(corpus) - len(disagreements)
    counts["disagreements"] = len(disagreements)
    print(f"\nms-swift {verdicts['ms_swift']} oracle, {len(corpus)} invocations: {dict(sorted(counts.items()))}")
    assert not disagreements, "\n".join(disagreements[:40])


def test_corpus_is_what_make_corpus_writes_for_the_installed_ms_swift(swift_python: str):
    p = subprocess.run([swift_python, str(ORACLE / "make_corpus.py")], capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout == (ORACLE / "corpus.json").read_text(encoding="utf-8"), (
        f"regenerate: {swift_python} tests/data/swift/oracle/make_corpus.py --write")
