"""In-house machines behind reverse tunnels, on loopback: a control VM's sshd, each machine's own sshd
and a real agent per machine.

The control VM is set up from EXACTLY what ``reconcile agent authorize`` prints: the command runs
(in-process, through the command line's own ``main``) over a repository whose Fleet declares the
machines, once per machine like an operator would; its ``Match`` block (the last one printed: it
covers every machine) is pasted into the VM's sshd_config and each printed authorized_keys line
into the agents' login's file. ``vm`` is that sshd, whose only login for agents is ``rcintun``.
Each machine has an sshd and a job login of its own (``rcinhouse``, ``rcinhous2``: its drain flag
never touches other tests), its agent's key in a root-only folder (the agent's login here is
root: a job's login must not read it), and ``python -m reconciler agent run`` as a real process
with its log in a file. Everything listens on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from reconciler.agent import tunnel as agent
from tests.infra._proc import descendants, free_port, port_open, wait_until
from tests.infra.sshd import SshServer, _keygen, worker_user

VM_USER = worker_user("rcintun")
INHOUSE_USER = worker_user("rcinhouse")
MACHINE = "inhouse-1"
JOB_USERS = {MACHINE: INHOUSE_USER, "inhouse-2": worker_user("rcinhous2")}


def authorize(repo: Path, machine: str, key_file: Path, vm_user: str, *extra: str) -> str:
    """What ``reconcile agent authorize`` prints (stdout), run as its command line runs it."""
    from reconciler.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["agent", "authorize", machine, "--key", str(key_file), "--vm-user", vm_user,
                     "--repo", str(repo), *extra])
    assert code == 0, err.getvalue()
    return out.getvalue()


def printed_parts(text: str) -> tuple[str, str, str]:
    """(the account command, the authorized_keys line, the Match block) of authorize's output."""
    lines = text.splitlines()
    account = next(line for line in lines if line.startswith("# 1.")).split(": ", 1)[1]
    key = next(line for line in lines if line.startswith("restrict,"))
    block = "\n".join(lines[next(i for i, line in enumerate(lines) if line.startswith("Match User")):])
    return account, key, block


