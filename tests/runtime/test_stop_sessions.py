"""A worker in a session of its own (``setsid``, as torchrun starts its workers) outlives a kill of
its attempt's process group; the agent's probe still reports the attempt alive and its terminate
ends it, here and on a machine reached over SSH (a real sshd on loopback)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from reconciler.core import boundary
from reconciler.machines.remote_agent import agent_program
from reconciler.runtime import probe, stop
from reconciler.runtime.readings import carriers, group_alive
from tests.e2e.attempts import kill_until_gone

pytest_plugins = ["tests.infra.fixtures"]

LAUNCH = Path(__file__).resolve().parents[2] / "reconciler" / "runtime" / "launch.sh"
# The job: a worker that leaves the group (its own session), ignores SIGTERM and keeps forking
# short-lived children (each carries the identity too), then the job's own main process.
WORKER = "setsid sh -c 'trap \"\" TERM; while :; do sleep 0.2; done' </dev/null >/dev/null 2>&1 &\nsleep 300\n"


def stage(ws: Path) -> None:
    (ws / "scripts").mkdir(parents=True)
    shutil.copy(LAUNCH, ws / "scripts" / "launch.sh")
    (ws / "scripts" / "entrypoint.sh").write_text(WORKER)


def until(pred, timeout=30.0, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def sessions(identity: str, root: str) -> set[int]:
    """The sessions the identity's live processes under ``root`` are in (one scan of /proc): another
    suite beside this one may run an attempt of the same name, never this test's."""
    out = set()
    for pid in carriers(root=root).get(identity, []):
        try:
            out.add(os.getsid(pid))
        except ProcessLookupError:
            pass
    return out


def kill_everything(identity: str, root: str) -> None:
    kill_until_gone(lambda: carriers(root=root).get(identity, []))


def started_with_a_worker(ws: Path, identity: str) -> int:
    """Wait until the wrapper's group and the worker's own session are both up; the wrapper's pgid."""
    pgid = until(lambda: (ws / "runtime" / "pid").is_file() and int((ws / "runtime" / "pid").read_text()),
                 what="the wrapper's pid")
    until(lambda: len(sessions(identity, str(ws.parent))) >= 2, what="a worker in a session of its own")
    return pgid


def kill_group_only(pgid: int, identity: str, root: str) -> None:
    """What the soak found: the job's process group is killed, the worker in its own session stays."""
    os.killpg(pgid, signal.SIGKILL)
    until(lambda: not group_alive(pgid, identity), what="the group to die")
    assert carriers(root=root).get(identity), "the worker did not survive its group's kill: the test shows nothing"


