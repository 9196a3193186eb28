"""Helpers for tests that drive real passes against real machines: a tmp git repository with
specs, templates and a Fleet pointing at test sshd servers, a Reconciler over it, and polling.

Nothing here is a fake: the repository is a real git repository, the machines are the sshd fixtures
(user ``rctest``), the containers run in the dockerd fixture.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import yaml

from reconciler.core import config
from reconciler.engine.loop import PassResult, Reconciler
from reconciler.runtime.readings import group_alive
from reconciler.core.runstatus import RunStatus
from reconciler.status.store import load_all

TEMPLATES = {
    "ssh-host": {"placement": {"kind": "ssh"}, "launch_mode": {"kind": "host_process"},
                 "defaults": {"target": "lab"}, "allow_overrides": ["target", "resources", "runtime_env"]},
    "ssh-docker": {"placement": {"kind": "ssh"}, "launch_mode": {"kind": "docker", "network": "none"},
                   "defaults": {"target": "lab", "image": "reconciler-test/busybox:latest"},
                   "allow_overrides": ["target", "image", "resources", "runtime_env"]},
    "local-host": {"placement": {"kind": "local"}, "launch_mode": {"kind": "host_process"},
                   "allow_overrides": ["resources", "runtime_env"]},
    "local-docker": {"placement": {"kind": "local"}, "launch_mode": {"kind": "docker", "network": "none"},
                     "defaults": {"image": "reconciler-test/busybox:latest"},
                     "allow_overrides": ["image", "resources", "runtime_env"]},
}


def remote_root() -> str:
    """A workspace root of its own for one test on the (shared) rctest account: /tmp is writable by it."""
    return f"/tmp/rc-ws-{uuid.uuid4().hex[:10]}"


def machine(server, name: str = "lab-1", *, gpus: int = 0, gpu_type: str = "T4", max_tasks: int = 2,
            workspace_root: str | None = None, docker_host: str | None = None, host_key: str | None = None,
            pin: bool = True) -> dict[str, Any]:
    ssh = {"host": server.host, "port": server.port, "user": server.user, "identity_file": str(server.identity_file)}
    if pin:
        ssh["host_key"] = host_key or server.host_key
    m: dict[str, Any] = {"name": name, "ssh": ssh, "max_tasks": max_tasks,
                         "workspace_root": workspace_root or remote_root()}
    if gpus:
        m["resources"] = {"gpus": [{"type": gpu_type, "count": gpus}]}
    if docker_host:
        m["docker_host"] = docker_host
    return m


def fleet(machines: list[dict], name: str = "lab", known_hosts: str | None = None) -> dict:
    spec: dict[str, Any] = {"machines": machines}
    if known_hosts:
        spec["known_hosts"] = known_hosts
    return {"apiVersion": "reconciler/v1", "kind": "Fleet", "metadata": {"name": name}, "spec": spec}


def run_spec(name: str, template: str, argv: list[str], **spec: Any) -> dict:
    body: dict[str, Any] = {"template": template, "task": {"type": "command", "argv": argv}}
    body.update(spec)
    return {"apiVersion": "reconciler/v1", "kind": "Run", "metadata": {"name": name}, "spec": body}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


class World:
    """A tmp repository plus the knobs of a reconciler over it."""

    def __init__(self, base: Path, fleets: list[dict] = (), **flags: Any):
        self.repo = base / "repo"
        self.local_root = base / "ws"
        (self.repo / "specs" / "runs").mkdir(parents=True)
        (self.repo / "specs" / "fleets").mkdir(parents=True)
        (self.repo / "execution_templates").mkdir()
        (self.repo / ".gitignore").write_text(".reconciler/\n")
        for tid, body in TEMPLATES.items():
            doc = {"apiVersion": "reconciler/v1", "kind": "ExecutionTemplate", "id": tid, **body}
            self._dump(self.repo / "execution_templates" / f"{tid}.yaml", doc)
        for f in fleets:
            self._dump(self.repo / "specs" / "fleets" / f"{f['metadata']['name']}.yaml", f)
        git(self.repo, "init", "-q", "-b", "main")
        git(self.repo, "config", "user.name", "test")
        git(self.repo, "config", "user.email", "test@localhost")
        self.commit("initial")
        self.flags: dict[str, Any] = {"workspace_root": str(self.local_root), "namespace": "test", "push": False,
                                      "unreachable_grace": 300.0, "terminate_grace": 2.0,
                                      "ssh_connect_timeout": 3.0, "ssh_command_timeout": 30.0}
        self.flags.update(flags)
        self.roots = [m["workspace_root"] for f in fleets for m in f["spec"]["machines"]]

    @staticmethod
    def _dump(path: Path, doc: dict) -> None:
        path.write_text(yaml.safe_dump(doc, sort_keys=False))

    def add_run(self, doc: dict, commit: bool = True) -> None:
        self._dump(self.repo / "specs" / "runs" / f"{doc['metadata']['name']}.yaml", doc)
        if commit:
            self.commit(f"add {doc['metadata']['name']}")

    def set_fleet(self, doc: dict) -> None:
        self._dump(self.repo / "specs" / "fleets" / f"{doc['metadata']['name']}.yaml", doc)
        self.commit("fleet")

    def commit(self, message: str) -> None:
        git(self.repo, "add", "-A", "specs", "execution_templates", ".gitignore")
        git(self.repo, "commit", "-q", "--allow-empty", "-m", message)

    def reconciler(self, **flags: Any) -> Reconciler:
        return Reconciler(config.load(str(self.repo), flags={**self.flags, **flags}))

    def run_pass(self, now: float | None = None, **flags: Any) -> PassResult:
        return self.reconciler(**flags).run_pass(now=now)

    def status(self, name: str) -> RunStatus | None:
        return load_all(self.repo / "status").get(name)

    def bundle(self, identity: str) -> Path:
        return self.repo / ".reconciler" / "bundles" / identity

    def until(self, name: str, pred: Callable[[RunStatus], bool], timeout: float = 20.0, interval: float = 0.1,
              **flags: Any) -> RunStatus:
        """Run passes until the run's status satisfies ``pred``; return that status."""
        rec = self.reconciler(**flags)
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            rec.run_pass()
            last = self.status(name)
            if last is not None and pred(last):
                return last
            time.sleep(interval)
        raise AssertionError(f"{name}: condition not reached in {timeout}s; last status:\n"
                             + (json.dumps(last.model_dump(mode="json"), indent=1) if last else "none"))

    def passes_until(self, cond: Callable[[], bool], passes: int = 3, **flags: Any) -> int:
        """Run passes until ``cond()`` holds (at most ``passes``); how many it took. For what a
        later pass does by design, such as removing a finished run's workspace once git records
        its end (engine/endclean.py)."""
        rec = self.reconciler(**flags)
        for n in range(passes + 1):
            if cond():
                return n
            if n < passes:
                rec.run_pass()
        raise AssertionError(f"not reached in {passes} passes")

    def __enter__(self) -> "World":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cleanup()

    def cleanup(self) -> None:
        """End every process group a workspace of this world records, and remove remote roots."""
        roots = [Path(r) / "test" for r in self.roots] + [self.local_root / "test"]
        for root in roots:
            if not root.is_dir():
                continue
            for pid_file in root.glob("*/runtime/pid"):
                kill_group(pid_file)
        for r in self.roots:
            shutil.rmtree(r, ignore_errors=True)


def kill_group(pid_file: Path, sig: int = signal.SIGKILL) -> bool:
    """Signal the process group a workspace's runtime/pid names, if it still carries the identity."""
    try:
        pgid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return False
    identity = pid_file.parent.parent.name
    if not group_alive(pgid, identity):
        return False
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def alive_instances(root: Path, name: str) -> list[str]:
    """Identities of ``name`` whose process group is alive under a workspace root (checked on the machine)."""
    out = []
    for pid_file in sorted(Path(root).glob(f"{name}-g*-a*/runtime/pid")):
        ident = pid_file.parent.parent.name
        try:
            pgid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if group_alive(pgid, ident):
            out.append(ident)
    return out
