"""Placement ``ssh``: a Fleet machine reached over one SSH connection per pass (paramiko).

One connection per machine per pass, opened on first use and reused by every command of the pass
(observe, stage, launch, collect). Each operation is one command on one channel of that
connection, so its cost is one round trip:

- ``agent(args)``: the stdlib agent's program (``runtime/probe.py`` and its siblings, put together
  by ``remote_agent``) goes to ``python3 -`` on stdin, its arguments as one JSON argv word (embedded
  into the program when they are too large for argv); one call reports every workspace of the machine.
- ``stage()``: the bundle's deterministic archive goes to ``tar`` on stdin and is unpacked into a
  fresh temporary folder that is renamed into ``<workspace_root>/<identity>``; a workspace that
  already has ``job.json`` is kept as is (idempotent).
- ``put_secret_file()``: the content goes on stdin to a ``umask 077`` shell that writes it 0600 and
  renames it into place; the value is never part of a command line or a log.
- ``fetch()``: one ``tar`` of ``runtime/`` and ``artifacts/`` on stdout, unpacked into the local bundle
  by ``safetar`` (the machine's tar may be anything: plain files and folders only, never through a link).

The transfers (``stage``, ``put_secret_file``, ``fetch``, ``fetch_folder``) are in ``ssh_files``.

Why paramiko directly and not fabric's ``Connection.run``: every command here needs binary stdin
and stdout streamed on one channel with a deadline; fabric adds invoke's runner threads and
stdin handling (``in_stream``) around the same paramiko channel and nothing this needs.

Host keys are never accepted blindly: the machine's pinned ``ssh.host_key``, else the fleet's
``known_hosts`` file; an unknown or different key is a ``PermanentError`` raised before any
authentication. Unreachable machines (refused, timed out, DNS, authentication, a dropped
session) raise ``TemporaryError``: the machine is Unknown, not dead.
"""

from __future__ import annotations

import base64
import json
import os
import posixpath
import select
import shlex
import socket
import threading
import time

import paramiko

from reconciler.core.boundary import MAX_REPLY_BYTES, BadReply, absolute_path
from reconciler.core.replies import REPLY_BUDGET
from reconciler.core.errors import PermanentError, TemporaryError
from .remote_agent import STAGED_DIR, agent_program, resident_request, staged_path
from .base import Completed, MachineInfo, docker_export, docker_prefix
from .ssh_files import SshFiles

IDLE_WAKE = 1.0  # seconds between an idle connection's reader thread's checks
RECONNECT_MAX = 30.0  # seconds, at most, between a kept connection's attempts to reconnect
STAGED_MISSING = 121  # the staged probe's exit code when the file for this version is not there
STDERR_KEEP = 64 * 1024  # bytes of a command's stderr kept (its end: where the error is)


_PRIVATE_KEYS: dict[tuple[str, float, int], paramiko.PKey | None] = {}
_PRIVATE_KEYS_LOCK = threading.Lock()


def private_key(path: str) -> paramiko.PKey | None:
    """The private key at ``path``, parsed once per file version (by mtime and size) and shared by
    every connection that uses it. None when paramiko cannot read it without help (a passphrase):
    the connection then names the file and paramiko reports what is wrong."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (path, st.st_mtime, st.st_size)
    with _PRIVATE_KEYS_LOCK:
        if key not in _PRIVATE_KEYS:
            try:
                _PRIVATE_KEYS[key] = paramiko.PKey.from_path(path)
            except Exception:  # noqa: BLE001 - left to paramiko's own connect, which explains it
                _PRIVATE_KEYS[key] = None
        return _PRIVATE_KEYS[key]


class UnknownHostKey(paramiko.SSHException):
    pass


class _RejectUnknown(paramiko.MissingHostKeyPolicy):
    """paramiko's RejectPolicy with an exception of our own, so the message can be made clear."""

    def missing_host_key(self, client, hostname, key):  # noqa: D401 - paramiko's signature
        raise UnknownHostKey(f"{hostname} {key.get_name()} {key.get_base64()}")


