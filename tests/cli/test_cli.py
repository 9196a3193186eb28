"""The command line's conventions, through the real ``reconcile`` process: --version, global
options before or after the command, --json where it does something (with the shapes docs/cli.md
documents), exit codes of --once, typo suggestions, the logs' tail notice and shell completion."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import reconciler
from reconciler.cli import main as cli
from tests.repo_helpers import make_repo, run_spec

REPO = Path(__file__).resolve().parents[2]
# Six lines on stdout, the last without its newline; one on stderr.
JOB = ["sh", "-c", "for i in 1 2 3 4 5; do echo line $i; done; echo oops >&2; printf tail"]


def run(*args: str, cwd: Path | None = None, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    """``python -m reconciler ARGS`` from this checkout; a traceback fails the test whatever the exit code."""
    full = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    r = subprocess.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True, env=full,
                       cwd=cwd or REPO, timeout=60, **kw)
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    return r


# ---------------------------------------------------------------- --version


def test_version_is_the_installed_distributions() -> None:
    r = run("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"reconcile {importlib.metadata.version('gpu-reconciler')}\n"
    assert importlib.metadata.version("gpu-reconciler") == reconciler.__version__  # one source: pyproject's dynamic


# ---------------------------------------------------------------- global options


@pytest.mark.parametrize("command", ["plan", "status", "logs", "provenance", "config"])
def test_global_options_mean_the_same_before_and_after_the_command(command: str) -> None:
    extra = ["hello"] if command in ("logs", "provenance") else []
    opts = ["--repo", "R", "--config", "C.yaml", "--json"] + (["--log-format", "json"] if command == "plan" else [])
    before = cli.parse([*opts, command, *extra])
    after = cli.parse([command, *extra, *opts])
    for k in ("repo", "config", "json", "log_format"):
        assert getattr(before[1], k) == getattr(after[1], k), k
    assert before[0] == after[0] == command
    assert (after[1].repo, after[1].config, after[1].json) == ("R", "C.yaml", True)
    # Given on both sides, the one after the command wins; left out, the default.
    assert cli.parse(["--repo", "A", command, *extra, "--repo", "B"])[1].repo == "B"
    assert cli.parse([command, *extra])[1].repo is None


def test_repo_before_validate_and_the_pass() -> None:
    assert cli.parse(["--repo", "R", "validate", "x.yaml"])[1].repo == "R"
    assert cli.parse(["validate", "--repo", "R"])[1].repo == "R"
    cmd, ns = cli.parse(["--json", "--once", "--repo", "R", "--no-commit"])
    assert (cmd, ns.json, ns.repo, ns.no_commit, ns.dry_run) == ("once", True, "R", True, False)
    assert cli.parse(["--repo", "R"])[0] == "daemon"


def test_global_options_before_and_after_print_the_same(world) -> None:
    repo, env = world
    elsewhere = repo.parent  # not the repository: only --repo says where it is
    for command in (["status"], ["plan"], ["config"]):
        a = run("--repo", str(repo), "--json", *command, cwd=elsewhere, env=env)
        b = run(*command, "--json", "--repo", str(repo), cwd=elsewhere, env=env)
        assert a.returncode == b.returncode == 0, a.stderr + b.stderr
        doc = json.loads(a.stdout)
        if command != ["plan"]:  # a plan carries its time
            assert a.stdout == b.stdout
        else:
            assert doc["changes"] and json.loads(b.stdout)["changes"] == doc["changes"]
    assert "hello" in json.loads(run("--repo", str(repo), "status", "--json", env=env).stdout)


@pytest.mark.parametrize("args, message", [
    (["--json"], "reconcile: --json does not apply to the daemon (use --log-format json for its log lines)"),
    (["--json", "completion", "bash"], "reconcile: --json does not apply to 'completion'"),
    (["schema", "--json"], "reconcile schema: error: unrecognized arguments: --json"),
    (["--config", "c.yaml", "schema"], "reconcile: --config does not apply to 'schema'"),
    (["status", "--log-format", "json"], "reconcile status: error: unrecognized arguments: --log-format"),
    (["--once", "status"], "reconcile: --once runs one pass and takes no command ('status' is one)"),
    (["status", "--once"], "reconcile status: error: unrecognized arguments: --once"),
    (["--once", "--listen", "127.0.0.1:0"], "reconcile: --listen does not apply to --once"),
    (["--dry-run"], "reconcile: --dry-run needs --once (or use 'reconcile plan')"),
    (["plan", "--dry-run"], "reconcile plan: error: unrecognized arguments: --dry-run"),
    (["logs", "hello", "--lines", "-1"], "reconcile: --lines must be 0 (all) or more"),
    (["completion", "tcsh"], "reconcile completion: error: argument SHELL: invalid choice: 'tcsh'"),
])
def test_options_where_they_do_nothing_are_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    r = run(*args, cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr and r.stdout == ""


# ---------------------------------------------------------------- typos


@pytest.mark.parametrize("args, word, suggestion", [
    (["stauts"], "stauts", "status"),
    (["--repo", "/tmp", "provenence", "x"], "provenence", "provenance"),
    (["--repo=/tmp", "vaildate"], "vaildate", "validate"),
    (["--rep", "/tmp", "--json", "lgos", "x"], "lgos", "logs"),  # an abbreviated option still takes its value
    (["complete", "bash"], "complete", "completion"),
])
def test_a_mistyped_command_is_named_with_the_nearest(args: list[str], word: str, suggestion: str) -> None:
    r = run(*args)
    assert r.returncode == 2
    assert r.stderr == f"reconcile: unknown command {word!r}; did you mean {suggestion!r}?\n" and r.stdout == ""


def test_an_unknown_command_with_no_near_one_lists_them() -> None:
    r = run("frobnicate")
    assert r.returncode == 2 and "did you mean" not in r.stderr
    assert r.stderr.startswith("reconcile: unknown command 'frobnicate' (commands: validate, schema, plan, status,")


def test_main_returns_the_exit_code_instead_of_raising(capsys) -> None:
    assert cli.main(["--help"]) == 0
    assert "global options" in capsys.readouterr().out.lower()
    assert cli.main(["stauts"]) == 2
    assert cli.main(["status", "--bogus"]) == 2


# ---------------------------------------------------------------- --once exit codes


def test_once_exits_1_when_an_action_of_the_pass_failed(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"ok": run_spec("ok", ["true"])})
    (tmp_path / "file").write_text("a file where the workspaces should be\n")
    env = {"RECONCILER_WORKSPACE_ROOT": str(tmp_path / "file" / "ws"), "RECONCILER_NAMESPACE": "test"}
    plan = run("plan", "--repo", str(repo), env=env)
    assert plan.returncode == 0 and "+ launch" in plan.stdout  # a dry run has no action to fail
    r = run("--once", "--repo", str(repo), env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "error: ok: launch failed (will retry)" in r.stdout
    assert "Committed 1 status file(s)" in r.stdout  # the pass still wrote what happened
    r = run("--once", "--json", "--repo", str(repo), env=env)
    assert r.returncode == 1, r.stderr
    outcomes = json.loads(r.stdout)["outcomes"]
    assert [(o["name"], o["ok"]) for o in outcomes] == [("ok", False)] and outcomes[0]["error"]


def test_once_exits_0_when_runs_only_wait(tmp_path: Path, ws_root: Path) -> None:
    spec = run_spec("later", ["true"], extra="  secrets: [RC_TEST_UNSET_SECRET]\n")
    repo = make_repo(tmp_path / "repo", {"later": spec})
    env = {"RECONCILER_WORKSPACE_ROOT": str(ws_root), "RECONCILER_NAMESPACE": "test"}
    r = run("--once", "--repo", str(repo), env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ". wait" in r.stdout and "error:" not in r.stdout


# ---------------------------------------------------------------- JSON shapes, as documented


def documented_shapes() -> dict[str, object]:
    text = (REPO / "docs" / "cli.md").read_text()
    found = re.findall(r"<!-- shape: ([\w-]+) -->\n```json\n(.*?)```", text, re.S)
    shapes = {name: json.loads(body) for name, body in found}
    assert set(shapes) == {"plan", "once", "status", "logs", "provenance-diff"}, set(shapes)
    return shapes


def test_json_output_has_exactly_the_documented_keys(world) -> None:
    repo, env = world
    shapes = documented_shapes()
    printed = {
        "plan": json.loads(run("plan", "--json", "--repo", str(repo), env=env).stdout),
        "once": json.loads(run("--once", "--json", "--repo", str(repo), env=env).stdout),
        "status": json.loads(run("status", "hello", "--json", "--repo", str(repo), env=env).stdout),
        "logs": json.loads(run("logs", "hello", "--json", "--repo", str(repo), env=env).stdout.splitlines()[0]),
        "provenance-diff": json.loads(run("provenance", "hello", "--diff", "hello", "--json", "--repo", str(repo),
                                          env=env).stdout),
    }
    for name, doc in printed.items():
        assert sorted(doc) == sorted(shapes[name]), name
    assert sorted(printed["plan"]["changes"][0]) == sorted(shapes["plan"]["changes"][0])
    assert sorted(printed["once"]["outcomes"][0] if printed["once"]["outcomes"] else shapes["once"]["outcomes"][0]) \
        == sorted(shapes["once"]["outcomes"][0])
    # Without NAME: the same documents, by run name.
    everything = json.loads(run("status", "--json", "--repo", str(repo), env=env).stdout)
    assert everything == {"hello": printed["status"]}


def test_config_and_provenance_print_json_with_or_without_json(world) -> None:
    repo, env = world
    for args in (["config"], ["provenance", "hello"]):
        plain = run(*args, "--repo", str(repo), env=env)
        asked = run(*args, "--json", "--repo", str(repo), env=env)
        assert plain.returncode == asked.returncode == 0, plain.stderr + asked.stderr
        assert json.loads(plain.stdout) == json.loads(asked.stdout) and isinstance(json.loads(plain.stdout), dict)


# ---------------------------------------------------------------- logs


def test_logs_say_when_they_show_only_the_tail(world) -> None:
    repo, env = world
    r = run("logs", "hello", "-n", "2", "--repo", str(repo), env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "line 5\ntail\noops\n"
    assert r.stderr == "reconcile logs: showing the last 2 lines of 6 of stdout.log; use --lines 0 for all\n"
    for args in (["--lines", "0"], [], ["-n", "6"]):  # all of it: no notice
        r = run("logs", "hello", *args, "--repo", str(repo), env=env)
        assert r.returncode == 0 and r.stderr == "", r.stderr
        assert r.stdout == "line 1\nline 2\nline 3\nline 4\nline 5\ntail\noops\n"


def test_logs_json_is_one_object_per_line(world) -> None:
    repo, env = world
    r = run("logs", "hello", "--json", "--repo", str(repo), env=env)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert rows == [{"stream": "stdout", "line": f"line {i}"} for i in range(1, 6)] + [
        {"stream": "stdout", "line": "tail"}, {"stream": "stderr", "line": "oops"}]
    r = run("logs", "hello", "--json", "--stream", "stdout", "-n", "1", "--repo", str(repo), env=env)
    assert [json.loads(x) for x in r.stdout.splitlines()] == [{"stream": "stdout", "line": "tail"}]
    assert "showing the last 1 lines of 6 of stdout.log" in r.stderr


def test_json_lines_hold_a_partial_line_until_it_is_complete(capsys) -> None:
    from reconciler.cli.logs import _JsonLines

    out = _JsonLines()
    out.write("stdout", "a\nb", final=False)
    out.write("stderr", "x\n", final=False)
    out.write("stdout", "c\nd", final=False)
    out.flush()
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert rows == [{"stream": "stdout", "line": "a"}, {"stream": "stderr", "line": "x"},
                    {"stream": "stdout", "line": "bc"}, {"stream": "stdout", "line": "d"}]


# ---------------------------------------------------------------- shell completion


def complete(line: str, cwd: Path = REPO) -> list[str]:
    """argcomplete's protocol as its shell function drives it: the line and the cursor in the
    environment, the candidates written to file descriptor 8, separated by _ARGCOMPLETE_IFS."""
    r_fd, w_fd = os.pipe()
    env = {**os.environ, "PYTHONPATH": str(REPO), "_ARGCOMPLETE": "1", "_ARGCOMPLETE_IFS": "\n",
           "COMP_LINE": line, "COMP_POINT": str(len(line)), "_ARGCOMPLETE_SUPPRESS_SPACE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "reconciler"], env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, close_fds=False, preexec_fn=lambda: os.dup2(w_fd, 8))
    os.close(w_fd)
    with os.fdopen(r_fd) as f:
        out = f.read()
    err = proc.communicate(timeout=30)[1]
    assert proc.returncode == 0, err
    return out.split("\n") if out else []


def test_completion_protocol_gives_commands_options_and_run_names(world) -> None:
    repo, _ = world
    assert complete("reconcile st") == ["status", "stop", "start"]
    assert set(complete("reconcile ")) >= set(cli.SUBCOMMANDS)
    assert complete("reconcile p") == ["plan", "provenance"]
    assert set(complete("reconcile status --")) >= {"--repo", "--config", "--json"}
    assert "--json" in complete("reconcile validate --")  # --format json's other spelling
    assert "--json" not in complete("reconcile schema --")  # not offered where it is refused
    assert complete("reconcile logs --stream std") == ["stdout", "stderr"]
    assert complete("reconcile logs h", cwd=repo) == ["hello"]
    offered = complete(f"reconcile --repo {repo} provenance ", cwd=REPO)
    assert [c for c in offered if not c.startswith("-")] == ["hello"] and "--diff" in offered
    assert complete("reconcile completion ") == ["-h", "--help", "bash", "zsh", "fish"]


def test_bash_completion_script_completes_for_real(tmp_path: Path) -> None:
    bash = shutil.which("bash")
    assert bash, "bash is needed"
    exe = Path(sys.executable).parent / "reconcile"
    assert exe.is_file(), f"{exe}: install the package (pip install -e .) for its console script"
    script = tmp_path / "complete.sh"
    script.write_text(r'''
eval "$(reconcile completion bash)"
complete -p reconcile
COMP_LINE="reconcile stat"; COMP_POINT=${#COMP_LINE}; COMP_WORDS=(reconcile stat); COMP_CWORD=1
_python_argcomplete reconcile stat reconcile 2>/dev/null
printf 'reply:%s\n' "${COMPREPLY[@]}"
''')
    env = {**os.environ, "PATH": f"{exe.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    r = subprocess.run([bash, "--norc", str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "-F _python_argcomplete reconcile" in r.stdout
    assert [x for x in r.stdout.splitlines() if x.startswith("reply:")] == ["reply:status "]


@pytest.mark.parametrize("shell, registers", [("zsh", "compdef _python_argcomplete reconcile"),
                                              ("fish", "complete --command reconcile")])
def test_zsh_and_fish_scripts(shell: str, registers: str) -> None:
    r = run("completion", shell)
    assert r.returncode == 0 and registers in r.stdout
    if shutil.which(shell):  # the shell parses it
        check = subprocess.run([shell, "-n"], input=r.stdout, capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stderr
