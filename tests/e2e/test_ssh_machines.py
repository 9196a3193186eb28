"""SSH machines end to end: real passes against a real sshd (user rctest), real processes."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from reconciler.core.runstatus import parse_iso
from tests.world import World, alive_instances, fleet, git, kill_group, machine, run_spec

pytestmark = pytest.mark.e2e


@pytest.fixture
def world(tmp_path, sshd):
    with World(tmp_path, [fleet([machine(sshd)])]) as w:
        yield w


def test_runs_to_succeeded_on_the_ssh_host(world, sshd):
    world.add_run(run_spec("hello", "ssh-host", ["sh", "-c", "echo hello from $(id -un); sleep 0.3"]))
    st = world.until("hello", lambda s: s.phase == "Succeeded")
    assert st.handle.machine == "lab-1" and st.handle.identity == "hello-g1-a1"
    assert st.handle.workspace.startswith("/")
    local = world.bundle("hello-g1-a1")
    assert (local / "artifacts" / "stdout.log").read_text() == f"hello from {sshd.user}\n"
    assert (local / "runtime" / "result.json").is_file()
    assert any(a["path"] == "artifacts/stdout.log" for a in st.artifacts)
    assert "status/hello.yaml" in git(world.repo, "log", "--name-only", "--format=")
    assert "Succeeded" in git(world.repo, "show", "HEAD:status/hello.yaml")


def test_remote_workspace_removed_after_collect_or_kept(tmp_path, sshd):
    with World(tmp_path, [fleet([machine(sshd)])], remote_cleanup="never") as w:
        w.add_run(run_spec("keep", "ssh-host", ["sh", "-c", "echo kept"]))
        st = w.until("keep", lambda s: s.phase == "Succeeded")
        ws = Path(st.handle.workspace)
        assert (ws / "runtime" / "collected").exists() and (ws / "artifacts" / "stdout.log").exists()
        w.flags["remote_cleanup"] = "after_collect"
        w.add_run(run_spec("gone", "ssh-host", ["sh", "-c", "echo gone"]))
        st = w.until("gone", lambda s: s.phase == "Succeeded")
        # removed by the next pass, which reads the end from git (engine/endclean.py)
        assert w.passes_until(lambda: not Path(st.handle.workspace).exists()) == 1
        assert (w.bundle("gone-g1-a1") / "artifacts" / "stdout.log").read_text() == "gone\n"
        # the next pass finds nothing there and changes nothing
        assert w.run_pass().written == []


def test_docker_over_ssh(tmp_path, sshd, dockerd):
    with World(tmp_path, [fleet([machine(sshd, docker_host=dockerd.host)])]) as w:
        w.add_run(run_spec("boxed", "ssh-docker", ["sh", "-c", "echo in a box as $(id -u); cat /proc/1/cmdline"]))
        st = w.until("boxed", lambda s: s.phase == "Succeeded", timeout=60)
        assert st.handle.container == "boxed-g1-a1" and st.handle.machine == "lab-1"
        out = (w.bundle("boxed-g1-a1") / "artifacts" / "stdout.log").read_text()
        assert out.startswith(f"in a box as {sshd_uid(sshd)}\n") and "launch.sh" in out
        # collected: the container is removed
        assert dockerd.docker("ps", "-aq", "--filter", "name=boxed-g1-a1").stdout.strip() == ""


def test_docker_here(tmp_path, dockerd):
    with World(tmp_path, [], docker_host=dockerd.host) as w:
        w.add_run(run_spec("here", "local-docker", ["sh", "-c", "echo local box; ls /bundle/job.json"]))
        running = w.until("here", lambda s: s.phase in ("Running", "Succeeded"), timeout=60)
        assert running.handle.container == "here-g1-a1"
        st = w.until("here", lambda s: s.phase == "Succeeded", timeout=60)
        ws = Path(st.handle.workspace)
        assert (ws / "artifacts" / "stdout.log").read_text() == "local box\n/bundle/job.json\n"


# Attempt 1 saves a checkpoint at step 3 and fails; attempt 2 is given it and reads its step.
RESUMING = """
if [ -n "${RECONCILER_RESUME_DIR:-}" ]; then
  echo "$RECONCILER_RESUME_DIR $(cat "$RECONCILER_RESUME_DIR/step")"
  touch "$RECONCILER_RESUME_DIR/x" 2>/dev/null && echo writable || echo read-only
  exit 0
