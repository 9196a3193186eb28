"""``reconcile plan --offline``: the plan from the specs and the committed status files alone, as a
pull request's CI job runs it (no SSH, no secrets), with terraform-like exit codes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reconciler.status import store as statuses
from reconciler.spec.load import load_tree
from tests.infra._proc import free_port

TEMPLATE = textwrap.dedent("""\
    apiVersion: reconciler/v1
    kind: ExecutionTemplate
    id: ssh-host
    placement: {kind: ssh}
    launch_mode: {kind: host_process}
    defaults: {target: lab}
    allow_overrides: [resources]
    """)


def fleet(port: int) -> str:
    # Nothing listens on the port: a plan that dialled it would say so.
    return textwrap.dedent(f"""\
        apiVersion: reconciler/v1
        kind: Fleet
        metadata: {{name: lab}}
        spec:
          machines:
            - name: gpu-1
              ssh: {{host: 127.0.0.1, port: {port}, user: u, host_key: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHabkw7ILXAgq2JQD8TN++zRtBACjuiUiEZ99iJmmjZl"}}
              resources: {{gpus: [{{type: H100, count: 1}}]}}
              max_tasks: 2
        """)


def run(name: str, gpus: int = 1, argv: str = '["sleep", "60"]', secrets: str = "") -> str:
    return textwrap.dedent(f"""\
        apiVersion: reconciler/v1
        kind: Run
        metadata: {{name: {name}}}
        spec:
          template: ssh-host
          overrides: {{resources: {{gpu_count: {gpus}}}}}
          task: {{type: command, argv: {argv}}}
        """) + secrets


@pytest.fixture
def repo(tmp_path):
    (tmp_path / "specs" / "runs").mkdir(parents=True)
    (tmp_path / "specs" / "fleets").mkdir()
    (tmp_path / "execution_templates").mkdir()
    (tmp_path / "execution_templates" / "ssh-host.yaml").write_text(TEMPLATE)
    (tmp_path / "specs" / "fleets" / "lab.yaml").write_text(fleet(free_port()))
    (tmp_path / "status").mkdir()
    return tmp_path


def record(repo: Path, name: str, phase: str, **fields) -> None:
    digest = load_tree(repo).runs[name].digest
    st = statuses.RunStatus.model_validate({"name": name, "phase": phase, "generation": 1, "attempt": 1,
                                            "spec": {"digest": digest, "path": f"specs/runs/{name}.yaml"},
                                            **fields})
    (repo / "status" / f"{name}.yaml").write_text(statuses.dump(st))


def plan(repo: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reconciler", "plan", "--offline", "--detailed-exitcode", *extra],
                          cwd=repo, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})


RUNNING_ON_GPU_0 = {"handle": {"machine": "gpu-1", "identity": "a-g1-a1", "gpus": [0], "pid": 4242,
                               "backend": "ssh_host_process", "launched_at": "2026-01-01T00:00:00Z"}}


def test_a_run_that_would_wait_for_the_gpu_a_recorded_run_holds(repo):
    (repo / "specs" / "runs" / "a.yaml").write_text(run("a"))
    record(repo, "a", "Running", **RUNNING_ON_GPU_0)
    (repo / "specs" / "runs" / "b.yaml").write_text(run("b"))
    p = plan(repo)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "NoCapacity: no capacity: gpu-1: 0 free GPU(s) of 1 wanted" in p.stdout
    assert "unreachable" not in p.stdout  # gpu-1's port is closed: nothing dialled it
    assert "+ launch" not in p.stdout and "Plan: 1 wait." in p.stdout  # a keeps running: no change


def test_no_changes_exits_0(repo):
    (repo / "specs" / "runs" / "a.yaml").write_text(run("a"))
    record(repo, "a", "Running", **RUNNING_ON_GPU_0)
    p = plan(repo)
    assert p.returncode == 0 and "No changes." in p.stdout, p.stdout + p.stderr


def test_a_changed_spec_would_replace_the_recorded_instance(repo):
    (repo / "specs" / "runs" / "a.yaml").write_text(run("a"))
    record(repo, "a", "Running", **RUNNING_ON_GPU_0)
    (repo / "specs" / "runs" / "a.yaml").write_text(run("a", argv='["sleep", "61"]'))
    p = plan(repo)
    assert p.returncode == 2
    # The old instance is stopped now; its GPU is free for the new generation at the next pass.
    assert "a-g2-a1 (stop a-g1-a1)" in p.stdout and "gpu-1: 0 free GPU(s) of 1 wanted" in p.stdout


def test_a_machine_recorded_unreachable_makes_its_runs_wait(repo):
    (repo / "specs" / "runs" / "a.yaml").write_text(run("a"))
    cond = {"type": "MachineReachable", "status": "False", "reason": "Unreachable",
            "message": "gpu-1: connection refused", "last_transition": "2099-01-01T00:00:00Z"}
    record(repo, "a", "Running", conditions=[cond], **RUNNING_ON_GPU_0)
    p = plan(repo)
    assert "MachineUnreachable: gpu-1 does not answer (gpu-1: connection refused)" in p.stdout, p.stdout


def test_secrets_are_never_looked_up(repo):
    (repo / "specs" / "runs" / "a.yaml").write_text(run("a", secrets="  secrets: [HF_TOKEN]\n"))
    p = plan(repo)  # HF_TOKEN is not in the environment: a real pass would warn and wait
    assert p.returncode == 2 and "+ launch" in p.stdout and "HF_TOKEN" not in p.stdout


def test_invalid_specs_exit_1_with_their_location(repo):
    (repo / "specs" / "runs" / "a.yaml").write_text(run("a").replace("gpu_count: 1", "gpu_count: -1"))
    p = plan(repo)
    assert p.returncode == 1 and "specs/runs/a.yaml:" in p.stderr and "Traceback" not in p.stderr


def test_json_says_offline(repo):
    (repo / "specs" / "runs" / "a.yaml").write_text(run("a"))
    import json

    p = plan(repo, "--json")
    out = json.loads(p.stdout)
    assert p.returncode == 2 and out["offline"] is True and out["summary"] == {"launch": 1}
