"""Placement ``local``: this machine is the execution plane (the embedded default).

Workspaces live under a root on this machine (``~/.reconciler/workspaces`` unless configured),
outside any checkout, so a reconciler started from a fresh clone in another folder still finds the
runs an earlier one launched. The bundle is built straight into the workspace: staging and
fetching are no-ops. The agent runs in-process, so observing costs no subprocess at all, and so
does a host process launch up to the wrapper itself (local_launch.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from reconciler.core import procenv
from reconciler.artifacts import safetar
from reconciler.artifacts.bundle import built_digest
from reconciler.core.errors import TemporaryError
from reconciler.runtime import probe as agent_module
from . import local_launch, local_memo
from .base import Completed, MachineInfo, only_runtime_and_artifacts
from .base import without_checkpoints as skip_checkpoints

class LocalTransport:
    # Launches of one pass on this machine that may run at once (engine/parallel_launches.py): each
    # builds its bundle and starts its wrapper in-process, in a workspace of its own; more than a
    # few only queue for the same two cores of a small VM.
    launch_width = 4

    def __init__(self, machine: MachineInfo):
        self.machine = machine
        self.root = os.path.abspath(os.path.expanduser(machine.workspace_root))
        self.round_trips = 0
        # Set by a long-lived reconciler (engine/focus.py): ``memo_age`` keeps each full probe's
        # report for up to that many seconds, and ``focus`` (run names) asks the next probe to
        # look afresh only at those runs' workspaces (local_memo.py says when it may). The probe
        # leaves in ``focus`` the runs it looked at afresh, or None when it looked at all.
        self.memo_age: float | None = None
        self.focus: frozenset[str] | None = None

    def workspace(self, identity: str) -> str:
        return os.path.join(self.root, identity)

    def sh(self, script: str, timeout: float = 60.0) -> Completed:
        self.round_trips += 1
        local_memo.acted(self.root)
        # Everything a local run or docker command inherits starts here: procenv's allowlist, never
        # this process's environment (which holds every secret of the control plane). A run gets
        # its own declared variables and granted secrets from its bundle (scripts/launch.sh).
        env = procenv.base({"DOCKER_HOST": self.machine.docker_host} if self.machine.docker_host else None)
        try:
            p = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=timeout, env=env,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return Completed(124, "", f"timed out after {timeout}s")
        return Completed(p.returncode, p.stdout, p.stderr)

    def agent(self, args: dict) -> dict:
        self.round_trips += 1
        if self.machine.docker_host:
            os.environ.setdefault("DOCKER_HOST", self.machine.docker_host)
        if args.get("op") != "probe":
            local_memo.acted(self.root)
            return agent_module.dispatch(args)
        args = dict(args, root=self.root)
        local_launch.reap()  # wrappers started here that ended: no zombie outlives a pass
        if self.memo_age is None:
            return agent_module.dispatch(args)
        if self.focus is not None:
            found = local_memo.focused(self.root, args, self.focus, self.memo_age)
            if found is not None:
                report, self.focus = found  # the runs looked at afresh
                return report
            self.focus = None
        return local_memo.full(self.root, args)

    def start_host(self, spec, not_after: float | None = None):
        """A host process launch without a shell (launchers._launch_host asks for it)."""
        local_memo.acted(self.root)
        return local_launch.start_host(self, spec, not_after)

    def stage(self, bundle: Path, identity: str, spec_digest: str = "") -> str:
        local_memo.acted(self.root)
        ws = self.workspace(identity)
        if os.path.abspath(bundle) != ws:
            raise ValueError(f"local bundles are built in their workspace ({ws}), not {bundle}")
        return ws

    def put_secret_file(self, workspace: str, content: bytes, name: str = "secrets.env") -> None:
        local_memo.acted(self.root)
        rt = Path(workspace) / "runtime"
        rt.mkdir(parents=True, exist_ok=True)
        path = rt / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(content)

    def fetch(self, identity: str, dest: Path, limits: safetar.Limits = safetar.Limits(),
              without_checkpoints: bool = False) -> safetar.Result:
        return safetar.Result(complete=True)  # the workspace is the local bundle: nothing is copied

    def close(self) -> None:
        return None


class StagingLocalTransport(LocalTransport):
    """This machine as another machine would be used: bundles are copied into the workspace root
    (staged) and runtime/ and artifacts/ copied back (fetched). For a root that is not this
    reconciler's own, such as a Slurm cluster's shared file system when this machine is the
    cluster's login host: the run's record must outlive the shared workspace."""

    def stage(self, bundle: Path, identity: str, spec_digest: str = "") -> str:
        """Copy the bundle in as the identity's workspace, atomically; one already there is kept
        only if it was built for the same spec (as SshTransport.stage)."""
        ws = Path(self.workspace(identity))
        if (ws / "job.json").is_file():
            if spec_digest and built_digest(ws) != spec_digest:
                raise TemporaryError(f"{identity} on {self.machine.name} was built for another spec; not reusing it")
            return str(ws)
        tmp = ws.with_name(f".{identity}.staging")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(ws, ignore_errors=True)
        shutil.copytree(bundle, tmp, symlinks=True, ignore=shutil.ignore_patterns("runtime", "artifacts"))
        (tmp / "runtime").mkdir()
        (tmp / "artifacts").mkdir()
        os.replace(tmp, ws)
        return str(ws)

    def fetch(self, identity: str, dest: Path, limits: safetar.Limits = safetar.Limits(),
              without_checkpoints: bool = False) -> safetar.Result:
        """runtime/ and artifacts/ of the workspace into ``dest``, never the secrets file. The
        workspace was written by the job: plain files and folders only, no link followed or
        copied (safetar.copy_tree), as for a workspace on another machine."""
        ws = Path(self.workspace(identity))
        if not ws.is_dir():
            raise TemporaryError(f"workspace of {identity} is gone from {self.machine.name}")
        res = safetar.Result(complete=True)
        Path(dest).mkdir(parents=True, exist_ok=True)
        for part in ("runtime", "artifacts"):
            if (ws / part).is_dir():
                safetar.copy_tree(ws / part, Path(dest), prefix=(part,),
                                  keep=skip_checkpoints if without_checkpoints else only_runtime_and_artifacts,
                                  limits=limits, result=res)
        return res
