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
RunState = Literal["running", "succeeded", "failed", "terminated", "lost"]


@dataclass
class ObservedRun:
    identity: str
    machine: str
    state: RunState
    exit_code: int | None = None
    finished_at: float | None = None  # unix time
    started_at: float | None = None
    heartbeat_age: float | None = None
    pid: int | None = None
    container: str | None = None
    workspace: str | None = None
    gpus: list[int] = field(default_factory=list)
    collected: bool = False
    message: str = ""
    progress: dict[str, Any] | None = None

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


@dataclass
class ObservedWorld:
    machines: dict[str, ObservedMachine] = field(default_factory=dict)
    at: float = 0.0

    def find(self, identity: str) -> ObservedRun | None:
        for m in self.machines.values():
            r = m.runs.get(identity)
            if r is not None:
                return r
        return None

    def instances(self, name: str) -> list[ObservedRun]:
        """Every observed instance of a run, any generation or attempt, on reachable machines."""
        out = []
        for m in self.machines.values():
            for ident, r in m.runs.items():
                p = parse(ident)
                if p is not None and p.name == name:
                    out.append(r)
        return sorted(out, key=lambda r: r.identity)

    def unreachable(self) -> dict[str, ObservedMachine]:
        return {n: m for n, m in self.machines.items() if not m.reachable}
