"""Observed state: what the machines say, as plain values the planner can read.

These types are filled by ``observe.py`` from each machine's probe and read by ``plan.py``; they
import nothing that touches the network, git or processes, so plans can be computed and tested
from fixtures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .identity import parse

# running: the process (or container) lives. succeeded/failed: result.json says so.
# terminated: the wrapper recorded a SIGTERM. lost: no result and nothing alive.
# staged: the bundle is there but was never started (nothing ran, nothing was lost).
# unknown: the machine answered but could not say (docker did not answer): neither alive nor dead.
RunState = Literal["running", "succeeded", "failed", "terminated", "lost", "staged", "unknown"]


@dataclass
class ObservedRun:
    identity: str
    machine: str
    state: RunState
    exit_code: int | None = None
    finished_at: float | None = None  # unix time
    started_at: float | None = None
    pid: int | None = None
    container: str | None = None
    workspace: str | None = None
    gpus: list[int] = field(default_factory=list)
    collected: bool = False
    message: str = ""
    progress: dict[str, Any] | None = None
    permanent: bool = False  # the run itself says retrying cannot help (e.g. its precheck refused it)
    spec_digest: str | None = None  # the spec the workspace was built for (its job.json); None: unreadable
    checkpoints: list[str] = field(default_factory=list)  # complete ones, workspace-relative, oldest first
    queued: str | None = None  # a cluster's scheduler holds it, not started yet: why (Slurm's reason)
    job: str | None = None  # the cluster's job id (slurm placement)

    def built_for(self, digest: str) -> bool:
        """Whether this instance runs the spec with ``digest``: the one condition for adopting it."""
        return self.spec_digest == digest

    @property
    def alive(self) -> bool:
        return self.state == "running"


@dataclass
class ObservedMachine:
    name: str
    reachable: bool = True
    error: str = ""
    unreachable_since: float | None = None
    runs: dict[str, ObservedRun] = field(default_factory=dict)
    round_trips: int = 0
    draining: str | None = None  # the machine's own drain flag (`reconcile agent drain`): its reason
    foreign_gpus: list[int] = field(default_factory=list)  # GPUs held by processes the reconciler did not start


@dataclass
class ObservedRental:
    """A machine rented from a provider under one of this repository's rental names."""

    machine: str  # "<provider>/<rental id>": the machine name runs and statuses use
    provider: str
    id: str
    name: str
    state: str  # provisioning, running, failed, terminating, terminated
    identity: str  # the run identity it was provisioned for (from its name)
    n: int = 1  # which of that identity's rentals it is
    host: str | None = None
    port: int | None = None
    user: str | None = None
    price_per_hour: float | None = None
    created_at: float | None = None
    offer: str | None = None
    message: str = ""
    workspace_root: str | None = None
    host_key: str | None = None


@dataclass
class ObservedWorld:
    machines: dict[str, ObservedMachine] = field(default_factory=dict)
    at: float = 0.0
    rentals: dict[str, ObservedRental] = field(default_factory=dict)  # machine name → this repository's rentals
    provider_errors: dict[str, str] = field(default_factory=dict)  # provider → why its inventory is unknown
    # Checkpoints already copied to the reconciler host: (run name, generation) → checkpoint names.
    saved_checkpoints: dict[tuple[str, int], set[str]] = field(default_factory=dict)
    _by_name: dict[str, list[ObservedRun]] | None = field(default=None, repr=False, compare=False)
    _by_identity: dict[str, ObservedRun] | None = field(default=None, repr=False, compare=False)

    def _index(self) -> None:
        # Built once, on first lookup, after observation has filled the machines: planning
        # thousands of runs must not scan every machine for every run.
        by_name: dict[str, list[ObservedRun]] = {}
        by_identity: dict[str, ObservedRun] = {}
        for m in self.machines.values():
            for ident, r in m.runs.items():
                by_identity.setdefault(ident, r)
                p = parse(ident)
                if p is not None:
                    by_name.setdefault(p.name, []).append(r)
        for runs in by_name.values():
            runs.sort(key=lambda r: r.identity)
        self._by_name, self._by_identity = by_name, by_identity

    def find(self, identity: str) -> ObservedRun | None:
        if self._by_identity is None:
            self._index()
        return self._by_identity.get(identity)

    def instances(self, name: str) -> list[ObservedRun]:
        """Every observed instance of a run, any generation or attempt."""
        if self._by_name is None:
            self._index()
        return list(self._by_name.get(name, ()))