def _served(rc: int, out: bytes, err: bytes) -> tuple[int, bytes, bytes]:
    """``--serve`` answers an operation that raised with ``{"__error__": why}``: a failure (exit 1)."""
    if out.startswith(b'{"__error__":'):
        return 1, b"", out[:300]
    return rc, out, err


class SshTransport(SshFiles):
    def __init__(self, machine: MachineInfo, connect_timeout: float = 5.0, command_timeout: float = 60.0,
                 probe_timeout: float | None = None, max_reply_bytes: int = MAX_REPLY_BYTES):
        if machine.fleet_machine is None:
            raise PermanentError(f"machine {machine.name!r} has no ssh endpoint")
        self.machine = machine
        self.endpoint = machine.fleet_machine.ssh
        # connect: tunnel — the machine dialled out to this host (``reconcile agent``) and its sshd is
        # here, on loopback at the tunnel's port; login, keys and host key are the machine's own.
        tunnel = getattr(machine.fleet_machine, "connect", "ssh") == "tunnel"
        self.host = "127.0.0.1" if tunnel else self.endpoint.host
        self.port = machine.fleet_machine.tunnel_port if tunnel else self.endpoint.port
        self.tunnel = tunnel
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        # A probe is short and runs every pass: a machine that does not answer it in time is
        # unreachable for the pass, instead of holding the pass for the long command timeout.
        self.probe_timeout = probe_timeout if probe_timeout is not None else command_timeout
        # What one command may print when it is read into memory (a probe's reply): a machine
        # answering with more is cut off, and the call fails.
        self.max_reply_bytes = max_reply_bytes
        self.round_trips = 0
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()
        # The probe is staged once per machine and version (~/.cache/reconciler/agent-<hash>.py) and
        # then invoked by path: no 16 KB of source per call. None: not known yet; False: the
        # machine cannot keep it (the source is sent every time, as before).
        self._staged: bool | None = None
        # A long-lived reconciler's probes go to a resident helper on the machine (kept:
        # set for kept connections only; a one-shot command would leave nothing to reuse).
        self.kept = False
        self._failures, self._retry_at, self._last_error = 0, 0.0, ""  # reconnection backoff (kept connections)
        self._resident = None
        self._resident_buf = bytearray()
        self._resident_names: str | None = None  # the reference of the names the helper holds
        self._resident_lock = threading.Lock()
        root = machine.workspace_root
        self._root: str | None = root if root.startswith("/") else None

    # ------------------------------------------------------------------ naming

    @property
    def where(self) -> str:
        if self.tunnel:
            return f"{self.machine.name} (tunnel 127.0.0.1:{self.port})"
        return f"{self.machine.name} ({self.host}:{self.port})"

    def workspace(self, identity: str) -> str:
        return posixpath.join(self.root(), identity)

    def root(self) -> str:
        """The absolute workspace root; a root relative to (or under ``~`` of) the login's home is
        resolved on the machine, normally for free by the pass's probe."""
        if self._root is None:
            r = self._exec('printf %s "$HOME"', None, self.command_timeout)
            home = r[1].decode().strip()
            if r[0] != 0 or not home.startswith("/"):
                raise TemporaryError(f"cannot find the login's home on {self.where}")
            rel = self.machine.workspace_root
            if rel == "~" or rel.startswith("~/"):
                rel = rel[2:]
            self._root = posixpath.normpath(posixpath.join(home, rel))
        return self._root

    # ------------------------------------------------------------------ connection

    def _host_keys_note(self) -> str:
        return self.machine.source or "its Fleet"

    def _connect(self) -> paramiko.SSHClient:
        with self._lock:
            if self._client is not None:
                tr = self._client.get_transport()
                if tr is not None and tr.is_active():
                    return self._client
                self._client.close()
                self._client = None
            if self._retry_at and time.monotonic() < self._retry_at:
                # Within the backoff: the last attempt's error, word for word (a status that
                # quotes it must not change from pass to pass while nothing does).
                raise TemporaryError(f"{self.where}: {self._last_error}")
            try:
                client = self._dial()
            except TemporaryError as e:
                if self.kept:  # a kept connection backs off: 1, 2, 4 ... 30 s between attempts
                    self._failures += 1
                    self._last_error = str(e).removeprefix(f"{self.where}: ")
                    self._retry_at = time.monotonic() + min(RECONNECT_MAX, 2.0 ** (self._failures - 1))
                raise
            self._failures, self._retry_at = 0, 0.0
            # paramiko's reader thread wakes every 0.1 s on an idle connection to check whether it
            # should stop: ten wake-ups a second for each of a daemon's kept connections (about
            # 180 µs of CPU a second each). Once a second does the same job (closing the socket
            # still ends the thread at once).
            sock = getattr(client.get_transport(), "sock", None)
            if sock is not None and hasattr(sock, "settimeout"):
                sock.settimeout(IDLE_WAKE)
            self._client = client
            return client

    def _dial(self) -> paramiko.SSHClient:
        """A new client, connected and authenticated under the machine's pinned host key; every
        failure as a PermanentError (the spec is wrong) or a TemporaryError (try again later)."""
        ep = self.endpoint
        client = paramiko.SSHClient()
        keys = client.get_host_keys()
        hostname = self.host if self.port == 22 else f"[{self.host}]:{self.port}"
        pinned = ep.host_key
        if pinned:
            parts = pinned.split()
            try:
                key = paramiko.PKey.from_type_string(parts[0], base64.b64decode(parts[1]))
            except Exception as e:  # noqa: BLE001 - any malformed key is the spec's fault
                raise PermanentError(f"ssh.host_key of {self.machine.name} in {self._host_keys_note()} "
                                     f"is not a public key line ('ssh-ed25519 AAAA...'): {e}") from None
            keys.add(hostname, parts[0], key)
        elif self.machine.known_hosts:
            path = os.path.expanduser(self.machine.known_hosts)
            try:
                client.load_host_keys(path)
            except OSError as e:
                raise PermanentError(f"known_hosts file {path} of {self._host_keys_note()} cannot be read "
                                     f"({e.strerror}): refusing to connect to {self.where}") from None
        client.set_missing_host_key_policy(_RejectUnknown())
        ident = os.path.expanduser(ep.identity_file) if ep.identity_file else None
        pkey = private_key(ident) if ident else None
        try:
            client.connect(
                self.host, port=self.port, username=ep.user, pkey=pkey,
                key_filename=ident if pkey is None else None,
                look_for_keys=ident is None, allow_agent=ident is None,
                timeout=self.connect_timeout, banner_timeout=self.connect_timeout,
                auth_timeout=self.connect_timeout, channel_timeout=self.connect_timeout,
            )
        except paramiko.BadHostKeyException as e:
            client.close()
            how = "the pinned key" if pinned else f"the key in {self.machine.known_hosts}"
            raise PermanentError(
                f"host key for {self.where} does not match {how} in {self._host_keys_note()}: "
                f"refusing to connect (it offered {e.key.get_name()} "
                f"{e.key.get_fingerprint().hex()[:16]}…)") from None
        except UnknownHostKey:
            client.close()
            if self.machine.known_hosts:
                why = f"it is not in {self.machine.known_hosts}"
            else:
                why = "neither ssh.host_key nor the fleet's known_hosts is set"
            raise PermanentError(f"host key for {self.where} is unknown ({why}; see {self._host_keys_note()}): "
                                 "refusing to connect") from None
        except paramiko.AuthenticationException as e:
            client.close()
            raise TemporaryError(f"{self.where}: authentication as {ep.user} failed: {e}") from None
        except socket.gaierror as e:
            client.close()
            raise TemporaryError(f"{self.where}: cannot resolve {self.host}: {e.strerror or e}") from None
        except (socket.timeout, TimeoutError):
            client.close()
            raise TemporaryError(f"{self.where}: connection timed out after {self.connect_timeout:g}s") from None
        except paramiko.ssh_exception.NoValidConnectionsError:
            client.close()
            if self.tunnel:  # nothing listens: the agent is down, or cannot reach this host
                raise TemporaryError(f"{self.where}: tunnel not up (is `reconcile agent` running on "
                                     "the machine?)") from None
            raise TemporaryError(f"{self.where}: connection refused") from None
        except (OSError, paramiko.SSHException, EOFError) as e:
            client.close()
            raise TemporaryError(f"{self.where}: cannot connect: {type(e).__name__}: {e}") from None
        return client

    def close(self) -> None:
        with self._lock:
            self._drop_resident()
            if self._client is not None:
                self._client.close()
                self._client = None

    # ------------------------------------------------------------------ the resident probe

    def _drop_resident(self) -> None:
        chan, self._resident, self._resident_names = self._resident, None, None
        if chan is not None:
            try:
                chan.close()  # its stdin closes: the helper exits
            except Exception:  # noqa: BLE001 - closing is best effort
                pass

    def _resident_probe(self, args: dict) -> dict | None:
        """A probe through the machine's resident helper (``probe.py --serve`` on a channel kept
        open): one line out, one line back, no interpreter started. Started on first use once the
        probe is staged; None whenever it cannot answer (not started, gone), and the caller runs
        the probe the usual way (a helper that misbehaves is dropped, and started again on a later
        pass). An answer that does not come within the probe timeout, or that is larger than
        ``max_reply_bytes`` or unreadable, fails the probe (TemporaryError): asking again the usual
        way would only make the pass wait twice for the same machine."""
        if not self._staged or not self.kept:
            return None
        deadline = time.monotonic() + self.probe_timeout
        failure = None
        try:
            with self._resident_lock:
                if self._resident is None:
                    client = self._connect()
                    chan = client.get_transport().open_session(timeout=self.connect_timeout)
                    chan.exec_command(docker_export(self.machine) + f'f="{staged_path()}"; [ -f "$f" ] || '
                                      f'exit {STAGED_MISSING}; exec python3 "$f" --serve')
                    self._resident, self._resident_buf = chan, bytearray()
                chan = self._resident
                self.round_trips += 1
                line, names_ref = resident_request(args, self._resident_names)
                chan.sendall(line)
                buf = self._resident_buf
                while b"\n" not in buf:
                    while chan.recv_stderr_ready():
                        chan.recv_stderr(1 << 16)  # nothing is expected there; never let it fill up
                    if chan.recv_ready():
                        data = chan.recv(1 << 20)
                        if not data:
                            raise EOFError("the helper closed its output")
                        buf += data
                        if len(buf) > self.max_reply_bytes and b"\n" not in buf:
                            failure = f"the reply exceeded {self.max_reply_bytes} bytes; not reading more"
                            raise EOFError(failure)
                        continue
                    if chan.exit_status_ready() or chan.closed:
                        raise EOFError("the helper exited")
                    left = deadline - time.monotonic()
                    if left <= 0:
                        failure = f"the probe did not answer within {self.probe_timeout:g}s"
                        raise TimeoutError(failure)
                    select.select([chan], [], [], min(left, 1.0))
                line, _, rest = bytes(buf).partition(b"\n")
                self._resident_buf = bytearray(rest)
            # Decoded within the process-wide budget (parallel probes), waiting out the probe timeout.
            answer = REPLY_BUDGET.decode(line, self.max_reply_bytes, max(0.0, deadline - time.monotonic()))
        except BadReply as e:
            with self._resident_lock:
                self._drop_resident()
            raise TemporaryError(f"{self.where}: its probe answer was rejected: {e}") from None
        except (paramiko.SSHException, OSError, EOFError, TimeoutError, ValueError, AttributeError):
            with self._resident_lock:
                self._drop_resident()
            if failure is not None:
                raise TemporaryError(f"{self.where}: {failure}") from None
            return None
        if not isinstance(answer, dict) or "__error__" in answer:
            self._resident_names = None  # the names go whole next time
            return None
        self._resident_names = names_ref
        return answer

    # ------------------------------------------------------------------ commands

    def _exec(self, command: str, stdin: bytes | None, timeout: float, sink=None) -> tuple[int, bytes, bytes]:
        """Run one command on one channel: send stdin, read stdout (into ``sink`` if given) and
        stderr until EOF or the deadline. Returns (rc, stdout, stderr); rc 124 on timeout.

        Stdout read into memory (no ``sink``) is bounded by the transport's ``max_reply_bytes``:
        past it, reading stops, the channel is closed and the call fails with a TemporaryError, so
        no machine can make the reconciler hold more. Stderr keeps its last STDERR_KEEP bytes (it
        only ever feeds a message)."""
        limit = self.max_reply_bytes
        client = self._connect()
        self.round_trips += 1
        out = bytearray()
        err = bytearray()
        deadline = time.monotonic() + timeout
        try:
            chan = client.get_transport().open_session(timeout=self.connect_timeout)
        except (paramiko.SSHException, OSError, EOFError, AttributeError) as e:
            self.close()
            raise TemporaryError(f"{self.where}: cannot open a session: {e}") from None
        try:
            chan.exec_command(command)
            if stdin:
                self._send_input(chan, stdin)
            chan.shutdown_write()
            while True:
                while chan.recv_ready():
                    data = chan.recv(1 << 16)
                    if sink is not None:
                        sink.write(data)
                    else:
                        out += data
                        if len(out) > limit:
                            raise TemporaryError(f"{self.where}: the reply exceeded {limit} bytes; not reading more")
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(1 << 16)
                    if len(err) > STDERR_KEEP:
                        del err[:len(err) - STDERR_KEEP]
                if (chan.eof_received or chan.closed) and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    return 124, bytes(out), bytes(err) + f"timed out after {timeout:g}s".encode()
                select.select([chan], [], [], min(left, 1.0))
            left = max(0.0, deadline - time.monotonic())
            if not chan.status_event.wait(min(left, 5.0) or 0.1):
                return 124, bytes(out), bytes(err) + b"no exit status"
            return chan.recv_exit_status(), bytes(out), bytes(err)
        except (paramiko.SSHException, OSError, EOFError) as e:
            self.close()
            raise TemporaryError(f"{self.where}: session lost: {type(e).__name__}: {e}") from None
        finally:
            chan.close()

    @staticmethod
    def _send_input(chan: paramiko.Channel, stdin: bytes) -> None:
        """Send a command's input. A command may end without reading it all (staging a workspace
        that already exists reads none of the bundle): the machine then closes the channel under
        the send, which fails although nothing is wrong. Its exit status and output still say what
        happened, so the send's failure counts only while the session itself is lost."""
        try:
            chan.sendall(stdin)
        except OSError:
            transport = chan.get_transport()
            if not (chan.closed or chan.eof_received) or transport is None or not transport.is_active():
                raise

    def sh(self, script: str, timeout: float = 60.0) -> Completed:
        prefix = f"export DOCKER_HOST={shlex.quote(self.machine.docker_host)}\n" if self.machine.docker_host else ""
        rc, out, err = self._exec("sh -c " + shlex.quote(prefix + script), None, timeout)
        return Completed(rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    def _run_staged(self, args: dict, program: str, argv: list[str], timeout: float) -> tuple:
        """The agent run from the copy staged on the machine: (rc, out, err), rc None when it
        cannot be (the caller sends the program itself). Arguments too long for a command line
        (``argv`` empty: a probe watching thousands of runs) go as one line on stdin to the
        ``--serve`` loop; on first contact they cost one more round trip, to stage the copy."""
        line = None if argv else json.dumps(args, separators=(",", ":"), sort_keys=True).encode() + b"\n"
        tail = " ".join(shlex.quote(a) for a in argv) if argv else "--serve"
        path, env = staged_path(), docker_export(self.machine)
        stage = (f'f="{path}"; d="{STAGED_DIR}"; if [ -f "$f" ]; then cat > /dev/null; '
                 f'elif ! {{ mkdir -p "$d" && cat > "$d/.agent.$$" && mv "$d/.agent.$$" "$f"; }}; '
                 f'then exit {STAGED_MISSING + 1}; fi; ')
        for _ in range(3):  # staged: by path; gone since (a cleaned home): staged again
            if self._staged is False:
                break
            if self._staged:  # staged before: invoked by path, only the arguments sent
                command, stdin = f'f="{path}"; [ -f "$f" ] || exit {STAGED_MISSING}; exec python3 "$f" {tail}', line
            elif argv:  # first contact: one round trip that stages it (when missing) and runs it
                command, stdin = stage + f'exec python3 "$f" {tail}', program.encode()
            else:  # first contact, with arguments for stdin: staged in one round trip, run in the next
                command, stdin = stage + "exit 0", program.encode()
            rc, out, err = self._exec(env + command, stdin, timeout)
            if rc == STAGED_MISSING and not out:
                self._staged = None
                continue
            if rc == STAGED_MISSING + 1 and not out:
                self._staged = False  # it cannot be kept here: the source every time
                break
            self._staged = True
            if not argv and stdin is not line:
                continue  # staged: now run
            if line is not None and rc == 0:
                rc, out, err = _served(rc, out, err)
            return rc, out, err
        return None, b"", b""

    def agent(self, args: dict) -> dict:
        """One agent operation on the machine; its JSON answer, decoded within the boundary's
        limits (``boundary.loads``). A probe gets the probe timeout, other operations (stopping a
        run waits for it to end) the command timeout. What the answer says is validated by the
        caller (``boundary.parse_probe``); only the root it resolved is learnt here, when it is a
        plain absolute path."""
        probing = args.get("op") == "probe"
        timeout = self.probe_timeout if probing else self.command_timeout
        deadline = time.monotonic() + timeout

        def learn_root(report: dict) -> None:
            root = absolute_path(report.get("root")) if probing else None
            if root is not None:
                self._root = root

        if probing:
            args = dict(args, root=self._root or self.machine.workspace_root)
            report = self._resident_probe(args)
            if report is not None:
                learn_root(report)
                return report
        program, argv = agent_program(args)
        rc, out, err = self._run_staged(args, program, argv, timeout)
        if rc is None:
            command = docker_prefix(self.machine) + "python3 - " + " ".join(shlex.quote(a) for a in argv)
            rc, out, err = self._exec(command, program.encode(), timeout)
        if rc != 0:
            tail = err.decode("utf-8", "replace").strip()[-300:]
            if rc == 127:
                raise TemporaryError(f"{self.where}: python3 not found on the machine: {tail}")
            raise TemporaryError(f"{self.where}: agent {args.get('op')} failed (exit {rc}): {tail}")
        try:
            # Room in the decoding budget is waited for within what is left of the call's timeout.
            report = REPLY_BUDGET.decode(out, self.max_reply_bytes, max(0.0, deadline - time.monotonic()))
        except BadReply as e:
            raise TemporaryError(f"{self.where}: agent {args.get('op')} answer rejected: {e}") from None
        if not isinstance(report, dict):
            raise TemporaryError(f"{self.where}: agent {args.get('op')} answered a JSON "
                                 f"{type(report).__name__}, not an object")
        learn_root(report)
        return report


__all__ = ["SshTransport"]
