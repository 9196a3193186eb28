"""Slurm as a cluster's admins see it, against a real Slurm on this machine (tests/infra/slurm.py).

Two repositories share one cluster and never touch each other's jobs; an admin's scancel is
respected; a time limit reads as TIMEOUT and is retried only when the run can resume, after the
run was warned by the signal it asked for; secrets never wait on the shared file system while a
job is queued. Every job is submitted from this machine as the cluster's login host.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.infra._proc import wait_until
from tests.world import TEMPLATES, World, run_spec

@pytest.fixture
def cluster_worlds(slurm, tmp_path):
    """make(namespace, **slurm settings) → a World (a repository) on the shared cluster; every
    world made in one test shares one workspace root on the shared folder, as one login host's
    templates must."""
    root = slurm.shared / f"e2e-{tmp_path.name}"
    worlds = []

    def make(namespace: str, env: dict | None = None, **settings) -> World:
        body = {"login": "local", "workspace_root": str(root), "partition": "debug",
                "env": dict(env or slurm.env), **settings}
        TEMPLATES["slurm-host"] = {"placement": {"kind": "slurm", "slurm": body},
                                   "launch_mode": {"kind": "host_process"}, "allow_overrides": ["resources"]}
        try:
            w = World(tmp_path / namespace, namespace=namespace)
        finally:
            del TEMPLATES["slurm-host"]
        w.cluster, w.namespace, w.shared = slurm, namespace, root / namespace
        worlds.append(w)
        return w

    yield make
    for w in worlds:
        w.cleanup()
    slurm.command("scancel", "--user=root", check=False)
    slurm.command("scancel", "--user=nobody", check=False)


def stop(w: World, doc: dict) -> None:
    doc["spec"]["desiredState"] = "Stopped"
    w.add_run(doc)


def test_two_repositories_with_a_run_named_train_never_adopt_or_cancel_each_others_job(cluster_worlds) -> None:
    a, b = cluster_worlds("team-a"), cluster_worlds("team-b")
    cluster = a.cluster
    # Someone else's job that happens to carry team-b's full job name: not this user's, so not b's.
    subprocess.run(["sbatch", "--parsable", "--job-name=rcl-team-b-train-g1-a1", "--chdir=/tmp",
                    "--output=/dev/null", "--wrap", "sleep 300"], check=True, capture_output=True,
                   env={**os.environ, **cluster.env}, user="nobody", group="nogroup", cwd="/tmp")
    docs = {}
    for w in (a, b):
        docs[w.namespace] = run_spec("train", "slurm-host", ["sleep", "300"])
        w.add_run(docs[w.namespace])
    sa = a.until("train", lambda s: s.phase == "Running", timeout=30)
    sb = b.until("train", lambda s: s.phase == "Running", timeout=30)
    [ja] = cluster.jobs("train-g1-a1", "team-a")
    jobs_b = cluster.jobs("train-g1-a1", "team-b")
    [jb] = [j for j in jobs_b if j["user"] == "root"]
    assert len(jobs_b) == 2  # b submitted its own beside the impostor's
    assert (sa.handle.job, sb.handle.job) == (ja["id"], jb["id"]) and ja["id"] != jb["id"]
    assert ja["name"] == "rcl-team-a-train-g1-a1" and jb["name"] == "rcl-team-b-train-g1-a1"

    # b loses its record of the id (a crash between sbatch and writing it): found again by its
    # full name among this user's jobs, never the impostor's.
    (b.shared / "train-g1-a1" / "runtime" / "slurm_job").unlink()
    b.run_pass()
    assert b.status("train").phase == "Running" and b.status("train").handle.job == jb["id"]

    stop(a, docs["team-a"])
    a.until("train", lambda s: s.phase == "Terminated", timeout=30)
    states = {j["id"]: j["state"] for j in cluster.jobs()}
    assert states[ja["id"]] == "CANCELLED"
    assert states[jb["id"]] == "RUNNING"
    assert [j["state"] for j in jobs_b if j["user"] == "nobody"] == ["RUNNING"]
    st = b.until("train", lambda s: s.phase == "Running", timeout=5)
    assert st.handle.job == jb["id"] and st.attempt == 1


def test_an_admins_scancel_is_respected_with_who_cancelled(cluster_worlds, slurm) -> None:
    w = cluster_worlds("ops", env=slurm.accounting_env())
    w.add_run(run_spec("train", "slurm-host", ["sleep", "300"], restartPolicy={"maxRetries": 3, "backoffSeconds": 0}))
    w.until("train", lambda s: s.phase == "Running", timeout=30)
    [job] = w.cluster.jobs("train-g1-a1", "ops")
    w.cluster.command("scancel", job["id"])  # the admin (root)
    st = w.until("train", lambda s: s.phase == "Failed", timeout=30)
    assert "cancelled by root" in st.message and "not relaunched" in st.message, st.message
    assert st.condition("Ready").reason == "CancelledInSlurm"
    for _ in range(3):
        w.run_pass()
    st = w.status("train")
    assert st.phase == "Failed" and st.attempt == 1
    assert not w.cluster.jobs("train-g1-a2", "ops")


CHECKPOINT_ON_USR1 = ('trap \'date +%s > artifacts/signalled; mkdir -p artifacts/output/checkpoint-1; '
                      'echo "{}" > artifacts/output/checkpoint-1/trainer_state.json\' USR1; '
                      'while :; do sleep 1; done')


def test_a_time_limit_reads_as_timeout_and_is_retried_only_when_the_run_can_resume(cluster_worlds) -> None:
    w = cluster_worlds("limits")
    # Slurm's limits are in minutes: both jobs end about a minute after they start.
    warned = {"time_limit": "1", "signal": {"name": "USR1", "before_s": 50}}
    w.add_run(run_spec("resumable", "slurm-host", ["sh", "-c", CHECKPOINT_ON_USR1], slurm=warned,
                       restartPolicy={"maxRetries": 1, "backoffSeconds": 0}))
    w.add_run(run_spec("fresh", "slurm-host", ["sh", "-c", "while :; do sleep 1; done"], slurm={"time_limit": "1"},
                       restartPolicy={"maxRetries": 1, "backoffSeconds": 0}))
    w.until("resumable", lambda s: s.phase == "Running", timeout=30)
    [first] = w.cluster.jobs("resumable-g1-a1", "limits")
    # The warning came before the limit, through the wrapper to the job, which saved a checkpoint.
    st = w.until("resumable", lambda s: s.attempt == 2, timeout=180)
    assert "TIMEOUT" in st.history[-1].reason or "TIMEOUT" in st.message, st
    assert w.cluster.job_fields(first["id"])["JobState"] == "TIMEOUT"
    bundle = w.bundle("resumable-g1-a1")
    assert (bundle / "artifacts" / "signalled").is_file()
    assert (bundle / "artifacts" / "output" / "checkpoint-1" / "trainer_state.json").is_file()
    assert "SIGUSR1 received" in (bundle / "runtime" / "runtime.log").read_text()

    st = w.until("fresh", lambda s: s.phase == "Failed", timeout=120)
    assert "TIMEOUT" in st.message and "no checkpoint" in st.message, st.message
    assert st.condition("Ready").reason == "TimeLimit" and st.attempt == 1
    w.run_pass()
    assert not w.cluster.jobs("fresh-g1-a2", "limits")


def _holding(canary: str) -> list[Path]:
    """The login host's holding folders that hold this canary (other tests may hold their own)."""
    found = []
    for d in Path(os.environ.get("TMPDIR", "/tmp")).glob("rcl-secrets.*"):
        f = d / "runtime" / "secrets.env"
        if f.is_file() and canary in f.read_text():
            found.append(d)
    return found


