"""In-house machines behind a reverse tunnel, end to end: a control VM's sshd, the machine's own sshd,
the agent as a real process, and real passes through the tunnel."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from reconciler.status import store as statuses
from tests.infra._proc import free_port, port_open, wait_until
from tests.infra.fixtures import _require_sshd
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
    # Unknown, not dead: the phase stays (docs/machines.md), the condition and message say why.
    assert st.phase == "Running" and "does not answer" in st.message
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