fi
mkdir -p artifacts/output/checkpoint-3 && echo 3 > artifacts/output/checkpoint-3/step
echo '{}' > artifacts/output/checkpoint-3/trainer_state.json
exit 1
"""


def test_docker_relaunch_resumes_from_the_previous_attempts_checkpoint_mounted_read_only(tmp_path, dockerd):
    """The previous attempt's workspace is not the container's /bundle: its checkpoint is mounted."""
    with World(tmp_path, [], docker_host=dockerd.host) as w:
        w.add_run(run_spec("again", "local-docker", ["sh", "-c", RESUMING],
                           restartPolicy={"maxRetries": 1, "backoffSeconds": 0}))
        st = w.until("again", lambda s: s.phase == "Succeeded", timeout=90)
        assert st.attempt == 2, st.message
        ws = Path(st.handle.workspace)
        assert (ws / "artifacts" / "stdout.log").read_text() == "/reconciler-resume/checkpoint-3 3\nread-only\n"
        assert json.loads((ws / "job.json").read_text())["payload"]["resume_from"] == "/reconciler-resume/checkpoint-3"


def test_docker_missing_image_fails_with_a_clear_message(tmp_path, sshd, dockerd):
    with World(tmp_path, [fleet([machine(sshd, docker_host=dockerd.host)])]) as w:
        w.add_run(run_spec("noimg", "ssh-docker", ["true"], overrides={"image": "reconciler-test/nope:1"},
                           restartPolicy={"maxRetries": 2, "backoffSeconds": 0}))
        st = w.until("noimg", lambda s: s.phase == "Failed", timeout=30)
        want = "image 'reconciler-test/nope:1' not found on lab-1; pulling is disabled by the template"
        assert want in st.message
        # it stays Failed with that reason on later passes: a permanent error is not retried
        for _ in range(2):
            w.run_pass()
        st2 = w.status("noimg")
        assert st2.phase == "Failed" and st2.attempt == 1 and want in st2.message, st2.message
        assert w.run_pass().written == []


def test_docker_stop_terminates_the_container(tmp_path, sshd, dockerd):
    with World(tmp_path, [fleet([machine(sshd, docker_host=dockerd.host)])]) as w:
        w.add_run(run_spec("long", "ssh-docker", ["sleep", "60"]))
        w.until("long", lambda s: s.phase == "Running", timeout=60)
        assert dockerd.docker("inspect", "-f", "{{.State.Running}}", "long-g1-a1").stdout.strip() == "true"
        doc = run_spec("long", "ssh-docker", ["sleep", "60"], desiredState="Stopped")
        w.add_run(doc)
        st = w.until("long", lambda s: s.phase == "Terminated", timeout=30)
        assert st.phase == "Terminated"
        assert dockerd.docker("ps", "-aq", "--filter", "name=long-g1-a1").stdout.strip() == ""


def sshd_uid(server) -> int:
    import pwd

    return pwd.getpwnam(server.user).pw_uid


def _pgid(ws: str) -> int:
    return int(Path(ws, "runtime", "pid").read_text())


def test_killed_remote_job_is_relaunched_then_fails(tmp_path, sshd):
    with World(tmp_path, [fleet([machine(sshd)])]) as w:
        w.add_run(run_spec("victim", "ssh-host", ["sleep", "60"],
                           restartPolicy={"maxRetries": 1, "backoffSeconds": 0}))
        st = w.until("victim", lambda s: s.phase == "Running")
        assert kill_group(Path(st.handle.workspace, "runtime", "pid"))  # SIGKILL: no result written
        st = w.until("victim", lambda s: s.attempt == 2 and s.phase == "Running")
        assert st.handle.identity == "victim-g1-a2"
        assert any("victim-g1-a1 is lost" in h.reason for h in st.history)
        root = Path(st.handle.workspace).parent
        assert alive_instances(root, "victim") == ["victim-g1-a2"]
        os.killpg(_pgid(st.handle.workspace), signal.SIGTERM)  # the wrapper records "terminated"
        st = w.until("victim", lambda s: s.phase == "Failed")
        assert st.attempt == 2 and "victim-g1-a2 was terminated from outside" in st.message
        assert "no retries left" in st.message
        assert alive_instances(root, "victim") == []
        # The run is over: no workspace of any of its attempts is left on the machine.
        assert w.passes_until(lambda: not [p.name for p in root.iterdir() if p.name.startswith("victim-")]) <= 1
        assert (w.repo / ".reconciler" / "bundles" / "victim-g1-a1" / "artifacts" / "manifest.json").is_file()


def test_unreachable_machine_keeps_its_run_and_adopts_it_back(tmp_path, sshd_factory):
    server = sshd_factory()
    with World(tmp_path, [fleet([machine(server)])], unreachable_grace=300) as w:
        w.add_run(run_spec("steady", "ssh-host", ["sleep", "60"]))
        st = w.until("steady", lambda s: s.phase == "Running")
        pid = st.handle.pid
        server.stop()  # the machine goes away; its processes keep running
        r = w.run_pass()
        st = w.status("steady")
        assert st.phase == "Unknown" and st.handle.identity == "steady-g1-a1"  # not dead: nobody can tell
        cond = st.condition("MachineReachable")
        assert cond.status == "False" and cond.reason == "Unreachable" and "connection refused" in cond.message
        assert r.plan.for_run("steady").action == "wait"
        since = cond.last_transition
        # a second pass (a fresh reconciler) changes nothing: the grace clock lives in the condition
        assert w.run_pass().written == []
        assert w.status("steady").condition("MachineReachable").last_transition == since
        assert alive_instances(Path(st.handle.workspace).parent, "steady") == ["steady-g1-a1"]
        server.start()
        st = w.until("steady", lambda s: s.condition("MachineReachable").status == "True")
        assert st.phase == "Running" and st.attempt == 1 and st.handle.pid == pid  # adopted, not relaunched
        assert alive_instances(Path(st.handle.workspace).parent, "steady") == ["steady-g1-a1"]


def test_lost_after_grace_relaunched_elsewhere_and_fenced_when_back(tmp_path, sshd_factory):
    one, two = sshd_factory("127.0.0.1"), sshd_factory("127.0.0.2")
    m1, m2 = machine(one, "lab-1", max_tasks=1), machine(two, "lab-2", max_tasks=1)
    with World(tmp_path, [fleet([m1, m2])], unreachable_grace=1) as w:
        w.add_run(run_spec("phoenix", "ssh-host", ["sleep", "60"], restartPolicy={"maxRetries": 2, "backoffSeconds": 0}))
        st = w.until("phoenix", lambda s: s.phase == "Running")
        first = st.handle.machine
        old_root, new_root = (m1, m2) if first == "lab-1" else (m2, m1)
        server = one if first == "lab-1" else two
        server.stop()
        t0 = time.time()
        w.run_pass(now=t0)
        st = w.status("phoenix")
        assert st.phase == "Unknown" and st.condition("MachineReachable").status == "False"
        since = parse_iso(st.condition("MachineReachable").last_transition)
        # past the grace (set explicitly, no sleeping): declared lost, relaunched on the other machine
        w.run_pass(now=since + 2)
        st = w.status("phoenix")
        assert st.attempt == 2 and st.handle.machine != first and st.phase == "Running", st.message
        assert any("lost" in h.reason and "unreachable" in h.reason for h in st.history)
        assert alive_instances(Path(new_root["workspace_root"]) / "test", "phoenix") == ["phoenix-g1-a2"]
        # the old instance is still alive on the partitioned machine...
        assert alive_instances(Path(old_root["workspace_root"]) / "test", "phoenix") == ["phoenix-g1-a1"]
        server.start()
        r = w.run_pass()
        fence = [c for c in r.plan.changes if any(k.identity == "phoenix-g1-a1" for k in c.kill)]
        assert fence and fence[0].code == "Fenced"
        # ...and fenced when it is back: exactly one instance alive, the current one
        assert alive_instances(Path(old_root["workspace_root"]) / "test", "phoenix") == []
        assert alive_instances(Path(new_root["workspace_root"]) / "test", "phoenix") == ["phoenix-g1-a2"]
        st = w.status("phoenix")
        assert st.phase == "Running" and st.handle.identity == "phoenix-g1-a2"


def test_lost_on_a_single_machine_relaunches_there_after_fencing(tmp_path, sshd_factory):
    server = sshd_factory()
    with World(tmp_path, [fleet([machine(server, max_tasks=2)])], unreachable_grace=1) as w:
        w.add_run(run_spec("solo", "ssh-host", ["sleep", "60"], restartPolicy={"maxRetries": 2, "backoffSeconds": 0}))
        st = w.until("solo", lambda s: s.phase == "Running")
        root = Path(st.handle.workspace).parent
        server.stop()
        t0 = time.time()
        w.run_pass(now=t0)
        w.run_pass(now=t0 + 5)
        st = w.status("solo")
        assert st.phase == "Pending" and st.attempt == 2 and "unreachable" in st.message
        server.start()
        w.run_pass()
        st = w.status("solo")
        assert st.phase == "Running" and st.handle.identity == "solo-g1-a2"
        assert alive_instances(root, "solo") == ["solo-g1-a2"]


def test_wrong_host_key_is_refused_with_a_clear_condition(tmp_path, sshd_factory):
    server = sshd_factory()
    with World(tmp_path, [fleet([machine(server, host_key=server.other_host_key())])]) as w:
        w.add_run(run_spec("guarded", "ssh-host", ["true"]))
        w.run_pass()
        st = w.status("guarded")
        assert st.phase == "Pending" and st.handle is None
        cond = st.condition("Scheduled")
        assert cond.status == "False" and cond.reason == "NoCapacity"
        want = (f"host key for lab-1 (127.0.0.1:{server.port}) does not match the pinned key in "
                "specs/fleets/lab.yaml: refusing to connect")
        assert want in cond.message and want in st.message
        assert "Accepted" not in server.log_text()


def test_two_runs_compete_for_one_gpu(tmp_path, sshd):
    with World(tmp_path, [fleet([machine(sshd, gpus=1, max_tasks=2)])]) as w:
        res = {"overrides": {"resources": {"gpu_count": 1}}}
        w.add_run(run_spec("gpu-a", "ssh-host", ["sh", "-c", "echo cvd=$CUDA_VISIBLE_DEVICES; sleep 60"], **res),
                  commit=False)
        w.add_run(run_spec("gpu-b", "ssh-host", ["sh", "-c", "echo cvd=$CUDA_VISIBLE_DEVICES"], **res))
        w.run_pass()
        a, b = w.status("gpu-a"), w.status("gpu-b")
        assert a.phase == "Running" and a.handle.gpus == [0]
        assert b.phase == "Pending" and b.condition("Scheduled").reason == "NoCapacity"
        assert "lab-1: 0 free GPU(s) of 1 wanted" in b.message
        w.run_pass()
        assert w.status("gpu-b").phase == "Pending"  # still waiting while gpu-a holds the GPU
        os.killpg(_pgid(a.handle.workspace), signal.SIGTERM)
        b = w.until("gpu-b", lambda s: s.phase == "Succeeded")
        assert b.handle.gpus == [0]
        assert (w.bundle("gpu-b-g1-a1") / "artifacts" / "stdout.log").read_text() == "cvd=0\n"
        assert "export CUDA_VISIBLE_DEVICES=0" in (w.bundle("gpu-b-g1-a1") / "scripts" / "env.sh").read_text()


def test_drained_machine_takes_no_new_work(tmp_path, sshd):
    with World(tmp_path, [fleet([machine(sshd, max_tasks=0)])]) as w:
        w.add_run(run_spec("waiting", "ssh-host", ["true"]))
        w.run_pass()
        st = w.status("waiting")
        assert st.phase == "Pending" and "lab-1: drained (max_tasks 0)" in st.message


def test_docker_gets_gpus_only_when_the_run_asks(tmp_path, sshd, dockerd):
    """The test dockerd has no NVIDIA runtime: a run with a GPU gets ``--gpus device=0``, which this
    daemon refuses (a permanent error that says so); a run without GPUs gets no --gpus at all."""
    with World(tmp_path, [fleet([machine(sshd, gpus=1, docker_host=dockerd.host)])]) as w:
        w.add_run(run_spec("cpu-box", "ssh-docker", ["true"]), commit=False)
        w.add_run(run_spec("gpu-box", "ssh-docker", ["true"], overrides={"resources": {"gpu_count": 1}}))
        st = w.until("cpu-box", lambda s: s.phase == "Succeeded", timeout=60)
        g = w.status("gpu-box")
        assert g.phase == "Failed" and g.attempt == 1
        assert "docker on lab-1 cannot give GPUs to containers: docker: Error response from daemon" in g.message
        assert "export CUDA_VISIBLE_DEVICES=0" in (w.bundle("gpu-box-g1-a1") / "scripts" / "env.sh").read_text()
        assert "CUDA_VISIBLE_DEVICES" not in (w.bundle("cpu-box-g1-a1") / "scripts" / "env.sh").read_text()
        assert st.handle.gpus == []


def test_old_generation_on_a_remote_machine_is_collected_then_removed(world):
    argv = ["sh", "-c", "echo generation one; sleep 300"]
    world.add_run(run_spec("x", "ssh-host", argv))
    world.until("x", lambda s: s.phase == "Running" and s.handle.identity == "x-g1-a1")
    old_ws = Path(world.status("x").handle.workspace)
    world.add_run(run_spec("x", "ssh-host", ["sh", "-c", "echo generation two; sleep 300"]))
    st = world.until("x", lambda s: s.generation == 2 and s.phase == "Running")
    assert alive_instances(old_ws.parent, "x") == ["x-g2-a1"]
    result = world.run_pass()
    leftovers = [(c.action, c.identity, c.remove) for c in result.plan.changes if c.code == "Leftover"]
    assert leftovers == [("collect", "x-g1-a1", True)]
    assert not old_ws.exists(), "the old generation's remote workspace is still there"
    assert (world.bundle("x-g1-a1") / "artifacts" / "stdout.log").read_text() == "generation one\n"
    assert not [c for c in world.run_pass().plan.changes if c.code == "Leftover"]
    assert st.handle.identity == "x-g2-a1"
