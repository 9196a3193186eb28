"""Fixtures for the daemon tests: a bare repository on disk as origin, clones, and real daemons.

Every daemon is a real subprocess (``python -m reconciler --repo CLONE``, or through tests/faults.py
for a crash or a held push at one of the product's seams); every process a test
starts is killed at teardown (the daemons by pid, the runs they launched by process group, read
from their workspaces). Waiting is always polling a condition with a timeout.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests import faults
from tests.repo_helpers import LOCAL_HOST, wait_for  # noqa: F401 - wait_for is used by the daemon tests

ROOT = Path(__file__).resolve().parents[2]


def run_spec(name: str, command: str = "echo hi; sleep 30") -> str:
    return (f"apiVersion: reconciler/v1\nkind: Run\nmetadata:\n  name: {name}\nspec:\n  template: local-host\n"
            f"  task:\n    type: command\n    argv: [sh, -c, {json.dumps(command)}]\n")


def git(cwd: Path, *args: str, check: bool = True) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="User", GIT_AUTHOR_EMAIL="user@example.invalid",
               GIT_COMMITTER_NAME="User", GIT_COMMITTER_EMAIL="user@example.invalid", GIT_TERMINAL_PROMPT="0")
    p = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=60)
    if check and p.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {p.stderr}")
    return p.stdout.strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def http(method: str, url: str, body: bytes | None = None, headers: dict | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class Daemon:
    def __init__(self, proc: subprocess.Popen, log: Path, port: int | None):
        self.proc, self.log, self.port = proc, log, port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def events(self) -> list[dict]:
        out = []
        for line in self.text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def logged(self, msg: str) -> list[dict]:
        return [e for e in self.events() if e.get("msg") == msg]

    def wait_ready(self, timeout: float = 20.0) -> None:
        wait_for(lambda: self.logged("daemon started") or self.proc.poll() is not None, timeout, what="daemon start")
        assert self.proc.poll() is None, f"daemon exited early ({self.proc.returncode}):\n{self.text()}"
        if self.port:
            wait_for(lambda: _answers(self.url + "/healthz"), timeout, what="the HTTP endpoint")


def _answers(url: str) -> bool:
    try:
        http("GET", url)
        return True
    except OSError:
        return False


class World:
    """origin (bare), a user clone, a workspace root, and the daemons started on clones of origin."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.origin = tmp / "origin.git"
        self.ws = tmp / "ws"
        self.user = tmp / "user"
        self.daemons: list[Daemon] = []
        git(tmp, "init", "-q", "--bare", "-b", "main", str(self.origin))
        git(tmp, "clone", "-q", str(self.origin), str(self.user))
        (self.user / "execution_templates").mkdir()
        (self.user / "execution_templates" / "local-host.yaml").write_text(LOCAL_HOST)
        (self.user / "specs" / "runs").mkdir(parents=True)
        (self.user / "specs" / "runs" / ".keep").write_text("")
        (self.user / ".gitignore").write_text(".reconciler/\n")
        self.user_commit("initial templates")

    # -------- the user's side

    def user_commit(self, message: str, push: bool = True) -> None:
        git(self.user, "add", "-A")
        git(self.user, "commit", "-q", "-m", message)
        if push:
            self.user_push()

    def user_push(self) -> None:
        # The daemon may have pushed status meanwhile: rebase like a user would (status/ never conflicts).
        for _ in range(10):
            git(self.user, "pull", "-q", "--rebase", "origin", "main", check=False)
            if subprocess.run(["git", "push", "-q", "origin", "HEAD:main"], cwd=self.user,
                              capture_output=True).returncode == 0:
                return
        raise AssertionError("user push kept failing")

    def add_spec(self, name: str, command: str = "echo hi; sleep 30", push: bool = True) -> None:
        (self.user / "specs" / "runs" / f"{name}.yaml").write_text(run_spec(name, command))
        self.user_commit(f"add run {name}", push=push)

    def add_unanswering_machine(self, name: str, port: int) -> None:
        """A fleet with one machine on a loopback port where no sshd answers (pushed)."""
        known_hosts = self.tmp / "known_hosts"
        known_hosts.write_text("")
        (self.user / "specs" / "fleets").mkdir(exist_ok=True)
        (self.user / "specs" / "fleets" / "lab.yaml").write_text(
            "apiVersion: reconciler/v1\nkind: Fleet\nmetadata: {name: lab}\nspec:\n"
            f"  known_hosts: {known_hosts}\n  machines:\n"
            f"    - name: {name}\n      ssh: {{host: 127.0.0.1, port: {port}, user: nobody}}\n")
        self.user_commit(f"a fleet machine, {name}, that does not speak SSH")

    # -------- the remote

    def remote_file(self, path: str) -> str | None:
        p = subprocess.run(["git", "--git-dir", str(self.origin), "show", f"main:{path}"], capture_output=True,
                           text=True)
        return p.stdout if p.returncode == 0 else None

    def remote_status(self, name: str) -> dict | None:
        import yaml

        text = self.remote_file(f"status/{name}.yaml")
        return yaml.safe_load(text) if text else None

    def remote_log(self) -> list[str]:
        return git(self.origin, "log", "--format=%H %s", "main").splitlines()

    def merges(self) -> list[str]:
        return git(self.origin, "rev-list", "--merges", "main").split()

    # -------- daemons

    def clone(self, name: str) -> Path:
        path = self.tmp / name
        git(self.tmp, "clone", "-q", str(self.origin), str(path))
        return path

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        for k in list(env):
            if k.startswith("RECONCILER_"):
                del env[k]
        env.update(RECONCILER_WORKSPACE_ROOT=str(self.ws), RECONCILER_NAMESPACE="fixed",
                   RECONCILER_POLL_INTERVAL="0.5", RECONCILER_RESYNC_INTERVAL="2", RECONCILER_DEBOUNCE="0.05",
                   RECONCILER_LOG_FORMAT="json", RECONCILER_TERMINATE_GRACE="2", RECONCILER_LOCAL_GPUS="0",
                   RECONCILER_ALLOW_DIRTY="true",  # tests edit the daemon's checkout to wake it
                   PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
        env.update(extra)
        return env

    def start(self, clone: Path, listen: bool = True, args: tuple[str, ...] = (), crash_after: str | None = None,
              hold_push: Path | None = None, **env: str) -> Daemon:
        """A daemon on ``clone``; ``crash_after`` ("apply", "commit") and ``hold_push``: faults at the
        product's seams (tests/faults.py)."""
        port = free_port() if listen else None
        if port:
            env.setdefault("RECONCILER_LISTEN", f"127.0.0.1:{port}")
        log = self.tmp / f"daemon-{len(self.daemons)}.log"
        fh = open(log, "wb")
        argv = ["--repo", str(clone), *args]
        cmd = faults.command(*argv, crash_after=crash_after, hold_push=hold_push) if crash_after or hold_push \
            else [sys.executable, "-m", "reconciler", *argv]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env=self.env(**env),
                                stdin=subprocess.DEVNULL)
        fh.close()
        d = Daemon(proc, log, port)
        self.daemons.append(d)
        return d

    # -------- the execution plane

    def workspaces(self) -> list[str]:
        """The workspaces under the root (hidden entries beside them, such as an identity's claim or
        the bundles' shared runtime files, are not workspaces)."""
        root = self.ws / "fixed"
        return sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) if root.is_dir() else []

    def pid_of(self, identity: str) -> int | None:
        p = self.ws / "fixed" / identity / "runtime" / "pid"
        try:
            text = p.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def cleanup(self) -> None:
        for d in self.daemons:
            if d.proc.poll() is None:
                d.proc.kill()
            try:
                d.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        root = self.ws / "fixed"
        if root.is_dir():
            for ws in root.iterdir():
                pid = self.pid_of(ws.name)
                if pid:
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass


def process_groups_with(identity: str, within: Path | None = None) -> set[int]:
    """Process groups of live processes whose command line or environment names ``identity``
    (and, with ``within``, that folder too: another test's run of the same name is not this one's)."""
    groups = set()
    needle = identity.encode()
    where = str(within).encode() if within is not None else b""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode()
            rest = stat[stat.rfind(")") + 2:].split()
            if rest[0] in ("Z", "X"):
                continue
            for part in ("cmdline", "environ"):
                with open(f"/proc/{entry}/{part}", "rb") as fh:
                    data = fh.read()
                    if needle in data and where in data:
                        groups.add(int(rest[2]))
                        break
        except OSError:
            continue
    return groups


@pytest.fixture
def world(tmp_path: Path):
    w = World(tmp_path)
    try:
        yield w
    finally:
        w.cleanup()
