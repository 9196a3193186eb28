"""Priorities and team quotas from the repository's Policy, for the planner. Pure.

A run's team is the value of its ``teamLabel`` label (``team`` by default); a team the Policy does
not list has no limit, and a run without the label belongs to no team. Usage counts what the
team's runs hold now: the GPUs of their live instances (a rental's GPUs are its offer's) and the
hourly price of the rentals they hold, plus what this plan places. A placement that would take a
team past ``maxGpus`` or ``maxPricePerHour`` waits with ``QuotaExceeded``.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from itertools import chain
from typing import Iterator

from reconciler.core.identity import parse
from reconciler.core.observed import ObservedWorld
from reconciler.spec.load import DesiredState, RunEntry
from reconciler.core.runstatus import RunStatus


def priority_of(desired: DesiredState, entry: RunEntry | None) -> tuple[int, str]:
    """(value, class name) of a run's priority: its class, else the Policy's default, else 0."""
    return class_of(desired, entry.run.spec.priority if entry is not None else None)


def class_of(desired: DesiredState, wanted: str | None) -> tuple[int, str]:
    """(value, class name) of priority class ``wanted`` (None: the Policy's default), else 0."""
    policy = desired.policy
    if policy is None:
        return 0, ""
    for c in policy.spec.priorityClasses:
        if (wanted is not None and c.name == wanted) or (wanted is None and c.default):
            return c.value, c.name
    return 0, ""


def placement_order(desired: DesiredState, names: list[str], previous: dict[str, RunStatus],
                    quotas: "Quotas | None" = None, reads: dict | None = None, groups: dict | None = None):
    """The order runs are placed in. Higher priority first. With a Policy, within one priority
    the team furthest below its share goes next (GPUs held / maxGpus, or / 1 for a team without
    one; fewest first, re-read after each placement), and a team's runs go first come first
    served (the time a run's status first recorded it); then by name. Without a Policy: by
    name. Deterministic: an iterator that reads ``quotas`` as placements update it. ``reads``:
    each run's priority class and team, read already (PlanBook.read_runs); ``groups``: the runs
    grouped as ``Groups`` groups them, by whoever read them (then ``names`` and ``reads`` are not
    read again)."""
    fair = desired.policy is not None and quotas is not None
    if groups is None:
        grouping = Groups(desired, quotas)
        runs, label, add = desired.runs, grouping.label, grouping.add
        reads = reads or {}
        for name in names:
            read = reads.get(name)
            if read is not None:
                add(name, read[0], read[1])
            else:  # the team read with the rest of the run: one visit of each spec, not two
                entry = runs.get(name)
                run = entry.run if entry is not None else None
                add(name, run.spec.priority if run is not None else None,
                    run.metadata.labels.get(label) if run is not None and label is not None else None)
        groups = grouping.groups
    # Chained rather than yielded from: each run passes through one generator, not two. A group's
    # fair order starts only when the chain reaches it, after the groups before have been placed.
    if not fair:
        return chain.from_iterable(sorted(groups[value]) for value in sorted(groups, reverse=True))
    # When each run's status first recorded it, for the fair order (a run without one counts as
    # "~": after every recorded run); only the runs with a status are listed.
    first = {name: prev.history[0].time if prev.history else "~" for name, prev in previous.items()}
    return chain.from_iterable(_fair_queues(groups[value], quotas, first) for value in sorted(groups, reverse=True))


class Groups:
    """The runs of one plan by priority value, then (with a Policy) by team: what the fair order
    takes them from. Runs are added in name order, so each list is by name already. Whoever reads
    the runs' specs fills it in the same pass (PlanBook.read_runs): one walk of 10,000 runs, not
    two."""

    __slots__ = ("desired", "fair", "label", "teams", "values", "groups", "by_class")

    def __init__(self, desired: DesiredState, quotas: "Quotas | None"):
        self.desired = desired
        self.fair = desired.policy is not None and quotas is not None
        self.label = desired.policy.spec.teamLabel if self.fair else None
        self.teams = quotas._teams if self.fair else {}  # as quotas.known(name, team) would set, without the call
        self.values: dict = {}  # priority class asked for → its value: a few classes, thousands of runs
        # priority value → (with a Policy) team → its runs, or (without) the runs
        self.groups: dict = {}
        self.by_class: dict = {}  # priority class asked for → team → the list its runs go to

    def add(self, name: str, wanted: str | None, team: str | None) -> None:
        by_team = self.by_class.get(wanted)
        queue = by_team.get(team) if by_team is not None else None
        if queue is None:
            queue = self.queue(wanted, team)
        if self.fair:
            self.teams[name] = team
        queue.append(name)

    def queue(self, wanted: str | None, team: str | None) -> list[str]:
        """The list the runs of class ``wanted`` and ``team`` go to (kept in ``by_class``, which
        ``add`` reads first)."""
        value = self.values.get(wanted)
        if value is None:
            value = self.values[wanted] = class_of(self.desired, wanted)[0]
        group = self.groups.get(value)
        if group is None:
            group = self.groups[value] = {} if self.fair else []
        if self.fair:
            queue = group.get(team or "")  # "": the runs without a team, together
            if queue is None:
                queue = group[team or ""] = []
        else:
            queue = group
        self.by_class.setdefault(wanted, {})[team] = queue
        return queue


def _fair_queues(queues: dict[str, list[str]], quotas: "Quotas", known: dict[str, str]) -> Iterator[str]:
    """One priority's runs, by team (``queues``: each team's runs, in any order), the
    team furthest below its share next: a heap of the teams by (share used, their next run's
    time, name). A team's key changes only when its usage grows or its next run goes, so only
    those teams are keyed again (marked in ``quotas.changed``); the entries keyed before are
    skipped when they come up, so the choice is the minimum over every team's current key, as a
    scan of all of them would find. ``known``: when the status of each run that has one first
    recorded it (the others count as "~"); a team's runs go by that time, then by name."""
    since = known.get
    for queue in queues.values():
        queue.sort()  # by name (linear on runs in name order already)
        if known and any(name in known for name in queue):
            queue.sort(key=lambda name: since(name, "~"))  # stable: by first record, then by name
        queue.reverse()  # each team's next run last: taken with pop()
    keys: dict[str, tuple] = {}
    heap: list[tuple] = []
    weight = {team: quotas.weight(team) for team in queues}  # the Policy is fixed: its shares too
    usage, none = quotas.usage, (0.0, 0.0)

    def rekey(team: str) -> None:  # the key share_used() gives, without its look-ups
        key = keys[team] = (usage.get(team, none)[0] / weight[team], since(queues[team][-1], "~"), team)
        heapq.heappush(heap, key)

    for team in queues:
        rekey(team)
    quotas.changed.clear()
    held = None  # the last team's new key, not pushed: a waiting queue keeps one team first for long
    changed, push, pop = quotas.changed, heapq.heappush, heapq.heappop
    while queues:  # every team still queued has its current key in the heap (or held), once changes are keyed
        if changed:
            for team in changed:
                if team in queues:
                    rekey(team)
            changed.clear()
        if held is not None and keys.get(held[2]) is held and (not heap or held <= heap[0]):
            key = held  # what pushing it and popping the least would give
        else:
            if held is not None:
                push(heap, held)
            key = pop(heap)
        held = None
        team = key[2]
        if keys.get(team) != key:
            continue  # keyed again since, or done
        queue = queues[team]
        while True:
            yield queue.pop()
            if not queue:
                del queues[team], keys[team]
                break
            if team in changed:
                break  # keyed again at the top, with its new usage
            # Its usage is as keyed (a change would have marked it): only its next run's time can
            # move its key, and a queue of runs with no status all have "~".
            if known:
                following = since(queue[-1], "~")
                if following != key[1]:
                    key = keys[team] = (key[0], following, team)
            if changed or (heap and not key <= heap[0]):
                held = key  # another team's key moved, or may be less: the choice is made above
                break
            # Still the least of every key: what holding it and taking it again above would give.


_UNKNOWN = object()  # a run whose team is not looked up yet (None: it has none)
_NOTHING_USED = (0.0, 0.0)  # a team's usage before it has any (read only)


@dataclass
class Quotas:
    desired: DesiredState
    usage: dict[str, list[float]] = field(default_factory=dict)  # team → [gpus, price per hour]
    changed: set[str] = field(default_factory=set)  # teams whose usage grew since placement_order last looked
    _limits: dict = field(default_factory=dict, repr=False)  # team → its Policy entry (None: not listed)
    _teams: dict = field(default_factory=dict, repr=False)  # run name → its team (the desired state is fixed)

    def team(self, name: str) -> str | None:
        team = self._teams.get(name, _UNKNOWN)  # asked for every comparison and placement: once per run suffices
        if team is not _UNKNOWN:
            return team
        entry = self.desired.runs.get(name)
        if entry is None or self.desired.policy is None:
            team = None
        else:
            team = entry.run.metadata.labels.get(self.desired.policy.spec.teamLabel)
        self._teams[name] = team
        return team

    def known(self, name: str, team: str | None) -> None:
        """The run's team, read by whoever reads its spec anyway (as ``team`` would find it)."""
        self._teams[name] = team

    def limits(self, team: str | None):
        if team is None or self.desired.policy is None:
            return None
        if not self._limits:  # one pass over the Policy's teams, rather than one per look-up
            for t in reversed(self.desired.policy.spec.teams):  # the first of a name wins, as next() would
                self._limits[t.name] = t
            self._limits[None] = None
        return self._limits.get(team)

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

    def _can_borrow(self, lim, gpus: float) -> bool:
        """Past its own maxGpus, a borrowing team may use what the teams with a quota leave unused:
        the sum of every team's maxGpus still holds."""
        return lim.borrow and gpus <= _borrowable(self)

    def borrowing(self, name: str, gpus: float) -> str | None:
        """The note for a placement that goes past the team's maxGpus on other teams' unused quota."""
        team = self.team(name)
        lim = self.limits(team)
        if lim is None or lim.maxGpus is None or not gpus:
            return None
        used = self.usage.get(team, [0.0, 0.0])[0]
        if used + gpus > lim.maxGpus:
            return (f"team {team} borrows {used + gpus - lim.maxGpus:g} GPU(s) of quota other teams leave unused "
                    f"(maxGpus {lim.maxGpus}, borrow: true)")
        return None

    def launched(self, team: str | None, gpus: float) -> str | None:
        """A launch on owned machines of a run of ``team`` (as ``team(name)`` gives it) counted, as
        ``add(name, gpus, 0.0)`` counts it, with the note ``borrowing`` gives it, asked before."""
        lim = self.limits(team)
        note = None
        if lim is not None and lim.maxGpus is not None and gpus:
            used = self.usage.get(team, _NOTHING_USED)[0]
            if used + gpus > lim.maxGpus:
                note = (f"team {team} borrows {used + gpus - lim.maxGpus:g} GPU(s) of quota other teams leave "
                        f"unused (maxGpus {lim.maxGpus}, borrow: true)")
        if self.desired.policy is not None:
            team = team or ""  # "": the runs without a team, together
            u = self.usage.get(team)
            if u is None:
                u = self.usage[team] = [0.0, 0.0]
            self.changed.add(team)
            u[0] += gpus
        return note

    def share_used(self, team: str) -> float:
        """GPUs the team holds per GPU of its share (maxGpus; 1 for a team without one)."""
        return self.usage.get(team, [0.0, 0.0])[0] / self.weight(team)

    def weight(self, team: str) -> int:
        """The team's share: its maxGpus, or 1 for a team without one."""
        lim = self.limits(team or None)
        return lim.maxGpus if lim is not None and lim.maxGpus else 1

    def add(self, name: str, gpus: float, price: float) -> None:
        if self.desired.policy is None:
            return
        team = self.team(name) or ""  # "": the runs without a team, together
        u = self.usage.setdefault(team, [0.0, 0.0])
        self.changed.add(team)
        u[0] += gpus
        u[1] += price

    def exceeded(self, name: str, gpus: float, price: float = 0.0) -> str | None:
        team = self._teams.get(name, _UNKNOWN)  # asked for every launch: the memo read without a call
        if team is _UNKNOWN:
            team = self.team(name)
        return self.exceeded_by(team, gpus, price)

    def exceeded_by(self, team: str | None, gpus: float, price: float = 0.0) -> str | None:
        """``exceeded`` for a run of ``team`` (as ``team(name)`` gives it, read by the caller already)."""
        lim = self._limits.get(team) if self._limits else self.limits(team)  # filled by the first look-up
        if lim is None:
            return None
        used = self.usage.get(team) or _NOTHING_USED
        if gpus and lim.maxGpus is not None and used[0] + gpus > lim.maxGpus and not self._can_borrow(lim, gpus):
            return f"team {team} holds {used[0]:g} of its maxGpus {lim.maxGpus} GPUs; this run needs {gpus:g} more"
        if price and lim.maxPricePerHour is not None and used[1] + price > lim.maxPricePerHour + 1e-9:
            return (f"team {team} rents {used[1]:g}/h of its maxPricePerHour {lim.maxPricePerHour:g}; this run's "
                    f"offer adds {price:g}/h")
        return None


def _quota_teams(q: "Quotas"):
    return [t for t in q.desired.policy.spec.teams if t.maxGpus is not None]


def _borrowable(q: "Quotas") -> float:
    """GPUs of quota the teams with one leave unused, all told: what a borrowing team may take."""
    teams = _quota_teams(q)
    return max(0.0, sum(t.maxGpus for t in teams) - sum(q.usage.get(t.name, [0.0, 0.0])[0] for t in teams))


def _offer_gpus(desired: DesiredState, provider: str | None, offer: str | None) -> int:
    p = desired.providers.get(provider or "")
    o = next((x for x in p.spec.offers if x.id == offer), None) if p is not None else None
    return o.gpu_count if o is not None else 0
