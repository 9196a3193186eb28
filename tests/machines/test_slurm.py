"""Slurm placement against a real Slurm cluster on this machine (tests/infra/slurm.py): submitted
with sbatch under the run's identity, followed with squeue and scontrol, stopped with scancel.

This machine is the cluster's login host (``login: local``); the workspaces live on the cluster's
"shared file system" (a folder both nodes see) and are copied back when a run is collected.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.repo_helpers import reconcile_cli
from tests.world import TEMPLATES, World, run_spec


@pytest.fixture
def slurm_world(slurm, tmp_path):
    worlds = []

    def make(namespace: str = "test", **slurm_settings) -> World:
        settings = {"login": "local", "workspace_root": str(slurm.shared / f"w{len(worlds)}"),
                    "partition": "debug", "env": dict(slurm.env), **slurm_settings}
        TEMPLATES["slurm-host"] = {"placement": {"kind": "slurm", "slurm": settings},
                                   "launch_mode": {"kind": "host_process"},
                                   "allow_overrides": ["resources", "runtime_env"]}
        try:
            w = World(tmp_path / f"w{len(worlds)}", namespace=namespace)
        finally:
            del TEMPLATES["slurm-host"]
        w.cluster = slurm
        w.namespace = namespace
        w.shared = Path(settings["workspace_root"]) / namespace
        worlds.append(w)
        return w

    yield make
    for w in worlds:
        w.cleanup()
    slurm.command("scancel", "--user=root", check=False)


def jobs_of(w: World, identity: str) -> list[dict]:
    """The jobs of one identity of this world's repository (its namespace)."""
    return w.cluster.jobs(name=identity, namespace=w.namespace)


def test_a_run_is_submitted_runs_on_a_node_and_is_collected(slurm_world) -> None:
    w = slurm_world()
    w.add_run(run_spec("s1", "slurm-host", ["sh", "-c", "echo job=$SLURM_JOB_ID node=$SLURMD_NODENAME; "
                                                         "echo trained > artifacts/out.txt"],
                       overrides={"resources": {"gpu_count": 1}}))
    first = w.run_pass()
    change = first.plan.for_run("s1")
    assert (change.action, change.machine) == ("launch", "slurm:local")
    assert change.considered == ["slurm:local: submitted to partition debug; Slurm chooses the node(s)"]
    [job] = jobs_of(w, "s1-g1-a1")
    st = w.until("s1", lambda s: s.phase == "Succeeded", timeout=30)
    assert st.exit_code == 0 and st.handle.job == job["id"] and st.handle.machine == "slurm:local"
    bundle = w.bundle("s1-g1-a1")
    assert (bundle / "artifacts" / "out.txt").read_text() == "trained\n"
    out = (bundle / "artifacts" / "stdout.log").read_text()
    assert f"job={job['id']}" in out and "node=n" in out
    # GRES: Slurm chose the GPU and said which; the bundle did not override it.
    env_sh = (bundle / "scripts" / "env.sh").read_text()
    assert "CUDA_VISIBLE_DEVICES" not in env_sh
    # Collected, then removed from the shared file system (remote_cleanup: after_collect).
    w.until("s1", lambda s: not (w.shared / "s1-g1-a1").exists(), timeout=10)


def test_a_failing_run_reports_its_exit_code(slurm_world) -> None:
    w = slurm_world()
    w.add_run(run_spec("bad", "slurm-host", ["sh", "-c", "echo broken >&2; exit 3"]))
    st = w.until("bad", lambda s: s.phase == "Failed", timeout=30)
    assert st.exit_code == 3
    assert "broken" in (w.bundle("bad-g1-a1") / "artifacts" / "stderr.log").read_text()
    assert len(jobs_of(w, "bad-g1-a1")) == 1  # no retry: maxRetries 0


def test_stopping_a_run_cancels_its_job(slurm_world) -> None:
    w = slurm_world()
    doc = run_spec("long", "slurm-host", ["sh", "-c", "echo started; sleep 300"])
    w.add_run(doc)
    w.until("long", lambda s: s.phase == "Running", timeout=30)
    [job] = jobs_of(w, "long-g1-a1")
    doc["spec"]["desiredState"] = "Stopped"
    w.add_run(doc)
    st = w.until("long", lambda s: s.phase == "Terminated", timeout=30)
    assert st.handle.job == job["id"]
    [after] = jobs_of(w, "long-g1-a1")
    assert after["state"] == "CANCELLED"


def test_a_job_waiting_for_gpus_shows_slurms_reason(slurm_world) -> None:
    w = slurm_world()
    # Each node has 2 GPUs: two nodes' worth held by one run leaves nothing for the next.
    big = run_spec("big", "slurm-host", ["sleep", "300"], overrides={"resources": {"gpu_count": 2, "nodes": 2}})
    w.add_run(big)
    w.until("big", lambda s: s.phase == "Running", timeout=30)
    w.add_run(run_spec("next", "slurm-host", ["true"], overrides={"resources": {"gpu_count": 1}}))
    # First "waiting to be scheduled" (Slurm's reason None), then why it cannot start.
    st = w.until("next", lambda s: s.phase == "Pending" and "Resources" in (s.message or ""), timeout=30)
    assert st.message.startswith("next-g1-a1 is queued in Slurm (job ")
    assert st.condition("Ready").status == "False"
    big["spec"]["desiredState"] = "Stopped"  # the GPUs come free: the queued run starts
    w.add_run(big)
    w.until("next", lambda s: s.phase == "Succeeded", timeout=40)