@pytest.fixture
def local_attempt(tmp_path):
    identity = "lone-g1-a1"
    ws = tmp_path / identity
    stage(ws)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}
    subprocess.Popen(["sh", str(ws / "scripts" / "launch.sh"), identity], cwd=ws, env=env, start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield ws, identity
    finally:
        kill_everything(identity, str(ws.parent))


def test_terminate_ends_a_worker_in_its_own_session_after_its_group_was_killed(local_attempt):
    ws, identity = local_attempt
    kill_group_only(started_with_a_worker(ws, identity), identity, str(ws.parent))
    # The probe: no result and no group, yet the attempt lives (and the trust boundary keeps it so).
    entry = probe.probe(str(ws.parent), [identity.split("-g")[0]])["runs"][identity]
    assert entry["state"] == "lost" and entry["live"] >= 1
    seen = boundary.parse_run(identity, entry)
    assert seen.lingering and seen.live == entry["live"] and not seen.alive  # its end stands; it is stopped
    t0 = time.time()
    out = stop.terminate(str(ws), identity, grace=0.5)
    assert out["was_alive"] and out["killed"] and not out.get("error"), out
    assert carriers(root=str(ws.parent)).get(identity) is None  # nothing of it: not one forked child either
    assert time.time() - t0 < 0.5 + stop.KILL_WAIT + 5  # the grace, the SIGKILL rounds, a loaded machine
    assert json.loads((ws / "runtime" / "result.json").read_text())["state"] == "terminated"
    # Idempotent: once more finds nothing.
    assert stop.terminate(str(ws), identity, grace=0.5) == {"identity": identity, "was_alive": False}


def test_a_finished_result_with_a_live_worker_reads_alive(local_attempt):
    ws, identity = local_attempt
    pgid = started_with_a_worker(ws, identity)
    os.killpg(pgid, signal.SIGTERM)  # the wrapper writes "terminated" and exits; the worker stays
    until(lambda: (ws / "runtime" / "result.json").is_file(), what="the wrapper's result")
    until(lambda: not group_alive(pgid, identity), what="the group to end")
    entry = probe.probe(str(ws.parent), ["lone"])["runs"][identity]
    assert entry["state"] == "terminated" and entry["live"] >= 1
    assert boundary.parse_run(identity, entry).lingering
    assert not stop.terminate(str(ws), identity, grace=0.3).get("error")
    assert "live" not in probe.probe(str(ws.parent), ["lone"])["runs"][identity]


def test_the_live_count_is_parsed_at_the_trust_boundary():
    base = {"state": "failed", "exit_code": 1}
    for bad in (-1, True, "3", 1.5, 10**30, None, [1]):
        assert boundary.parse_run("x-g1-a1", {**base, "live": bad}).live == 0, bad
    assert boundary.parse_run("x-g1-a1", {**base, "live": 3}).lingering


def test_a_stop_that_cannot_end_everything_says_so(tmp_path, monkeypatch):
    # A process that outlives SIGKILL (uninterruptible sleep on a dead file server) cannot be made
    # here: the re-scan is given one that never goes, and the stop must report it, not succeed.
    ws = tmp_path / "stuck-g1-a1"
    (ws / "runtime").mkdir(parents=True)
    monkeypatch.setattr(stop, "KILL_WAIT", 0.2)
    monkeypatch.setattr(stop, "_remaining", lambda pgid, identity, seen, root=None: {2 ** 22 + 7})
    out = stop.terminate(str(ws), "stuck-g1-a1", grace=0.1)
    assert out["left"] == 1 and "still alive after SIGKILL" in out["error"]
    assert boundary.parse_stop(out)["error"]


@pytest.fixture
def remote_attempt(sshd):
    identity = "far-g1-a1"
    root = f"{sshd.home}/stop-sessions-{uuid.uuid4().hex[:10]}"  # the account is shared with other suites
    ws = f"{root}/{identity}"
    sshd.run(f"rm -rf {root} && mkdir -p {ws}/scripts && cat > {ws}/scripts/launch.sh", input=LAUNCH.read_text())
    sshd.run(f"cat > {ws}/scripts/entrypoint.sh", input=WORKER)
    sshd.run(f"cd {ws} && setsid -f sh scripts/launch.sh {identity} </dev/null >/dev/null 2>&1")
    try:
        yield sshd, Path(ws), identity
    finally:
        kill_everything(identity, root)
        sshd.run(f"rm -rf {root}", check=False)


def agent_over_ssh(server, args: dict) -> dict:
    program, argv = agent_program(args)
    p = server.run(["python3", "-", *argv], input=program, timeout=60)
    return json.loads(p.stdout)


def test_over_ssh_probe_sees_and_terminate_ends_a_worker_in_its_own_session(remote_attempt):
    server, ws, identity = remote_attempt
    kill_group_only(started_with_a_worker(ws, identity), identity, str(ws.parent))
    report = agent_over_ssh(server, {"op": "probe", "root": str(ws.parent), "names": ["far"]})
    entry = boundary.parse_probe(report).runs[identity]
    assert entry.state == "lost" and entry.lingering and entry.live >= 1
    out = boundary.parse_stop(agent_over_ssh(server, {"op": "terminate", "workspace": str(ws),
                                                      "identity": identity, "grace": 0.5}))
    assert out["was_alive"] and out["killed"] and "error" not in out, out
    assert carriers(root=str(ws.parent)).get(identity) is None


def test_the_agent_program_still_runs_where_only_python3_is(tmp_path):
    # The agent ships its modules as one program: the new scan must be in it.
    program, argv = agent_program({"op": "probe", "root": str(tmp_path)})
    p = subprocess.run([sys.executable, "-", *argv], input=program, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and json.loads(p.stdout)["runs"] == {}


def test_terminate_follows_the_sessions_the_identity_leads(tmp_path):
    # A child whose environment does not name the identity (one caught between fork and exec
    # reads as such for an instant; here one started with an empty environment) in the session the
    # worker leads goes with the attempt; the test process's own session is never followed.
    identity = "kin-g1-a1"
    ws = tmp_path / identity
    stage(ws)
    (ws / "scripts" / "entrypoint.sh").write_text(
        "setsid sh -c 'env -i sleep 300 & trap \"\" TERM; while :; do sleep 0.2; done' </dev/null >/dev/null 2>&1 &\n"
        "sleep 300\n")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}
    subprocess.Popen(["sh", str(ws / "scripts" / "launch.sh"), identity], cwd=ws, env=env, start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bystander = subprocess.Popen(["sleep", "300"], env={**env, "RECONCILER_IDENTITY": "other-g1-a1"})
    try:
        pgid = started_with_a_worker(ws, identity)
        worker_session = next(s for s in sessions(identity, str(tmp_path)) if s != pgid)
        kin = until(lambda: [p for p in map(int, filter(str.isdigit, os.listdir("/proc")))
                             if _session(p) == worker_session
                             and p not in carriers(root=str(tmp_path)).get(identity, [])],
                    what="the worker's child without the identity")
        assert stop.terminate(str(ws), identity, grace=0.3).get("error") is None
        assert all(_session(p) is None for p in kin), "a child in the worker's session outlived the stop"
        assert bystander.poll() is None  # another identity, and the test's own session: untouched
    finally:
        bystander.kill()
        bystander.wait()
        kill_everything(identity, str(tmp_path))


def _session(pid: int) -> int | None:
    """The session of a live (non-zombie) process, else None."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            rest = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if rest[0] in ("Z", "X") else int(rest[3])


def test_a_namesake_of_another_repository_is_neither_counted_nor_stopped(tmp_path):
    """Two repositories (two workspace roots, as two namespaces make) each run an attempt named
    `twin-g1-a1` on one machine: the probe and the terminate of one never see the other's."""
    identity = "twin-g1-a1"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}
    roots = [tmp_path / "team-a", tmp_path / "team-b"]
    for root in roots:
        stage(root / identity)
        subprocess.Popen(["sh", str(root / identity / "scripts" / "launch.sh"), identity], cwd=root / identity,
                         env=env, start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        for root in roots:
            started_with_a_worker(root / identity, identity)  # every process of it is up
        a, b = (len(carriers(root=str(r))[identity]) for r in roots)
        everyone = set(carriers()[identity])  # one machine, both namesakes (and maybe another suite's)
        assert all(everyone & set(carriers(root=str(r))[identity]) for r in roots)
        # One repository's count (its worker forks short-lived children: a count may be one off).
        assert abs(probe.probe(str(roots[0]), ["twin"])["runs"][identity]["live"] - a) <= 1
        out = stop.terminate(str(roots[0] / identity), identity, grace=0.5)
        assert out["was_alive"] and not out.get("error"), out
        assert not carriers(root=str(roots[0])).get(identity)
        assert abs(len(carriers(root=str(roots[1]))[identity]) - b) <= 1  # the other repository's, untouched
    finally:
        for root in roots:
            kill_everything(identity, str(root))
