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
Each change of state is one log line (connecting, up, down with the client's last words), not each
retry: an outage of an hour is one "down" line and a "still down" line a minute, not thousands.

The ssh client dies with the agent (``PR_SET_PDEATHSIG``, prctl(2)): an agent killed with SIGKILL
would otherwise leave its client holding the VM's port, and the agent that the supervisor starts
next would be refused its own forward until that orphan went away.

The VM side grants the agent's key one thing only: that one remote forward. ``authorize.py``
prints the authorized_keys line and the sshd ``Match`` block that do so (docs/inhouse.md explains
each line). ``drain`` and ``resume`` set and clear the machine's drain flag, which the reconciler's
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

from reconciler.core import procenv

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
    report_every: float = 60.0  # while down: one "still down" line this often, whatever the retries

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


def _die_with_parent():
    """A ``preexec_fn`` that has the kernel send SIGTERM to the child when the agent dies, however
    it dies (prctl(2), PR_SET_PDEATHSIG; Linux only: elsewhere the supervisor's process-group kill
    is what ends it). ssh exits on SIGTERM and its TCP close frees the VM's port at once."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except (OSError, ImportError, AttributeError):
        return None
    if not sys.platform.startswith("linux") or not hasattr(libc, "prctl"):
        return None
    parent = os.getpid()
    pr_set_pdeathsig = 1  # <linux/prctl.h>

    def preexec() -> None:
        libc.prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the agent died before the prctl took hold
            os._exit(1)

    return preexec


class Tunnel:
    """Holds the tunnel until ``stop()``: one ssh client at a time, restarted after any exit."""

    def __init__(self, settings: TunnelSettings):
        self.s = settings
        self.state = "down"
        self.ups = 0
        self.tries = 0
        self._proc: subprocess.Popen | None = None
        self._stop = threading.Event()
        self._preexec = _die_with_parent()

    def _set(self, state: str, detail: str = "") -> None:
        if state != self.state:
            self.state = state
            log.info("tunnel %s%s", state, f": {detail}" if detail else "")

    def _session(self) -> tuple[int, str, float]:
        """One ssh client, until it exits: (exit code, its last meaningful line, seconds it was up)."""
        self.tries += 1
        self._proc = subprocess.Popen(self.s.argv(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True, errors="replace",
                                      preexec_fn=self._preexec, env=procenv.base())
        last, up_at = "", None
        for line in self._proc.stderr:
            line = line.strip()
            if UP_MARK in line and up_at is None:
                up_at = time.monotonic()
                self.ups += 1
                self._set("up", f"127.0.0.1:{self.s.listen_port} on {self.s.vm_host} leads to "
                                f"127.0.0.1:{self.s.sshd_port} here")
            elif line and not line.startswith("debug") and not line.startswith("OpenSSH_"):
                last = line[:300]  # errors and warnings; -v's debug lines are only read for UP_MARK
        code = self._proc.wait()
        return code, last, (time.monotonic() - up_at) if up_at is not None else 0.0

    def run(self) -> None:
        backoff = self.s.min_backoff
        self._set("connecting", f"{self.s.vm_user}@{self.s.vm_host}:{self.s.vm_port}")
        down_since = next_report = 0.0
        tries_at_down = 0
        while not self._stop.is_set():
            code, last, lasted = self._session()
            if self._stop.is_set():
                break
            if lasted >= self.s.stable_after:
                backoff = self.s.min_backoff
            why = f"ssh exited {code}" + (f" ({last})" if last else "")
            now = time.monotonic()
            if self.state != "down":  # one line per outage, however many retries it takes
                self._set("down", f"{why}; retrying every {self.s.max_backoff:g}s or sooner")
                down_since, next_report, tries_at_down = now, now + self.s.report_every, self.tries
            elif now >= next_report:  # a bounded reminder: one line per report_every
                log.info("tunnel still down after %.0fs (%d tries; last: %s)", now - down_since,
                         self.tries - tries_at_down + 1, why)
                next_report = now + self.s.report_every
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


MACHINE_DRAIN_FILE = Path("/etc/reconciler/drain")  # root's: runtime/probe.py reads it first


def drain_path(home: str | None = None, machine_wide: bool = False) -> Path:
    """The login's own flag, or the machine-wide one (root's: a job of the login cannot lift it)."""
    return MACHINE_DRAIN_FILE if machine_wide else Path(home or os.path.expanduser("~")) / DRAIN_FILE


def drain(reason: str, home: str | None = None, now: float | None = None, path: Path | None = None) -> Path:
    """Set the flag (atomically, readable by the login the reconciler uses)."""
    path = path or drain_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"reason": reason, "since": time.time() if now is None else now}) + "\n")
    tmp.chmod(0o644)
    os.replace(tmp, path)
    if home and path == drain_path(home) and os.geteuid() == 0:  # by root for another login: that login owns it
        st = path.parent.parent.stat()
        for p in (path.parent, path):
            os.chown(p, st.st_uid, st.st_gid)
    return path


def resume(home: str | None = None, path: Path | None = None) -> bool:
    """Clear the flag; False when there was none."""
    try:
        (path or drain_path(home)).unlink()
        return True
    except FileNotFoundError:
        return False


def configure_logging() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s agent %(message)s", datefmt="%Y-%m-%dT%H:%M:%S")
