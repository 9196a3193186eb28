"""Every malformed input in tests/spec/corpus/ through the command line's entry point.

Each case is a small repository (cases.yaml says what it holds and what must be reported). The test
copies it to a temporary folder, does the case's setup step (a symlink or a big file: neither belongs
in git), calls ``reconciler.cli.main.main(["validate", "--repo", CASE])`` in this process and checks the
exit code, every expected ``file:line:col: message`` and that main returned (an exception escaping
it is what the command line would print as a traceback). In-process because an interpreter start
per case cost far more than the validation itself; validate keeps no state between calls (paths
are resolved from ``--repo``, the loader gets no cache), so the cases cannot see each other.
``test_command_line_prints_what_main_returns`` runs a few cases through ``python -m reconciler``
to keep the real command line covered.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from reconciler.cli import main as cli
from tests.spec.helpers import run_cli

CORPUS = Path(__file__).parent / "corpus"
CASES: dict = yaml.safe_load((CORPUS / "cases.yaml").read_text(encoding="utf-8"))


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def validate(repo: Path, *extra: str) -> Result:
    """``reconcile validate --repo REPO EXTRA...`` in this process, its output captured."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main(["validate", "--repo", str(repo), *extra])
    r = Result(code, out.getvalue(), err.getvalue())
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    return r


def validate_subprocess(repo: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_cli("validate", "--repo", str(repo), *extra, cwd=repo)


def prepare(name: str, tmp: Path) -> Path:
    repo = tmp / "repo"
    shutil.copytree(CORPUS / name, repo, ignore=shutil.ignore_patterns(".gitkeep"))
    setup = CASES[name].get("setup")
    if setup == "symlink-escape":
        outside = tmp / "outside.txt"
        outside.write_text("not in the repository\n")
        (repo / "data" / "escape").symlink_to(outside)
    elif setup == "oversized":
        (repo / "specs").mkdir(exist_ok=True)
        # A valid head and 1.1 MB of comments: only the size is wrong.
        (repo / "specs" / "huge.yaml").write_text("apiVersion: reconciler/v1\nkind: Run\n" + "# padding\n" * 110_000)
    elif setup is not None:
        raise AssertionError(f"unknown setup {setup!r} in cases.yaml")
    return repo


def test_corpus_is_complete() -> None:
    folders = {p.name for p in CORPUS.iterdir() if p.is_dir()}
    assert folders == set(CASES), f"folders without a case: {folders - set(CASES)}; cases without a folder: {set(CASES) - folders}"
    assert len(CASES) >= 45
    for name, case in CASES.items():
        assert case.get("expect"), f"{name}: no expected diagnostics"


@pytest.mark.parametrize("name", sorted(CASES))
def test_case(name: str, tmp_path: Path) -> None:
    r = validate(prepare(name, tmp_path))
    assert r.returncode == 1, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    lines = [ln for ln in r.stdout.splitlines() if not re.match(r"^\d+ error\(s\) in", ln)]
    expected = CASES[name]["expect"]
    for e in expected:
        where = f"{e['file']}:{e['line']}:{e['col']}: " if e["line"] else f"{e['file']}: "
        hits = [ln for ln in lines if ln.startswith(where) and e["message"] in ln]
        assert hits, f"expected {where}...{e['message']}...\ngot:\n{r.stdout}"
    # Nothing beyond what the case expects: a spurious error is a bug too.
    assert len(lines) == len(expected), f"expected {len(expected)} diagnostic(s), got:\n{r.stdout}"
    assert re.search(rf"^{len(expected)} error\(s\) in \d+ file\(s\)", r.stdout, re.M), r.stdout


@pytest.mark.parametrize("name", ["yaml-duplicate-key", "template-itself-invalid", "oversized-file"])
def test_github_format(name: str, tmp_path: Path) -> None:
    repo = prepare(name, tmp_path)
    r = validate(repo, "--format", "github")
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    expected = CASES[name]["expect"]
    assert len(lines) == len(expected), r.stdout
    for line, e in zip(lines, expected):
        m = re.fullmatch(r"::error file=([^,:]+)(?:,line=(\d+),col=(\d+))?::(.+)", line)
        assert m, f"not a GitHub annotation: {line!r}"
        assert m.group(1) == e["file"]
        if e["line"]:
            assert (int(m.group(2)), int(m.group(3))) == (e["line"], e["col"])
        else:
            assert m.group(2) is None
        assert e["message"] in m.group(4)
        assert "\n" not in m.group(4)


def test_json_format(tmp_path: Path) -> None:
    name = "template-itself-invalid"
    repo = prepare(name, tmp_path)
    r = validate(repo, "--format", "json")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert set(doc) == {"valid", "files_checked", "errors"}
    assert doc["valid"] is False
    assert doc["files_checked"] == 2
    expected = CASES[name]["expect"]
    assert [(e["path"], e["line"], e["col"]) for e in doc["errors"]] == [(e["file"], e["line"], e["col"]) for e in expected]
    for got, e in zip(doc["errors"], expected):
        assert set(got) == {"path", "line", "col", "message"}
        assert e["message"] in got["message"]


def test_all_cases_in_one_repository_are_independent(tmp_path: Path) -> None:
    """One malformed file never hides another's errors: the YAML-level cases, merged into one tree,
    report exactly the union of their diagnostics."""
    repo = tmp_path / "repo"
    (repo / "execution_templates").mkdir(parents=True)
    shutil.copy(CORPUS / "yaml-syntax-error" / "execution_templates" / "local-host.yaml", repo / "execution_templates")
    want = []
    for name in sorted(CASES):
        if not name.startswith("yaml-"):
            continue
        for src in (CORPUS / name / "specs").rglob("*.yaml"):
            dst = repo / src.relative_to(CORPUS / name)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dst)
        want += CASES[name]["expect"]
    r = validate(repo)
    assert r.returncode == 1
    for e in want:
        assert f"{e['file']}:{e['line']}:{e['col']}: " in r.stdout, e
    assert re.search(rf"^{len(want)} error\(s\)", r.stdout, re.M), r.stdout


@pytest.mark.parametrize("name, extra", [("yaml-duplicate-key", ()), ("input-symlink-escapes", ("--format", "github"))])
def test_command_line_prints_what_main_returns(name: str, extra: tuple[str, ...], tmp_path: Path) -> None:
    """The real command line (``python -m reconciler``, run in the case's folder) does what main does
    in this process: same exit code, same output, no traceback."""
    repo = prepare(name, tmp_path)
    real = validate_subprocess(repo, *extra)
    assert "Traceback" not in real.stdout + real.stderr, real.stdout + real.stderr
    here = validate(repo, *extra)
    assert (real.returncode, real.stdout, real.stderr) == (here.returncode, here.stdout, here.stderr)
    assert real.returncode == 1 and real.stdout
