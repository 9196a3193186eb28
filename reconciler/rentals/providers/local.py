"""The local provider: rentals that are real sshd servers on this machine's loopback.

The embedded default needs no account, bills nothing and runs on a fresh machine, yet every step
of a rental's life is real: a rental is asked for, becomes ready after ``delaySeconds``, is
reached over SSH with a host key seen for the first time, verified, used, and given back (its
sshd stopped, its processes killed, its files removed). Each rental has its own port, host key,
workspace root and, when the reconciler runs as root, its own unix user (otherwise it logs in as
the reconciler's own user). ``failureRate`` makes some provisionings fail; ``evaporate`` makes a
rental vanish the way a preempted cloud machine does.

A machine without NVIDIA GPUs cannot show real ones: a rental of an offer with GPUs gets an
``nvidia-smi`` stand-in on its PATH that reports the offer's GPUs (or ``misreport``'s model, for
tests of the GPU check). It is a fake and is named so; on a real rental the same check reads the
real ``nvidia-smi``.

The provider's own records live in ``stateDir`` (one folder per rental, a lock file for the
whole): they are the "cloud's" state, so they survive a reconciler restart, as a real provider's do.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

from reconciler.core import procenv
from reconciler.core.errors import PermanentError, TemporaryError
from reconciler.spec.models.provider import Offer, Provider
from .base import AdapterContext, Rental

SSHD = "/usr/sbin/sshd"


def make(provider: Provider, ctx: AdapterContext) -> "LocalAdapter":
    return LocalAdapter(provider, ctx)


def default_identity(state: Path) -> Path:
    return state / "id_ed25519"


class LocalAdapter:
    def __init__(self, provider: Provider, ctx: AdapterContext):
        self.provider = provider
        settings = provider.spec.local
        self.delay = settings.delaySeconds if settings else 0.0
        self.failure_rate = settings.failureRate if settings else 0.0
        self.seed = settings.seed if settings else None
        self.misreport = dict(settings.misreport) if settings else {}
        where = settings.stateDir if settings and settings.stateDir else f"~/.reconciler/local-provider/{provider.metadata.name}"
        self.state = Path(os.path.expanduser(where))
        self.calls = 0
        self.root_mode = os.geteuid() == 0 and (settings is None or settings.login == "own")

    # ------------------------------------------------------------------ the contract

    def offers(self) -> list[Offer]:
        return list(self.provider.spec.offers)

    def identity_file(self) -> Path:
        """The reconciler's login key for these rentals: ssh.identity_file, else one made here."""
        if self.provider.spec.ssh.identity_file:
            return Path(os.path.expanduser(self.provider.spec.ssh.identity_file))
        key = default_identity(self.state)
        if not key.exists():
            self.state.mkdir(parents=True, exist_ok=True)
            _keygen(key, "reconciler@local-provider")
        return key

    def provision(self, name: str, offer: Offer) -> Rental:
        self.calls += 1
        with self._locked():
            for meta in self._all():
                if meta["name"] == name and meta["state"] not in ("terminated",):
                    return self._rental(meta)  # asked twice for one name: the same machine
            rid = "lr-" + uuid.uuid4().hex[:10]
            d = self.state / rid
            d.mkdir(parents=True)
            now = time.time()
            meta = {"id": rid, "name": name, "state": "provisioning", "offer": offer.id,
                    "price_per_hour": offer.price_per_hour, "created_at": now, "ready_at": now + self.delay,
                    "gpus": _gpus(offer, self.misreport.get(offer.id)), "fails": self._fails(name)}
            _write(d / "meta.json", meta)
            if self.delay == 0:
                meta = self._advance(meta)
            return self._rental(meta)

    def inventory(self) -> list[Rental]:
        self.calls += 1
        with self._locked():
            return [self._rental(self._advance(m)) for m in self._all()]

    def terminate(self, rental_id: str) -> None:
        self.calls += 1
        with self._locked():
            self._destroy(rental_id)

    # ------------------------------------------------------------------ test levers

    def evaporate(self, rental_id: str) -> None:
        """The machine is gone, without anyone asking: its processes die with it (a preemption)."""
        with self._locked():
            self._destroy(rental_id)

    def crash(self, rental_id: str) -> None:
        """The machine dies (its sshd and everything it ran) while the provider still lists it
        running: only the reconciler's unreachable grace can tell that from a slow network."""
        with self._locked():
            d = self.state / rental_id
            if not rental_id.startswith("lr-") or "/" in rental_id or not d.is_dir():
                return
            meta = json.loads((d / "meta.json").read_text())
            _stop_sshds(d, (meta["sshd_pid"],) if isinstance(meta.get("sshd_pid"), int) else ())
            self._kill_processes(meta)

    # ------------------------------------------------------------------ internals

    @contextmanager
    def _locked(self):
        self.state.mkdir(parents=True, exist_ok=True)
        with open(self.state / ".lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            yield

    def _all(self) -> list[dict]:
        out = []
        for d in sorted(self.state.glob("lr-*")):
            try:
                out.append(json.loads((d / "meta.json").read_text()))
            except (OSError, ValueError):
                continue  # a rental half-made by a killed process: nothing to list yet
        return out

    def _fails(self, name: str) -> bool:
        if self.failure_rate <= 0:
            return False
        seed = hashlib.sha256(f"{self.seed}:{name}".encode()).digest() if self.seed is not None else None
        rng = random.Random(seed) if seed is not None else random.Random()
        return rng.random() < self.failure_rate

    def _advance(self, meta: dict) -> dict:
        if meta["state"] != "provisioning" or time.time() < meta["ready_at"]:
            return meta
        if meta.get("fails"):
            meta.update(state="failed", message="the provider could not start the machine")
        else:
            try:
                meta.update(self._boot(meta))
                meta["state"] = "running"
            except (OSError, subprocess.SubprocessError, RuntimeError) as e:
                meta.update(state="failed", message=f"sshd did not start: {e}")
        _write(self.state / meta["id"] / "meta.json", meta)
        return meta

    def _boot(self, meta: dict) -> dict:
        """Start the rental's sshd: its own user (as root), host key, port and workspace root."""
        d = self.state / meta["id"]
        if self.root_mode:
            user = "rcl" + meta["id"][3:11]
            _ensure_user(user)
            home = Path(pwd.getpwnam(user).pw_dir)
        else:
            user = pwd.getpwuid(os.geteuid()).pw_name
            home = d / "home"
            home.mkdir(exist_ok=True)
        # Files sshd reads as the login user live under that user's home (a root-only state
        # folder would hide them).
        sshdir = home / ".rc-rental"
        sshdir.mkdir(exist_ok=True)
        pub = Path(str(self.identity_file()) + ".pub").read_text().split()[:2]
        (sshdir / "authorized_keys").write_text(" ".join(pub) + "\n")
        bindir = sshdir / "bin"
        bindir.mkdir(exist_ok=True)
        if meta["gpus"]:
            smi = bindir / "nvidia-smi"
            lines = "".join(f"{g['name']}, {g['memory_mib']}\n" for g in meta["gpus"])
            smi.write_text("#!/bin/sh\n# A stand-in for nvidia-smi on a local rental (this machine has no GPU): it\n"
                           "# reports the offer's GPUs. Real rentals run the real one.\n"
                           f"cat <<'EOF'\n{lines}EOF\n")
            smi.chmod(0o755)
        workspace = home / "work"
        workspace.mkdir(exist_ok=True)
        if self.root_mode:
            uid, gid = pwd.getpwnam(user).pw_uid, pwd.getpwnam(user).pw_gid
            for p in (home, sshdir, bindir, workspace, sshdir / "authorized_keys", *bindir.iterdir()):
                os.chown(p, uid, gid)
        host_key_file = d / "ssh_host_ed25519_key"
        if not host_key_file.exists():
            _keygen(host_key_file, f"{meta['id']}@local-provider")
        host_key = " ".join(Path(f"{host_key_file}.pub").read_text().split()[:2])
        port = _free_port()
        config = d / "sshd_config"
        config.write_text("\n".join([
            f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {host_key_file}", f"PidFile {d / 'sshd.pid'}",
            f"AuthorizedKeysFile {sshdir / 'authorized_keys'}", "PubkeyAuthentication yes",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
            "PermitRootLogin prohibit-password" if user == "root" else "PermitRootLogin no", f"AllowUsers {user}", "PrintMotd no", "PrintLastLog no", "UseDNS no",
            "MaxStartups 100", "MaxSessions 50", "Subsystem sftp internal-sftp",
            f"SetEnv PATH={bindir}:/usr/local/bin:/usr/bin:/bin", ""]))
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", exist_ok=True)
        # An sshd started by a process killed before it recorded it (kill -9 mid-boot) is still
        # listening on its own port: stop it before starting this one, never two per rental.
        _stop_sshds(d)
        log = open(d / "sshd.log", "ab")
        try:
            # procenv's base, not this process's environment: a rental logging in as the same user
            # could read this sshd's /proc/<pid>/environ, and with it every secret of this host.
            proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=log, start_new_session=True, env=procenv.base())
        finally:
            log.close()
        # Recorded at once, before the wait for the port: the rental's meta.json learns the pid
        # only when the boot is done, and a process killed before then must not lose it.
        with open(d / SSHD_PIDS, "a") as fh:
            fh.write(f"{proc.pid}\n")
        _after_sshd_start()
        deadline = time.monotonic() + 10
        while not _port_open(port):
            if proc.poll() is not None:
                raise RuntimeError((d / "sshd.log").read_text(errors="replace")[-300:])
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd on 127.0.0.1:{port} did not answer in 10 s")
            time.sleep(0.02)
        return {"host": "127.0.0.1", "port": port, "user": user, "sshd_pid": proc.pid, "host_key": host_key,
                "workspace_root": str(workspace)}

    def _destroy(self, rental_id: str) -> None:
        d = self.state / rental_id
        if not rental_id.startswith("lr-") or "/" in rental_id or not d.is_dir():
            return  # gone already (or never ours): terminating twice succeeds
        try:
            meta = json.loads((d / "meta.json").read_text())
        except (OSError, ValueError):
            meta = {}
        # The sshd in meta.json and any that a killed process started and never recorded there, each
        # only while it is still this rental's: a pid from an old meta.json may name another process.
        _stop_sshds(d, (meta["sshd_pid"],) if isinstance(meta.get("sshd_pid"), int) else ())
        self._kill_processes(meta)
        user = meta.get("user")
        if self.root_mode and user and user.startswith("rcl"):
            subprocess.run(["userdel", "-r", "-f", user], capture_output=True, env=procenv.base())
        shutil.rmtree(d, ignore_errors=True)

    def _kill_processes(self, meta: dict) -> None:
        """Everything the rental ran dies with it, as on a machine that is switched off."""
        user = meta.get("user")
        if self.root_mode and user and user.startswith("rcl"):
            subprocess.run(["pkill", "-KILL", "-u", user], capture_output=True, env=procenv.base())
            for _ in range(50):
                if subprocess.run(["pgrep", "-u", user], capture_output=True, env=procenv.base()).returncode != 0:
                    break
                time.sleep(0.05)
        elif meta.get("workspace_root"):
            _kill_workspace_processes(meta["workspace_root"])

    def _rental(self, meta: dict) -> Rental:
        return Rental(id=meta["id"], name=meta["name"], state=meta["state"], host=meta.get("host"),
                      port=meta.get("port"), user=meta.get("user"), price_per_hour=meta.get("price_per_hour"),
                      created_at=meta.get("created_at"), offer=meta.get("offer"), message=meta.get("message", ""),
                      workspace_root=meta.get("workspace_root"), host_key=meta.get("host_key"))