def test_a_crash_between_sbatch_and_the_status_commit_submits_once(slurm_world) -> None:
    w = slurm_world()
    w.add_run(run_spec("once", "slurm-host", ["sleep", "300"]))
    env = {"RECONCILER_WORKSPACE_ROOT": str(w.local_root), "RECONCILER_NAMESPACE": "test"}
    crashed = reconcile_cli(w.repo, "--once", env=env, crash_after="apply")
    assert crashed.returncode == 137, crashed.stderr
    assert w.status("once") is None  # the status never reached git
    assert len(jobs_of(w, "once-g1-a1")) == 1
    st = w.until("once", lambda s: s.phase in ("Running", "Pending") and s.handle is not None, timeout=30)
    assert st.handle.identity == "once-g1-a1"
    w.run_pass()
    assert len(jobs_of(w, "once-g1-a1")) == 1 and not jobs_of(w, "once-g1-a2")


def test_two_nodes_get_their_ranks_and_one_rendezvous(slurm_world) -> None:
    w = slurm_world()
    w.add_run(run_spec("pair", "slurm-host", ["sh", "-c", "echo rank=$NODE_RANK of=$NNODES "
                                                           "master=$MASTER_ADDR:$MASTER_PORT node=$SLURMD_NODENAME"],
                       overrides={"resources": {"nodes": 2}}))
    w.until("pair", lambda s: s.phase == "Succeeded", timeout=30)
    lines = sorted((w.bundle("pair-g1-a1") / "artifacts" / "stdout.log").read_text().splitlines())
    assert len(lines) == 2
    # srun labels each line with its task's rank
    assert [line.split()[0] for line in lines] == ["0:", "1:"]
    assert [line.split()[1] for line in lines] == ["rank=0", "rank=1"]
    assert {line.split()[4] for line in lines} == {"node=n1", "node=n2"}
    masters = {line.split()[3] for line in lines}
    assert len(masters) == 1 and masters.pop().startswith("master=127.0.0.1:")
    assert all("of=2" in line for line in lines)


def test_a_request_the_cluster_can_never_hold_fails_with_slurms_reason(slurm_world) -> None:
    w = slurm_world()
    w.add_run(run_spec("huge", "slurm-host", ["true"], overrides={"resources": {"gpu_count": 8}}))
    st = w.until("huge", lambda s: s.phase == "Failed", timeout=20)
    assert "Slurm refused" in st.message and "not available" in st.message



def test_a_login_host_reached_over_ssh_submits_as_its_user(slurm, sshd, tmp_path, monkeypatch) -> None:
    """The cluster's login node is a Fleet machine: staging, sbatch, squeue and collection go over
    SSH, and the job runs as the login's user; its secret waits on the login host until it starts."""
    monkeypatch.setenv("FAR_TOKEN", "far-" + os.urandom(8).hex())
    from tests.world import fleet, machine

    login = machine(sshd, "login", max_tasks=0)
    settings = {"login": "login", "workspace_root": str(slurm.shared / "over-ssh"), "partition": "debug",
                "env": dict(slurm.env)}
    TEMPLATES["slurm-ssh"] = {"placement": {"kind": "slurm", "slurm": settings}, "launch_mode": {"kind": "host_process"},
                              "allow_overrides": ["resources"]}
    try:
        w = World(tmp_path / "w", [fleet([login])])
    finally:
        del TEMPLATES["slurm-ssh"]
    try:
        w.add_run(run_spec("far", "slurm-ssh", ["sh", "-c", "echo user=$(id -un) job=$SLURM_JOB_ID token=$FAR_TOKEN"],
                           secrets=["FAR_TOKEN"]))
        assert w.run_pass().plan.for_run("far").machine == "slurm:login"
        st = w.until("far", lambda s: s.phase == "Succeeded", timeout=30)
        out = (w.bundle("far-g1-a1") / "artifacts" / "stdout.log").read_text()
        assert f"user={sshd.user} job={st.handle.job} token={os.environ['FAR_TOKEN']}" in out
        [job] = slurm.jobs(name="far-g1-a1")
        assert job["state"] == "COMPLETED" and job["user"] == sshd.user
    finally:
        w.cleanup()


