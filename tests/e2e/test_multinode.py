"""Runs on several machines over SSH: gang placement, one launch per node with its rank and the
run's rendezvous, and an attempt that ends on every node when one node is lost or frozen.

The machines are real sshd servers on distinct loopback addresses. The gloo test runs a real
2-node torch job (torch from the ms-swift environment, whose python only root can reach here, so
those machines log in as root); the fault tests use plain processes, which show what is stopped
more directly than torch would (a survivor torch exits by itself; a sleeping process does not).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.test_swift_e2e import swift_python  # noqa: F401 - the fixture
from tests.infra._proc import alive
from tests.repo_helpers import processes_with
from tests.world import World, fleet, machine, run_spec

ALL_REDUCE = """\
import os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
t = torch.ones(1) * (rank + 1)
dist.all_reduce(t)
print(f"rank {rank} of {size} on {os.environ['RECONCILER_IDENTITY']}: sum {t.item():.0f}", flush=True)
dist.destroy_process_group()
"""

TORCHRUN = ('exec "$RECONCILER_PYTHON" -m torch.distributed.run --nnodes "$NNODES" --nproc-per-node 1 '
            '--node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" inputs/jobs/ar.py')


def gang_world(base: Path, servers, python: str | None = None, **flags) -> World:
    ms = [machine(s, f"node-{i}", max_tasks=1) for i, s in enumerate(servers)]
    for m in ms:
        if python:
            m["python"] = python
    return World(base, [fleet(ms)], **flags)


def test_a_two_node_gloo_all_reduce_succeeds_and_both_ranks_logs_are_collected(tmp_path, sshd_factory,
                                                                            swift_python) -> None:  # noqa: F811
    servers = [sshd_factory(host=f"127.0.0.{i + 2}", user="root") for i in range(2)]
    w = gang_world(tmp_path, servers, python=swift_python)
    (w.repo / "jobs").mkdir()
    (w.repo / "jobs" / "ar.py").write_text(ALL_REDUCE)
    w.add_run(run_spec("ar", "ssh-host", ["sh", "-c", TORCHRUN], inputs=["jobs/ar.py"],
                       overrides={"resources": {"nodes": 2}, "runtime_env": {"GLOO_SOCKET_IFNAME": "lo"}}))
    try:
        first = w.run_pass()
        change = first.plan.for_run("ar")
        assert change.action == "launch" and [n.machine for n in change.nodes] == ["node-0", "node-1"]
        assert change.considered[:2] == ["node-0: node n0 (the rendezvous)", "node-1: node n1"]
        st = w.until("ar", lambda s: s.phase == "Succeeded", timeout=120)
        assert [n["identity"] for n in st.handle.nodes] == ["ar-g1-a1-n0", "ar-g1-a1-n1"]
        outs = [(w.bundle(f"ar-g1-a1-n{k}") / "artifacts" / "stdout.log").read_text() for k in range(2)]
        assert "rank 0 of 2 on ar-g1-a1-n0: sum 3" in outs[0]
        assert "rank 1 of 2 on ar-g1-a1-n1: sum 3" in outs[1]
        env0 = (w.bundle("ar-g1-a1-n0") / "runtime" / "launch.env").read_text()
        assert "MASTER_ADDR=127.0.0.2" in env0 and "NODE_RANK=0" in env0 and "NNODES=2" in env0
    finally:
        w.cleanup()


def _gang(tmp_path, sshd_factory, **flags) -> World:
    return gang_world(tmp_path, [sshd_factory(host=f"127.0.0.{i + 2}") for i in range(2)], **flags)


def _pgid(st, rank: int) -> int:
    """The process group of a node's launch wrapper (it leads it), from the node's workspace."""
    return int((Path(st.handle.nodes[rank]["workspace"]) / "runtime" / "pid").read_text())


def _until(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


# A node that also leaves a worker in a session of its own, as torchrun's workers are.
NODE = ["sh", "-c", "setsid sleep 300 & echo rank $NODE_RANK; sleep 300"]


def test_a_node_lost_ends_the_attempt_on_every_node_and_the_run_is_relaunched(tmp_path, sshd_factory) -> None:
    w = _gang(tmp_path, sshd_factory)
    w.add_run(run_spec("pair", "ssh-host", NODE, overrides={"resources": {"nodes": 2}},
                       restartPolicy={"maxRetries": 1, "backoffSeconds": 0}))
    try:
        st = w.until("pair", lambda s: s.phase == "Running", timeout=30)
        survivor_worker = _until(lambda: [p for p in processes_with("RECONCILER_IDENTITY=pair-g1-a1-n0", within=w.roots)
                                          if os.getsid(p) == p], 10, "node 0's worker in its own session")
        # Node 1's job has started and written its output (its wrapper shows Running before that).
        out1 = Path(st.handle.nodes[1]["workspace"]) / "artifacts" / "stdout.log"
        _until(lambda: out1.is_file() and out1.read_text() == "rank 1\n", 10, "node 1's output")
        os.killpg(_pgid(st, 1), signal.SIGKILL)  # node 1's whole process group dies
        rec, reasons = w.reconciler(), []

        def relaunched() -> bool:
            reasons.extend(c.reason for c in rec.run_pass().plan.changes if c.name == "pair")
            st = w.status("pair")
            return st.attempt == 2 and st.phase == "Running"

        _until(relaunched, 40, "attempt 2 running")
        st = w.status("pair")
        assert st.handle.identity == "pair-g1-a2"
        assert any("node n1 on node-1 is lost" in r for r in reasons), reasons
        # Node 0 was stopped, its worker in its own session with it; attempt 2 runs on both nodes.
        assert not processes_with("RECONCILER_IDENTITY=pair-g1-a1-n0", within=w.roots)
        assert not any(alive(p) for p in survivor_worker)  # (a zombie nobody reaps is dead)
        _until(lambda: processes_with("RECONCILER_IDENTITY=pair-g1-a2-n0", within=w.roots)
               and processes_with("RECONCILER_IDENTITY=pair-g1-a2-n1", within=w.roots), 20, "attempt 2 on both nodes")
        # Both nodes of attempt 1 were collected.
        for k in range(2):
            assert (w.bundle(f"pair-g1-a1-n{k}") / "artifacts" / "stdout.log").read_text() == f"rank {k}\n"
    finally:
        w.cleanup()


def test_a_frozen_node_is_caught_by_its_heartbeat(tmp_path, sshd_factory) -> None:
    w = _gang(tmp_path, sshd_factory, gang_heartbeat_timeout=3.0)
    w.add_run(run_spec("ice", "ssh-host", NODE, overrides={"resources": {"nodes": 2}}))
    try:
        st = w.until("ice", lambda s: s.phase == "Running", timeout=30)
        os.killpg(_pgid(st, 1), signal.SIGSTOP)  # frozen, not dead: torch would wait for ever
        st = w.until("ice", lambda s: s.phase == "Failed", timeout=30)
        assert "has not beaten" in " ".join(h.reason for h in st.history)
        _until(lambda: not processes_with("RECONCILER_IDENTITY=ice-g1-a1", within=w.roots), 15, "every node stopped")
    finally:
        w.cleanup()


def test_a_gang_waits_whole_when_one_machine_is_missing(tmp_path, sshd_factory) -> None:
    servers = [sshd_factory(host="127.0.0.2")]
    w = gang_world(tmp_path, servers)
    w.add_run(run_spec("three", "ssh-host", ["true"], overrides={"resources": {"nodes": 2}}))
    try:
        change = w.run_pass().plan.for_run("three")
        assert (change.action, change.code) == ("wait", "NoCapacity")
        assert "2 machines needed at once, 1 have room" in change.reason
        assert not processes_with("three-g1-a1", within=w.roots)
    finally:
        w.cleanup()


@pytest.mark.parametrize("placement", ["local-host"])
def test_several_nodes_need_ssh_or_slurm_placement(tmp_path, placement) -> None:
    from reconciler.spec.load import load_tree

    w = World(tmp_path)
    w.add_run(run_spec("wide", placement, ["true"], overrides={"resources": {"nodes": 2}}))
    desired = load_tree(w.repo)
    assert "wide" in desired.invalid and "needs ssh or slurm placement" in desired.invalid["wide"]


def test_a_node_whose_machine_stays_unreachable_ends_the_attempt_on_the_others(tmp_path, sshd_factory) -> None:
    servers = [sshd_factory(host=f"127.0.0.{i + 2}") for i in range(2)]
    w = gang_world(tmp_path, servers, unreachable_grace=1.0)
    w.add_run(run_spec("far", "ssh-host", NODE, overrides={"resources": {"nodes": 2}}))
    try:
        w.until("far", lambda s: s.phase == "Running", timeout=30)
        servers[1].stop()  # node-1 stops answering; what runs there is out of reach
        rec = w.reconciler()
        first = rec.run_pass().plan.for_run("far")
        assert (first.action, first.code) == ("wait", "MachineUnreachable") and first.machine == "node-1"
        assert processes_with("RECONCILER_IDENTITY=far-g1-a1-n0", within=w.roots)  # within the grace nothing is stopped
        time.sleep(1.1)  # past unreachable_grace (1 s): the timeout under test
        st = _until(lambda: rec.run_pass() and (s := w.status("far")).phase == "Failed" and s, 20, "Failed")
        assert "node-1, a node's machine, unreachable" in st.message
        # Node 0 was stopped: an attempt never goes on with a node missing.
        _until(lambda: not processes_with("RECONCILER_IDENTITY=far-g1-a1-n0", within=w.roots), 15, "node 0 stopped")
    finally:
        for pid in processes_with("RECONCILER_IDENTITY=far-g1-a1-n1", within=w.roots):
            os.kill(pid, signal.SIGKILL)
        w.cleanup()
