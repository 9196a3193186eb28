"""Observed state: what the machines say, as plain values the planner can read.

These types are filled by ``engine/observe.py`` from each machine's probe and read by the planner; they
import nothing that touches the network, git or processes, so plans can be computed and tested
from fixtures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .identity import node_of, parse, split

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
    curve: list[tuple[int, float]] = field(default_factory=list)  # (step, loss) of the last logged steps, oldest first
    permanent: bool = False  # the run itself says retrying cannot help (e.g. its precheck refused it)
    scope: str | None = None  # "machine": permanent on this machine only, another may take the run
    spec_digest: str | None = None  # the spec the workspace was built for (its job.json); None: unreadable
    checkpoints: list[str] = field(default_factory=list)  # complete ones, workspace-relative, oldest first
    queued: str | None = None  # a cluster's scheduler holds it, not started yet: why (Slurm's reason)
    job: str | None = None  # the cluster's job id (slurm placement)
    slurm_end: dict[str, Any] | None = None  # how Slurm ended the job: core/slurm_end.py's SlurmEnd.record()
    heartbeat_age: float | None = None  # seconds since the launch wrapper last beat
    # One node of a run on several machines (its job.json): {rank, of, machines}, the machine of each rank.
    gang: dict[str, Any] | None = None
    # A run on several machines, as one instance (ObservedWorld folds its nodes): the nodes seen,
    # and the machines of the nodes not seen because their machine does not answer.
    nodes: list["ObservedRun"] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)
    # Processes carrying its identity in their environment, in any session: after its result was
    # written (a worker that left the wrapper's group outlives it) the attempt still lives.
    live: int = 0
    # runtime/uploads.json of a run with a Storage (core/uploads.py): its shape checked here, its
    # URIs held to the run's folder once the engine knows it; or why it was refused.
    uploads: dict[str, Any] | None = None
    uploads_error: str | None = None
    outputs: dict[str, Any] | None = None  # the status's outputs, from uploads (engine/outputs.py)

    def built_for(self, digest: str) -> bool:
        """Whether this instance runs the spec with ``digest``: the one condition for adopting it."""
        return self.spec_digest == digest

    @property
    def alive(self) -> bool:
        return self.state == "running"

    @property
    def lingering(self) -> bool:
        """Ended by its state (its end is what the run records), yet processes of it still live:
        to be stopped before anything replaces it (planner/fence.py)."""
        return self.live > 0 and self.state != "running"


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
    # With foreign_gpus: avoid, why the GPUs' processes are unknown this pass: none of its GPUs is free.
    gpu_error: str | None = None
    # What its probe said that the trust boundary refused (a run it does not host, a malformed
    # field), one reason each: the rest of its report still counts.
    rejected: list[str] = field(default_factory=list)
    # Its runs were reported as in its reply to the observation before, heartbeat ages and live
    # counts aside (core/parse_reuse.py); engine/steady.py reads it.
    same_runs: bool = False


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
    # "<machine> <identity>" → when a pass first saw that live instance, for the ones without a
    # start time of their own (engine/lookalikes.py): their orphan_grace counts from then.
    first_seen: dict[str, float] = field(default_factory=dict)
    _by_name: dict[str, list[ObservedRun]] | None = field(default=None, repr=False, compare=False)
    _by_identity: dict[str, ObservedRun] | None = field(default=None, repr=False, compare=False)
    _has_nodes: bool = field(default=False, repr=False, compare=False)

    def _index(self) -> None:
        # Built once, on first lookup, after observation has filled the machines: planning
        # thousands of runs must not scan every machine for every run.
        by_name: dict[str, list[ObservedRun]] = {}
        by_identity: dict[str, ObservedRun] = {}
        gangs: dict[str, list[ObservedRun]] = {}
        for m in self.machines.values():
            for ident, r in m.runs.items():
                by_identity.setdefault(ident, r)
                p, node = split(ident)
                if p is None:
                    continue
                if node is not None:
                    gangs.setdefault(str(p), []).append(r)
                else:
                    by_name.setdefault(p.name, []).append(r)
        self._has_nodes = bool(gangs)
        for base, parts in gangs.items():
            gang = fold_gang(base, parts, self.machines)
            by_identity[base] = gang
            by_name.setdefault(parse(base).name, []).append(gang)
        for runs in by_name.values():
            if len(runs) > 1:  # most runs have one instance: nothing to order
                runs.sort(key=lambda r: r.identity)
        self._by_name, self._by_identity = by_name, by_identity

    def find(self, identity: str) -> ObservedRun | None:
        if self._by_identity is None:
            self._index()
        return self._by_identity.get(identity)

    def names(self):
        """The runs with an instance in sight (those ``instances`` finds something for), as a
        set-like view: asked for every run of a plan, answered by the index."""
        if self._by_name is None:
            self._index()
        return self._by_name.keys()

    def has_nodes(self) -> bool:
        """Whether any instance in sight is a node of a run on several machines."""
        if self._by_name is None:
            self._index()
        return self._has_nodes

    def only_instance(self, name: str) -> ObservedRun | None:
        """The run's instance when it has exactly one in sight (the common case: asked for every
        running run of every plan, without the copy ``instances`` makes); else None."""
        if self._by_name is None:
            self._index()
        found = self._by_name.get(name)
        return found[0] if found is not None and len(found) == 1 else None

    def instances(self, name: str) -> list[ObservedRun]:
        """Every observed instance of a run, any generation or attempt."""
        if self._by_name is None:
            self._index()
        return list(self._by_name.get(name, ()))


def fold_gang(identity: str, parts: list[ObservedRun], machines: dict[str, ObservedMachine]) -> ObservedRun:
    """The nodes of a run on several machines, as the one instance the planner reasons about.

    The attempt lives only while every node does: one failed, lost or stopped node ends it (the
    planner then stops the others and relaunches the whole run). A node not seen at all is lost
    when its machine answers, and waited for while its machine does not (``unreachable``: the
    planner gives it the unreachable grace of any machine). A node that has finished while others
    still run is normal (rank 0 often ends last)."""
    parts = sorted(parts, key=lambda r: node_of(r.identity) or 0)
    lead = parts[0]
    size = max([int((r.gang or {}).get("of") or 0) for r in parts] + [len(parts)])
    layout = list((lead.gang or {}).get("machines") or [])
    seen = {node_of(r.identity) for r in parts}
    missing = [k for k in range(size) if k not in seen]
    unreachable = [layout[k] for k in missing if k < len(layout) and layout[k] in machines
                   and not machines[layout[k]].reachable]
    gone = [k for k in missing if not (k < len(layout) and layout[k] in unreachable)]
    gang = ObservedRun(identity=identity, machine=lead.machine, state="running", workspace=lead.workspace,
                       gpus=list(lead.gpus), collected=all(r.collected for r in parts), spec_digest=lead.spec_digest,
                       started_at=min((r.started_at for r in parts if r.started_at), default=None),
                       progress=lead.progress, curve=list(lead.curve), checkpoints=list(lead.checkpoints), pid=lead.pid,
                       heartbeat_age=lead.heartbeat_age, gang=lead.gang, nodes=parts, unreachable=unreachable,
                       live=sum(r.live for r in parts))

    def where(r: ObservedRun) -> str:
        return f"node n{node_of(r.identity)} on {r.machine}"

    failed = [r for r in parts if r.state == "failed"]
    lost = [r for r in parts if r.state == "lost"]
    stopped = [r for r in parts if r.state == "terminated"]
    staged = [r for r in parts if r.state == "staged"]
    if failed:
        r = failed[0]
        gang.state, gang.exit_code, gang.permanent = "failed", r.exit_code, r.permanent
        gang.scope = r.scope
        gang.message = f"{where(r)} failed (exit {r.exit_code})" + (f": {r.message}" if r.message else "")
    elif lost:
        gang.state = "lost"
        gang.message = f"{where(lost[0])} is lost" + (f" ({lost[0].message})" if lost[0].message else "")
    elif gone:
        k = gone[0]
        gang.state = "lost"
        gang.message = f"the workspace of node n{k} is gone" + (f" from {layout[k]}" if k < len(layout) else "")
    elif stopped:
        gang.state, gang.exit_code = "terminated", stopped[0].exit_code
        gang.message = f"{where(stopped[0])} was stopped"
    elif any(r.state == "unknown" for r in parts):
        r = next(r for r in parts if r.state == "unknown")
        gang.state, gang.message = "unknown", f"{where(r)}: {r.message or 'cannot tell'}"
    elif staged and len(staged) == len(parts) and not missing:
        gang.state = "staged"
    elif staged:
        gang.state = "lost"
        gang.message = f"{where(staged[0])} was never started while other nodes ran"
    elif all(r.state == "succeeded" for r in parts) and not missing:
        gang.state, gang.exit_code = "succeeded", 0
    if gang.state in ("succeeded", "failed", "terminated"):
        gang.finished_at = max((r.finished_at for r in parts if r.finished_at), default=None)
    return gang
