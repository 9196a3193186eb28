"""Secrets are scoped: what the reconciler starts gets an allowlisted environment, never its own,
and a run gets only the secrets the Policy grants it. Real parts throughout: the reconciler as a
process on a real git repository, real local runs, a real command provider executable, a real
Slurm cluster on loopback, and real git."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from reconciler.gitops import repo as gitops
from reconciler.core import procenv
from reconciler.planner.exposure import logins, shared_login_warnings
from reconciler.core.observed import ObservedWorld
from reconciler.core.plan import Change, Plan
from reconciler.rentals.providers.base import AdapterContext
from reconciler.rentals.providers.command import CommandAdapter
from reconciler.spec.load import load_tree
from reconciler.spec.models.policy import Policy
from reconciler.spec.models.provider import Provider
from tests.repo_helpers import make_repo, reconcile_cli, reconciler, run_spec, status_of, wait_for, workspace
from tests.world import TEMPLATES, World
from tests.world import run_spec as world_run

# What the reconciler host holds besides the runs' secrets: a provider's key, its own webhook
# secret and another team's token. None of them may reach anything it starts.
HOST_SECRETS = {"TARGON_API_KEY": "targon-" + os.urandom(8).hex(),
                "RECONCILER_WEBHOOK_SECRET": "webhook-" + os.urandom(8).hex(),
                "OTHER_TEAM_TOKEN": "other-" + os.urandom(8).hex()}
GRANTED = "hf-granted-" + os.urandom(8).hex()

POLICY = textwrap.dedent("""\
    apiVersion: reconciler/v1
    kind: Policy
    metadata: {name: policy}
    spec:
      secrets:
        - names: [HF_TOKEN]
          teams: [nlp]
        - names: ["VISION_*"]
          runs: ["vision-*"]
    """)

TARGON = textwrap.dedent("""\
    apiVersion: reconciler/v1
    kind: Provider
    metadata: {name: targon}
    spec:
      type: targon
      credentials: TARGON_API_KEY
      endpoint: http://127.0.0.1:9/tha/v2     # never contacted: validation only
      offers:
        - {id: cpu, resource: cpu-small, cpu_count: 4, memory_gb: 16, price_per_hour: 0.2}
    """)


def dump_run(name: str, secrets: list[str], team: str = "nlp") -> str:
    """A local run that writes its whole environment into an artifact."""
    return textwrap.dedent(f"""\
        apiVersion: reconciler/v1
        kind: Run
        metadata:
          name: {name}
          labels: {{team: {team}}}
        spec:
          template: local-host
          task:
            type: command
            argv: ["sh", "-c", "env > artifacts/env.txt"]
            env: {{DECLARED_SETTING: declared-value}}
          secrets:
        """) + "".join(f"    - {s}\n" for s in secrets)


def env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def cli_env(root: Path, **more: str) -> dict[str, str]:
    return {**HOST_SECRETS, "RECONCILER_WORKSPACE_ROOT": str(root), "RECONCILER_NAMESPACE": "test",
            "RECONCILER_PUSH": "false", **more}


def once_until(repo: Path, name: str, env: dict, phases: tuple[str, ...], timeout: float = 30.0):
    """``reconcile --once`` as a process, again and again, until the run reaches one of ``phases``."""
    def done():
        p = reconcile_cli(repo, "--once", env=env)
        assert p.returncode in (0, 1), p.stderr
        st = status_of(repo, name)
        return st if st is not None and st.phase in phases else None

    return wait_for(done, timeout=timeout, interval=0.1, what=f"{name} to reach {phases}")


def test_a_local_run_sees_its_declared_env_and_granted_secret_and_nothing_of_the_host(tmp_path, ws_root):
    repo = make_repo(tmp_path / "repo", {"dump": dump_run("dump", ["HF_TOKEN"])})
    (repo / "specs" / "policy.yaml").write_text(POLICY)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", "policy"], check=True)
    env = cli_env(ws_root, HF_TOKEN=GRANTED)
    st = once_until(repo, "dump", env, ("Succeeded", "Failed", "Invalid"))
    assert st.phase == "Succeeded", st.message
    job = env_file(workspace(ws_root, "dump-g1-a1") / "artifacts" / "env.txt")
    assert job["DECLARED_SETTING"] == "declared-value" and job["HF_TOKEN"] == GRANTED
    text = (workspace(ws_root, "dump-g1-a1") / "artifacts" / "env.txt").read_text()
    for name, value in HOST_SECRETS.items():
        assert name not in job and value not in text, name
    # Nothing else of the reconciler's own environment either (the test runner's included): only
    # the allowlisted base, with the values the host has.
    for name, value in {**os.environ, **env}.items():
        if name in procenv.BASE or name in ("HF_TOKEN", "PWD", "OLDPWD"):
            continue
        assert job.get(name) != value, f"{name} leaked into the run"
    assert job["PATH"] == os.environ.get("PATH", procenv.DEFAULT_PATH)
    assert not (workspace(ws_root, "dump-g1-a1") / "runtime" / "secrets.env").exists()


def test_a_command_provider_sees_the_base_env_its_settings_and_its_own_credential(tmp_path, monkeypatch):
    for name, value in HOST_SECRETS.items():
        monkeypatch.setenv(name, value)
    dump = tmp_path / "env.json"
    script = tmp_path / "provider.py"
    script.write_text("import json, os, sys\n"
                      "json.dump(dict(os.environ), open(os.environ['DUMP_TO'], 'w'))\n"
                      "print('[]')\n")
    doc = {"apiVersion": "reconciler/v1", "kind": "Provider", "metadata": {"name": "acme"},
           "spec": {"type": "command", "credentials": "ACME_API_KEY",
                    "offers": [{"id": "small", "cpu_count": 1, "price_per_hour": 0.5}],
                    "command": {"provision": [sys.executable, str(script)], "inventory": [sys.executable, str(script)],
                                "terminate": [sys.executable, str(script)], "env": {"DUMP_TO": str(dump)}}}}
    secrets = {"ACME_API_KEY": "acme-key-value", **HOST_SECRETS}
    adapter = CommandAdapter(Provider.model_validate(doc), AdapterContext(secret_source=secrets.get, repo=tmp_path))
    assert adapter.inventory() == []
    seen = json.loads(dump.read_text())
    assert seen["ACME_API_KEY"] == "acme-key-value" and seen["DUMP_TO"] == str(dump)
    # LC_CTYPE: Python's own locale coercion (PEP 538) may add it in the child.
    assert set(seen) - set(procenv.BASE) - {"LC_CTYPE"} == {"ACME_API_KEY", "DUMP_TO"}
    for name in procenv.BASE:
        if name in seen and name in os.environ:
            assert seen[name] == os.environ[name]


def test_validate_refuses_a_secret_the_policy_does_not_grant_at_its_entry(tmp_path):
    text = dump_run("greedy", ["HF_TOKEN", "OTHER_TEAM_TOKEN"], team="nlp")
    vision = dump_run("vision-a", ["VISION_KEY", "HF_TOKEN"], team="vision")
    own = dump_run("own", ["RECONCILER_WEBHOOK_SECRET", "TARGON_API_KEY"], team="nlp")
    repo = make_repo(tmp_path / "repo", {"greedy": text, "vision-a": vision, "own": own})
    (repo / "specs" / "policy.yaml").write_text(POLICY)
    (repo / "specs" / "targon.yaml").write_text(TARGON)
    p = reconcile_cli(repo, "validate")
    assert p.returncode == 1, p.stdout

    def at(name: str, doc: str, secret: str) -> str:
        lines = doc.splitlines()
        row = next(i for i, line in enumerate(lines) if line.strip() == f"- {secret}")
        index = [line.strip() for line in lines if line.startswith("    - ")].index(f"- {secret}")
        return f"specs/runs/{name}.yaml:{row + 1}:{lines[row].index(secret) + 1}: spec.secrets[{index}]: "

    out = p.stdout.splitlines()
    assert (at("greedy", text, "OTHER_TEAM_TOKEN") + "secret 'OTHER_TEAM_TOKEN' is not granted to run 'greedy' "
            "(team nlp) by the Policy's spec.secrets (specs/policy.yaml)") in out, p.stdout
    assert (at("vision-a", vision, "HF_TOKEN") + "secret 'HF_TOKEN' is not granted to run 'vision-a' (team vision) "
            "by the Policy's spec.secrets (specs/policy.yaml)") in out, p.stdout
    # The reconciler's own names are refused whatever the Policy says (a Provider's credential too).
    for secret in ("RECONCILER_WEBHOOK_SECRET", "TARGON_API_KEY"):
        assert at("own", own, secret) + f"secret '{secret}' is the reconciler's own and is never given to runs" in out
    # What the Policy grants passes: greedy's HF_TOKEN and vision-a's VISION_KEY are not reported.
    assert not [line for line in out if "'HF_TOKEN' is not granted to run 'greedy'" in line]
    assert not [line for line in out if "VISION_KEY" in line]


def test_without_secret_rules_any_name_but_the_reconcilers_own_passes(tmp_path):
    repo = make_repo(tmp_path / "repo", {"a": dump_run("a", ["HF_TOKEN", "ANYTHING"]),
                                         "b": dump_run("b", ["GIT_SSH_COMMAND"])})
    p = reconcile_cli(repo, "validate")
    assert p.returncode == 1
    errors = [line for line in p.stdout.splitlines() if ": " in line and line.startswith("specs/")]
    assert len(errors) == 1 and errors[0].startswith("specs/runs/b.yaml:") and "GIT_SSH_COMMAND" in errors[0]


def test_a_policy_rule_naming_a_reserved_secret_is_refused_at_the_policy(tmp_path):
    repo = make_repo(tmp_path / "repo")
    policy = POLICY.replace("names: [HF_TOKEN]", "names: [HF_TOKEN, SSH_AUTH_SOCK]")
    (repo / "specs" / "policy.yaml").write_text(policy)
    p = reconcile_cli(repo, "validate")
    assert p.returncode == 1
    col = policy.splitlines()[5].index("SSH_AUTH_SOCK") + 1
    assert f"specs/policy.yaml:6:{col}: spec.secrets[0].names[1]: 'SSH_AUTH_SOCK' is the reconciler's own secret and is never given to runs" in p.stdout


def test_an_ungranted_secret_is_never_delivered(tmp_path, ws_root):
    """Validation makes the run Invalid (nothing launched); and if it did not, apply refuses."""
    repo = make_repo(tmp_path / "repo", {"greedy": dump_run("greedy", ["OTHER_TEAM_TOKEN"])})
    (repo / "specs" / "policy.yaml").write_text(POLICY)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", "policy"], check=True)
    st = once_until(repo, "greedy", cli_env(ws_root), ("Invalid", "Running", "Succeeded", "Failed"))
    assert st.phase == "Invalid" and "OTHER_TEAM_TOKEN" in st.message
    assert not workspace(ws_root, "greedy-g1-a1").exists()


def test_apply_refuses_a_secret_the_policy_does_not_grant_even_past_validation(tmp_path, ws_root, monkeypatch):
    repo = make_repo(tmp_path / "repo", {"sneaky": dump_run("sneaky", ["OTHER_TEAM_TOKEN"])})
    monkeypatch.setenv("OTHER_TEAM_TOKEN", HOST_SECRETS["OTHER_TEAM_TOKEN"])
    strict = Policy.model_validate(yaml.safe_load(POLICY))
    import reconciler.engine.loop as loop

    real = loop.load_tree

    def without_the_check(*args, **kwargs):
        # The tree has no Policy, so the run validates; the Policy appears only after validation,
        # as if a check had been skipped: apply must still hold the secret back.
        desired = real(*args, **kwargs)
        desired.policy = strict
        return desired

    monkeypatch.setattr(loop, "load_tree", without_the_check)
    rec = reconciler(repo, ws_root)
    result = rec.run_pass()
    [out] = [o for o in result.outcomes if o.name == "sneaky"]
    assert not out.ok and out.permanent and "'OTHER_TEAM_TOKEN' is not granted to run 'sneaky'" in out.error
    assert not workspace(ws_root, "sneaky-g1-a1").exists()
    assert status_of(repo, "sneaky").phase == "Failed"


def test_git_gets_no_secrets_of_the_host(tmp_path, monkeypatch):
    for name, value in HOST_SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("GIT_SSH_COMMAND", "ssh -i /etc/reconciler/deploy_key -o BatchMode=yes")
    monkeypatch.setenv("SSH_AUTH_SOCK", "/run/agent.sock")
    env = gitops.git_env()
    assert not set(HOST_SECRETS) & set(env)
    assert env["GIT_SSH_COMMAND"] == "ssh -i /etc/reconciler/deploy_key -o BatchMode=yes"  # the operator's, kept
    assert env["SSH_AUTH_SOCK"] == "/run/agent.sock" and env["GIT_TERMINAL_PROMPT"] == "0"
    assert set(env) <= set(procenv.BASE) | set(procenv.PROXIES) | {"SSH_AUTH_SOCK"} | {
        k for k in env if k.startswith("GIT_")}
    # A real status commit through that environment. The repository runs a program of its own
    # configuration (core.fsmonitor, run by `git status`): it sees what git sees.
    repo = make_repo(tmp_path / "repo")
    seen = tmp_path / "git-env.txt"
    hook = tmp_path / "fsmonitor.sh"
    hook.write_text(f"#!/bin/sh\nenv >> {seen}\nexit 1\n")
    hook.chmod(0o755)
    subprocess.run(["git", "-C", str(repo), "config", "core.fsmonitor", str(hook)], check=True)
    (repo / "status").mkdir()
    (repo / "status" / "x.yaml").write_text("phase: Running\n")
    r = gitops.open_repo(repo)
    made = gitops.commit_status(r, "status: x", gitops.Author("reconciler", "reconciler@localhost"))
    assert made is not None and made.paths == ["status/x.yaml"]
    shown = subprocess.run(["git", "-C", str(repo), "show", "--name-only", "--format=%an %s", "HEAD"],
                           capture_output=True, text=True, check=True).stdout
    assert shown.splitlines()[:3] == ["reconciler status: x", "", "status/x.yaml"]
    text = seen.read_text()
    assert "GIT_SSH_COMMAND=ssh -i /etc/reconciler/deploy_key" in text  # the hook ran, under git's env
    for name, value in HOST_SECRETS.items():
        assert value not in text and f"{name}=" not in text


def test_runs_of_two_teams_on_one_login_are_said_in_the_plan(tmp_path, ws_root):
    repo = make_repo(tmp_path / "repo", {"a": dump_run("a", [], team="nlp").replace("  secrets:\n", ""),
                                         "b": dump_run("b", [], team="vision").replace("  secrets:\n", "")})
    plan = reconciler(repo, ws_root).run_pass(dry_run=True).plan
    [warning] = [w for w in plan.warnings if "share" in w]
    assert warning.startswith("runs of different teams share the reconciler's own login on this machine (local): "
                              "nlp: a; vision: b;")
    same = make_repo(tmp_path / "same", {"a": dump_run("a", [], team="nlp").replace("  secrets:\n", ""),
                                         "b": dump_run("b", [], team="nlp").replace("  secrets:\n", "")})
    assert not [w for w in reconciler(same, ws_root).run_pass(dry_run=True).plan.warnings if "share" in w]


def test_two_fleet_entries_for_one_login_are_one_login(tmp_path):
    repo = make_repo(tmp_path / "repo")
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICqRT6LKgEqdobuvittBCu1add1q6i1ofysL9m5i7d6G"
    machines = [{"name": n, "ssh": {"host": "gpu1.lab", "user": u, "host_key": key}}
                for n, u in (("gpu1-nlp", "nlp"), ("gpu1-nlp-too", "nlp"), ("gpu1-cv", "cv"))]
    (repo / "specs" / "lab.yaml").write_text(yaml.safe_dump(
        {"apiVersion": "reconciler/v1", "kind": "Fleet", "metadata": {"name": "lab"}, "spec": {"machines": machines}}))
    (repo / "specs" / "runs" / "a.yaml").write_text(dump_run("a", [], team="nlp").replace("  secrets:\n", ""))
    (repo / "specs" / "runs" / "b.yaml").write_text(dump_run("b", [], team="cv").replace("  secrets:\n", ""))
    desired = load_tree(repo)
    assert not desired.diagnostics
    known = logins(desired)
    assert known["gpu1-nlp"] == known["gpu1-nlp-too"] == "nlp@gpu1.lab"
    assert known["gpu1-cv"] == "cv@gpu1.lab"
    # Two teams on two entries of one login: said; on two logins of one host: not.
    same = Plan(changes=[Change("a", "launch", "NewRun", "", "Running", machine="gpu1-nlp"),
                         Change("b", "launch", "NewRun", "", "Running", machine="gpu1-nlp-too")])
    [warning] = shared_login_warnings(desired, ObservedWorld(), same)
    assert warning.startswith("runs of different teams share the unix login nlp@gpu1.lab (machine gpu1-nlp, "
                              "gpu1-nlp-too): cv: b; nlp: a;")
    apart = Plan(changes=[Change("a", "launch", "NewRun", "", "Running", machine="gpu1-nlp"),
                          Change("b", "launch", "NewRun", "", "Running", machine="gpu1-cv")])
    assert shared_login_warnings(desired, ObservedWorld(), apart) == []


# ---------------------------------------------------------------- Slurm


@pytest.fixture
def slurm_world(slurm, tmp_path):
    settings = {"login": "local", "workspace_root": str(slurm.shared / "sec"), "partition": "debug",
                "env": dict(slurm.env)}
    TEMPLATES["slurm-host"] = {"placement": {"kind": "slurm", "slurm": settings},
                               "launch_mode": {"kind": "host_process"}, "allow_overrides": ["resources"]}
    try:
        w = World(tmp_path / "w")
    finally:
        del TEMPLATES["slurm-host"]
    w.cluster, w.shared = slurm, Path(settings["workspace_root"]) / "test"
    yield w
    w.cleanup()
    slurm.command("scancel", "--name=sec-held-g1-a1", check=False)


def test_a_slurm_job_gets_its_secret_but_slurm_never_holds_a_secret(slurm_world, monkeypatch):
    w = slurm_world
    for name, value in {**HOST_SECRETS, "HF_TOKEN": GRANTED}.items():
        monkeypatch.setenv(name, value)
    # The job dumps its environment, then waits for the test to look at slurmctld's saved state.
    w.add_run(world_run("sec-held", "slurm-host", ["sh", "-c", "env > artifacts/env.txt; "
                                                           "while [ ! -e release ]; do sleep 0.1; done"],
                        secrets=["HF_TOKEN"]))
    rec = w.reconciler()
    rec.run_pass()
    ws = w.shared / "sec-held-g1-a1"
    wait_for(lambda: (ws / "artifacts" / "env.txt").is_file(), timeout=30, what="the job to start")
    [job] = w.cluster.jobs(name="sec-held-g1-a1")
    state = Path(w.cluster.base) / "state"
    saved = [p for p in state.rglob("*") if p.is_file() and f"job.{job['id']}" in p.parts]
    assert any(p.name == "environment" for p in saved), sorted(state.rglob("*"))
    # The environment slurmctld keeps for the job: the base names of procenv and Slurm's own, only.
    [saved_env] = [p.read_bytes() for p in saved if p.name == "environment"]
    names = {item.split(b"=", 1)[0].decode() for item in saved_env[4:].split(b"\0") if b"=" in item}
    assert "PATH" in names and names - set(procenv.BASE) == {n for n in names if n.startswith("SLURM_")}
    shown = w.cluster.command("scontrol", "show", "job", "-d", job["id"])
    for blob in [p.read_bytes() for p in saved] + [shown.encode()]:
        for value in [*HOST_SECRETS.values(), GRANTED]:
            assert value.encode() not in blob
        assert b"TARGON_API_KEY" not in blob and b"OTHER_TEAM_TOKEN" not in blob
    (ws / "release").touch()
    st = w.until("sec-held", lambda s: s.phase == "Succeeded", timeout=30)
    assert st.exit_code == 0
    job_env = env_file(w.bundle("sec-held-g1-a1") / "artifacts" / "env.txt")
    assert job_env["HF_TOKEN"] == GRANTED and job_env["SLURM_JOB_ID"] == job["id"]
    for name in HOST_SECRETS:
        assert name not in job_env


def test_every_node_of_a_slurm_run_gets_its_secret_and_declared_env(slurm_world, monkeypatch):
    w = slurm_world
    monkeypatch.setenv("HF_TOKEN", GRANTED)
    monkeypatch.setenv("OTHER_TEAM_TOKEN", HOST_SECRETS["OTHER_TEAM_TOKEN"])
    doc = world_run("sec-pair", "slurm-host", ["sh", "-c", "echo rank=$NODE_RANK secret=$HF_TOKEN "
                                                       "declared=$DECLARED_SETTING other=${OTHER_TEAM_TOKEN:-none}"],
                    secrets=["HF_TOKEN"], overrides={"resources": {"nodes": 2}})
    doc["spec"]["task"]["env"] = {"DECLARED_SETTING": "declared-value"}
    w.add_run(doc)
    w.until("sec-pair", lambda s: s.phase == "Succeeded", timeout=30)
    lines = sorted((w.bundle("sec-pair-g1-a1") / "artifacts" / "stdout.log").read_text().splitlines())
    assert [line.split(" ", 1)[1] for line in lines] == [
        f"rank={r} secret={GRANTED} declared=declared-value other=none" for r in (0, 1)]


def test_grant_rules_select_runs_by_every_selector_they_give():
    from reconciler.spec.models.policy import secret_refusal

    rules = Policy.model_validate(yaml.safe_load(POLICY)).spec.secrets
    rules.append(type(rules[0]).model_validate({"names": ["SHARED_*"], "teams": ["nlp"], "runs": ["nlp-*"]}))
    assert secret_refusal(rules, "anything", "nlp", "HF_TOKEN") is None
    assert secret_refusal(rules, "anything", None, "HF_TOKEN") is not None  # no team label: not nlp's
    assert secret_refusal(rules, "vision-1", None, "VISION_X") is None
    assert secret_refusal(rules, "nlp-1", "nlp", "SHARED_A") is None
    assert secret_refusal(rules, "other", "nlp", "SHARED_A") is not None  # the team, but not the name glob
    assert secret_refusal(rules, "nlp-1", "cv", "SHARED_A") is not None  # the name glob, but not the team
    # No rules: any name but the reconciler's own; an empty list of rules: nothing.
    assert secret_refusal(None, "r", None, "ANY_NAME") is None
    assert secret_refusal([], "r", None, "ANY_NAME") is not None
    assert secret_refusal([{"names": ["*"]}], "r", None, "RECONCILER_WEBHOOK_SECRET") is not None
    assert secret_refusal([{"names": ["*"]}], "r", None, "TARGON_API_KEY", reserved={"TARGON_API_KEY"}) is not None
