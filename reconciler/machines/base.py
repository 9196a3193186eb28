"""The backend contract: a transport to a machine, and a launch mode on top of it.

A backend is chosen by the key ``<placement>_<launch_mode>`` and by nothing else. Placement decides
how commands and files reach a machine (``LocalTransport`` runs them here, ``SshTransport`` over
one SSH connection per machine and pass); the launch mode decides what is started (a detached
host process group, or a container). Every operation is idempotent on the run identity: launching
an identity that already exists adopts it, terminating one that is gone succeeds.

Errors follow ``errors.py``: ``PermanentError`` (a missing image, a refused host key) fails the
run; ``TemporaryError`` (a timeout, a refused connection) leaves it for a later pass.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from reconciler.core import procenv
from reconciler.artifacts import safetar
from reconciler.tasks import env_lines


@dataclass
class Completed:
    rc: int
    out: str
    err: str


@dataclass
class MachineInfo:
    """What a backend needs to know about a machine (this one, or a Fleet entry)."""

    name: str
    workspace_root: str
    docker_host: str | None = None
    python: str | None = None
    fleet_machine: Any = None  # spec.models.Machine for ssh placement
    known_hosts: str | None = None
    source: str | None = None  # the Fleet file that declares the machine (for messages)


def without_checkpoints(parts: tuple[str, ...]) -> str | None:
    """A collection of a run with a Storage: as ``only_runtime_and_artifacts``, and never a
    checkpoint folder (checkpoint-N): its checkpoints are in the bucket, and must not cross the
    reconciler host (skipped silently)."""
    why = only_runtime_and_artifacts(parts)
    if why is None and any(p.startswith("checkpoint-") and p[11:].isdigit() for p in parts[1:]):
        return ""
    return why


# A tar --exclude pattern for the same (GNU tar and busybox match it against every name component).
CHECKPOINT_EXCLUDE = "--exclude=checkpoint-[0-9]*"


def only_runtime_and_artifacts(parts: tuple[str, ...]) -> str | None:
    """What a collection takes of a workspace (a safetar ``keep``): runtime/ and artifacts/ only,
    and never the secrets file (skipped silently: it is not an artifact)."""
    if parts[0] not in ("runtime", "artifacts"):
        return "outside runtime/ and artifacts/"
    if parts[-1].endswith("secrets.env") or parts[-1] == ".secrets.env.tmp":
        return ""
    if parts[-1].endswith("storage.env") or parts[-1] == ".storage.env.tmp":  # the Storage's credentials
        return ""
    return None


class Transport(Protocol):
    machine: MachineInfo
    round_trips: int

    def workspace(self, identity: str) -> str: ...

    def sh(self, script: str, timeout: float = 60.0) -> Completed: ...

    def agent(self, args: dict) -> dict: ...

    def stage(self, bundle: Path, identity: str, spec_digest: str) -> str: ...

    def put_secret_file(self, workspace: str, content: bytes, name: str = "secrets.env") -> None: ...

    def fetch(self, identity: str, dest: Path, limits: safetar.Limits = ...,
              without_checkpoints: bool = False) -> safetar.Result:
        """runtime/ and artifacts/ into ``dest`` as plain files and folders; a safetar.Result."""
        ...

    def close(self) -> None: ...


@dataclass
class LaunchSpec:
    identity: str
    run_name: str
    workspace: str
    launch_mode: str
    image: str | None = None
    network: str = "none"
    pull: bool = False
    gpus: list[int] = field(default_factory=list)
    secrets: dict[str, str] = field(default_factory=dict)
    spec_digest: str = ""  # the workspace must have been built for this spec to be started or adopted
    slurm: "SlurmJob | None" = None  # slurm placement: what sbatch asks for
    env: dict[str, str] = field(default_factory=dict)  # plain, launch-time environment (a node's rank and rendezvous)
    # The run's Storage as RCLONE_CONFIG_STORE_* (credentials included): runtime/storage.env, written
    # as the secrets are (0600, never in the bundle), read once and deleted by the launch wrapper.
    storage_env: dict[str, str] = field(default_factory=dict)
    # docker: (machine path, container path) mounted read-only, a previous attempt's checkpoint
    mounts: list[tuple[str, str]] = field(default_factory=list)


# What a job takes from the submitting environment: the base names of procenv (and Slurm's own
# SLURM_*), never ALL. slurmctld saves a job's environment with its state, and sbatch's
# environment is the reconciler's; the run's secrets reach the job in runtime/secrets.env (0600,
# delivered from the login host once the job starts, read once and deleted by the launch wrapper),
# its plain variables in scripts/env.sh.
SLURM_EXPORT = "--export=" + ",".join(procenv.BASE)


# Slurm refuses a job name over 1024 characters ("Pathname of a file, directory or other parameter
# too long", measured with sbatch of Slurm 22.05 on this machine); ours stay far below: the prefix,
# a namespace of at most 40 characters and an identity of at most about 80.
SLURM_NAME_MAX = 1024
SLURM_NAME_PREFIX = "rcl-"


def slurm_job_name(workspace: str, identity: str) -> str:
    """The job's name on the cluster: the repository's namespace and the identity, so that two
    repositories with a run of one name never see each other's job. The namespace is the folder
    the workspace sits in (the pool puts every workspace at <root>/<namespace>/<identity>)."""
    namespace = posixpath.basename(posixpath.dirname(workspace.rstrip("/"))) or "default"
    name = f"{SLURM_NAME_PREFIX}{namespace}-{identity}"
    if len(name) > SLURM_NAME_MAX:
        raise ValueError(f"Slurm job name over {SLURM_NAME_MAX} characters: {name[:80]}...")
    return name


@dataclass
class SlurmJob:
    """One run's request to a Slurm cluster: the template's settings and the run's resources, the
    run's own time limit, account, QOS and warning signal over the template's."""

    env: dict[str, str] = field(default_factory=dict)
    partition: str | None = None
    time_limit: str | None = None
    gres: str = "gpu"
    sbatch_args: list[str] = field(default_factory=list)
    nodes: int = 1
    gpus_per_node: int = 0
    cpus_per_node: int | None = None
    memory_gb: float | None = None
    account: str | None = None
    qos: str | None = None
    signal: str | None = None  # "USR1@300": sbatch --signal=B:USR1@300 (the wrapper forwards it)

    def sbatch_argv(self, name: str, identity: str, workspace: str) -> list[str]:
        # --no-requeue (man sbatch: "never be requeued under any circumstances"): a preempted or
        # node-failed job ends as PREEMPTED or NODE_FAIL and the reconciler runs it again as a new
        # attempt, with a fresh workspace and its secrets delivered again; a job requeued by Slurm
        # would start over in a workspace whose result and secrets are already spent.
        argv = ["sbatch", "--parsable", f"--job-name={name}", f"--chdir={workspace}",
                "--output=runtime/slurm-%j.out", "--no-requeue", f"--nodes={self.nodes}", "--ntasks-per-node=1",
                SLURM_EXPORT]
        for flag, value in (("partition", self.partition), ("time", self.time_limit), ("account", self.account),
                            ("qos", self.qos)):
            if value:
                argv.append(f"--{flag}={value}")
        if self.signal:
            # B: only the batch shell (the wrapper) gets it; it forwards it to the job's processes.
            argv.append(f"--signal=B:{self.signal}")
        if self.gpus_per_node:
            argv.append(f"--gres={self.gres}:{self.gpus_per_node}")
        if self.cpus_per_node:
            argv.append(f"--cpus-per-task={self.cpus_per_node}")
        if self.memory_gb:
            argv.append(f"--mem={max(1, int(self.memory_gb * 1024))}M")
        return argv + list(self.sbatch_args) + ["--wrap", f"exec sh scripts/launch.sh {identity}"]


@dataclass
class LaunchResult:
    identity: str
    workspace: str
    adopted: bool = False
    pid: int | None = None
    container: str | None = None
    job: str | None = None  # a cluster's job id (slurm placement)


def secrets_file(secrets: dict[str, str]) -> bytes:
    """Shell-sourceable ``export NAME='value'`` lines, read once by the wrapper and deleted."""
    return env_lines(secrets).encode()


def launch_env_lines(env: dict[str, str]) -> str:
    """Shell lines, run in a workspace before it starts: write runtime/launch.env, which the launch
    wrapper reads after scripts/env.sh (what only the launch can know, such as a node's rank)."""
    return f"printf '%s' {shlex.quote(env_lines(env))} > runtime/launch.env\n" if env else ""


def built_for_check(spec_digest: str) -> str:
    """Shell lines, run in a workspace: exit 96 unless its job.json was built for ``spec_digest``.
    job.json is written with sorted keys and two-space indents, so the line is exact."""
    if not spec_digest:
        return ":\n"
    line = shlex.quote(f'"spec_digest": "{spec_digest}"')
    return f"grep -qF {line} job.json 2>/dev/null || {{ echo 'built for another spec' >&2; exit 96; }}\n"


WRONG_SPEC = 96  # built_for_check's exit code


def docker_prefix(machine: MachineInfo) -> str:
    return f"DOCKER_HOST={shlex.quote(machine.docker_host)} " if machine.docker_host else ""


def docker_export(machine: MachineInfo) -> str:
    """``docker_prefix`` for a compound command: the variable exported for all of it."""
    return f"export DOCKER_HOST={shlex.quote(machine.docker_host)}; " if machine.docker_host else ""