def test_secrets_wait_on_the_login_host_not_the_shared_folder_while_queued(cluster_worlds, monkeypatch) -> None:
    w = cluster_worlds("sec")
    canary = "canary-" + os.urandom(12).hex()
    monkeypatch.setenv("SLURM_CANARY", canary)
    big = run_spec("big", "slurm-host", ["sleep", "300"], overrides={"resources": {"gpu_count": 2, "nodes": 2}})
    w.add_run(big)
    w.until("big", lambda s: s.phase == "Running", timeout=30)
    w.add_run(run_spec("sekret", "slurm-host", ["sh", "-c", 'printf %s "$SLURM_CANARY" | sha256sum > artifacts/sum'],
                       secrets=["SLURM_CANARY"], overrides={"resources": {"gpu_count": 1}}))
    w.until("sekret", lambda s: s.phase == "Pending" and "queued in Slurm" in (s.message or ""), timeout=30)
    rt = w.shared / "sekret-g1-a1" / "runtime"
    assert (rt / "secrets.pending").is_file() and not (rt / "secrets.env").exists()
    for p in w.cluster.shared.rglob("*"):
        if p.is_file() and not p.is_symlink():
            assert canary.encode() not in p.read_bytes(), p
    [hold] = _holding(canary)
    assert stat.S_IMODE(hold.stat().st_mode) == 0o700
    assert not str(hold).startswith(str(w.cluster.shared))

    stop(w, big)  # the GPUs come free: the queued job starts and gets its secret
    w.until("sekret", lambda s: s.phase == "Succeeded", timeout=60)
    bundle = w.bundle("sekret-g1-a1")
    assert (bundle / "artifacts" / "sum").read_text().split()[0] == hashlib.sha256(canary.encode()).hexdigest()
    assert not (bundle / "runtime" / "secrets.env").exists()
    wait_until(lambda: not _holding(canary), 10, what="the holding folder to go")


