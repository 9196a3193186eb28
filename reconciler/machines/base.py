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


def only_runtime_and_artifacts(parts: tuple[str, ...]) -> str | None:
    """What a collection takes of a workspace (a safetar ``keep``): runtime/ and artifacts/ only,
    and never the secrets file (skipped silently: it is not an artifact)."""
    if parts[0] not in ("runtime", "artifacts"):
        return "outside runtime/ and artifacts/"
    if parts[-1].endswith("secrets.env") or parts[-1] == ".secrets.env.tmp":
        return ""
    return None


class Transport(Protocol):
    machine: MachineInfo
    round_trips: int

    def workspace(self, identity: str) -> str: ...

    def sh(self, script: str, timeout: float = 60.0) -> Completed: ...

    def agent(self, args: dict) -> dict: ...

    def stage(self, bundle: Path, identity: str, spec_digest: str) -> str: ...

    def put_secret_file(self, workspace: str, content: bytes) -> None: ...

    def fetch(self, identity: str, dest: Path, limits: safetar.Limits = ...) -> safetar.Result:
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


# What a job takes from the submitting environment: the base names of procenv (and Slurm's own
# SLURM_*), never ALL. slurmctld saves a job's environment with its state, and sbatch's
# environment is the reconciler's; the run's secrets reach the job in runtime/secrets.env (0600,
# read once and deleted by the launch wrapper), its plain variables in scripts/env.sh.
SLURM_EXPORT = "--export=" + ",".join(procenv.BASE)


@dataclass
class SlurmJob:
    """One run's request to a Slurm cluster: the template's settings and the run's resources."""

    env: dict[str, str] = field(default_factory=dict)
    partition: str | None = None
    time_limit: str | None = None
    gres: str = "gpu"
    sbatch_args: list[str] = field(default_factory=list)
    nodes: int = 1
    gpus_per_node: int = 0
    cpus_per_node: int | None = None
    memory_gb: float | None = None

    def sbatch_argv(self, identity: str, workspace: str) -> list[str]:
        argv = ["sbatch", "--parsable", f"--job-name={identity}", f"--chdir={workspace}",
                "--output=runtime/slurm-%j.out", f"--nodes={self.nodes}", "--ntasks-per-node=1", SLURM_EXPORT]
        if self.partition:
            argv.append(f"--partition={self.partition}")
        if self.time_limit:
            argv.append(f"--time={self.time_limit}")
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
