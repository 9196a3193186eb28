"""``reconcile agent``: an in-house machine that accepts no inbound connections dials out instead.

The machine runs the agent; the agent keeps one OpenSSH client connected to the reconciler's host
(the control VM) with a reverse forward, ``-R 127.0.0.1:PORT:127.0.0.1:SSHD``: the VM's loopback
port PORT leads to the machine's own sshd. The reconciler then reaches the machine like any other
(``connect: tunnel`` in its Fleet: same transport, same keys, only host and port differ), so
nothing on the machine listens to the outside and nothing new runs there but this client.

Why the OpenSSH client and not paramiko: keepalives (``ServerAliveInterval``), refusal to run
without the forward (``ExitOnForwardFailure``) and host key checking are its own, well tested; the
agent only restarts it. It restarts with a short, capped backoff, so the tunnel is back within
about a second of the VM answering again; a session that was up (for a second or more) starts
the backoff over, so a drop after a long session is mended at once.
Each change of state is one log line (connecting, up, down with the client's last words).

The VM side grants the agent's key one thing only: that one remote forward. ``authorize`` prints
the authorized_keys line and the sshd ``Match`` block that do so (docs/inhouse.md explains each
line). ``drain`` and ``resume`` set and clear the machine's drain flag, which the reconciler's
probe reads: an engineer at the machine takes it out of service without a pull request.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("reconciler.agent")

DRAIN_FILE = Path(".reconciler") / "drain"  # under the login's home: runtime/probe.py reads the same
UP_MARK = "remote forward success"  # ssh -v, once the VM accepted the forward


@dataclass
class TunnelSettings:
    vm_host: str
    vm_user: str
    listen_port: int  # on the VM's loopback
    vm_port: int = 22
    identity_file: str | None = None
    known_hosts: str | None = None
    sshd_port: int = 22  # this machine's sshd, on its loopback
    keepalive: int = 5  # seconds; the client gives up after 2 unanswered (about 3x this, measured)
    connect_timeout: int = 5
    min_backoff: float = 0.2
    max_backoff: float = 1.0
    stable_after: float = 1.0  # a session up this long was a new start: the backoff starts over

    def argv(self) -> list[str]:
        out = ["ssh", "-v", "-N", "-F", "/dev/null",
               "-o", "ExitOnForwardFailure=yes", "-o", "BatchMode=yes",
               "-o", f"ServerAliveInterval={self.keepalive}", "-o", "ServerAliveCountMax=2",
               "-o", f"ConnectTimeout={self.connect_timeout}", "-o", "StrictHostKeyChecking=yes",
               "-o", "RequestTTY=no",
               "-p", str(self.vm_port),
               "-R", f"127.0.0.1:{self.listen_port}:127.0.0.1:{self.sshd_port}"]
        if self.identity_file:
            out += ["-i", self.identity_file, "-o", "IdentitiesOnly=yes"]
        if self.known_hosts:
            out += ["-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null"]
        return out + [f"{self.vm_user}@{self.vm_host}"]


class Tunnel:
    """Holds the tunnel until ``stop()``: one ssh client at a time, restarted after any exit."""

    def __init__(self, settings: TunnelSettings):
        self.s = settings
        self.state = "down"
        self.ups = 0
        self._proc: subprocess.Popen | None = None
        self._stop = threading.Event()

    def _set(self, state: str, detail: str = "") -> None:
        if state != self.state:
            self.state = state
            log.info("tunnel %s%s", state, f": {detail}" if detail else "")

    def _session(self) -> tuple[int, str, float]:
        """One ssh client, until it exits: (exit code, its last meaningful line, seconds it was up)."""
        self._proc = subprocess.Popen(self.s.argv(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True, errors="replace")
        last, up_at = "", None
        for line in self._proc.stderr:
            line = line.strip()
            if UP_MARK in line and up_at is None:
                up_at = time.monotonic()
                self.ups += 1
                self._set("up", f"127.0.0.1:{self.s.listen_port} on {self.s.vm_host} leads to "
                                f"127.0.0.1:{self.s.sshd_port} here")
            elif line and not line.startswith("debug") and not line.startswith("OpenSSH_"):
                last = line  # errors and warnings; -v's debug lines are only read for UP_MARK
        code = self._proc.wait()
        return code, last, (time.monotonic() - up_at) if up_at is not None else 0.0

    def run(self) -> None:
        backoff = self.s.min_backoff
        while not self._stop.is_set():
            self._set("connecting", f"{self.s.vm_user}@{self.s.vm_host}:{self.s.vm_port}")
            code, last, lasted = self._session()
            if self._stop.is_set():
                break
            if lasted >= self.s.stable_after:
                backoff = self.s.min_backoff
            self._set("down", f"ssh exited {code}" + (f" ({last})" if last else "")
                      + f"; retrying in {backoff:.1f}s")
            self._stop.wait(backoff)
            backoff = min(self.s.max_backoff, backoff * 2)
        self._set("stopped")

    def stop(self) -> None:
        self._stop.set()
        p = self._proc
        if p is not None and p.poll() is None:
            p.terminate()


def run_agent(settings: TunnelSettings) -> int:
    """The agent's main loop, in the foreground, until SIGTERM or SIGINT (exit 0)."""
    tunnel = Tunnel(settings)

    def stop(signum, _frame):
        log.info("signal %d: stopping", signum)
        tunnel.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    tunnel.run()
    return 0