class Machine:
    """One in-house machine: its own sshd, its agent's key, its agent."""

    def __init__(self, scratch: Path, name: str, vm: "Inhouse"):
        scratch.mkdir(parents=True, exist_ok=True)
        self.name, self.lab = name, vm
        self.tunnel_port = free_port()
        # Where a deployment keeps it: a folder only the agent's login can enter.
        self.key_dir = Path(tempfile.mkdtemp(prefix="rc-agentkey-", dir="/tmp"))
        self.key_dir.chmod(0o700)
        self.agent_key = self.key_dir / "agent_key"
        self.agent_public = _keygen(self.agent_key, f"agent@{name}")
        self.server = SshServer(scratch / "sshd", user=JOB_USERS[name])
        self.home = self.server.home
        self.log_file = scratch / "agent.log"
        self.proc: subprocess.Popen | None = None

    def agent_argv(self, *extra: str) -> list[str]:
        return [sys.executable, "-m", "reconciler", "agent", "run", "--vm", f"{self.lab.vm_user}@127.0.0.1",
                "--vm-port", str(self.lab.vm.port), "--listen-port", str(self.tunnel_port),
                "--sshd-port", str(self.server.port), "--identity", str(self.agent_key),
                "--known-hosts", str(self.lab.vm.known_hosts_file), *extra]

    def start_agent(self, *extra: str, wait: bool = True) -> subprocess.Popen:
        ups = self.log().count("tunnel up")
        log = open(self.log_file, "ab")
        self.proc = subprocess.Popen(self.agent_argv(*extra), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        log.close()
        if wait:
            self.wait_up(ups + 1)
        return self.proc

    def tunnel_open(self) -> bool:
        return port_open("127.0.0.1", self.tunnel_port)

    def wait_up(self, ups: int = 1, timeout: float = 15.0) -> None:
        """Until the agent has logged its ``ups``-th 'tunnel up' and the port answers."""
        wait_until(lambda: self.log().count("tunnel up") >= ups and self.tunnel_open(), timeout=timeout,
                   what=f"the tunnel on 127.0.0.1:{self.tunnel_port} (agent log: {self.log_file})")

    def ssh_child(self) -> int:
        """The agent's current ssh client."""
        assert self.proc is not None
        kids = [p for p in descendants(self.proc.pid) if Path(f"/proc/{p}/comm").read_text().strip() == "ssh"]
        assert kids, "the agent has no ssh client"
        return kids[0]

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def stop_agent(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def fleet_machine(self, workspace_root: str) -> dict:
        """The Fleet entry: connect: tunnel. ssh.host is only a name here; the port is never dialled."""
        return {"name": self.name, "connect": "tunnel", "tunnel_port": self.tunnel_port, "max_tasks": 2,
                "workspace_root": workspace_root,
                "ssh": {"host": f"{self.name}.lab.example", "user": self.server.user,
                        "identity_file": str(self.server.identity_file), "host_key": self.server.host_key}}

    def close(self) -> None:
        self.stop_agent()
        self.server.close()
        agent.resume(self.home)
        subprocess.run(["rm", "-rf", str(self.key_dir)], check=False)


class Inhouse:
    """The control VM and its in-house machines (``names``), set up from authorize's output.

    The first machine's parts are also this object's (``machine``, ``tunnel_port``, ``start_agent``
    ...): most tests need one."""

    def __init__(self, scratch: Path, names: tuple[str, ...] = (MACHINE,), client_alive: int = 5,
                 vm_user: str = VM_USER, new_account: bool = False, pam: bool = False,
                 machine_path: str | None = None):
        """``new_account``: ``vm_user`` is made afresh by the printed account command (removed
        first, and by ``close``); ``pam``: the VM's sshd runs with ``UsePAM yes``."""
        scratch.mkdir(parents=True, exist_ok=True)
        self.scratch, self.vm_user, self.new_account = scratch, vm_user, new_account
        self.machines = {n: Machine(scratch / n, n, self) for n in names}
        if machine_path:  # what the machine's sessions find on PATH (a stand-in nvidia-smi)
            for m in self.machines.values():
                m.server.extra_config = f"SetEnv PATH={machine_path}"
                m.server._write_config(m.server.authorized_keys)
        self.outputs = self._authorize(client_alive)
        self.account, _, self.match_block = printed_parts(self.outputs[-1])  # the last one covers all
        self.key_lines = [printed_parts(o)[1] for o in self.outputs]
        if new_account:
            subprocess.run(["userdel", "-r", vm_user], capture_output=True, check=False)
            made = subprocess.run(["sh", "-c", self.account], capture_output=True, text=True)
            assert made.returncode == 0, made.stderr
            self.shadow = subprocess.run(["getent", "shadow", vm_user], capture_output=True, text=True).stdout
        self.vm = SshServer(scratch / "vm", user=vm_user, extra_config=self.match_block)
        if pam:
            self.vm.config_file.write_text(self.vm.config_file.read_text().replace("UsePAM no\n", "UsePAM yes\n"))
            subprocess.run(["/usr/sbin/sshd", "-t", "-f", str(self.vm.config_file)], check=True, capture_output=True)
        self.vm.authorized_keys.write_text("".join(line + "\n" for line in self.key_lines))
        self.key_line = self.key_lines[0]

    def _authorize(self, client_alive: int) -> list[str]:
        """authorize for each machine in turn, over a repository that declares them all."""
        repo = self.scratch / "authorize-repo"
        (repo / "specs" / "fleets").mkdir(parents=True, exist_ok=True)
        doc = {"apiVersion": "reconciler/v1", "kind": "Fleet", "metadata": {"name": "lab"},
               "spec": {"machines": [m.fleet_machine("/tmp/unused") for m in self.machines.values()]}}
        (repo / "specs" / "fleets" / "lab.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        outputs = []
        for m in self.machines.values():
            pub = self.scratch / f"{m.name}.pub"
            pub.write_text(m.agent_public + f" agent@{m.name}\n")
            outputs.append(authorize(repo, m.name, pub, self.vm_user, "--client-alive", str(client_alive)))
        return outputs

    # the first machine, for tests of one
    @property
    def first(self) -> Machine:
        return next(iter(self.machines.values()))

    @property
    def machine(self) -> SshServer:
        return self.first.server

    @property
    def tunnel_port(self) -> int:
        return self.first.tunnel_port

    @property
    def agent_key(self) -> Path:
        return self.first.agent_key

    @property
    def proc(self) -> subprocess.Popen | None:
        return self.first.proc

    def start_agent(self, *extra: str, wait: bool = True) -> subprocess.Popen:
        return self.first.start_agent(*extra, wait=wait)

    def tunnel_open(self) -> bool:
        return self.first.tunnel_open()

    def wait_up(self, ups: int = 1, timeout: float = 15.0) -> None:
        self.first.wait_up(ups, timeout)

    def ssh_child(self) -> int:
        return self.first.ssh_child()

    def log(self) -> str:
        return self.first.log()

    def stop_agent(self) -> None:
        self.first.stop_agent()

    def fleet_machine(self, workspace_root: str) -> dict:
        return self.first.fleet_machine(workspace_root)

    def start(self) -> "Inhouse":
        self.vm.start()
        for m in self.machines.values():
            m.server.start()
        return self

    def close(self) -> None:
        for m in self.machines.values():
            m.close()
        self.vm.close()
        if self.new_account:
            subprocess.run(["userdel", "-r", self.vm_user], capture_output=True, check=False)
