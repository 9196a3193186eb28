"""Helpers for tests that drive the reconciler against a real temporary git repository."""

from __future__ import annotations

import functools
import json
import os
import pwd
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import git

from reconciler.core import config as configs
from reconciler.status import store as statuses
from reconciler.engine.loop import Reconciler
from tests import faults

LOCAL_HOST = """\
apiVersion: reconciler/v1
kind: ExecutionTemplate
id: local-host
placement: {kind: local}
launch_mode: {kind: host_process}
allow_overrides: [resources, runtime_env]
"""


def run_spec(name: str, argv: list[str], max_retries: int = 0, backoff: float = 0, extra: str = "",
             template: str = "local-host", desired: str = "Running") -> str:
    args = ", ".join('"' + a.replace("\\", "\\\\").replace('"', '\\"') + '"' for a in argv)
    return textwrap.dedent(f"""\
        apiVersion: reconciler/v1
        kind: Run
        metadata:
          name: {name}
        spec:
          template: {template}
          desiredState: {desired}
          task:
            type: command
            argv: [{args}]
          restartPolicy:
            maxRetries: {max_retries}
            backoffSeconds: {backoff}
        """) + extra


def make_repo(root: Path, runs: dict[str, str] | None = None, templates: dict[str, str] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    repo = git.Repo.init(root, initial_branch="main")
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "Test User")
        cw.set_value("user", "email", "user@example.invalid")
    (root / "execution_templates").mkdir(exist_ok=True)
    for tid, text in (templates or {"local-host": LOCAL_HOST}).items():
        (root / "execution_templates" / f"{tid}.yaml").write_text(text)
    (root / "specs" / "runs").mkdir(parents=True, exist_ok=True)
    for name, text in (runs or {}).items():
        (root / "specs" / "runs" / f"{name}.yaml").write_text(text)
    (root / ".gitignore").write_text(".reconciler/\n")
    repo.git.add("-A")
    repo.git.commit("-m", "initial specs")
    return root


def commit_all(root: Path, message: str) -> None:
    repo = git.Repo(root)
    repo.git.add("-A")
    repo.git.commit("-m", message)


def reconciler(root: Path, ws_root: Path, **flags) -> Reconciler:
    base = {"workspace_root": str(ws_root), "namespace": "test", "terminate_grace": 3.0}
    base.update(flags)
    return Reconciler(configs.load(str(root), flags=base))


def status_of(root: Path, name: str) -> statuses.RunStatus | None:
    return statuses.load_one(root / "status", name)


def wait_for(cond, timeout: float = 20.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def pass_until(rec: Reconciler, name: str, phase: str, timeout: float = 30.0):
    """Run passes until the run reaches a phase; return its status."""

    def check():
        rec.run_pass()
        st = status_of(rec.cfg.repo, name)
        return st if st is not None and st.phase == phase else None

    return wait_for(check, timeout=timeout, interval=0.1, what=f"{name} to reach {phase}")


def workspace(ws_root: Path, identity: str) -> Path:
    return ws_root / "test" / identity


def result_of(ws_root: Path, identity: str) -> dict | None:
    p = workspace(ws_root, identity) / "runtime" / "result.json"
    return json.loads(p.read_text()) if p.exists() else None


def pgid_of(ws_root: Path, identity: str) -> int | None:
    """The process group the wrapper recorded, or None while it has not written it yet."""
    try:
        return int((workspace(ws_root, identity) / "runtime" / "pid").read_text())
    except (OSError, ValueError):
        return None


def _live_processes():
    """(pid, fields after the command name in /proc/PID/stat) for every live, non-zombie process."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode()
        except OSError:
            continue
        rest = stat[stat.rfind(")") + 2:].split()
        if rest and rest[0] not in ("Z", "X"):
            yield int(entry), rest


def _other_workers_account(pid: int) -> bool:
    """True for a process of another pytest-xdist worker's test account (tests/infra/sshd.py's
    worker_user): never one of this test's, though it may run a job of the same name."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return False
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return False
    name = _account(uid) if uid else ""
    return re.search(r"-gw\d+$", name) is not None and not name.endswith(f"-{worker}")


@functools.lru_cache(maxsize=None)
def _account(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return ""


def processes_with(text: str, under: int | None = None, within=None) -> list[int]:
    """Live pids whose environment or command line mentions ``text`` (this process excluded, and
    those of another test worker's account). ``under``: only descendants of that pid, so that a
    test looks at the processes it started and not at another suite's running beside it.
    ``within``: a folder (or several): only processes that also name it beside ``text`` (a run's
    wrapper exports its workspace as RECONCILER_BUNDLE), for processes that left every parent."""
    from tests.infra._proc import descendants

    needle = text.encode()
    places = [str(p).encode() for p in ([within] if isinstance(within, (str, Path)) else within or [])]
    mine = set(descendants(under)) if under is not None else None
    pids = []
    for pid, _ in _live_processes():
        if pid == os.getpid() or _other_workers_account(pid) or (mine is not None and pid not in mine):
            continue
        for part in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as fh:
                    data = fh.read()
                    if needle in data and (not places or any(p in data for p in places)):
                        pids.append(pid)
                        break
            except OSError:
                continue
    return pids


def group_alive(pgid: int) -> bool:
    return any(int(rest[2]) == pgid for _, rest in _live_processes())


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def reconcile_cli(root: Path, *args: str, env: dict | None = None, timeout: float = 60,
                  crash_after: str | None = None) -> subprocess.CompletedProcess:
    """``reconcile ARGS --repo ROOT`` in a subprocess; ``crash_after``: killed at that point
    (tests/faults.py: "stage", "apply")."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    argv = [*args, "--repo", str(root)]
    if crash_after is not None:
        cmd, full_env = faults.command(*argv, crash_after=crash_after), faults.env(full_env)
    else:
        cmd = [sys.executable, "-m", "reconciler", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout)


class Listings:
    """Counts the folders listed through ``os.scandir`` as ``module`` calls it (a walk that is
    skipped lists none)."""

    def __init__(self, monkeypatch, module) -> None:
        self.count = 0
        real = os.scandir

        def counting(path):
            self.count += 1
            return real(path)

        monkeypatch.setattr(module.os, "scandir", counting)