def _holding_file(name: str, needle: str) -> list[Path]:
    """The login host's holding folders whose runtime/``name`` holds ``needle``."""
    return [d for d in Path(os.environ.get("TMPDIR", "/tmp")).glob("rcl-secrets.*")
            if (d / "runtime" / name).is_file() and needle in (d / "runtime" / name).read_text()]


def test_a_slurm_run_with_a_storage_gets_its_credentials_from_the_login_host_when_it_starts(
        cluster_worlds, monkeypatch, s3) -> None:
    from tests.engine.test_outputs import SAVE, add_storage, s3_storage

    w = cluster_worlds("store")
    add_storage(w, s3_storage(s3))
    monkeypatch.setenv("ENG_S3_KEY", s3.access_key)
    monkeypatch.setenv("ENG_S3_SECRET", s3.secret_key)
    big = run_spec("big", "slurm-host", ["sleep", "300"], overrides={"resources": {"gpu_count": 2, "nodes": 2}})
    w.add_run(big)
    w.until("big", lambda s: s.phase == "Running", timeout=30)
    # No secrets of its own: the Storage's credentials alone make it hold and wait.
    w.add_run(run_spec("saver", "slurm-host", ["sh", "-c", SAVE], outputs={"storage": "s3-out"},
                       overrides={"resources": {"gpu_count": 1}}))
    w.until("saver", lambda s: s.phase == "Pending" and "queued in Slurm" in (s.message or ""), timeout=30)
    rt = w.shared / "saver-g1-a1" / "runtime"
    assert (rt / "secrets.pending").is_file() and not (rt / "storage.env").exists()
    for p in w.cluster.shared.rglob("*"):
        if p.is_file() and not p.is_symlink():
            assert s3.secret_key.encode() not in p.read_bytes(), p
    [hold] = _holding_file("storage.env", s3.secret_key)
    assert stat.S_IMODE(hold.stat().st_mode) == 0o700
    assert not str(hold).startswith(str(w.cluster.shared))

    stop(w, big)  # the GPUs come free: the queued job starts, gets the credentials, and uploads
    st = w.until("saver", lambda s: s.phase in ("Succeeded", "Failed"), timeout=90)
    assert st.phase == "Succeeded", st.message
    base = f"p/{w.namespace}/saver/g1"
    wait_until(lambda: s3.path(f"{base}/checkpoints/checkpoint-3.json").is_file(), 30, what="the upload")
    assert s3.path(f"{base}/checkpoints/checkpoint-3/w.bin").stat().st_size == 4096
    assert not (rt / "storage.env").exists() and not (rt / "secrets.env").exists()
    wait_until(lambda: not _holding_file("storage.env", s3.secret_key), 10, what="the holding folder to go")
    text = (w.repo / "status" / "saver.yaml").read_text()
    assert s3.secret_key not in text and s3.access_key not in text


