"""``reconcile stop|start|restart|ssh|init`` on real repositories and real runs on this machine."""

from __future__ import annotations

from pathlib import Path

import git
import pytest

from tests.cli.test_cli import run
from tests.repo_helpers import make_repo, pass_until, reconciler as make_reconciler, run_spec, status_of

COMMENTED = run_spec("train", ["sh", "-c", "exit 3"]).replace("kind: Run", "kind: Run   # our first run", 1)


def _head(repo: Path) -> git.Commit:
    return git.Repo(repo).head.commit


def test_stop_commits_one_field_and_keeps_the_users_comments(tmp_path):
    repo = make_repo(tmp_path / "repo", {"train": COMMENTED})
    before = _head(repo).hexsha
    r = run("stop", "train", "--repo", str(repo))
    assert r.returncode == 0, r.stderr
    text = (repo / "specs/runs/train.yaml").read_text()
    assert "desiredState: Stopped" in text and "# our first run" in text
    head = _head(repo)
    assert head.parents[0].hexsha == before
    assert head.message.startswith("Stop run train")
    assert list(head.stats.files) == ["specs/runs/train.yaml"]
    assert git.Repo(repo).git.status("--porcelain") == ""
    again = run("stop", "train", "--repo", str(repo))
    assert again.returncode == 2 and "already stopped" in again.stderr
    started = run("start", "train", "--repo", str(repo))
    assert started.returncode == 0, started.stderr
    assert "desiredState: Running" in (repo / "specs/runs/train.yaml").read_text()
    assert run("validate", "--repo", str(repo)).returncode == 0


def test_patch_writes_nothing_and_a_dirty_spec_is_refused(tmp_path):
    repo = make_repo(tmp_path / "repo", {"train": COMMENTED})
    before = (repo / "specs/runs/train.yaml").read_text()
    r = run("restart", "train", "--patch", "--repo", str(repo))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("--- a/specs/runs/train.yaml") and "+  restartedAt: " in r.stdout
    assert (repo / "specs/runs/train.yaml").read_text() == before
    (repo / "specs/runs/train.yaml").write_text(before + "# an edit in progress\n")
    head = _head(repo).hexsha
    r = run("stop", "train", "--repo", str(repo))
    assert r.returncode == 2 and "uncommitted changes" in r.stderr
    assert _head(repo).hexsha == head
    assert (repo / "specs/runs/train.yaml").read_text().endswith("# an edit in progress\n")


def test_unknown_run_says_so_with_a_suggestion(tmp_path):
    repo = make_repo(tmp_path / "repo", {"train": COMMENTED})
    r = run("restart", "trian", "--repo", str(repo))
    assert r.returncode == 2 and "did you mean 'train'" in r.stderr
    assert "Traceback" not in r.stderr


def test_restart_runs_a_failed_run_again_as_a_new_generation(tmp_path):
    repo = make_repo(tmp_path / "repo", {"train": COMMENTED})
    ws = tmp_path / "ws"
    rec = make_reconciler(repo, ws)
    pass_until(rec, "train", "Failed")
    assert status_of(repo, "train").generation == 1
    r = run("restart", "train", "--repo", str(repo))
    assert r.returncode == 0, r.stderr
    assert "restartedAt" in _head(repo).message
    st = pass_until(make_reconciler(repo, ws), "train", "Failed")
    assert st.generation == 2 and st.attempt == 1


def test_ssh_runs_a_command_in_the_workspace_of_a_local_run(world):
    repo, env = world
    r = run("ssh", "hello", "--repo", str(repo), "--", "sh", "-c", "pwd; ls runtime", env=env)
    assert r.returncode == 0, r.stderr
    st = status_of(repo, "hello")
    assert r.stdout.splitlines()[0] == st.handle.workspace
    assert "result.json" in r.stdout
    bad = run("ssh", "hello", "--node", "3", "--repo", str(repo), "--", "true", env=env)
    assert bad.returncode == 2 and "no node 3" in bad.stderr


def test_ssh_gets_an_allowlisted_environment(world, monkeypatch):
    repo, env = world
    r = run("ssh", "hello", "--repo", str(repo), "--", "env", env={**env, "PROVIDER_TOKEN": "s3cr3t-value"})
    assert r.returncode == 0, r.stderr
    assert "s3cr3t-value" not in r.stdout and "PATH=" in r.stdout


def test_init_makes_a_repository_that_validates_and_plans(tmp_path):
    target = tmp_path / "team-runs"
    r = run("init", str(target))
    assert r.returncode == 0, r.stderr
    for rel in ("specs/runs/hello.yaml", "specs/policy.yaml", "execution_templates/local-host.yaml",
                ".github/workflows/validate.yml", ".github/workflows/plan.yml", ".vscode/settings.json",
                "schemas/run.schema.json", ".gitignore"):
        assert (target / rel).is_file(), rel
    assert (target / ".git").is_dir()
    assert run("validate", "--repo", str(target)).returncode == 0
    assert run("schema", "--check", "--repo", str(target)).returncode == 0
    plan = run("plan", "--offline", "--repo", str(target))
    assert plan.returncode == 0, plan.stderr
    assert "hello" in plan.stdout
    (target / "specs/policy.yaml").write_text("# ours\n")
    again = run("init", str(target))
    assert again.returncode == 0 and "kept specs/policy.yaml" in again.stdout
    assert (target / "specs/policy.yaml").read_text() == "# ours\n"


@pytest.mark.parametrize("action", ["stop", "start", "restart"])
def test_steering_needs_a_run_name(action):
    r = run(action)
    assert r.returncode == 2
