"""A real OpenSSH server on loopback, for tests that must talk SSH to a "machine".

Why a real sshd instead of a mock: the reconciler's transport (fabric/paramiko, the ``ssh`` CLI) has
failure modes that only show up against a real server -- host key checks, connection refusals when a
machine goes away, sessions dropped mid-command.  A private sshd started by the test costs ~0.1 s.

Design notes (measured on the project's Debian 12 machines, see docs in /work/shared/notes):

* It logs in as a dedicated unprivileged user, ``rctest``, created once per machine (under pytest-xdist,
  one per worker, ``rctest-gw0`` ...: see :func:`worker_user`).  Logging in as
  root costs ~150 ms per command because root's shell start-up runs pyenv; ``rctest`` uses /bin/sh.
  With ``UsePAM no`` a fresh ``useradd`` account is *locked*, and sshd refuses even key logins to
  locked accounts, hence ``usermod -p '*'`` (no password, but not locked).
* sshd must be started by absolute path (``/usr/sbin/sshd``: it re-executes itself) and, as root,
  needs ``/run/sshd`` (its privilege-separation directory).
* sshd reads ``AuthorizedKeysFile`` *as the target user*, so that file must lie in a directory the
  user can traverse.  pytest's tmp dirs are 0700 root, so the public files go in a separate 0755
  directory under /tmp; private keys stay in the (root-only) scratch dir.
* ``stop()`` followed by ``start()`` reuses the same port and keys, which models "the machine went
  away and came back" with an unchanged host identity.  ``stop()`` also ends the per-connection sshd
  processes, so open sessions drop like on a network loss; the user's commands are *not* killed
  (they may die of a broken pipe), just as on a real machine that is only unreachable, unless
  ``stop(kill_processes=True)`` asks for reboot semantics.  ``close()`` ends all it can trace.
* Everything listens on 127.0.0.0/8 only (extra servers may use 127.0.0.2 etc., still loopback).
"""

from __future__ import annotations

import fcntl
import os
import pwd
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tests.infra._proc import descendants, end_pids, free_port, port_open, process_name, start_time, wait_until

SSHD = "/usr/sbin/sshd"


def worker_user(name: str) -> str:
    """The account ``name`` for this test process: one of its own per pytest-xdist worker.

    Tests running side by side on one account would share its home (the staged probe under
    ``~/.cache``, a drain flag) and its processes, and each could disturb what the other asserts.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return f"{name}-{worker}" if worker else name


TEST_USER = worker_user("rctest")
_USER_LOCK = "/tmp/.rctest-user.lock"


def ensure_test_user(name: str = TEST_USER) -> pwd.struct_passwd:
    """Create the unprivileged login user once per machine (safe under concurrent test sessions)."""
    with open(_USER_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], check=True, capture_output=True)
            entry = pwd.getpwnam(name)
        # UsePAM=no: sshd rejects locked accounts ("!" in shadow), even for public key logins.
        subprocess.run(["usermod", "-p", "*", name], check=True, capture_output=True)
    return entry


def _keygen(path: Path, comment: str) -> str:
    """Generate an ed25519 key pair without passphrase; return the public key line "type base64"."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    key_type, blob = Path(f"{path}.pub").read_text().split()[:2]
    return f"{key_type} {blob}"


class PortTaken(RuntimeError):
    """sshd could not listen: another process holds the port."""


