"""In-house machines behind a reverse tunnel, end to end: a control VM's sshd, the machine's own sshd,
the agent as a real process, and real passes through the tunnel."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from reconciler.status import store as statuses
from tests.infra._proc import free_port, port_open, wait_until
from tests.infra.fixtures import _require_sshd
from tests.infra.sshd import worker_user
from tests.infra.tunnel import INHOUSE_USER, MACHINE, VM_USER, Inhouse
from tests.world import World, alive_instances, fleet, remote_root, run_spec

pytestmark = pytest.mark.e2e


@pytest.fixture
def inhouse(tmp_path):
    _require_sshd()
    setup = Inhouse(tmp_path / "inhouse").start()
    try:
        yield setup
    finally:
        setup.close()


@pytest.fixture
def world(tmp_path, inhouse):
    with World(tmp_path, [fleet([inhouse.fleet_machine(remote_root())])]) as w:
        yield w


def agent_ssh(inhouse: Inhouse, *args: str, command: tuple[str, ...] = (), timeout: float = 15
              ) -> subprocess.CompletedProcess:
    """The ssh CLI with the agent's own key, against the control VM."""
    argv = ["ssh", "-F", "/dev/null", "-p", str(inhouse.vm.port), "-i", str(inhouse.agent_key),
            "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={inhouse.vm.known_hosts_file}", "-o", "GlobalKnownHostsFile=/dev/null",
            *args, f"{VM_USER}@127.0.0.1", *command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


# ---------------------------------------------------------------- the restricted key


def test_the_agent_key_holds_its_one_forward_and_nothing_else(inhouse):
    # Its forward works: the tunnel leads to the in-house sshd.
    inhouse.start_agent()
    with socket.create_connection(("127.0.0.1", inhouse.tunnel_port), timeout=5) as s:
        assert s.recv(64).startswith(b"SSH-2.0-")
    # A shell, or a command: nothing runs.
    shell = agent_ssh(inhouse, "-T", command=("echo", "pwned"))
    assert shell.returncode == 1 and "pwned" not in shell.stdout  # /bin/false ran instead
    # A terminal: refused.
    tty = agent_ssh(inhouse, "-tt", command=("true",))
    assert tty.returncode != 0 and "PTY allocation request failed" in tty.stderr
    # Another listen port: refused by the server.
    other = agent_ssh(inhouse, "-N", "-o", "ExitOnForwardFailure=yes", "-R", f"127.0.0.1:{free_port()}:127.0.0.1:22")
    assert other.returncode == 255 and "remote port forwarding failed" in other.stderr
    # A local forward (-L) into the VM: the channel is refused, not a byte of the VM's sshd comes back.
    local = free_port()
    fwd = subprocess.Popen(["ssh", "-F", "/dev/null", "-p", str(inhouse.vm.port), "-i", str(inhouse.agent_key),
                            "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                            "-o", f"UserKnownHostsFile={inhouse.vm.known_hosts_file}", "-N",
                            "-L", f"127.0.0.1:{local}:127.0.0.1:{inhouse.vm.port}", f"{VM_USER}@127.0.0.1"],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: port_open("127.0.0.1", local), timeout=10, what="the local forward's listener")
        with socket.create_connection(("127.0.0.1", local), timeout=5) as s:
            s.settimeout(5)
            assert s.recv(64) == b""  # refused channel: closed without data
    finally:
        fwd.kill()
        fwd.wait(timeout=10)
    # The key with the restrictions taken off would have read the banner: the check above can fail.
    assert "PermitOpen none" in inhouse.match_block and "AllowTcpForwarding remote" in inhouse.match_block


# ---------------------------------------------------------------- runs through the tunnel


def test_run_reaches_succeeded_through_the_tunnel(world, inhouse):
    inhouse.start_agent()
    world.add_run(run_spec("hello", "ssh-host", ["sh", "-c", "echo hello from $(id -un)"],
                           overrides={"target": MACHINE}))
    st = world.until("hello", lambda s: s.phase == "Succeeded")
    assert st.handle.machine == MACHINE
    assert (world.bundle("hello-g1-a1") / "artifacts" / "stdout.log").read_text() == f"hello from {INHOUSE_USER}\n"
    assert "tunnel up" in inhouse.log()


def test_agent_reconnects_by_itself_after_its_client_dies(inhouse):
    inhouse.start_agent()
    os.kill(inhouse.ssh_child(), signal.SIGKILL)
    wait_until(lambda: inhouse.log().count("tunnel up") == 2, timeout=15,
               what=f"the agent's second 'tunnel up'; its log:\n{inhouse.log()}")
    assert "tunnel down: ssh exited" in inhouse.log()
    assert inhouse.tunnel_open()


def test_tunnel_lost_mid_run_is_unknown_then_adopted(world, inhouse):
    inhouse.start_agent()
    world.add_run(run_spec("long", "ssh-host", ["sleep", "60"], overrides={"target": MACHINE}))
    st = world.until("long", lambda s: s.phase == "Running")
    root = os.path.dirname(st.handle.workspace)
    # The control VM goes away: its sessions end, the tunnel with them, and the agent cannot redial.
    inhouse.vm.stop()
    wait_until(lambda: not inhouse.tunnel_open(), timeout=10, what="the tunnel to close")
    world.run_pass()
    st = world.status("long")
    reach = st.condition("MachineReachable")
    assert reach is not None and reach.status == "False" and "tunnel not up" in reach.message
    # Unknown, not dead (docs/machines.md): not failed, not relaunched; the condition and message say why.
    assert st.phase == "Unknown" and "does not answer" in st.message
    # Back: the agent redials by itself, and the run is adopted, not launched again.
    inhouse.vm.start()
    inhouse.wait_up(2)
    st = world.until("long", lambda s: s.phase == "Running" and s.condition("MachineReachable").status == "True")
    assert st.handle.identity == "long-g1-a1" and st.attempt == 1
    assert alive_instances(__import__("pathlib").Path(root), "long") == ["long-g1-a1"]


def test_drain_from_the_machine_then_resume(world, inhouse):
    inhouse.start_agent()
    gate = os.path.join(remote_root(), "go")
    os.makedirs(os.path.dirname(gate), exist_ok=True)
    os.chmod(os.path.dirname(gate), 0o777)
    world.add_run(run_spec("first", "ssh-host", ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.1; done"],
                           overrides={"target": MACHINE}))
    world.until("first", lambda s: s.phase == "Running")
    drained = subprocess.run([sys.executable, "-m", "reconciler", "agent", "drain", "--reason", "GPU swap",
                              "--home", inhouse.machine.home], capture_output=True, text=True, timeout=30)
    assert drained.returncode == 0, drained.stderr
    world.add_run(run_spec("second", "ssh-host", ["true"], overrides={"target": MACHINE}))
    world.run_pass()
    second = world.status("second")
    assert second.phase == "Pending" and f"{MACHINE}: draining (GPU swap)" in second.message
    rows = {r["name"]: r for r in machines(world)}
    assert rows[MACHINE]["state"] == "draining" and rows[MACHINE]["tasks"] == 1
    # The running one finishes; the machine is then drained: free for manual use.
    open(gate, "w").close()
    world.until("first", lambda s: s.phase == "Succeeded")
    assert world.status("second").phase == "Pending"
    assert {r["name"]: r for r in machines(world)}[MACHINE]["state"] == "drained"
    resumed = subprocess.run([sys.executable, "-m", "reconciler", "agent", "resume", "--home", inhouse.machine.home],
                             capture_output=True, text=True, timeout=30)
    assert resumed.stdout.strip() == "resumed"
    world.until("second", lambda s: s.phase == "Succeeded")
    assert {r["name"]: r for r in machines(world)}[MACHINE]["state"] == "attached"


def machines(world: World) -> list[dict]:
    from reconciler.core import config
    from reconciler.cli.commands import machine_states

    return machine_states(config.load(str(world.repo), flags=world.flags))


def test_status_machines_shows_an_unreachable_tunnel(world, inhouse):
    rows = {r["name"]: r for r in machines(world)}  # no agent running
    assert rows[MACHINE]["state"] == "unreachable" and "tunnel not up" in rows[MACHINE]["reason"]
    assert rows[MACHINE]["connect"] == "tunnel"
    assert statuses.load_all(world.repo / "status") == {}  # asking changed nothing


# ---------------------------------------------------------------- set up from what authorize prints


def test_two_machines_set_up_from_what_authorize_prints_both_run_jobs(tmp_path):
    _require_sshd()
    lab = Inhouse(tmp_path / "lab", names=(MACHINE, "inhouse-2")).start()
    try:
        one, two = lab.machines.values()
        # One Match block for the login, listing both ports (sshd keeps the first value of each
        # keyword: a second block would never apply), one key line per machine with its own port.
        assert sum(line.startswith("Match ") for line in lab.vm.config_file.read_text().splitlines()) == 1
        assert f"PermitListen 127.0.0.1:{min(one.tunnel_port, two.tunnel_port)} " \
               f"127.0.0.1:{max(one.tunnel_port, two.tunnel_port)}" in lab.match_block
        assert lab.match_block in lab.vm.config_file.read_text()
        assert [f'permitlisten="127.0.0.1:{m.tunnel_port}"' in line for m, line in zip((one, two), lab.key_lines)] \
            == [True, True]
        one.start_agent()
        two.start_agent()
        with World(tmp_path, [fleet([one.fleet_machine(remote_root()), two.fleet_machine(remote_root())])]) as w:
            for m in (one, two):
                w.add_run(run_spec(f"on-{m.name}", "ssh-host", ["sh", "-c", "echo hello from $(id -un)"],
                                   overrides={"target": m.name}))
            for m in (one, two):
                st = w.until(f"on-{m.name}", lambda s: s.phase == "Succeeded")
                assert st.handle.machine == m.name
                out = (w.bundle(f"on-{m.name}-g1-a1") / "artifacts" / "stdout.log").read_text()
                assert out == f"hello from {m.server.user}\n"
        assert "remote port forwarding failed" not in one.log() + two.log()
    finally:
        lab.close()


@pytest.mark.parametrize("pam", [False, True], ids=["UsePAM-no", "UsePAM-yes"])
def test_the_printed_account_works_with_and_without_pam(tmp_path, pam):
    _require_sshd()
    lab = Inhouse(tmp_path / "lab", vm_user=worker_user("rcinvm"), new_account=True, pam=pam)
    try:
        assert lab.account.startswith("useradd -m -s /usr/sbin/nologin ") and "usermod -p '*'" in lab.account
        assert lab.shadow.split(":")[1] == "*"  # not locked ("!"): sshd without PAM would refuse it
        lab.start()
        assert ("UsePAM yes" if pam else "UsePAM no") in lab.vm.config_file.read_text()
        lab.start_agent()
        with socket.create_connection(("127.0.0.1", lab.tunnel_port), timeout=5) as s:
            assert s.recv(64).startswith(b"SSH-2.0-")
    finally:
        lab.close()


# ---------------------------------------------------------------- the agent's life


def test_a_silently_dead_machine_frees_its_port_within_client_alive(tmp_path):
    _require_sshd()
    interval = 1
    lab = Inhouse(tmp_path / "lab", client_alive=interval).start()
    try:
        assert f"ClientAliveInterval {interval}" in lab.match_block and "ClientAliveCountMax 2" in lab.match_block
        lab.start_agent()
        child = lab.ssh_child()
        # A frozen machine: its client answers nothing and sends no FIN.
        os.kill(child, signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            # Watched from the listening sockets, not by connecting: each connection to a frozen
            # forward wakes the VM's sshd and postpones its ClientAlive check (measured: polling
            # the port every 0.2 s kept it bound for over 60 s with ClientAliveInterval 1).
            wait_until(lambda: not listening(lab.tunnel_port), timeout=20, what="the VM to free the port")
            freed = time.monotonic() - t0
        finally:
            os.kill(child, signal.SIGCONT)
        print(f"port freed {freed:.1f}s after the client froze (ClientAliveInterval {interval} x 2)")
        assert freed <= 2 * (2 + 1) * interval + 3  # about 2 x (count + 1) x interval, measured
        # Back: the client finds its session gone and exits; the agent dials again and holds the port.
        lab.wait_up(2, timeout=20)
        assert lab.tunnel_open()
    finally:
        lab.close()


def listening(port: int) -> bool:
    """Whether something listens on 127.0.0.1:port (``ss``: it opens no connection)."""
    out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, timeout=10).stdout
    return "127.0.0.1:" in out


def test_kill_9_of_the_agent_frees_the_tunnel(inhouse):
    inhouse.start_agent()
    child = inhouse.ssh_child()
    os.kill(inhouse.proc.pid, signal.SIGKILL)
    inhouse.proc.wait(timeout=10)
    # The kernel ends its client with it (PR_SET_PDEATHSIG): the VM's port goes at once.
    wait_until(lambda: not inhouse.tunnel_open(), timeout=5, what="the tunnel's port to close")
    wait_until(lambda: not os.path.exists(f"/proc/{child}"), timeout=5, what="the orphaned ssh client to exit")
    inhouse.start_agent()  # what the supervisor does next: it gets the port at once
    assert inhouse.tunnel_open()


def test_an_outage_is_one_line_and_a_bounded_reminder(inhouse):
    inhouse.start_agent("--report-every", "1", "--max-backoff", "0.2")
    inhouse.vm.stop()
    t0 = time.monotonic()
    wait_until(lambda: inhouse.log().count("still down") >= 2, timeout=15, what="two reminders")
    elapsed = time.monotonic() - t0
    outage = inhouse.log().split("tunnel down", 1)[1]
    lines = [line for line in inhouse.log().splitlines() if " agent " in line]
    assert inhouse.log().count("tunnel down") == 1 and inhouse.log().count("tunnel connecting") == 1
    assert len([line for line in lines if "still down" in line]) <= elapsed / 1 + 1
    tries = [int(t) for t in re.findall(r"\((\d+) tries", outage)]
    assert tries[-1] >= 4, outage  # several retries, yet no line of their own
    inhouse.vm.start()
    inhouse.wait_up(2)
    assert inhouse.log().count("tunnel up") == 2


# ---------------------------------------------------------------- jobs and the agent: two logins


def test_a_job_cannot_read_the_tunnel_key_or_stop_the_agent(world, inhouse):
    inhouse.start_agent()
    key = str(inhouse.agent_key)
    world.add_run(run_spec("nosy", "ssh-host", ["sh", "-c",
                                                f"cat {key}; echo read=$?; kill -TERM {inhouse.proc.pid}; echo kill=$?"],
                           overrides={"target": MACHINE}))
    st = world.until("nosy", lambda s: s.phase in ("Succeeded", "Failed"))
    out = (world.bundle("nosy-g1-a1") / "artifacts" / "stdout.log").read_text()
    assert "read=1" in out and "kill=1" in out and "PRIVATE KEY" not in out, out
    assert st.phase == "Succeeded" and inhouse.proc.poll() is None and inhouse.tunnel_open()


# ---------------------------------------------------------------- foreign_gpus: avoid fails closed

FAILING_SMI = "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the driver' >&2\nexit 9\n"


def test_a_failing_gpu_query_withholds_every_gpu(tmp_path):
    _require_sshd()
    bin_dir = Path(tempfile.mkdtemp(prefix="rc-smi-", dir="/tmp"))
    bin_dir.chmod(0o755)
    (bin_dir / "nvidia-smi").write_text(FAILING_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    lab = Inhouse(tmp_path / "lab", machine_path=f"{bin_dir}:/usr/bin:/bin").start()
    try:
        lab.start_agent()
        entry = {**lab.fleet_machine(remote_root()), "foreign_gpus": "avoid",
                 "resources": {"gpus": [{"type": "T4", "count": 2}]}}
        with World(tmp_path, [fleet([entry])]) as w:
            w.add_run(run_spec("wants-gpu", "ssh-host", ["true"],
                               overrides={"target": MACHINE, "resources": {"gpu_count": 1}}))
            w.add_run(run_spec("cpu-only", "ssh-host", ["true"], overrides={"target": MACHINE}))
            w.until("cpu-only", lambda s: s.phase == "Succeeded")  # the machine itself is in service
            st = w.status("wants-gpu")
            assert st.phase == "Pending" and "GPUs withheld" in st.message and "NVIDIA-SMI has failed" in st.message
            row = {r["name"]: r for r in machines(w)}[MACHINE]
            assert row["state"] == "attached" and "NVIDIA-SMI has failed" in row["gpu_error"]
            assert "GPUs withheld (foreign_gpus: avoid)" in row["reason"]
            env = {**os.environ, "RECONCILER_WORKSPACE_ROOT": str(w.local_root), "RECONCILER_NAMESPACE": "test"}
            explained = subprocess.run([sys.executable, "-m", "reconciler", "explain", "wants-gpu", "--repo",
                                        str(w.repo)], capture_output=True, text=True, timeout=60, env=env)
            assert "GPUs withheld" in explained.stdout, explained.stdout + explained.stderr
    finally:
        lab.close()
        shutil.rmtree(bin_dir, ignore_errors=True)


# ---------------------------------------------------------------- a look-alike without a start time


def test_a_lookalike_without_a_start_time_survives_until_orphan_grace(tmp_path):
    with World(tmp_path, []) as w:
        # A live instance named like a run nobody declares, whose launch never wrote started_at.
        ws = w.local_root / "test" / "ghost-g1-a1"
        (ws / "runtime").mkdir(parents=True)
        ghost = subprocess.Popen(["sleep", "300"], start_new_session=True,
                                 env={"PATH": os.environ["PATH"], "RECONCILER_IDENTITY": "ghost-g1-a1"})
        try:
            (ws / "runtime" / "pid").write_text(f"{ghost.pid}\n")
            t0 = time.time()
            first = w.reconciler(orphan_grace=60.0).run_pass(now=t0)
            assert first.plan.changes == [] and ghost.poll() is None
            assert any("ghost-g1-a1 runs on local but no spec or status names ghost" in x for x in first.plan.warnings)
            # A restart (a new reconciler over the same checkout) keeps counting from the first sight.
            later = w.reconciler(orphan_grace=60.0).run_pass(now=t0 + 59)
            assert later.plan.changes == [] and ghost.poll() is None
            assert json.loads((w.repo / ".reconciler" / "first-seen.json").read_text()) == {"local ghost-g1-a1": t0}
            due = w.reconciler(orphan_grace=60.0).run_pass(now=t0 + 61)
            assert [(c.action, c.code) for c in due.plan.changes] == [("terminate", "Fenced")]
            ghost.wait(timeout=10)
        finally:
            if ghost.poll() is None:
                ghost.kill()
                ghost.wait()