# ---------------------------------------------------------------- drain flag


def drain_path(home: str | None = None) -> Path:
    return Path(home or os.path.expanduser("~")) / DRAIN_FILE


def drain(reason: str, home: str | None = None, now: float | None = None) -> Path:
    """Set the flag (atomically, readable by the login the reconciler uses)."""
    path = drain_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"reason": reason, "since": time.time() if now is None else now}) + "\n")
    tmp.chmod(0o644)
    os.replace(tmp, path)
    if home and os.geteuid() == 0:  # written by root for another login: that login owns it
        st = path.parent.parent.stat()
        for p in (path.parent, path):
            os.chown(p, st.st_uid, st.st_gid)
    return path


def resume(home: str | None = None) -> bool:
    """Clear the flag; False when there was none."""
    try:
        drain_path(home).unlink()
        return True
    except FileNotFoundError:
        return False


# ---------------------------------------------------------------- what the control VM must allow


def authorization(machine: str, vm_user: str, listen_port: int, public_key: str) -> tuple[str, str]:
    """(the authorized_keys line, the sshd_config Match block) that let the agent's key hold the one
    forward ``127.0.0.1:listen_port`` on the VM and do nothing else.

    ``restrict`` turns everything off; ``port-forwarding`` turns forwarding back on, local forwards
    included, and an authorized_keys ``permitopen="none"`` makes OpenSSH reject the whole line
    (measured), so the Match block closes what the key line cannot: ``AllowTcpForwarding remote``
    (no -L), ``PermitOpen none``, ``PermitListen`` the one port. ``command="/bin/false"`` and
    ``ForceCommand`` stop a shell; ``PermitTTY no`` a terminal."""
    key = " ".join(public_key.split()[:2])
    line = (f'restrict,port-forwarding,permitlisten="127.0.0.1:{listen_port}",command="/bin/false" '
            f"{key} reconcile-agent@{machine}")
    block = "\n".join([
        f"Match User {vm_user}",
        "    AllowTcpForwarding remote",
        "    PermitOpen none",
        f"    PermitListen 127.0.0.1:{listen_port}",
        "    GatewayPorts no",
        "    X11Forwarding no",
        "    AllowAgentForwarding no",
        "    AllowStreamLocalForwarding no",
        "    PermitTunnel no",
        "    PermitTTY no",
        "    ForceCommand /bin/false",
    ])
    return line, block


def configure_logging() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s agent %(message)s", datefmt="%Y-%m-%dT%H:%M:%S")