class SshServer:
    """A private sshd on a loopback address that accepts ``user`` with ``identity_file``.

    Attributes: ``host``, ``port``, ``user``, ``home`` (usable as a workspace root),
    ``identity_file`` (client private key, root-readable), ``host_key`` ("ssh-ed25519 AAAA..."),
    ``known_hosts_line`` ("[127.0.0.1]:PORT ssh-ed25519 AAAA..."), ``known_hosts_file``.
    """

    def __init__(self, scratch: str | os.PathLike[str], host: str = "127.0.0.1", user: str = TEST_USER,
                 extra_config: str = "", port: int | None = None):
        if not host.startswith("127."):
            raise ValueError(f"test sshd must listen on loopback (127.0.0.0/8), not {host!r}")
        self.host = host
        self.user = user
        self.extra_config = extra_config  # appended last (a Match block must be)
        self.scratch = Path(scratch)
        self.scratch.mkdir(parents=True, exist_ok=True)
        # root: for what only root can run here (the ms-swift environment's python lives under
        # /root); its account is used as it is (no password change), as the local provider's
        # rentals with login: self do.
        self.home = pwd.getpwnam("root").pw_dir if user == "root" else ensure_test_user(user).pw_dir
        self.port = port or free_port(host)
        self._port_chosen = port is None  # ours to choose again when another process took it first
        self._started = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._other_host_key: str | None = None
        # (pid, start time) of session processes left running by stop(); close() ends them.
        self._left_running: set[tuple[int, int | None]] = set()

        # Private material in the scratch dir (root only).
        self.host_key_file = self.scratch / "ssh_host_ed25519_key"
        self.identity_file = self.scratch / "id_ed25519"
        self.host_key = _keygen(self.host_key_file, f"test-host@{host}")
        self.client_key = _keygen(self.identity_file, f"{user}@test-client")

        # Public material where sshd, acting as the user, can read it.
        self.public_dir = Path(tempfile.mkdtemp(prefix="rc-sshd-", dir="/tmp"))
        self.public_dir.chmod(0o755)
        authorized = self.authorized_keys = self.public_dir / "authorized_keys"
        authorized.write_text(self.client_key + "\n")
        authorized.chmod(0o644)

        self.known_hosts_file = self.scratch / "known_hosts"
        self.known_hosts_file.write_text(self.known_hosts_line + "\n")
        self.config_file = self.scratch / "sshd_config"
        self.pid_file = self.scratch / "sshd.pid"
        self.log_file = self.scratch / "sshd.log"
        self._write_config(authorized)

    # ------------------------------------------------------------------ identity helpers

    @property
    def known_hosts_line(self) -> str:
        return self.known_hosts_entry(self.host_key)

    def known_hosts_entry(self, host_key: str) -> str:
        """A known_hosts line binding ``host_key`` to this server's ``[host]:port``."""
        return f"[{self.host}]:{self.port} {host_key}"

    def other_host_key(self) -> str:
        """A valid ed25519 public key line that is NOT this server's host key (wrong-key tests)."""
        if self._other_host_key is None:
            self._other_host_key = _keygen(self.scratch / "other_host_key", "not-this-host")
        return self._other_host_key

    # ------------------------------------------------------------------ lifecycle

    def _write_config(self, authorized: Path) -> None:
        self.config_file.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    f"ListenAddress {self.host}",
                    f"HostKey {self.host_key_file}",
                    f"PidFile {self.pid_file}",
                    f"AuthorizedKeysFile {authorized}",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "PermitRootLogin prohibit-password" if self.user == "root" else "PermitRootLogin no",
                    f"AllowUsers {self.user}",
                    "PrintMotd no",
                    "PrintLastLog no",
                    "UseDNS no",
                    # Reconciler tests may open many connections at once; the default (10:30:100)
                    # randomly drops unauthenticated connections beyond 10.
                    "MaxStartups 200",
                    "MaxSessions 100",
                    "Subsystem sftp internal-sftp",
                    self.extra_config,
                    "",
                ]
            )
        )
        os.makedirs("/run/sshd", exist_ok=True)
        check = subprocess.run([SSHD, "-t", "-f", str(self.config_file)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"sshd rejected {self.config_file}: {check.stderr.strip()}")

    @property
    def pid(self) -> int | None:
        """sshd's own pid: every session it serves is among its descendants."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 10.0) -> "SshServer":
        """Start sshd (again) on the same port with the same keys; return once it listens. A port
        chosen here that another process took between its choice and the first start (a test run
        beside this one) is chosen again."""
        for _ in range(3):
            try:
                return self._start(timeout)
            except PortTaken:
                if self._started or not self._port_chosen:
                    raise
                self.port = free_port(self.host)
                self.known_hosts_file.write_text(self.known_hosts_line + "\n")
                self._write_config(self.authorized_keys)
        return self._start(timeout)

    def _start(self, timeout: float) -> "SshServer":
        if self.running:
            return self
        offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        listening = f"Server listening on {self.host} port {self.port}".encode()
        log = open(self.log_file, "ab")
        try:
            self._proc = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(self.config_file)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        finally:
            log.close()

        def ready() -> bool:
            # Its own log line, not an open port: another process may hold the port it asked for.
            with open(self.log_file, "rb") as fh:
                fh.seek(offset)
                said = fh.read()
            if self._proc.poll() is not None:
                self._proc = None
                if b"Address already in use" in said:
                    raise PortTaken(f"{self.host}:{self.port}")
                raise RuntimeError(f"sshd exited:\n{self.log_text()}")
            return listening in said and port_open(self.host, self.port, timeout=0.2)

        try:
            wait_until(ready, timeout, what=f"sshd on {self.host}:{self.port}")
        except TimeoutError:
            self.stop()
            raise
        self._started = True
        return self

    def stop(self, timeout: float = 5.0, kill_processes: bool = False) -> None:
        """Stop sshd and drop its open connections.

        By default the commands running in the dropped sessions are left to their fate (like a
        machine that is only unreachable); ``kill_processes=True`` ends them too (like a reboot).
        Either way :meth:`close` ends whatever of them is still running.
        """
        if self._proc is None:
            return
        # Collect the tree before the listener dies and its children get reparented to init.
        tree = descendants(self._proc.pid)
        connections = [p for p in tree if process_name(p) == "sshd"]
        commands = [p for p in tree if p not in connections]
        if kill_processes:
            end_pids(commands, timeout)
        else:
            self._left_running.update((p, start_time(p)) for p in commands)
        end_pids([self._proc.pid, *connections], timeout)
        self._proc.wait()
        self._proc = None
        wait_until(lambda: not port_open(self.host, self.port, 0.2), timeout, what="sshd port to close")

    def close(self) -> None:
        """Stop the server, end every process its sessions started that we can still trace, and
        remove its public directory (the scratch dir belongs to the caller).

        Processes that detached themselves (double fork, ``setsid``/``nohup ... &`` whose parent
        exited) are reparented to init and cannot be traced: tests that start them must end them.
        """
        if self._proc is not None:
            self._left_running.update((p, start_time(p)) for p in descendants(self._proc.pid)
                                      if process_name(p) != "sshd")
        self.stop()
        # Same pid and same start time: still the process we left running, not a reused pid.
        end_pids([pid for pid, started in self._left_running if started is not None and start_time(pid) == started])
        self._left_running.clear()
        shutil.rmtree(self.public_dir, ignore_errors=True)

    def log_text(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")
        except OSError:
            return ""

    def __enter__(self) -> "SshServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ clients

    def ssh_command(self, *, connect_timeout: int = 5) -> list[str]:
        """Argv prefix for the ``ssh`` CLI logging in to this server with strict host key checking."""
        return [
            "ssh",
            "-F", "/dev/null",
            "-p", str(self.port),
            "-i", str(self.identity_file),
            "-o", "IdentitiesOnly=yes",
            "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={self.known_hosts_file}",
            "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", f"ConnectTimeout={connect_timeout}",
            "-o", "LogLevel=ERROR",
            f"{self.user}@{self.host}",
        ]  # fmt: skip

    def run(
        self, cmd: str | list[str], *, check: bool = True, timeout: float = 30.0, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` as the test user through the ``ssh`` CLI; returns the completed process."""
        if not isinstance(cmd, str):
            cmd = shlex.join(cmd)
        return subprocess.run(
            [*self.ssh_command(), cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
        )

    def connect_kwargs(self) -> dict[str, Any]:
        """paramiko ``connect_kwargs`` for fabric that use only this server's client key."""
        return {"key_filename": str(self.identity_file), "look_for_keys": False, "allow_agent": False}

    def connection(self, connect_timeout: float = 5.0, strict_host_key: bool = True) -> Any:
        """A fabric ``Connection`` to this server; with ``strict_host_key`` unknown keys are rejected.

        ``run()`` on it does not read the local stdin (``in_stream=False``).
        """
        import fabric
        import paramiko

        conn = fabric.Connection(
            host=self.host,
            port=self.port,
            user=self.user,
            connect_timeout=connect_timeout,
            connect_kwargs=self.connect_kwargs(),
            # invoke forwards our stdin by default, which fails under pytest's capture
            # ("reading from stdin while output is captured").
            config=fabric.Config(overrides={"run": {"in_stream": False}}),
        )
        if strict_host_key:
            conn.client.load_host_keys(str(self.known_hosts_file))
            conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        return conn
