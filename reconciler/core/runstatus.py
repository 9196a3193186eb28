"""A run's status as a value: the model every layer reads, and the clock it is written in.

The files that hold it (their order, their escaping, reading them back) live in ``reconciler.status``;
the planner, the page and the providers need only the value, so it lives here, below all of them.
Lenient on read: unknown keys from a newer reconciler are ignored.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

HISTORY_LIMIT = 20
PHASES = ("Pending", "Provisioning", "Starting", "Running", "Succeeded", "Failed", "Terminated", "Invalid", "Unknown")
TERMINAL = ("Succeeded", "Failed", "Terminated")


class Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class SpecRef(Lenient):
    digest: str | None = None
    commit: str | None = None
    path: str | None = None
    dirty: bool | None = None  # launched from uncommitted content (allow_dirty): no commit holds it


# What the loop passes as a spec's commit when the file launched had uncommitted changes.
DIRTY = "dirty"


class Handle(Lenient):
    backend: str | None = None
    machine: str | None = None
    identity: str | None = None
    workspace: str | None = None
    pid: int | None = None
    container: str | None = None
    job: str | None = None  # the Slurm job id (slurm placement)
    # A run on several machines: each node's machine, identity and workspace, by rank (machine,
    # identity and workspace above are the attempt's and node 0's).
    nodes: list[dict[str, Any]] | None = None
    gpus: list[int] = Field(default_factory=list)
    launched_at: str | None = None
    # A rented machine: {provider, id, name, offer, price_per_hour, host_key, host, port, user,
    # identity_file, workspace_root}. The host key is pinned here on first contact, so a later
    # connection to another key is refused; the endpoint lets the run be followed while the
    # provider's API is down.
    rental: dict[str, Any] | None = None


class Condition(Lenient):
    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str = ""
    message: str = ""
    last_transition: str = ""


class Transition(Lenient):
    time: str
    phase: str
    generation: int = 0
    attempt: int = 0
    reason: str = ""


class RunStatus(Lenient):
    name: str
    phase: str = "Pending"
    generation: int = 0
    attempt: int = 0
    spec: SpecRef = Field(default_factory=SpecRef)
    handle: Handle | None = None
    # What the run's machine costs, for rented machines: {price_per_hour, so_far} (currency of the
    # provider's prices). Shown by the ledger and the live page when present.
    cost: dict[str, Any] | None = None
    # The last placement decision: {action, code, considered: ["<machine or offer>: <verdict>", ...]}
    # (`reconcile explain NAME` shows it with the decision a pass would take now).
    placement: dict[str, Any] | None = None
    exit_code: int | None = None
    message: str = ""
    preemptions: int | None = None  # times it was stopped for a run of higher priority (not counted as retries)
    # Machines this generation may not use, after a permanent end that was the machine's:
    # [{machine, reason, attempt}] (planner/ruled_out.py reads it leniently; a new generation has none).
    ruled_out: list[Any] | None = None
    retry_at: str | None = None
    conditions: list[Condition] = Field(default_factory=list)
    history: list[Transition] = Field(default_factory=list)
    artifacts: list[dict[str, Any]] = Field(default_factory=list)
    progress: dict[str, Any] | None = None
    # [[step, loss], ...] of the current generation, at most CURVE_POINTS (thinned evenly when full):
    # the ledger's sparkline and status/<run>.svg are drawn from it.
    loss_curve: list[tuple[int, float]] = Field(default_factory=list)
    provenance: dict[str, Any] | None = None
    # A run with a Storage: where its checkpoints and artifacts are (engine/outputs.py writes it).
    outputs: dict[str, Any] | None = None
    created_at: str | None = None  # when the reconciler first recorded the run (AGE counts from it)
    observed_at: str | None = None

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        try:
            return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None


def cost_so_far(st: RunStatus, now: float) -> float:
    """What the run's rentals cost until ``now``: the closed stretches and the open one."""
    cost = st.cost or {}
    total = float(cost.get("so_far") or 0.0)
    since = parse_iso(cost.get("since"))
    if since is not None:
        total += float(cost.get("price_per_hour") or 0.0) * max(0.0, now - since) / 3600.0
    return total