def test_a_worker_that_escapes_the_job_is_stopped_before_the_next_attempt_is_submitted(cluster_worlds) -> None:
    """This cluster tracks a job's processes by parentage (proctrack/linuxproc): a worker in a
    session of its own that ignores SIGTERM outlives scancel. Its login host is also its node, so
    the stop sees it, ends it, and only then is the changed spec submitted."""
    from reconciler.runtime.readings import carriers

    w = cluster_worlds("escape")
    worker = "setsid sh -c 'trap \"\" TERM; while :; do sleep 0.2; done' </dev/null >/dev/null 2>&1 & "
    w.add_run(run_spec("esc", "slurm-host", ["sh", "-c", worker + "sleep 300"]))
    w.until("esc", lambda s: s.phase == "Running", timeout=60)
    root = str(w.shared)
    wait_until(lambda: len(carriers(root=root).get("esc-g1-a1", [])) >= 2, 20, what="the worker")
    w.add_run(run_spec("esc", "slurm-host", ["sh", "-c", worker + "sleep 301"]))
    w.until("esc", lambda s: s.generation == 2 and s.phase in ("Pending", "Running"), timeout=60)
    assert not carriers(root=root).get("esc-g1-a1"), "the escaped worker outlived the stop"
    stop(w, run_spec("esc", "slurm-host", ["sh", "-c", worker + "sleep 301"]))
    w.until("esc", lambda s: s.phase == "Terminated", timeout=60)
    assert not [i for i in carriers(root=root) if i.startswith("esc-g")]


def test_an_ended_attempts_escaped_worker_is_stopped_before_its_retry_is_submitted(cluster_worlds) -> None:
    from reconciler.runtime.readings import carriers

    w = cluster_worlds("linger")
    worker = "setsid sh -c 'trap \"\" TERM; while :; do sleep 0.2; done' </dev/null >/dev/null 2>&1 & "
    w.add_run(run_spec("lin", "slurm-host", ["sh", "-c", worker + "sleep 3; exit 3"],
                       restartPolicy={"maxRetries": 1, "backoffSeconds": 0}))
    root = str(w.shared)
    w.until("lin", lambda s: s.phase == "Running", timeout=60)
    wait_until(lambda: carriers(root=root).get("lin-g1-a1"), 20, what="the worker")
    st = w.until("lin", lambda s: s.attempt == 2, timeout=90)
    assert st.handle.identity == "lin-g1-a2"
    assert not carriers(root=root).get("lin-g1-a1"), "the first attempt's worker outlived its retry's start"
    stop(w, run_spec("lin", "slurm-host", ["sh", "-c", worker + "sleep 3; exit 3"],
                     restartPolicy={"maxRetries": 1, "backoffSeconds": 0}))
    w.until("lin", lambda s: s.phase in ("Terminated", "Failed"), timeout=90)
    wait_until(lambda: not [i for i in carriers(root=root) if i.startswith("lin-g")], 30, what="nothing left")
