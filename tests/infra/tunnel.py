"""An in-house machine behind a reverse tunnel, on loopback: two real sshd and a real agent.

``control_vm``: the reconciler's host, an sshd whose only login for agents (``rcintun``) is
restricted exactly as ``reconcile agent authorize`` prints (its authorized_keys line and Match
block). ``inhouse``: the GPU server's own sshd (login ``rcinhouse``, its own account so that its
drain flag never touches other tests). ``agent``: ``python -m reconciler agent run`` as a real
process, its log in a file. Everything listens on 127.0.0.1 only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from reconciler.agent import tunnel as agent
from tests.infra._proc import descendants, free_port, port_open, wait_until
from tests.infra.sshd import SshServer, _keygen, worker_user

VM_USER = worker_user("rcintun")
INHOUSE_USER = worker_user("rcinhouse")
MACHINE = "inhouse-1"


class Inhouse:
    def __init__(self, scratch: Path):
        scratch.mkdir(parents=True, exist_ok=True)
        self.scratch = scratch
        self.tunnel_port = free_port()
        self.agent_key = scratch / "agent_key"
        self.agent_public = _keygen(self.agent_key, f"agent@{MACHINE}")
        self.key_line, self.match_block = agent.authorization(MACHINE, VM_USER, self.tunnel_port,
                                                              self.agent_public)
        self.vm = SshServer(scratch / "vm", user=VM_USER, extra_config=self.match_block)
        self.vm.authorized_keys.write_text(self.key_line + "\n")
        self.machine = SshServer(scratch / "inhouse", user=INHOUSE_USER)
        self.log_file = scratch / "agent.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Inhouse":
        self.vm.start()
        self.machine.start()
        return self

    def agent_argv(self) -> list[str]:
        return [sys.executable, "-m", "reconciler", "agent", "run", "--vm", f"{VM_USER}@127.0.0.1",
                "--vm-port", str(self.vm.port), "--listen-port", str(self.tunnel_port),
                "--sshd-port", str(self.machine.port), "--identity", str(self.agent_key),
                "--known-hosts", str(self.vm.known_hosts_file)]

    def start_agent(self, wait: bool = True) -> subprocess.Popen:
        ups = self.log().count("tunnel up")
        log = open(self.log_file, "ab")
        self.proc = subprocess.Popen(self.agent_argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
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
        return {"name": MACHINE, "connect": "tunnel", "tunnel_port": self.tunnel_port, "max_tasks": 2,
                "workspace_root": workspace_root,
                "ssh": {"host": "gpu-1.lab.example", "user": INHOUSE_USER,
                        "identity_file": str(self.machine.identity_file), "host_key": self.machine.host_key}}

    def close(self) -> None:
        self.stop_agent()
        self.machine.close()
        self.vm.close()
        agent.resume(self.machine.home)
