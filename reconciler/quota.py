"""Priorities and team quotas from the repository's Policy, for the planner. Pure.

A run's team is the value of its ``teamLabel`` label (``team`` by default); a team the Policy does
not list has no limit, and a run without the label belongs to no team. Usage counts what the
team's runs hold now: the GPUs of their live instances (a rental's GPUs are its offer's) and the
hourly price of the rentals they hold, plus what this plan places. A placement that would take a
team past ``maxGpus`` or ``maxPricePerHour`` waits with ``QuotaExceeded``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .identity import parse
from .observed import ObservedWorld
from .spec.load import DesiredState, RunEntry
from .status import RunStatus


def priority_of(desired: DesiredState, entry: RunEntry | None) -> tuple[int, str]:
    """(value, class name) of a run's priority: its class, else the Policy's default, else 0."""
    policy = desired.policy
    if policy is None:
        return 0, ""
    wanted = entry.run.spec.priority if entry is not None else None
    for c in policy.spec.priorityClasses:
        if (wanted is not None and c.name == wanted) or (wanted is None and c.default):
            return c.value, c.name
    return 0, ""


def placement_order(desired: DesiredState, names: list[str], previous: dict[str, RunStatus]) -> list[str]:
    """Higher priority first; with a Policy, first come first served within a priority (the time
    a run's status first recorded it); then by name. Deterministic."""
    def key(name: str):
        value, _ = priority_of(desired, desired.runs.get(name))
        prev = previous.get(name)
        since = prev.history[0].time if desired.policy is not None and prev is not None and prev.history else "~"
        return (-value, since, name)

    return sorted(names, key=key)


@dataclass
class Quotas:
    desired: DesiredState
    usage: dict[str, list[float]] = field(default_factory=dict)  # team → [gpus, price per hour]

    def team(self, name: str) -> str | None:
        entry = self.desired.runs.get(name)
        if entry is None or self.desired.policy is None:
            return None
        return entry.run.metadata.labels.get(self.desired.policy.spec.teamLabel)

    def limits(self, team: str | None):
        if team is None or self.desired.policy is None:
            return None
        return next((t for t in self.desired.policy.spec.teams if t.name == team), None)

    @classmethod
    def build(cls, desired: DesiredState, world: ObservedWorld, previous: dict[str, RunStatus]) -> "Quotas":
        q = cls(desired)
        if desired.policy is None or not desired.policy.spec.teams:
            return q
        for m in world.machines.values():
            for r in m.runs.values():
                p = parse(r.identity)
                if r.alive and p is not None:
                    rental = world.rentals.get(m.name)
                    gpus = len(r.gpus)
                    if rental is not None:
                        gpus = _offer_gpus(desired, rental.provider, rental.offer) or gpus
                    q.add(p.name, gpus, rental.price_per_hour or 0.0 if rental is not None else 0.0)
        for name, st in previous.items():  # a rental asked for and not yet used is held already
            r = (st.handle.rental or {}) if st.handle is not None else {}
            if st.phase == "Provisioning" and r.get("offer"):
                q.add(name, _offer_gpus(desired, r.get("provider"), r.get("offer")), r.get("price_per_hour") or 0.0)
        return q

    def add(self, name: str, gpus: float, price: float) -> None:
        team = self.team(name)
        if team is None:
            return
        u = self.usage.setdefault(team, [0.0, 0.0])
        u[0] += gpus
        u[1] += price

    def exceeded(self, name: str, gpus: float, price: float = 0.0) -> str | None:
        team = self.team(name)
        lim = self.limits(team)
        if lim is None:
            return None
        used = self.usage.get(team, [0.0, 0.0])
        if lim.maxGpus is not None and gpus and used[0] + gpus > lim.maxGpus:
            return f"team {team} holds {used[0]:g} of its maxGpus {lim.maxGpus} GPUs; this run needs {gpus:g} more"
        if lim.maxPricePerHour is not None and price and used[1] + price > lim.maxPricePerHour + 1e-9:
            return (f"team {team} rents {used[1]:g}/h of its maxPricePerHour {lim.maxPricePerHour:g}; this run's "
                    f"offer adds {price:g}/h")
        return None


def _offer_gpus(desired: DesiredState, provider: str | None, offer: str | None) -> int:
    p = desired.providers.get(provider or "")
    o = next((x for x in p.spec.offers if x.id == offer), None) if p is not None else None
    return o.gpu_count if o is not None else 0