def test_a_job_is_named_by_namespace_and_identity_and_gets_the_runs_own_limits(slurm_world) -> None:
    w = slurm_world(time_limit="30", account="ml-default")
    w.add_run(run_spec("own", "slurm-host", ["sleep", "300"],
                       slurm={"time_limit": "7", "account": "ml-team", "qos": "high",
                              "signal": {"name": "USR1", "before_s": 120}}))
    w.add_run(run_spec("plain", "slurm-host", ["sleep", "300"]))
    w.until("own", lambda s: s.phase == "Running", timeout=30)
    w.until("plain", lambda s: s.phase == "Running", timeout=30)
    [own] = jobs_of(w, "own-g1-a1")
    [plain] = jobs_of(w, "plain-g1-a1")
    assert own["name"] == "rcl-test-own-g1-a1" and own["user"] == "root"
    fields = w.cluster.job_fields(own["id"])
    assert (fields["TimeLimit"], fields["Account"], fields["Requeue"]) == ("00:07:00", "ml-team", "0")
    # Without accounting Slurm keeps no QOS (QOS=(null)); the workspace records what sbatch was told.
    asked = json.loads((w.shared / "own-g1-a1" / "runtime" / "slurm.json").read_text())["sbatch"]
    assert "--qos=high" in asked and "--signal=B:USR1@120" in asked and "--time=7" in asked
    # The template's values where the run sets none.
    fields = w.cluster.job_fields(plain["id"])
    assert (fields["TimeLimit"], fields["Account"]) == ("00:30:00", "ml-default")


def test_a_run_level_slurm_block_is_validated(slurm_world) -> None:
    w = slurm_world()
    w.add_run(run_spec("badtime", "slurm-host", ["true"], slurm={"time_limit": "1:2:3:4"}))
    st = w.until("badtime", lambda s: s.phase == "Invalid", timeout=10)
    assert "time_limit" in st.message and "man sbatch" in st.message
    assert st.message.startswith("specs/runs/badtime.yaml:")
    assert not jobs_of(w, "badtime-g1-a1")
    w.add_run(run_spec("elsewhere", "ssh-host", ["true"], slurm={"time_limit": "5"}))
    st = w.until("elsewhere", lambda s: s.phase == "Invalid", timeout=10)
    assert "spec.slurm only applies to slurm placement" in st.message


def test_the_rank_that_failed_and_its_exit_code_are_in_the_status(slurm_world) -> None:
    w = slurm_world()
    w.add_run(run_spec("ranks", "slurm-host", ["sh", "-c", 'if [ "$NODE_RANK" = 1 ]; then exit 3; fi; sleep 60'],
                       overrides={"resources": {"nodes": 2}}))
    st = w.until("ranks", lambda s: s.phase == "Failed", timeout=40)
    assert st.exit_code == 3
    assert "rank 1 exited 3" in st.message, st.message
    ready = st.condition("Ready")
    assert ready.status == "False" and "rank 1 exited 3" in ready.message


def test_slurms_end_crosses_the_trust_boundary_bounded_or_not_at_all() -> None:
    from reconciler.core.boundary import parse_run

    ok = parse_run("t-g1-a1", {"state": "failed", "exit_code": 3, "slurm_job": "12",
                               "slurm_end": {"state": "FAILED", "rank": 1, "rank_exit": 3, "extra": "ignored"}})
    assert ok.state == "failed" and ok.slurm_end == {"state": "FAILED", "rank": 1, "rank_exit": 3}
    for bad in ({"state": "EXPLODED"}, {"state": "CANCELLED", "by": "root; rm -rf /"},
                {"state": "FAILED", "rank": -1}, {"state": "FAILED", "rank_exit": 4096},
                {"state": "CANCELLED", "by": "x" * 40}, {"state": ["CANCELLED"]}, "CANCELLED"):
        r = parse_run("t-g1-a1", {"state": "terminated", "slurm_end": bad})
        assert r.state == "unknown" and r.slurm_end is None, bad


def test_which_slurm_ends_are_retried() -> None:
    from types import SimpleNamespace

    from reconciler.core.observed import ObservedRun
    from reconciler.planner.slurm_ends import slurm_verdict

    run = SimpleNamespace(spec=SimpleNamespace(task=SimpleNamespace(type="command")))

    def verdict(end, checkpoints=()):
        obs = ObservedRun("t-g1-a1", "slurm:local", "failed", exit_code=143, job="7", slurm_end=end,
                          checkpoints=list(checkpoints))
        return slurm_verdict(run, obs, "t-g1-a1")

    why, no_retry, code = verdict({"state": "CANCELLED", "by": "alice"})
    assert "cancelled by alice" in why and no_retry and code == "CancelledInSlurm"
    assert verdict({"state": "CANCELLED", "ours": True}) is None  # the reconciler's own stop
    assert verdict({"state": "COMPLETED"}) is None
    assert verdict({"state": "TIMEOUT"})[1] is not None  # nothing to resume from: not retried
    assert verdict({"state": "TIMEOUT"}, ["artifacts/output/checkpoint-5"])[1] is None
    for state, code in (("NODE_FAIL", "NodeFail"), ("PREEMPTED", "PreemptedInSlurm"), ("OUT_OF_MEMORY", "OutOfMemory")):
        why, no_retry, got = verdict({"state": state})
        assert no_retry is None and got == code and state in why
    why, _, _ = verdict({"state": "FAILED", "rank": 1, "rank_exit": 3})
    assert "rank 1 exited 3" in why