SSHD_PIDS = "sshd.pids"  # every sshd started for the rental, one pid a line


def _after_sshd_start() -> None:
    """A seam: nothing here; the crash tests replace it to die as kill -9 would, mid-boot."""


def _stop_sshds(d: Path, known: tuple[int, ...] = ()) -> None:
    """Stop every sshd started for the rental in ``d`` that still runs: ``known`` ones, those
    recorded in ``SSHD_PIDS`` and sshd's own PidFile. A pid counts only while its command line still
    names this rental's sshd_config, so a pid reused by another process is never touched."""
    pids: set[int] = set(known)
    for name in (SSHD_PIDS, "sshd.pid"):
        try:
            pids.update(int(x) for x in (d / name).read_text().split() if x.isdigit())
        except OSError:
            continue
    config = b" " + str(d / "sshd_config").encode() + b" "
    for pid in sorted(pids):
        try:
            # sshd rewrites its title ("sshd: /usr/sbin/sshd -D -e -f CONFIG [listener] ..."): the
            # arguments may come separated by spaces rather than NULs.
            if config not in b" " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ") + b" ":
                continue
            os.killpg(pid, signal.SIGKILL)  # its own session: sshd and its logins
        except (OSError, ProcessLookupError):
            continue


def _gpus(offer: Offer, reported: str | None) -> list[dict]:
    name = reported or (f"NVIDIA {offer.gpu_type}" if offer.gpu_type else "NVIDIA GPU")
    mib = int((offer.gpu_memory_gb or 80) * 1024)
    return [{"name": name, "memory_mib": mib} for _ in range(offer.gpu_count)]


def _keygen(path: Path, comment: str) -> None:
    r = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                       capture_output=True, text=True, env=procenv.base())
    if r.returncode != 0:
        raise PermanentError(f"ssh-keygen failed: {r.stderr.strip()}")


def _ensure_user(user: str) -> None:
    try:
        pwd.getpwnam(user)
    except KeyError:
        r = subprocess.run(["useradd", "-m", "-s", "/bin/sh", user], capture_output=True, text=True,
                           env=procenv.base())
        if r.returncode != 0 and "already exists" not in r.stderr:
            raise TemporaryError(f"useradd {user}: {r.stderr.strip()}")
    # UsePAM no: a locked account ("!" in shadow) is refused even with a key.
    subprocess.run(["usermod", "-p", "*", user], capture_output=True, env=procenv.base())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def _kill_workspace_processes(root: str) -> None:
    """Without a user of its own, a rental's processes are those whose working folder is under its
    workspace root (every run starts in its workspace)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if cwd == root or cwd.startswith(root.rstrip("/") + "/"):
            try:
                os.kill(int(entry), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _write(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)
