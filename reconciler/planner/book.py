"""The book one plan keeps while it is computed: every cache and running tally its decisions share.

Placements within a plan depend on each other (a machine taken, a rental asked for, a run
preempted, a team's quota used), so they all read and update one PlanBook, created per plan and
passed explicitly; nothing of it outlives the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reconciler.core.identity import parse
from reconciler.core.observed import ObservedRental, ObservedWorld
from reconciler.core.runstatus import TERMINAL, RunStatus
from reconciler.spec.load import DesiredState
from reconciler.spec.models.provider import Offer
from reconciler.spec.resolve import Effective, effective, effective_by_digest, effectives_of

from .quota import Groups, Quotas

LIVE = ("provisioning", "running")


@dataclass
class PlanBook:
    """What one plan knows and has decided so far, beyond its changes: created once per
    ``make_plan`` call and passed to every decision, so that placements see each other's room."""

    desired: DesiredState
    world: ObservedWorld
    previous: dict[str, RunStatus]
    now: float
    namespace: str
    bad_offers: dict[tuple[str, str], float] = field(default_factory=dict)  # (provider, offer) → until
    spend: dict[str, float] = field(default_factory=dict)  # provider → what its rentals cost so far
    held: dict[str, str] = field(default_factory=dict)  # machine → the run holding it
    released: dict[str, object] = field(default_factory=dict)  # machine → its release change
    planned: list[tuple[str, float]] = field(default_factory=list)  # (provider, price) of this plan's provisions
    # The planner's caches for owned machines, kept here because the book lives for one plan:
    candidates: dict = field(default_factory=dict)  # (placement, target) → the candidate slots
    no_room: dict = field(default_factory=dict)  # a request that found no room → the reasons
    rooms: dict = field(default_factory=dict)  # id(candidate list) → its RoomIndex
    preempted: dict = field(default_factory=dict)  # run name → (Kill, why): stopped for a higher priority
    slots: dict = field(default_factory=dict)  # owned machine → its Slot: room left, shrinking as runs are placed
    quotas: Quotas | None = None  # the teams' usage, growing as runs are placed (None: no Policy)
    _runs_on: dict | None = None  # machine → names of the runs live there or placed there by this plan
    resources_memo: dict = field(default_factory=dict)  # resources overrides → validated Resources
    _effective: dict = field(default_factory=dict)  # id(run) → (run, its Effective), without a content digest
    _kept: dict = field(default_factory=dict)  # template name → its runs' Effectives kept across plans
    shapes: dict = field(default_factory=dict)  # id(Effective) → its placement Shape (placement.py)
    plain: dict = field(default_factory=dict)  # id(Effective) → its Shape, for a plain request of owned machines
    judged: dict = field(default_factory=dict)  # Shape → (room count, the verdicts) of a judged request without room
    ruled_out: dict = field(default_factory=dict)  # run → machines this plan ruled out for it (ruled_out.py)
    _placed: list = field(default_factory=list)  # (machine, run) placed before anything asked who runs where
    # Whether the Policy lets a run preempt others at all: asked for every run that finds no room,
    # and the Policy does not change within a plan (set in __post_init__).
    preempts: bool = False
    _any_down: bool | None = None  # whether any machine of the world does not answer (asked once per plan)
    # What the plan reads of each run's spec, read in one pass in name order (read_runs):
    reads: dict = field(default_factory=dict)  # run name → (priority class, team, digest, rel, affinity?, Effective)
    stopped: set = field(default_factory=set)  # runs whose spec says desiredState: Stopped
    # run name → its entry, for a new run that launch.new_run takes: no status, nothing of it
    # observed, every machine answering, not stopped.
    fresh: dict = field(default_factory=dict)
    groups: Groups | None = None  # every run of the plan by priority and team, for the placement order (read_runs)

    def any_down(self) -> bool:
        """Whether some machine does not answer: when none does, no start can be held for one
        (fence.hold_unseen_launches), and the per-run search for them is skipped."""
        if self._any_down is None:
            self._any_down = any(not m.reachable for m in self.world.machines.values())
        return self._any_down

    def read_runs(self, names) -> None:
        """Read, for every run of ``names`` that has a spec, what the plan decides it by (its
        priority class, team, digest and path, whether it has affinity, its Effective when one
        is kept for its digest; ``stopped``), in one pass in name order, and group every run of
        ``names`` for the placement order (``groups``, as quota.Groups groups them). The runs are
        placed in priority and team order, which jumps across them; reading the spec models
        there, each a few scattered objects, costs a cache miss for every one of them. A run's
        spec reads the same for the whole plan; an Effective not kept yet is resolved when it is
        needed. ``quotas`` is set first: the grouping records each run's team there."""
        runs, reads, stopped, fresh, previous = self.desired.runs, self.reads, self.stopped, self.fresh, self.previous
        answer, observed = not self.any_down(), self.world.names()  # nothing is fresh while a machine is down
        grouping = self.groups = Groups(self.desired, self.quotas)
        group = grouping.add
        policy = self.desired.policy
        label = policy.spec.teamLabel if policy is not None else None
        kept_by_template: dict = {}  # template name → its kept Effectives (None: no such template)
        templates = self.desired.templates
        for name in names:
            entry = runs.get(name)
            if entry is None:
                group(name, None, None)
                continue
            run = entry.run
            spec = run.spec
            tname = spec.template
            kept = kept_by_template.get(tname, self)
            if kept is self:
                kept = kept_by_template[tname] = self._kept_for(tname, templates.get(tname))
            digest = entry.digest
            wanted, team = spec.priority, run.metadata.labels.get(label) if label is not None else None
            reads[name] = (wanted, team, digest, entry.rel, bool(spec.affinity or spec.antiAffinity),
                           kept.get(digest) if kept is not None else None)
            group(name, wanted, team)
            if spec.desiredState == "Stopped":
                stopped.add(name)
            elif answer and name not in observed and previous.get(name) is None:
                fresh[name] = entry

    def _kept_for(self, name: str, template) -> dict | None:
        """The kept Effectives of the runs of template ``name`` (as ``effective`` finds them)."""
        if template is None:
            return None
        kept = self._kept.get(name)
        if kept is None:
            kept = self._kept[name] = effectives_of(template)
        return kept

    def effective(self, entry) -> Effective:
        """The run's effective spec, resolved once per plan (and, by its spec digest, once for as
        long as neither the spec nor its template changes): every decision about one run (quota,
        placement, its gang's nodes) reads the same object rather than revalidating the models."""
        run = entry.run
        name = run.spec.template
        kept = self._kept.get(name)
        if kept is not None:  # the template was read by this plan already; only content digests are kept
            found = kept.get(entry.digest)
            if found is not None:
                return found
        template = self.desired.templates[name]
        if not entry.digest.startswith("sha256:"):  # no content digest: kept for this plan only
            found = self._effective.get(id(run))
            if found is None or found[0] is not run:
                found = self._effective[id(run)] = (run, effective(run, template, self.resources_memo))
            return found[1]
        kept = self._kept.get(name)
        if kept is None:
            kept = self._kept[name] = effectives_of(template)
        found = kept.get(entry.digest)  # what effective_by_digest looks up first, without the call
        return found if found is not None else effective_by_digest(run, entry.digest, template, kept,
                                                                   self.resources_memo)

    def room_changed(self, slot, grew: bool = False) -> None:
        """``slot``'s room changed: every room index that holds it re-reads it (two targets can
        share a machine, each with its own index). ``grew``: room was given back, so a request
        that found none may find some now."""
        for index in self.rooms.values():
            if slot.name in index.by_name:
                index.changed(slot)
        if grew:
            self.no_room.clear()

    def placed_on(self, machine: str, name: str) -> None:
        # Only affinity asks who runs where: most plans never build the map (every live identity parsed).
        if self._runs_on is None:
            self._placed.append((machine, name))
        else:
            self._runs_on.setdefault(machine, set()).add(name)

    def _on(self) -> dict:
        if self._runs_on is None:
            self._runs_on = {}
            for m in self.world.machines.values():
                for r in m.runs.values():
                    p = parse(r.identity)
                    if r.alive and p is not None:
                        self._runs_on.setdefault(m.name, set()).add(p.name)
            for machine, name in self._placed:
                self._runs_on.setdefault(machine, set()).add(name)
            self._placed.clear()
        return self._runs_on

    def runs_with(self, machine: str, labels: dict[str, str], other_than: str) -> list[str]:
        """The runs on ``machine`` (live, or placed by this plan) whose labels include ``labels``."""
        out = []
        for name in sorted(self._on().get(machine, ())):
            entry = self.desired.runs.get(name)
            if name != other_than and entry is not None and all(
                    entry.run.metadata.labels.get(k) == v for k, v in labels.items()):
                out.append(name)
        return out

    def __post_init__(self):
        policy = self.desired.policy
        self.preempts = policy is not None and bool(policy.spec.preemption.enabled)
        for name, st in self.previous.items():
            m = st.handle.machine if st.handle is not None else None
            if m in self.world.rentals and st.phase not in TERMINAL:
                self.held.setdefault(m, name)
            r = (st.handle.rental or {}) if st.handle is not None else {}
            # A run still provisioning holds its rental before it has a machine.
            if st.phase == "Provisioning" and r.get("provider") and r.get("id"):
                self.held.setdefault(f"{r['provider']}/{r['id']}", name)

    def offer(self, r: ObservedRental) -> Offer | None:
        p = self.desired.providers.get(r.provider)
        return next((o for o in p.spec.offers if o.id == r.offer), None) if p is not None else None

    def busy(self, machine: str) -> bool:
        m = self.world.machines.get(machine)
        return m is not None and any(x.alive or not x.collected for x in m.runs.values())

    def live(self, provider: str) -> tuple[int, float]:
        count, price = 0, 0.0
        for r in self.world.rentals.values():
            if r.provider == provider and r.state in LIVE and r.machine not in self.released:
                count += 1
                price += r.price_per_hour or 0.0
        for p, pr in self.planned:
            if p == provider:
                count += 1
                price += pr
        return count, price

    def is_bad(self, provider: str, offer: str | None) -> bool:
        return offer is not None and self.bad_offers.get((provider, offer), 0) > self.now
