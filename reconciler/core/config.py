"""The reconciler's own configuration: defaults, then a file, then the environment, then flags.

The file is YAML (``--config PATH``, else ``reconciler.yaml`` beside the repository's .git, if
any); environment variables are ``RECONCILER_<KEY>`` (upper case). Secrets (the webhook secret)
come only from the environment or a file outside the repository, and ``reconcile config`` prints
them redacted.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from . import configcache
from .errors import UsageError

REDACT = configcache.REDACT
NAMESPACE_PATTERN = r"^[a-z0-9]+(-[a-z0-9]+)*$"  # offers.NAMESPACE: "--" never inside


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")

    repo: Path = Field(default_factory=Path.cwd)
    # Where this machine keeps run workspaces (the local execution plane). A sub-folder per
    # repository keeps two repositories' runs apart on a shared machine.
    workspace_root: str = "~/.reconciler/workspaces"
    # The prefix of this repository's rental names (``offers.rental_name``): lowercase letters,
    # digits and single hyphens inside, because the double hyphen ends it in a name and providers
    # accept no other characters. A namespace outside that could never be read back from a name.
    namespace: str | None = Field(None, pattern=NAMESPACE_PATTERN, max_length=40)
    commit: bool = True
    push: bool = True
    remote: str = "origin"
    branch: str | None = None
    author_name: str = "reconciler"
    author_email: str = "reconciler@localhost"
    unreachable_grace: float = 300.0
    # A live instance named like ours whose run the repository does not know at all (no spec, no
    # status) is stopped only once it has run this long: a checkout behind the one that launched
    # it must not kill it on sight.
    orphan_grace: float = 300.0
    terminate_grace: float = 10.0
    # A launch is refused on its machine once the machine's clock is past the reconciler's clock
    # at issue plus this (so one left in flight by a killed reconciler lands within it, or never);
    # a reconciler that cannot tell what its predecessor left in flight holds new identities for
    # it plus the margin. The margin is the clock skew tolerated between this host and machines.
    launch_ttl: float = Field(20.0, gt=0)
    launch_clock_margin: float = Field(5.0, ge=0)
    # A node of a run on several machines whose launch wrapper has not beaten for this long is
    # frozen: the attempt is ended on every node (the wrapper beats every 2 s).
    gang_heartbeat_timeout: float = Field(30.0, gt=0)
    ssh_connect_timeout: float = 5.0
    ssh_command_timeout: float = 60.0
    # A machine's probe (every pass) must answer within this, else the machine is unreachable for
    # the pass: a machine that never answers cannot hold every pass for the command timeout. Keep
    # it above the probe's own 15 s limit on docker and squeue (runtime/readings.py TOOL_TIMEOUT).
    ssh_probe_timeout: float = Field(30.0, gt=0)
    # The most a machine's answer read into memory (a probe reply) may hold; a larger one fails
    # that call. 1,000 runs on a machine answer in about 1 MB.
    ssh_max_reply_bytes: int = Field(16 << 20, ge=64 << 10)
    # The reply bytes decoded at once across all machines (each decodes to up to ~8x its size):
    # a reply waits for room before it is decoded; one larger than this fails its machine.
    ssh_decode_budget_bytes: int = Field(128 << 20, ge=1 << 20)
    # A fresh rental's sshd may start after its provider says it runs: how long a launch waits for
    # it before leaving the run for the next pass.
    ssh_ready_timeout: float = 20.0
    # Checkpoints copied off rentals while runs train: at most this many MB/s (None: no limit).
    checkpoint_copy_mbps: float | None = Field(100.0, gt=0)
    # What one collection (runtime/ and artifacts/ of an attempt) or checkpoint copy may bring to
    # this host: the files that fit are kept and the rest is listed as left out (a machine is
    # untrusted: it must not fill this host's disk). Sized for real checkpoints while they are
    # copied through this host rather than to object storage.
    collect_max_bytes: int = Field(20 << 30, gt=0)
    collect_max_files: int = Field(100_000, gt=0)
    parallel_machines: int = 16
    parallel_changes: int = 8
    local_max_tasks: int | None = None
    local_gpus: int | None = None  # None: count with NVML when available
    docker_host: str | None = None
    remote_cleanup: Literal["after_collect", "never"] = "after_collect"
    ledger: bool = True  # status/README.md and status/<run>.svg, committed with the status files
    poll_interval: float = 15.0
    resync_interval: float = 30.0
    # A change of progress alone (step, loss, the curve, cost so far) is written, and so committed, at
    # most once in this many seconds; transitions always at once. 0: every pass.
    status_progress_interval: float = Field(600.0, ge=0)
    # A spec file with uncommitted changes is not launched (its status could not name the commit it
    # ran); true launches it and records ``spec.dirty``. Only a git checkout is checked.
    allow_dirty: bool = False
    debounce: float = 0.2
    listen: str | None = None  # HOST:PORT for /healthz, /metrics and /hooks/git
    dashboard_listen: str | None = None  # HOST:PORT for the read-only live page (off when unset)
    webhook_secret: str | None = None
    log_format: Literal["text", "json"] = "text"
    push_retries: int = 5
    # /healthz: unhealthy after this many fetches, pushes or passes failed in a row (one blip of
    # the network is not an outage; three polls are), or when the last good pass is older than
    # health_max_pass_age seconds (None: max(60, 3 x resync_interval), plus the last pass's duration).
    health_max_failures: int = Field(3, ge=1)
    health_max_pass_age: float | None = Field(None, gt=0)
    _namespace: str | None = PrivateAttr(default=None)

    def redacted(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        for k in REDACT:
            if data.get(k):
                data[k] = "***"
        return data

    @property
    def repo_namespace(self) -> str:
        """A stable id for the repository: its origin URL's hash, else its path's."""
        if self.namespace:
            return self.namespace
        if self._namespace is None:  # one git call per process, not per machine and pass
            self._namespace = configcache.derived_namespace(self.repo, self.remote)
        return self._namespace

    @property
    def local_root(self) -> str:
        return os.path.join(os.path.expanduser(self.workspace_root), self.repo_namespace)

    @property
    def state_dir(self) -> Path:
        return self.repo / ".reconciler"


def _coerce(field: str, raw: str) -> Any:
    if Config.model_fields[field].annotation is bool:
        return raw.lower() in ("1", "true", "yes", "on")
    return raw


def load(repo: str | None = None, path: str | None = None, flags: dict[str, Any] | None = None) -> Config:
    repo_path = Path(repo or ".").resolve()
    data: dict[str, Any] = {}
    file_path = Path(path) if path else repo_path / "reconciler.yaml"
    if path and not file_path.is_file():
        raise UsageError(f"{file_path}: no such configuration file")
    if file_path.is_file():
        from . import yamlsafe

        try:
            loaded = yamlsafe.located_load(yamlsafe.decode(file_path.read_bytes())).data
        except OSError as e:
            raise UsageError(f"{file_path}: cannot read: {e.strerror or e}") from None
        except yamlsafe.YamlProblem as p:
            raise UsageError(f"{file_path}:{p.line}:{p.col}: {p.message}") from None
        if not isinstance(loaded, dict):
            raise UsageError(f"{file_path}:1:1: expected a mapping of settings")
        data.update(loaded)
    for field in Config.model_fields:
        env = os.environ.get(f"RECONCILER_{field.upper()}")
        if env is not None and field != "repo":
            data[field] = _coerce(field, env)
    for k, v in (flags or {}).items():
        if v is not None:
            data[k] = v
    data["repo"] = repo_path
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        if first["type"] == "extra_forbidden":
            import difflib

            close = difflib.get_close_matches(where, list(Config.model_fields), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise UsageError(f"configuration: unknown setting '{where}'{hint}") from None
        if where == "namespace":
            raise UsageError(f"configuration: namespace {data.get('namespace')!r}: expected at most 40 lowercase "
                             "letters, digits and single hyphens inside (a-z, 0-9, '-'), as rental names "
                             "need") from None
        raise UsageError(f"configuration: {where}: {first['msg']}") from None
