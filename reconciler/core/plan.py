"""A plan as a value: the changes one pass would make, and the settings it is computed with.

The planner computes plans; the engine applies them, the status files record them, the command line
and the live page show them. Those read a plan without needing the planner's logic, so the value
lives here, below all of them (the text and JSON rendering are the planner's: planner/render.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from reconciler.core.actions import Action

MUTATING = frozenset({Action.LAUNCH, Action.RELAUNCH, Action.TERMINATE, Action.COLLECT, Action.PROVISION,
                      Action.RELEASE, Action.SAVE})


@dataclass(slots=True)
class Kill:
    machine: str
    identity: str
    workspace: str | None = None
    grace: float | None = None  # seconds from SIGTERM to SIGKILL (None: the configuration's terminate_grace)


@dataclass(slots=True)
class Node:
    """One node of a run on several machines."""

    machine: str
    identity: str
    workspace: str | None = None
    gpus: list[int] = field(default_factory=list)


# Slots: a plan of 10,000 runs holds 10,000 changes and walks them several times; without a
# per-instance dict each is a third of the size, so those walks touch far less memory.
@dataclass(slots=True)
class Change:
    name: str
    action: Action
    code: str  # machine-readable reason: NewRun, SpecChanged, BackOff, NoCapacity, ...
    reason: str
    phase: str | None  # the phase after a successful apply; None leaves the status alone
    generation: int = 0
    attempt: int = 0
    identity: str | None = None
    machine: str | None = None
    backend: str | None = None
    workspace: str | None = None
    gpus: list[int] = field(default_factory=list)
    kill: list[Kill] = field(default_factory=list)
    retry_after: float | None = None
    exit_code: int | None = None
    spec_digest: str | None = None
    spec_path: str | None = None
    resume_from: str | None = None  # identity of the attempt whose checkpoints a relaunch resumes
    collect_first: Kill | None = None  # a finished attempt to collect before relaunching
    cleanup: list[Kill] = field(default_factory=list)  # earlier attempts' remote workspaces, at the end
    remove: bool = False  # collect: remove the workspace afterwards, on this machine too (a leftover)
    ran: bool = True  # collect of a leftover: False for a bundle never started (no logs to keep)
    stalled: str | None = None  # set when spec.stall is configured and the run made no progress (the why)
    # Rental placement: {provider, id, name, offer, price_per_hour} of the machine asked for, waited
    # for, launched on or released; a launch adds ``verify`` (the offer's GPUs, checked first).
    rental: dict | None = None
    checkpoint: str | None = None  # save: the workspace-relative checkpoint folder to copy off the machine
    considered: list[str] = field(default_factory=list)  # placement: every machine or offer judged, and why
    # A run on several machines: one entry per node, by rank (launch: where each starts and on
    # which GPUs; collect and collect_first's run: where each node's workspace is).
    nodes: list[Node] = field(default_factory=list)
    collect_nodes: list[Node] = field(default_factory=list)  # collect_first's nodes, for a run on several machines
    # The run's machines ruled out after this change (planner/ruled_out.py): the status's list; None: unchanged.
    ruled_out: list[dict] | None = None

    @property
    def mutates(self) -> bool:
        return self.action in MUTATING or bool(self.kill)


_blank = object.__new__


def bulk_change(name: str, action: Action, code: str, reason: str, phase: str | None, base: dict,
                identity: str | None, machine: str | None, backend: str | None, gpus: list[int],
                kill: list[Kill], retry_after: float | None, resume_from: str | None,
                considered: list[str]) -> Change:
    """``Change(name, action, code, reason, phase, identity=..., machine=..., backend=..., gpus=...,
    kill=..., retry_after=..., resume_from=..., considered=..., **base)``, the same value, built
    for the bulk of a queue (a launch placed, or a wait for room): positional, every other field
    set to its default directly. The generated ``__init__`` matches keywords against 29
    parameters and builds six default lists per call, several times this cost when a plan makes
    10,000 of them. ``base``: exactly generation, attempt, spec_digest and spec_path.
    tests/planner/test_bulk_change.py checks that the two agree on every field."""
    c = _blank(Change)
    c.name = name
    c.action = action
    c.code = code
    c.reason = reason
    c.phase = phase
    c.generation = base["generation"]
    c.attempt = base["attempt"]
    c.identity = identity
    c.machine = machine
    c.backend = backend
    c.workspace = None
    c.gpus = gpus
    c.kill = kill
    c.retry_after = retry_after
    c.exit_code = None
    c.spec_digest = base["spec_digest"]
    c.spec_path = base["spec_path"]
    c.resume_from = resume_from
    c.collect_first = None
    c.cleanup = []
    c.remove = False
    c.ran = True
    c.stalled = None
    c.rental = None
    c.checkpoint = None
    c.considered = considered
    c.nodes = []
    c.collect_nodes = []
    c.ruled_out = None
    return c


@dataclass
class Plan:
    changes: list[Change] = field(default_factory=list)
    at: float = 0.0
    warnings: list[str] = field(default_factory=list)  # what will block a run later (a missing secret)
    # Rentals named as this repository's that no run claims (machine → when the sweep gives them
    # back): `reconcile rentals` shows them as orphans, in their grace or past it.
    orphans: dict[str, float] = field(default_factory=dict)

    def for_run(self, name: str) -> Change | None:
        return next((c for c in self.changes if c.name == name and c.phase is not None), None)

    def summary(self) -> dict[Action, int]:
        out: dict[Action, int] = {}
        for c in self.changes:
            out[c.action] = out.get(c.action, 0) + 1
        return out

    def new_rentals(self) -> tuple[int, float]:
        """How many machines this plan rents, and what they cost per hour together."""
        asked = [c.rental for c in self.changes if c.action == Action.PROVISION and c.rental]
        return len(asked), sum(r.get("price_per_hour") or 0.0 for r in asked)

    def to_json(self) -> dict:
        return {"at": self.at, "summary": self.summary(), "changes": [asdict(c) for c in self.changes],
                "warnings": list(self.warnings)}


@dataclass
class PlanSettings:
    unreachable_grace: float = 300.0
    orphan_grace: float = 300.0  # a live instance of a run nobody knows is stopped after running this long
    local_max_tasks: int | None = None
    local_gpus: int = 0
    namespace: str = "repo"  # this repository's id: the prefix of its rentals' names
    bad_offers: dict = field(default_factory=dict)  # (provider, offer) → until when it is not rented
    # A node of a run on several machines whose wrapper has not beaten for this long is frozen:
    # the attempt ends on every node (torch itself would wait for its own, much longer, timeout).
    gang_heartbeat_timeout: float = 30.0
    spend: dict = field(default_factory=dict)  # provider → what the runs' rentals there cost so far
