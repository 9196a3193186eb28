"""One spelling and one answer across the commands, through the real ``reconcile`` process:
``--json`` for validate too, the same exit code and message for a run NAME that is not there,
and ``plan --detailed-exitcode`` doing what docs/cli.md says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_cli import REPO, run
from tests.repo_helpers import make_repo, run_spec
from tests.spec.helpers import TEMPLATE, run_text, write


# ---------------------------------------------------------------- validate --json


@pytest.fixture
def specs(tmp_path: Path) -> Path:
    """One valid run and one naming a template that is not there."""
    write(tmp_path, "execution_templates/local-host.yaml", TEMPLATE)
    write(tmp_path, "specs/runs/good.yaml", run_text("good"))
    write(tmp_path, "specs/runs/dangling.yaml", run_text("dangling", template="gone"))
    return tmp_path


def test_validate_json_is_format_json_before_or_after_the_command(specs: Path) -> None:
    alias = run("validate", "--format", "json", cwd=specs)
    assert alias.returncode == 1, alias.stderr
    doc = json.loads(alias.stdout)
    assert doc["valid"] is False and [e["path"] for e in doc["errors"]] == ["specs/runs/dangling.yaml"]
    for args in (["validate", "--json"], ["--json", "validate"], ["validate", "--json", "--format", "json"],
                 ["--repo", str(specs), "--json", "validate"]):
        r = run(*args, cwd=specs)
        assert (r.returncode, r.stdout, r.stderr) == (1, alias.stdout, ""), args


def test_validate_keeps_its_text_and_github_formats(specs: Path) -> None:
    text = run("validate", cwd=specs)
    assert text.returncode == 1 and "specs/runs/dangling.yaml:6:3: spec.template: template 'gone'" in text.stdout
    assert run("validate", "--format", "text", cwd=specs).stdout == text.stdout
    github = run("validate", "--format", "github", cwd=specs)
    assert github.returncode == 1
    assert github.stdout.startswith("::error file=specs/runs/dangling.yaml,line=6,col=3::spec.template:")
    (specs / "specs/runs/dangling.yaml").unlink()
    valid = run("--json", "validate", cwd=specs)
    assert valid.returncode == 0 and json.loads(valid.stdout)["valid"] is True


@pytest.mark.parametrize("args", [["validate", "--json", "--format", "github"],
                                  ["--json", "validate", "--format", "text"]])
def test_validate_json_with_another_format_is_a_usage_error(specs: Path, args: list[str]) -> None:
    r = run(*args, cwd=specs)
    assert r.returncode == 2 and r.stdout == ""
    fmt = args[-1]
    assert r.stderr == f"reconcile: --json and --format {fmt} disagree; give one of them\n"


# ---------------------------------------------------------------- a run that is not there


NAMED = [["status", "{}"], ["status", "{}", "--json"], ["logs", "{}"], ["logs", "{}", "--json"],
         ["provenance", "{}"], ["provenance", "hello", "--diff", "{}"], ["explain", "{}"], ["explain", "{}", "--json"],
         ["artifacts", "{}"], ["reproduce", "{}"], ["stop", "{}"], ["start", "{}"], ["restart", "{}"], ["ssh", "{}"]]


@pytest.mark.parametrize("args", NAMED, ids=lambda a: " ".join(a))
def test_a_mistyped_run_is_exit_2_with_the_nearest_name(world, args: list[str]) -> None:
    repo, env = world
    r = run(*[a.format("helo") for a in args], "--repo", str(repo), env=env)
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr == "reconcile: no run 'helo' (did you mean 'hello'?)\n"


@pytest.mark.parametrize("args", NAMED, ids=lambda a: " ".join(a))
def test_a_run_with_no_near_name_is_exit_2_without_a_guess(world, args: list[str]) -> None:
    repo, env = world
    r = run(*[a.format("zzzzzz") for a in args], "--repo", str(repo), env=env)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", "reconcile: no run 'zzzzzz'\n")


def test_the_runs_that_are_there_still_answer(world) -> None:
    repo, env = world
    for args in (["status", "hello"], ["logs", "hello"], ["provenance", "hello"], ["explain", "hello"],
                 ["provenance", "hello", "--diff", "hello-g1-a1"]):
        r = run(*args, "--repo", str(repo), env=env)
        assert r.returncode == 0 and r.stdout, (args, r.stderr)
    # An identity is looked up among the manifests, not the status files: its own message, exit 1.
    r = run("provenance", "hello-g9-a9", "--repo", str(repo), env=env)
    assert r.returncode == 1 and r.stderr.startswith("reconcile provenance: hello-g9-a9 has no artifacts/manifest")


def test_the_docs_give_the_same_exit_code_for_a_run_that_is_not_there() -> None:
    text = (REPO / "docs" / "cli.md").read_text()
    codes = {row.split("|")[1].strip(): row for row in text.splitlines() if row.startswith("| ") and "|" in row[2:]}
    assert "a run NAME that is not there" in codes["2"] and "no such run" not in codes["1"]
    assert "`reconcile: no run 'helo' (did you mean 'hello'?)`" in text


# ---------------------------------------------------------------- plan --detailed-exitcode


def test_plan_detailed_exitcode_does_what_the_docs_say(world, tmp_path: Path) -> None:
    repo, env = world
    for offline in ([], ["--offline"]):
        settled = run("plan", "--detailed-exitcode", *offline, "--repo", str(repo), env=env)
        assert settled.returncode == 0, settled.stdout + settled.stderr
        assert run("plan", *offline, "--repo", str(repo), env=env).returncode == 0
    fresh = make_repo(tmp_path / "fresh", {"new": run_spec("new", ["true"])})
    env = {**env, "RECONCILER_WORKSPACE_ROOT": str(tmp_path / "ws")}
    for offline in ([], ["--offline"]):
        changes = run("plan", "--detailed-exitcode", *offline, "--repo", str(fresh), env=env)
        assert changes.returncode == 2 and "launch" in changes.stdout, changes.stdout + changes.stderr
        assert run("plan", *offline, "--repo", str(fresh), env=env).returncode == 0  # without it: 0 whatever it plans
    text = (REPO / "docs" / "cli.md").read_text()
    assert "There is no `-detailed-exitcode`" not in text
    assert text.count("`--detailed-exitcode` (with or without `--offline`)") == 1


def test_status_name_is_a_row_and_o_chooses_yaml_or_json(world):
    repo, env = world
    r = run("status", "hello", "--repo", str(repo), env=env)
    assert r.returncode == 0, r.stderr
    header, row = r.stdout.splitlines()
    assert header.split() == ["NAME", "PHASE", "GEN/ATT", "MACHINE", "AGE", "SINCE", "MESSAGE"]
    assert row.split()[:4] == ["hello", "Succeeded", "1/1", "local"]
    y = run("status", "hello", "-o", "yaml", "--repo", str(repo), env=env)
    assert "kind: RunStatus" in y.stdout and "created_at: " in y.stdout
    j = run("status", "hello", "-o", "json", "--repo", str(repo), env=env)
    assert json.loads(j.stdout)["name"] == "hello"
    assert json.loads(j.stdout) == json.loads(run("status", "hello", "--json", "--repo", str(repo), env=env).stdout)
    clash = run("status", "hello", "-o", "yaml", "--json", "--repo", str(repo), env=env)
    assert clash.returncode == 2 and "disagree" in clash.stderr
