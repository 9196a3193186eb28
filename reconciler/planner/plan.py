"""The planner: desired state + observed state + previous status → a Plan. Pure.

Nothing here touches a network, a process or git (a test enforces it), so a plan can be computed
from fixtures, printed, stored, and compared. Each change carries an action, the phase the run
reaches if the change applies, a machine-readable reason code and a human reason.

The rules, per run:
- a new spec launches generation 1, attempt 1; a changed spec digest bumps the generation and
  replaces whatever still runs of the old one;
- a removed spec, or ``desiredState: Stopped``, terminates every live instance (status kept,
  phase Terminated);
- a failure with retries left relaunches as attempt + 1 once the backoff has passed; without
  retries left the run is Failed; a success is collected and never relaunched;
- an instance found running that the status does not know (a crash between launch and commit) is
  adopted, never launched again, but only if it was built from the desired spec (its bundle's spec
  digest): identities never collide across spec contents, so a spec whose generation number is
  already used on a machine by another content gets the next unused generation, and the other
  instance is fenced; an instance that is not the current identity is fenced;
- a workspace staged but never started is finished launching (the current identity) or removed
  (any other); a finished instance that is no run's current one (a fenced leftover) is collected
  and cleaned;
- a launch that needs a secret the reconciler host does not have waits, Pending, spending no
  attempt and staging nothing;
- a machine that does not answer is not dead: its runs wait, and only after the grace period are
  they declared lost and relaunched elsewhere; the old instance is fenced when it comes back;
- an invalid spec marks its run Invalid with the validation message and touches nothing else: what
  its last valid generation started keeps running, and a fix back to the same content continues it.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import asdict, dataclass, field
from typing import Callable

from reconciler.core.actions import Action
from reconciler.core.identity import make, node_identity, node_of, parse
from reconciler.core.observed import ObservedRun, ObservedWorld
from reconciler.spec.load import DesiredState, RunEntry
from reconciler.spec.resolve import effective
from reconciler.core.names import LOCAL, SLURM_PREFIX, slurm_machine
from reconciler.core.runstatus import TERMINAL, RunStatus, iso, parse_iso

SYMBOL = {Action.LAUNCH: "+", Action.RELAUNCH: "~", Action.TERMINATE: "-", Action.COLLECT: ">",
          Action.MARK_INVALID: "!", Action.WAIT: ".", Action.ADOPT: "=", Action.NONE: " ", Action.PROVISION: "^",
          Action.RELEASE: "x", Action.SAVE: "s"}
# The actions that change a machine, a rental or a copy of a run's files.
MUTATING = frozenset({Action.LAUNCH, Action.RELAUNCH, Action.TERMINATE, Action.COLLECT, Action.PROVISION,
                      Action.RELEASE, Action.SAVE})


@dataclass
class Kill:
    machine: str
    identity: str
    workspace: str | None = None
    grace: float | None = None  # seconds from SIGTERM to SIGKILL (None: the configuration's terminate_grace)


@dataclass
class Node:
    """One node of a run on several machines."""

    machine: str
    identity: str
    workspace: str | None = None
    gpus: list[int] = field(default_factory=list)


@dataclass
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

    @property
    def mutates(self) -> bool:
        return self.action in MUTATING or bool(self.kill)


@dataclass
class Plan:
    changes: list[Change] = field(default_factory=list)
    at: float = 0.0
    warnings: list[str] = field(default_factory=list)  # what will block a run later (a missing secret)

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

    def text(self, verbose: bool = False) -> str:
        shown = [c for c in self.changes if verbose or c.action != Action.NONE]
        warnings = "".join(f"\nWarning: {w}" for w in self.warnings)
        if not shown:
            return "No changes. The machines match the repository." + warnings
        width = max(len(c.name) for c in shown)
        lines = [f"Reconcile plan: {len(shown)} change(s)", ""]
        for c in shown:
            where = c.identity or ""
            if c.machine and c.action in (Action.LAUNCH, Action.RELAUNCH, Action.ADOPT, Action.COLLECT, Action.SAVE):
                where += f" on {', '.join(n.machine for n in c.nodes) if c.nodes else c.machine}"
            notes = [where] if where else []
            if c.kill:
                notes.append("(stop " + ", ".join(k.identity for k in c.kill) + ")")
            if c.collect_first:
                notes.append(f"(collect {c.collect_first.identity})")
            if c.rental and c.action == Action.PROVISION:
                notes.append(f"renting {c.rental['provider']}/{c.rental['offer']} at {c.rental['price_per_hour']:g}/h")
            elif c.rental and c.action == Action.RELEASE:
                notes.append(f"give back {c.machine}")
            if c.retry_after is not None and c.action != Action.PROVISION:
                notes.append(f"(retry in {c.retry_after:.0f}s)")
            where = " ".join(notes)
            lines.append(f"  {SYMBOL[c.action]} {c.action:<12} {c.name:<{width}}  {where}")
            lines.append(f"      {' ' * 12} {'':<{width}}  {c.code}: {c.reason}")
        counts = self.summary()
        lines += ["", "Plan: " + ", ".join(f"{n} {a}" for a, n in sorted(counts.items()) if a != Action.NONE) + "."]
        n, price = self.new_rentals()
        if n:
            lines.append(f"New rentals: {n}, estimated {price:g} per hour.")
        return "\n".join(lines) + warnings


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


# ---------------------------------------------------------------- capacity


@dataclass
class Slot:
    name: str
    placement: str
    fleet: str | None
    max_tasks: int | None
    gpu_types: dict[int, str] = field(default_factory=dict)  # index → type
    tasks: int = 0
    used_gpus: set[int] = field(default_factory=set)
    reachable: bool = True
    error: str = ""
    draining: str | None = None  # drained from the machine itself (its reason)
    foreign_gpus: set[int] = field(default_factory=set)  # used by processes the reconciler did not start
    labels: dict[str, str] = field(default_factory=dict)
    gpu_memory: dict[str, float] = field(default_factory=dict)  # GPU type (lower case) → GB per GPU, when known
    cpu_total: int | None = None  # what the Fleet says the machine has (None: not said, not checked)
    memory_total: float | None = None
    cpu_used: float = 0.0  # by the live runs whose spec asks for CPUs, and by this plan's placements
    memory_used: float = 0.0

    def host_room(self, cpus: int | None, memory: float | None) -> str | None:
        """Why the machine's CPUs or memory cannot hold the run, or None."""
        if cpus and self.cpu_total is not None and self.cpu_used + cpus > self.cpu_total:
            return f"{self.cpu_total - self.cpu_used:g} free CPU(s) of {cpus} wanted"
        if memory and self.memory_total is not None and self.memory_used + memory > self.memory_total:
            return f"{self.memory_total - self.memory_used:g} GB free memory of {memory:g} wanted"
        return None
    _counts: dict = field(default_factory=dict, repr=False, compare=False)  # GPU type → free count (cache)

    def free_count(self, gpu_type: str | None) -> int:
        key = gpu_type.lower() if gpu_type else None
        n = self._counts.get(key)
        if n is None:
            n = self._counts[key] = len(self._free(gpu_type))
        return n

    def available(self) -> bool:
        """Takes new work at all: reachable, not drained or draining, below its task limit."""
        return (self.reachable and self.max_tasks != 0 and self.draining is None
                and (self.max_tasks is None or self.tasks < self.max_tasks))

    def fits(self, gpu_count: int, gpu_type: str | None) -> bool:
        """why_not(...) is None, without building a message."""
        return self.available() and self.free_count(gpu_type) >= gpu_count

    def types_for(self, wanted: list[str | None], min_memory: float | None) -> list[str | None]:
        """Which of the wanted GPU models this machine could give, in the run's order."""
        if wanted == [None]:
            if min_memory is None:
                return [None]
            wanted = sorted({t for t in self.gpu_types.values()})
        return [t for t in wanted if min_memory is None
                or (t is not None and self.gpu_memory.get(t.lower(), 0.0) >= min_memory)]

    def _free(self, gpu_type: str | None) -> list[int]:
        return [i for i, t in sorted(self.gpu_types.items())
                if i not in self.used_gpus and (gpu_type is None or t.lower() == gpu_type.lower())]

    def why_not(self, gpu_count: int, gpu_type: str | None) -> str | None:
        if not self.reachable:
            return f"unreachable ({self.error})" if self.error else "unreachable"
        if self.max_tasks == 0:
            return "drained (max_tasks 0)"
        if self.draining is not None:
            return f"draining ({self.draining})"
        if self.max_tasks is not None and self.tasks >= self.max_tasks:
            return f"{self.tasks}/{self.max_tasks} tasks"
        free = self._free(gpu_type)
        if len(free) < gpu_count:
            kind = f" {gpu_type}" if gpu_type else ""
            others = f" ({len(self.foreign_gpus)} in use outside the reconciler)" if self.foreign_gpus else ""
            return f"{len(free)} free{kind} GPU(s) of {gpu_count} wanted{others}"
        return None

    def hold(self, res, gpu_type: str | None) -> list[int]:
        """Take room for one instance of ``res`` (GPUs of ``gpu_type``, CPUs, memory); its GPUs."""
        gpus = self.take(res.gpu_count, gpu_type)
        self.cpu_used += res.cpu_count or 0
        self.memory_used += res.memory_gb or 0.0
        return gpus

    def give_back(self, gpus: list[int], res) -> None:
        """The room of a live instance (of ``res``, on ``gpus``) that this plan stops before it
        places anything: what ``hold`` took, and what ``_slots`` counted for a live run."""
        self.used_gpus.difference_update(gpus)
        self.tasks = max(0, self.tasks - 1)
        if self.cpu_total is not None or self.memory_total is not None:
            self.cpu_used = max(0.0, self.cpu_used - (res.cpu_count or 0))
            self.memory_used = max(0.0, self.memory_used - (res.memory_gb or 0.0))
        self._counts.clear()

    def take(self, gpu_count: int, gpu_type: str | None) -> list[int]:
        got = self._free(gpu_type)[:gpu_count]
        self.used_gpus.update(got)
        self.tasks += 1
        self._counts.clear()
        return got


def _slots(desired: DesiredState, world: ObservedWorld, settings: PlanSettings) -> dict[str, Slot]:
    slots: dict[str, Slot] = {
        LOCAL: Slot(LOCAL, "local", None, settings.local_max_tasks,
                    {i: "local" for i in range(settings.local_gpus)})
    }
    for fleet in desired.fleets.values():
        for m in fleet.spec.machines:
            types: dict[int, str] = {}
            for g in m.resources.gpus:
                for _ in range(g.count):
                    types[len(types)] = g.type
            slots[m.name] = Slot(m.name, "ssh", fleet.metadata.name, m.max_tasks, types, labels=dict(m.labels),
                                 gpu_memory={g.type.lower(): g.memory_gb for g in m.resources.gpus if g.memory_gb},
                                 cpu_total=m.resources.cpu_count, memory_total=m.resources.memory_gb)
    for name, obs in world.machines.items():
        slot = slots.get(name)
        if slot is None:
            continue
        slot.reachable, slot.error = obs.reachable, obs.error
        slot.draining = obs.draining
        # A GPU someone uses by hand is not free, whatever the fleet says (foreign_gpus: avoid).
        slot.foreign_gpus = set(obs.foreign_gpus)
        slot.used_gpus.update(obs.foreign_gpus)
        for r in obs.runs.values():
            if r.alive:
                slot.tasks += 1
                slot.used_gpus.update(r.gpus)
                if slot.cpu_total is not None or slot.memory_total is not None:
                    p = parse(r.identity)
                    entry = desired.runs.get(p.name) if p is not None else None
                    template = desired.templates.get(entry.run.spec.template) if entry is not None else None
                    if template is not None:
                        res = effective(entry.run, template).resources
                        slot.cpu_used += res.cpu_count or 0
                        slot.memory_used += res.memory_gb or 0.0
    return slots


SHOWN = 8  # machines an explanation names one by one; the rest are counted


def _shown(lines: list[str]) -> list[str]:
    """The first SHOWN verdicts, and how many more there are."""
    return lines[:SHOWN] + ([f"… and {len(lines) - SHOWN} more"] if len(lines) > SHOWN else [])


class RoomIndex:
    """Which candidate machines have room, by free GPUs of a type, so that placing a run costs a
    few look-ups rather than a look at every machine: buckets of machines by free GPU count, each
    a heap by (tasks, name); placing a run updates the one machine it took. The choice is the one
    a scan of every machine would make: fewest matching GPUs left free, then fewest tasks, then
    name (for a run without GPUs: fewest tasks, then name)."""

    def __init__(self, candidates: list[Slot]):
        self.candidates = candidates
        self.members: dict = {}  # gpu type key → {free count → set of slot names}
        self.heaps: dict = {}  # gpu type key → {free count → heap of (tasks, name, version)}
        self.where: dict = {}  # (gpu type key, slot name) → its free count bucket
        self.version: dict[str, int] = {}
        self.by_name = {s.name: s for s in candidates}

    def _built(self, key: str | None) -> None:
        if key in self.members:
            return
        self.members[key], self.heaps[key] = {}, {}
        for s in self.candidates:
            self._add(key, s)

    def _add(self, key, s: Slot) -> None:
        if not s.available():
            return
        f = s.free_count(key)
        self.members[key].setdefault(f, set()).add(s.name)
        heapq.heappush(self.heaps[key].setdefault(f, []), (s.tasks, s.name, self.version.get(s.name, 0)))
        self.where[(key, s.name)] = f

    def best(self, gpu_type: str | None, count: int) -> Slot | None:
        key = gpu_type.lower() if gpu_type else None
        self._built(key)
        found = None
        for f in sorted(b for b in self.members[key] if b >= count and self.members[key][b]):
            heap = self.heaps[key][f]
            while heap:
                tasks, name, ver = heap[0]
                if ver != self.version.get(name, 0) or self.where.get((key, name)) != f:
                    heapq.heappop(heap)  # an entry from before the machine last changed
                    continue
                cand = (tasks, name)
                if found is None or cand < found[0]:
                    found = (cand, self.by_name[name])
                break
            if found is not None and count:
                break  # with GPUs, the fewest left free wins first
        return found[1] if found is not None else None

    def fitting(self, gpu_type: str | None, count: int) -> int:
        key = gpu_type.lower() if gpu_type else None
        self._built(key)
        return sum(len(names) for f, names in self.members[key].items() if f >= count)

    def fitting_names(self, gpu_type: str | None, count: int) -> list[str]:
        key = gpu_type.lower() if gpu_type else None
        self._built(key)
        return sorted(n for f, names in self.members[key].items() if f >= count for n in names)

    def changed(self, s: Slot) -> None:
        self.version[s.name] = self.version.get(s.name, 0) + 1
        for key in self.members:
            old = self.where.pop((key, s.name), None)
            if old is not None:
                self.members[key][old].discard(s.name)
            self._add(key, s)


def _candidates(slots: dict[str, Slot], placement: str, target: str | None, cache: dict | None = None) -> list[Slot]:
    """The machines a placement may use, by name (computed once per plan and request kind)."""
    if cache is not None:
        found = cache.get((placement, target))
        if found is None:
            found = cache[(placement, target)] = _candidates(slots, placement, target)
        return found
    if placement == "local":
        return [slots[LOCAL]]
    return sorted((s for s in slots.values()
                   if s.placement == "ssh" and (target is None or s.fleet == target or s.name == target)),
                  key=lambda s: s.name)


# ---------------------------------------------------------------- the plan


def make_plan(desired: DesiredState, world: ObservedWorld, previous: dict[str, RunStatus], now: float,
              settings: PlanSettings | None = None, settled: frozenset[str] = frozenset(),
              missing_secrets: dict[str, list[str]] | None = None) -> Plan:
    """``settled``: runs the caller knows are finished and untouched since (their plan would be
    "none"); they are left out of the plan. A long-lived reconciler uses it to keep thousands of
    finished runs out of memory. ``missing_secrets``: per run, the secrets it names that the
    reconciler host does not have (the caller looks; the planner stays pure)."""
    settings = settings or PlanSettings()
    missing_secrets = missing_secrets or {}
    from .rentals import RentalBook, sweep

    plan = Plan(at=now)
    slots = _slots(desired, world, settings)
    book = RentalBook(desired, world, previous, now, settings.namespace, settings.bad_offers, settings.spend)
    from .quota import Quotas, placement_order

    book.quotas = Quotas.build(desired, world, previous) if desired.policy is not None else None
    names = sorted((set(desired.runs) | set(desired.invalid) | set(previous)) - settled)
    # An invalid spec protects everything its run has on the machines: nothing is fenced, collected
    # or cleaned until the spec is fixed (or removed).
    invalid = {n for n in desired.invalid if n not in desired.runs}
    # Runs already holding a slot keep it; launches are placed by priority (then first come, first
    # served, with a Policy; then by name), and the plan lists every run in name order.
    for name in placement_order(desired, names, previous, book.quotas):
        prev = previous.get(name)
        if name in invalid:
            plan.changes.append(_invalid(name, desired.invalid[name], prev, world))
            continue
        entry = desired.runs.get(name)
        if entry is None or entry.run.spec.desiredState == "Stopped":
            plan.changes.append(_stop(name, entry, prev, world))
            continue
        if name in book.preempted:
            plan.changes.append(_preempted(name, entry, prev, book.preempted[name]))
            continue
        plan.changes.extend(_running(name, entry, prev, world, desired, slots, settings, now,
                                     missing_secrets.get(name, []), book))
    position = {n: i for i, n in enumerate(names)}
    plan.changes.sort(key=lambda c: position.get(c.name, len(position)))  # stable: a run's own order kept
    by_run = {c.name: c for c in plan.changes if c.phase is not None} if missing_secrets else {}
    for name, secrets in sorted(missing_secrets.items()):
        entry, change = desired.runs.get(name), by_run.get(name)
        # Only where a launch may still come: not for a stopped run, nor for one that has ended.
        if (secrets and entry is not None and entry.run.spec.desiredState != "Stopped"
                and change is not None and change.phase not in TERMINAL):
            plan.warnings.append(f"{name}: secret(s) {', '.join(secrets)} not set on the reconciler host; "
                                 "its launches wait until they are")
    covered = _accounted(plan)
    known = set(desired.runs) | set(desired.invalid) | set(previous) | settled
    plan.changes.extend(_fences(world, invalid, covered, known, now, settings.orphan_grace, plan.warnings))
    # Fences add only live instances, which _leftovers passes over anyway: the same set serves both.
    plan.changes.extend(_leftovers(plan, world, invalid, known, covered))
    if world.rentals:
        plan.changes.extend(sweep(book, plan, plan.warnings))
        plan.changes.extend(_saves(plan, world))
    expand_gangs(plan, world)
    return plan


def _saves(plan: Plan, world: ObservedWorld) -> list[Change]:
    """A run training on a rental gets its newest complete checkpoint copied off the machine,
    once: the machine may vanish, the copy is what a relaunch elsewhere resumes from."""
    out = []
    for c in list(plan.changes):
        if c.phase != "Running" or c.action not in (Action.NONE, Action.ADOPT) or not c.identity:
            continue
        obs = world.find(c.identity)
        if obs is None or not obs.alive or obs.machine not in world.rentals or not obs.checkpoints:
            continue
        newest = obs.checkpoints[-1]
        if newest.rsplit("/", 1)[-1] in world.saved_checkpoints.get((c.name, c.generation), set()):
            continue
        out.append(Change(c.name, Action.SAVE, "CheckpointCopy", f"copying {newest} of {c.identity} off {obs.machine}",
                          None, c.generation, c.attempt, identity=c.identity, machine=obs.machine,
                          workspace=obs.workspace, checkpoint=newest))
    return out


def _preempted(name: str, entry: RunEntry, prev: RunStatus | None, victim: tuple) -> Change:
    kill, why = victim
    p = parse(kill.identity)
    return Change(name, Action.TERMINATE, "Preempted", why, "Pending", p.generation, p.attempt, identity=kill.identity,
                  machine=kill.machine, kill=[kill], spec_digest=entry.digest, spec_path=entry.rel)


def _invalid(name: str, message: str, prev: RunStatus | None, world: ObservedWorld) -> Change:
    gen = prev.generation if prev else 0
    att = prev.attempt if prev else 0
    alive = [r.identity for r in world.instances(name) if r.alive]
    if alive:
        message += f" (the last valid spec keeps running as {', '.join(alive)}; nothing is changed until the spec is fixed)"
    ident = prev.handle.identity if prev is not None and prev.handle is not None else None
    if prev and prev.phase == "Invalid" and prev.message == message:
        return Change(name, Action.NONE, "SpecInvalid", "still invalid", "Invalid", gen, att, identity=ident)
    return Change(name, Action.MARK_INVALID, "SpecInvalid", message, "Invalid", gen, att, identity=ident)


def _stop(name: str, entry: RunEntry | None, prev: RunStatus | None, world: ObservedWorld) -> Change:
    why = "spec removed" if entry is None else "desiredState: Stopped"
    code = "SpecRemoved" if entry is None else "Stopped"
    gen = prev.generation if prev else (1 if entry else 0)
    att = prev.attempt if prev else 0
    digest = entry.digest if entry else None
    path = entry.rel if entry else None
    alive = [r for r in world.instances(name) if r.alive or any(n.alive for n in r.nodes)]
    if alive:
        kills = [Kill(r.machine, r.identity, r.workspace) for r in alive]
        return Change(name, Action.TERMINATE, code, f"{why}: stopping {', '.join(r.identity for r in alive)}",
                      "Terminated", gen, att, kill=kills, spec_digest=digest, spec_path=path)
    ended = _ended_uncollected(name, prev, world)
    if prev is not None and prev.phase in TERMINAL:
        if ended is not None:  # stopped, but its collection failed: once more
            return Change(name, Action.COLLECT, code, f"{why}; collecting {ended.identity}", prev.phase, gen, att,
                          identity=ended.identity, machine=ended.machine, workspace=ended.workspace,
                          exit_code=prev.exit_code, spec_digest=prev.spec.digest, spec_path=prev.spec.path)
        return Change(name, Action.NONE, code, f"{why}; nothing running", prev.phase, gen, att,
                      spec_digest=prev.spec.digest, spec_path=prev.spec.path)
    if ended is not None:
        # It finished before the stop: its own end is the run's end, kept with its exit code.
        phase = ENDED_PHASE[ended.state]
        p = parse(ended.identity)
        exit_note = f" (exit {ended.exit_code})" if ended.exit_code is not None else ""
        return Change(name, Action.COLLECT, code, f"{why}; {ended.identity} had already {ended.state}{exit_note}",
                      phase, p.generation, p.attempt, identity=ended.identity,
                      machine=ended.machine, workspace=ended.workspace, exit_code=ended.exit_code,
                      # The spec that attempt ran, not the one that stops it: the end belongs to it
                      # (so flipping Stopped back gives the same result whenever passes ran).
                      spec_digest=ended.spec_digest or (prev.spec.digest if prev else None),
                      spec_path=path or (prev.spec.path if prev else None))
    unknown = _on_unreachable(world, prev)
    if unknown:
        return Change(name, Action.WAIT, "MachineUnreachable",
                      f"{why}, but {unknown} does not answer; it is stopped when it is back",
                      prev.phase if prev else "Unknown", gen, att, spec_digest=digest, spec_path=path)
    if prev is None:  # never launched: record it, with nothing to stop
        return Change(name, Action.NONE, code, f"{why}; never launched", "Terminated", gen, att,
                      spec_digest=digest, spec_path=path)
    return Change(name, Action.TERMINATE, code, f"{why}; nothing was running", "Terminated", gen, att,
                  spec_digest=digest, spec_path=path)


ENDED_PHASE = {"succeeded": "Succeeded", "failed": "Failed", "terminated": "Terminated"}


def _ended_uncollected(name: str, prev: RunStatus | None, world: ObservedWorld) -> ObservedRun | None:
    """The run's own finished, not yet collected instance: the one its status names, else its newest."""
    ended = [r for r in world.instances(name) if r.state in ENDED_PHASE and not r.collected]
    if not ended:
        return None
    current = prev.handle.identity if prev is not None and prev.handle is not None else None
    mine = [r for r in ended if r.identity == current]
    if mine:
        return mine[0]
    return max(ended, key=lambda r: parse(r.identity)[1:])  # instances() holds parsed identities only


def _on_unreachable(world: ObservedWorld, prev: RunStatus | None) -> str | None:
    if prev is None or prev.handle is None or prev.handle.machine is None:
        return None
    m = world.machines.get(prev.handle.machine)
    if m is not None and not m.reachable and prev.phase not in TERMINAL:
        return prev.handle.machine
    return None


def _running(name: str, entry: RunEntry, prev: RunStatus | None, world: ObservedWorld, desired: DesiredState,
             slots: dict[str, Slot], settings: PlanSettings, now: float, missing: list[str], book) -> list[Change]:
    ended = [g for g in world.instances(name) if g.nodes and g.state != "running" and any(n.alive for n in g.nodes)]
    for g in ended:
        _free_nodes(g, slots, book, _resources(entry, desired))  # stopped by this pass's change: their room is the relaunch's
    changes = _running_changes(name, entry, prev, world, desired, slots, settings, now, missing, book)
    for g in ended:
        # An attempt on several machines ends on every node at once: the nodes still running are
        # stopped with the run's change (their workers too: terminate stops every process that
        # carries the identity).
        _stop_nodes(changes, g)
    for c in changes:
        if c.action == Action.COLLECT and c.phase in ("Succeeded", "Failed"):
            # The run is over: the workspaces its earlier attempts left on remote machines can go
            # (they were collected when those attempts ended; local ones are the bundles themselves).
            c.cleanup = [Kill(r.machine, r.identity, r.workspace) for r in world.instances(name)
                         if r.identity != c.identity and not r.alive and r.machine != LOCAL
                         and r.state != "unknown"]
    return changes


def _gang_changes(name, entry, prev, obs, world, desired, settings, now, launch, base, policy, stale, slots, book):
    """What only a run on several machines needs: its staged nodes started where they were staged,
    a node whose machine does not answer waited for (the unreachable grace), a frozen node caught
    by its heartbeat. None: the common path decides (the folded instance reads like any other)."""
    ident = obs.identity
    if obs.state == "staged":
        # A pass died between staging the nodes and starting them: start them where they are, with
        # the same GPUs (the rendezvous is chosen at launch, so nothing in the bundles is stale).
        return [Change(name, Action.LAUNCH, "Launch", f"{ident} was staged but never started; starting it", "Running",
                       identity=ident, machine=obs.machine, backend=_backend(entry, desired), gpus=list(obs.gpus),
                       kill=stale, nodes=[Node(r.machine, r.identity, r.workspace, list(r.gpus)) for r in obs.nodes],
                       **base)]
    if obs.state != "running":
        return None
    if obs.unreachable:
        where = obs.unreachable[0]
        since, wait = _unreachable_wait(name, where, ident, prev, world, settings, now, base)
        if wait is not None:
            wait.kill = stale
            return [wait]
        why = f"lost: {where}, a node's machine, unreachable for {now - since:.0f}s"
        _free_nodes(obs, slots, book, _resources(entry, desired))
        return _stop_nodes(_after_failure(name, entry, prev, ident, obs, why, now, launch, base, policy,
                                          lost_at=since + settings.unreachable_grace), obs)
    frozen = [r for r in obs.nodes if r.alive and r.heartbeat_age is not None
              and r.heartbeat_age > settings.gang_heartbeat_timeout]
    if frozen:
        r = frozen[0]
        why = (f"node n{node_of(r.identity)} on {r.machine} has not beaten for {r.heartbeat_age:.0f}s "
               f"(frozen; gang_heartbeat_timeout {settings.gang_heartbeat_timeout:g}s): ending {ident} on every node")
        _free_nodes(obs, slots, book, _resources(entry, desired))
        return _stop_nodes(_after_failure(name, entry, prev, ident, obs, why, now, launch, base, policy,
                                          lost_at=now - r.heartbeat_age + settings.gang_heartbeat_timeout), obs)
    return None


def _unreachable_wait(name, where, ident, prev, world, settings, now, base) -> tuple[float, Change | None]:
    """Since when ``where`` has not answered, and the wait for it while within the unreachable
    grace (None once the grace is over: the instance there is lost)."""
    since = world.machines[where].unreachable_since or now
    left = settings.unreachable_grace - (now - since)
    if left <= 0:
        return since, None
    # No countdown in the text: an unchanged wait must leave the status byte-identical.
    return since, Change(name, Action.WAIT, "MachineUnreachable",
                         f"{where} does not answer ({world.machines[where].error or 'no reply'}); "
                         f"{ident} is declared lost at {iso(since + settings.unreachable_grace)} "
                         "if it still does not answer",
                         prev.phase if prev else "Unknown", retry_after=min(left, 60.0), identity=ident,
                         machine=where, **base)


def _stop_nodes(changes: list[Change], gang: ObservedRun) -> list[Change]:
    """The attempt is over: its nodes still alive are stopped with the change that ends it."""
    have = {k.identity for k in changes[-1].kill}
    changes[-1].kill = changes[-1].kill + [Kill(r.machine, r.identity, r.workspace) for r in gang.nodes
                                           if r.alive and r.identity not in have]
    return changes


def _resources(entry: RunEntry, desired: DesiredState):
    return effective(entry.run, desired.templates[entry.run.spec.template]).resources


def _free_nodes(gang: ObservedRun, slots: dict[str, Slot], book, res) -> None:
    """Give back, in this plan, the room of an ending attempt's live nodes (the change that ends
    the attempt stops them before it launches anything); ``res``: what each node holds."""
    for r in gang.nodes:
        slot = slots.get(r.machine)
        if not r.alive or slot is None:
            continue
        slot.give_back(r.gpus, res)
        if book is not None:
            for index in book.rooms.values():
                if slot.name in index.by_name:
                    index.changed(slot)


def expand_gangs(plan: Plan, world: ObservedWorld) -> None:
    """Changes name a run on several machines by its attempt's identity; what is done is done on
    each node: a stop or a clean-up on each node's machine, a collection of each node."""
    def nodes_of(ident: str | None) -> list[ObservedRun]:
        gang = world.find(ident) if ident else None
        return gang.nodes if gang is not None else []

    def flat(kills: list[Kill]) -> list[Kill]:
        out = []
        for k in kills:
            parts = nodes_of(k.identity)
            out += [Kill(r.machine, r.identity, r.workspace, k.grace) for r in parts] if parts else [k]
        return out

    for c in plan.changes:
        c.kill, c.cleanup = flat(c.kill), flat(c.cleanup)
        if c.collect_first is not None and nodes_of(c.collect_first.identity):
            c.collect_nodes = [Node(r.machine, r.identity, r.workspace, list(r.gpus))
                               for r in nodes_of(c.collect_first.identity)]
        if c.action == Action.COLLECT and not c.nodes and nodes_of(c.identity):
            c.nodes = [Node(r.machine, r.identity, r.workspace, list(r.gpus)) for r in nodes_of(c.identity)]


def generation_for(entry: RunEntry, prev: RunStatus | None, instances: list[ObservedRun]) -> int:
    """The generation the desired spec runs as.

    The previous one while the spec digest is unchanged, else the next. An instance found on a
    machine at that generation or later decides further: one built from this very spec is a launch
    whose status never reached git (adopt its generation); one built from any other content owns
    its generation for good, and the desired spec moves past every generation in use. So an
    identity never names two spec contents, even when status files were lost.
    """
    same_spec = prev is not None and prev.generation > 0 and prev.spec.digest == entry.digest
    gen = prev.generation if same_spec else (prev.generation + 1 if prev else 1)
    digests: dict[int, set[str | None]] = {}
    for r in instances:
        p = parse(r.identity)
        # An unreadable bundle (no job.json) that holds no process is only debris: it is rebuilt.
        if p is not None and (r.spec_digest is not None or r.alive):
            digests.setdefault(p.generation, set()).add(r.spec_digest)
    if not same_spec:
        ours = [g for g, ds in digests.items() if g >= gen and ds == {entry.digest}]
        if ours:
            gen = max(ours)
    if digests.get(gen, {entry.digest}) != {entry.digest}:
        gen = max(max(digests), gen) + 1
    return gen


def _running_changes(name: str, entry: RunEntry, prev: RunStatus | None, world: ObservedWorld,
                     desired: DesiredState, slots: dict[str, Slot], settings: PlanSettings,
                     now: float, missing: list[str], book=None) -> list[Change]:
    run = entry.run
    policy = run.spec.restartPolicy
    instances = world.instances(name)
    gen = generation_for(entry, prev, instances)
    same_spec = prev is not None and prev.generation == gen and prev.spec.digest == entry.digest
    attempt = prev.attempt if (same_spec and prev.attempt) else 1
    for r in instances:  # an attempt launched by a pass whose status never reached git
        p = parse(r.identity)
        if p and p.generation == gen and p.attempt > attempt and r.built_for(entry.digest):
            attempt = p.attempt
    ident = make(name, gen, attempt)
    obs = world.find(ident)
    stale = [Kill(r.machine, r.identity, r.workspace) for r in instances if r.alive and r.identity != ident]
    base = dict(generation=gen, attempt=attempt, spec_digest=entry.digest, spec_path=entry.rel)
    changed = prev is not None and prev.generation > 0 and not same_spec

    def launch(next_attempt: int, code: str, why: str, resume_from: str | None = None) -> list[Change]:
        """The changes of a launch: the run's own change last (a rental placement may put the
        release of a rental that timed out before it)."""
        if missing:
            # Staging nothing and spending no attempt: the launch happens on the first pass after
            # the secret is set. Stale instances are still stopped: they run a spec not wanted.
            return [Change(name, Action.WAIT, "SecretMissing",
                           f"secret(s) {', '.join(missing)} not set on the reconciler host; "
                           f"{make(name, gen, next_attempt)} launches once they are",
                           "Pending", identity=make(name, gen, next_attempt), kill=stale,
                           retry_after=30.0, **base)]
        if resume_from is None and next_attempt > 1 and getattr(run.spec.task, "resume", "never") == "auto":
            # A relaunch finished on a later pass (its rental was being provisioned, or it was
            # staged by a pass that died) resumes like the pass that decided it would have.
            resume_from = make(name, gen, next_attempt - 1)
        template = desired.templates[entry.run.spec.template]
        eff = effective(entry.run, template)
        quotas = getattr(book, "quotas", None)
        nbase = dict(base, attempt=next_attempt)
        wanted_gpus = eff.resources.gpu_count * eff.resources.nodes
        if quotas is not None:
            over = quotas.exceeded(name, wanted_gpus)
            if over:
                return [Change(name, Action.WAIT, "QuotaExceeded", over, "Pending",
                               identity=make(name, gen, next_attempt),
                               kill=stale, retry_after=60.0, **nbase)]
        if template.placement.slurm is not None:
            # The cluster's scheduler places it: the run is submitted, and waits in Slurm's queue
            # (with Slurm's reason in the status) rather than in this reconciler's.
            action = _launch_action(stale, code)
            s = template.placement.slurm
            where = slurm_machine(s)
            part = f"partition {s.partition}" if s.partition else "the default partition"
            out = [Change(name, action, code, why, "Pending", identity=make(name, gen, next_attempt), machine=where,
                          backend=eff.backend, kill=stale, resume_from=resume_from,
                          considered=[f"{where}: submitted to {part}; Slurm chooses the node(s)"], **nbase)]
        elif template.placement.kind == "rental" and book is not None:
            from .rentals import place_rental

            action = _launch_action(stale, code)
            out = place_rental(book, name, entry, eff, prev, make(name, gen, next_attempt),
                               action, code, why, stale, nbase, resume_from)
        else:
            out = _place(name, entry, desired, slots, make(name, gen, next_attempt), code, why, stale,
                         nbase, resume_from, book)
        c = out[-1]
        if quotas is not None and c.action in (Action.LAUNCH, Action.RELAUNCH, Action.PROVISION):
            note = quotas.borrowing(name, wanted_gpus)
            if note:
                c.considered = c.considered + [note]
            gpus = wanted_gpus
            if c.rental and c.action == Action.PROVISION:
                from .quota import _offer_gpus

                gpus = _offer_gpus(desired, c.rental.get("provider"), c.rental.get("offer")) or gpus
            quotas.add(name, gpus,
                       (c.rental or {}).get("price_per_hour") or 0.0 if c.action == Action.PROVISION else 0.0)
        return out

    handle_ident = prev.handle.identity if prev and prev.handle else None
    if obs is not None and obs.nodes:
        out = _gang_changes(name, entry, prev, obs, world, desired, settings, now, launch, base, policy, stale,
                            slots, book)
        if out is not None:
            return out
    if obs is not None and obs.state == "staged":
        # Staged by an earlier pass that could not start it (or died first): finish launching it.
        return launch(attempt, "Launch", f"{ident} was staged but never started; starting it")
    if obs is not None and obs.state == "unknown":
        return [Change(name, Action.WAIT, "ObserveFailed", f"{obs.machine} cannot tell whether {ident} runs: "
                       f"{obs.message or 'no answer'}", prev.phase if prev else "Unknown", identity=ident,
                       machine=obs.machine, retry_after=30.0, **base)]
    if obs is None:
        unknown = _on_unreachable(world, prev)
        if unknown and handle_ident == ident:
            since, wait = _unreachable_wait(name, unknown, ident, prev, world, settings, now, base)
            if wait is not None:
                return [wait]
            return _after_failure(name, entry, prev, ident, None, f"lost: {unknown} unreachable for "
                                  f"{now - since:.0f}s", now, launch, base, policy, lost_at=since + settings.unreachable_grace)
        if same_spec and prev is not None and prev.phase in TERMINAL and prev.attempt == attempt:
            return [Change(name, Action.NONE, "Done", f"{prev.phase.lower()}; nothing to do", prev.phase,
                           exit_code=prev.exit_code, identity=ident, **base)]
        if handle_ident == ident and prev is not None and prev.phase not in ("Pending", "Provisioning"):
            return _after_failure(name, entry, prev, ident, None, "lost: the workspace is gone from its machine",
                                  now, launch, base, policy)
        if changed and prev.spec.digest == entry.digest:
            return launch(1, "GenerationTaken", f"generation {prev.generation} is used on a machine by another "
                                                f"spec's instance; this spec runs as generation {gen}")
        if changed:
            return launch(1, "SpecChanged", f"spec changed ({_short(prev.spec.digest)} → {_short(entry.digest)}): "
                                            f"generation {prev.generation} → {gen}")
        why = "new run" if prev is None else "not running yet"
        taken = [r.identity for r in instances if r.spec_digest != entry.digest]
        if taken:
            why += f"; {', '.join(taken)} on the machines ran another spec, so this one runs as generation {gen}"
        return launch(attempt, "NewRun" if prev is None or prev.generation == 0 else "Launch", why)

    if obs.state == "running" and obs.queued is not None:
        return [Change(name, Action.WAIT, "Queued",
                       f"{ident} is queued in Slurm (job {obs.job}): {obs.queued}", "Pending",
                       identity=ident, machine=obs.machine, kill=stale, retry_after=15.0, **base)]
    if obs.state == "running":
        if (prev is not None and prev.phase == "Pending" and handle_ident == ident
                and obs.machine.startswith(SLURM_PREFIX)):
            return [Change(name, Action.ADOPT, "Started", f"Slurm started {ident} (job {obs.job})", "Running",
                           identity=ident, machine=obs.machine, backend=_backend(entry, desired),
                           workspace=obs.workspace, gpus=list(obs.gpus), kill=stale, **base)]
        if prev is not None and prev.phase == "Invalid" and handle_ident == ident:
            return [Change(name, Action.ADOPT, "SpecValid",
                           f"the spec is valid again; {ident} kept running on {obs.machine}",
                           "Running", identity=ident, machine=obs.machine, backend=_backend(entry, desired),
                           workspace=obs.workspace, gpus=list(obs.gpus), kill=stale, **base)]
        if prev is None or prev.phase != "Running" or handle_ident != ident:
            return [Change(name, Action.ADOPT, "Adopted",
                           f"found {ident} running on {obs.machine}; adopting it", "Running",
                           identity=ident, machine=obs.machine, backend=_backend(entry, desired), workspace=obs.workspace,
                           gpus=list(obs.gpus), kill=stale, **base)]
        stalled = _stalled(run, obs, now)
        if stalled and run.spec.stall.action == "terminate":
            return [Change(name, Action.TERMINATE, "Stalled",
                           f"{stalled}; terminating {ident} (stall.action: terminate)",
                           "Running", identity=ident, machine=obs.machine, stalled=stalled,
                           kill=stale + [Kill(obs.machine, ident, obs.workspace)], **base)]
        return [Change(name, Action.NONE if not stale else Action.TERMINATE, "Running" if not stale else "Fenced",
                       "running" if not stale else "stopping stale instances", "Running", identity=ident,
                       machine=obs.machine, kill=stale, stalled=stalled, **base)]

    if obs.state == "succeeded":
        if obs.collected and prev is not None and prev.phase == "Succeeded" and handle_ident == ident:
            return [Change(name, Action.NONE, "Done", "succeeded", "Succeeded", identity=ident, exit_code=0, **base)]
        return [Change(name, Action.COLLECT, "Succeeded", f"{ident} succeeded (exit 0)", "Succeeded", identity=ident,
                       machine=obs.machine, workspace=obs.workspace, exit_code=0, kill=stale, backend=_backend(entry, desired),
                       **base)]

    pre = prev.condition("Preempted") if prev is not None else None
    if pre is not None and pre.status == "True" and handle_ident == ident and obs.state != "running":
        # Stopped to make room for a run of higher priority: back when there is room, from its
        # last checkpoint, without spending a retry.
        resume = ident if getattr(run.spec.task, "resume", "never") == "auto" else None
        changes = launch(attempt + 1, "Resume", f"{ident} was preempted; running it again", resume_from=resume)
        c = changes[-1]
        if not obs.collected and c.action in (Action.RELAUNCH, Action.LAUNCH, Action.PROVISION):
            c.collect_first = Kill(obs.machine, obs.identity, obs.workspace)
        return changes

    stall = prev.condition("Stalled") if prev is not None else None
    stopped_for_stall = stall is not None and stall.status == "True"
    if obs.nodes:  # which node ended the attempt, and how
        return _after_failure(name, entry, prev, ident, obs, f"{ident} ended: {obs.message}", now, launch, base,
                              policy)
    why = {"failed": f"{ident} failed (exit {obs.exit_code})" + (f": {obs.message}" if obs.message else ""),
           "terminated": (f"{ident} was stopped after stalling ({stall.message})" if stopped_for_stall
                          else f"{ident} was terminated from outside (exit {obs.exit_code})"),
           "lost": f"{ident} is lost: no process and no result" + (f" ({obs.message})" if obs.message else "")}
    return _after_failure(name, entry, prev, ident, obs, why.get(obs.state, obs.state), now, launch, base, policy)


def _failed_at(obs: ObservedRun | None, prev: RunStatus | None, lost_at: float | None) -> float:
    """When the instance ended, for the backoff: its result, else when it was declared lost, else
    the last recorded transition, else its start. Never 'now': a clock that moves with every pass
    would push the relaunch back for ever."""
    for t in (obs.finished_at if obs is not None else None, lost_at,
              parse_iso(prev.history[-1].time) if prev is not None and prev.history else None,
              obs.started_at if obs is not None else None):
        if t:
            return float(t)
    return 0.0


def _stalled(run, obs: ObservedRun, now: float) -> str | None:
    """Why a running instance counts as stalled under ``spec.stall``, or None (pure: reads obs and now).

    Progress is the time of the last training step the probe saw (its logging.jsonl); before the
    first step, the instance's start. No progress for ``stall.afterSeconds`` is a stall.
    """
    stall = run.spec.stall
    if stall is None:
        return None
    last = parse_iso((obs.progress or {}).get("updated_at")) or obs.started_at
    if last is None:
        return None
    idle = now - last
    if idle <= stall.afterSeconds:
        return None
    since = f"step {obs.progress['step']}" if obs.progress and obs.progress.get("step") is not None else "the start"
    # No running count in the text: a message that changed every pass would rewrite the status every pass.
    return f"no training progress since {since} at {iso(last)} (stall.afterSeconds {stall.afterSeconds:g})"


def _after_failure(name, entry, prev, ident, obs, why, now, launch, base, policy, lost_at=None) -> list[Change]:
    attempt = base["attempt"]
    exit_code = obs.exit_code if obs is not None else None
    retries_used = attempt - 1 - ((prev.preemptions or 0) if prev is not None else 0)  # preemptions are not failures
    no_retry = "no retries left"
    if obs is not None and obs.permanent:  # e.g. the precheck refused the environment: retrying cannot help
        policy = type(policy)(maxRetries=0, backoffSeconds=policy.backoffSeconds)
        no_retry = "not retried: retrying cannot help"
    if retries_used < policy.maxRetries:
        finished = _failed_at(obs, prev, lost_at)
        left = finished + policy.backoffSeconds - now
        if left > 0:
            # A time, not a countdown: the status of a run waiting out its backoff stays byte-identical.
            c = Change(name, Action.WAIT, "BackOff",
                       f"{why}; retry {retries_used + 1}/{policy.maxRetries} at {iso(finished + policy.backoffSeconds)}",
                       "Pending",
                       retry_after=left, identity=ident, exit_code=exit_code, **base)
            if obs is not None and not obs.collected:
                c.action, c.machine, c.workspace = Action.COLLECT, obs.machine, obs.workspace
            return [c]
        resume = ident if getattr(entry.run.spec.task, "resume", "never") == "auto" else None
        changes = launch(attempt + 1, "Relaunch", f"{why}; retry {retries_used + 1}/{policy.maxRetries}",
                         resume_from=resume)
        c = changes[-1]
        if obs is not None and not obs.collected and c.action in (Action.RELAUNCH, Action.PROVISION):
            # Its logs and manifest (a relaunch on a new rental asks for the machine first).
            c.collect_first = Kill(obs.machine, obs.identity, obs.workspace)
        return changes
    phase = "Failed"
    if obs is not None and not obs.collected:
        return [Change(name, Action.COLLECT, "Failed", f"{why}; {no_retry}", phase, identity=ident,
                       machine=obs.machine, workspace=obs.workspace, exit_code=exit_code, **base)]
    if prev is not None and prev.phase == phase and prev.attempt == attempt:
        return [Change(name, Action.NONE, "Done", "failed; no retries left", phase, identity=ident,
                       exit_code=prev.exit_code, **base)]
    return [Change(name, Action.NONE, "Failed", f"{why}; {no_retry}", phase, identity=ident, exit_code=exit_code,
                   **base)]


def _launch_action(stale: list, code: str) -> Action:
    """A launch that replaces something (stale instances, a failed attempt, another spec) is a relaunch."""
    return Action.RELAUNCH if (stale or code in ("Relaunch", "SpecChanged", "GenerationTaken")) else Action.LAUNCH


def _backend(entry: RunEntry, desired: DesiredState) -> str | None:
    t = desired.templates.get(entry.run.spec.template)
    return t.backend_key if t else None


def _place(name, entry, desired, slots, ident, code, why, stale, base, resume_from, book=None) -> list[Change]:
    """Owned machines: every candidate is judged (the explanation lists them all); among those
    with room, a GPU run goes where the fewest matching GPUs stay free (packing keeps whole
    machines free for big runs), others where the fewest tasks run; then by name. With
    ``fallback: rental`` a run no owned machine has room for now rents one."""
    template = desired.templates[entry.run.spec.template]
    eff = effective(entry.run, template)
    res = eff.resources
    candidates = _candidates(slots, eff.placement, eff.target, book.candidates if book is not None else None)
    action = _launch_action(stale, code)
    fallback = template.placement.fallback == "rental" and book is not None
    if res.nodes > 1:
        return [_place_gang(name, eff, candidates, res, ident, action, code, why, stale, base, resume_from, book)]
    if not candidates and not fallback:
        return [Change(name, Action.WAIT, "NoMachine", f"no machine matches target {eff.target!r}", "Pending",
                       identity=ident, kill=stale, retry_after=60.0, **base)]
    wanted = res.wanted_types()
    spec = entry.run.spec
    if (len(wanted) > 1 or res.gpu_memory_gb is not None or eff.selector or spec.affinity or spec.antiAffinity
            or res.cpu_count or res.memory_gb):
        return _place_constrained(name, eff, candidates, res, wanted, ident, action, code, why, stale, base,
                                  resume_from, fallback, entry, book)
    # Within one plan capacity only shrinks: once a request found no room among these candidates,
    # the same request finds none again (10,000 waiting runs must not each judge every machine).
    memo = book.no_room if book is not None else {}
    memo_key = (eff.placement, eff.target, (res.gpu_type or "").lower(), res.gpu_count)
    rejected: list[str] = list(memo.get(memo_key) or [])
    index = None
    if book is not None:
        index = book.rooms.get(id(candidates))
        if index is None:
            index = book.rooms[id(candidates)] = RoomIndex(candidates)
    slot = None
    if memo_key not in memo:
        slot = index.best(res.gpu_type, res.gpu_count) if index is not None else next(
            iter(sorted((s for s in candidates if s.fits(res.gpu_count, res.gpu_type)),
                        key=lambda s: (s.free_count(res.gpu_type), s.tasks, s.name) if res.gpu_count
                        else (s.tasks, s.name))), None)
        if slot is None:
            shown = 0
            for other in candidates:
                if not other.fits(res.gpu_count, res.gpu_type):
                    shown += 1
                    if shown <= SHOWN:
                        rejected.append(f"{other.name}: {other.why_not(res.gpu_count, res.gpu_type)}")
            if shown > SHOWN:
                rejected.append(f"… and {shown - SHOWN} more machine(s) without room")
            memo[memo_key] = list(rejected)
    if slot is not None:
        fitting = index.fitting(res.gpu_type, res.gpu_count) if index is not None else 1
        others = index.fitting_names(res.gpu_type, res.gpu_count) if index is not None and fitting <= SHOWN + 1 else []
        left = slot.free_count(res.gpu_type) - res.gpu_count
        gpus = slot.take(res.gpu_count, res.gpu_type)
        if index is not None:
            index.changed(slot)
        if book is not None:
            book.placed_on(slot.name, name)
        considered = [f"{slot.name}: chosen" + (f" (owned; {left} matching GPU(s) left free)"
                                                if res.gpu_count else f" (owned; {slot.tasks - 1} other task(s))")]
        considered += [f"{n}: fits, ranked lower" for n in others if n != slot.name]
        if fitting > SHOWN + 1:
            considered.append(f"{fitting - 1} other machine(s) fit, ranked lower")
        if len(candidates) > fitting:
            considered.append(f"{len(candidates) - fitting} machine(s) without room")
        return [Change(name, action, code, why, "Running", identity=ident, machine=slot.name,
                       backend=eff.backend, gpus=gpus, kill=stale, resume_from=resume_from, considered=considered,
                       **base)]
    if not fallback and book is not None:
        pre = _preempt(name, entry, desired, candidates, res, ident, stale, base, book)
        if pre is not None:
            pre.considered = rejected + pre.considered
            return [pre]
    if fallback:
        from .rentals import place_rental

        out = place_rental(book, name, entry, eff, book.previous.get(name), ident, action, code, why, stale, base,
                           resume_from, target_any=True)
        out[-1].considered = rejected + ["owned machines are full: renting"] + out[-1].considered
        return out
    return [Change(name, Action.WAIT, "NoCapacity", "no capacity: " + "; ".join(rejected), "Pending",
                   identity=ident, kill=stale, retry_after=30.0, considered=rejected, **base)]


def _place_gang(name, eff, candidates, res, ident, action, code, why, stale, base, resume_from, book) -> Change:
    """N machines at once or none (gang placement): each node needs the run's GPUs, CPUs and
    memory on a machine of its own. The nodes go where the fewest matching GPUs stay free, then the
    fewest tasks, then by name; rank 0 (the rendezvous) is the first of them."""
    ranked, rejected = [], []
    for slot in candidates:
        option, no = _judge(slot, res, res.wanted_types(), eff.selector)
        if option is None:
            rejected.append(no)
        else:
            ranked.append((option, slot))
    shown = _shown(rejected)
    if len(ranked) < res.nodes:
        return Change(name, Action.WAIT, "NoCapacity", f"no capacity: {res.nodes} machines needed at once, "
                      f"{len(ranked)} have room" + ("; " + "; ".join(shown) if shown else ""), "Pending",
                      identity=ident, kill=stale, retry_after=30.0, considered=shown, **base)
    ranked.sort(key=lambda x: x[0])
    nodes = []
    for rank, ((_, _, _, _, t), slot) in enumerate(ranked[:res.nodes]):
        gpus = slot.hold(res, t)
        if book is not None:
            book.placed_on(slot.name, name)
            index = book.rooms.get(id(candidates))
            if index is not None:
                index.changed(slot)
        nodes.append(Node(slot.name, node_identity(ident, rank), gpus=gpus))
    considered = [f"{n.machine}: node n{k}" + (" (the rendezvous)" if k == 0 else "") for k, n in enumerate(nodes)]
    considered += [f"{slot.name}: fits, not needed" for _, slot in ranked[res.nodes:]][:SHOWN] + shown
    return Change(name, action, code, why, "Running", identity=ident, machine=nodes[0].machine, backend=eff.backend,
                  gpus=list(nodes[0].gpus), kill=stale, resume_from=resume_from, considered=considered, nodes=nodes,
                  **base)


def _judge(slot: Slot, res, wanted: list[str | None], selector: dict[str, str],
           also: Callable[[Slot], str | None] | None = None) -> tuple[tuple | None, str | None]:
    """Whether ``slot`` can hold one instance of the request now: its rank among the machines
    that can (fewest matching GPUs left free, fewest tasks, name, the model preferred; the model
    last), or the verdict why not. ``also``: a further reason to refuse, judged after the labels."""
    missing = [f"{k}={v}" for k, v in sorted(selector.items()) if slot.labels.get(k) != v]
    if missing:
        return None, f"{slot.name}: labels do not match the selector ({', '.join(missing)})"
    no = also(slot) if also is not None else None
    if no:
        return None, no
    short = slot.host_room(res.cpu_count, res.memory_gb)
    if short:
        return None, f"{slot.name}: {short}"
    types = slot.types_for(wanted, res.gpu_memory_gb)
    if not types:
        return None, (f"{slot.name}: no GPU of " + ("/".join(t or "any" for t in wanted))
                      + (f" with {res.gpu_memory_gb:g} GB" if res.gpu_memory_gb else ""))
    options = [(slot.free_count(t) - res.gpu_count if res.gpu_count else 0, slot.tasks, slot.name, i, t)
               for i, t in enumerate(types) if slot.fits(res.gpu_count, t)]
    if not options:
        return None, f"{slot.name}: {slot.why_not(res.gpu_count, types[0])}"
    return min(options), None


def _labels(wanted: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(wanted.items()))


def _place_constrained(name, eff, candidates, res, wanted, ident, action, code, why, stale, base, resume_from,
                       fallback, entry, book) -> list[Change]:
    """A run with a selector, a least GPU memory or several acceptable GPU models: every machine
    is judged (the room index serves the plain requests that make up the bulk of a queue)."""
    selector = eff.selector
    spec = entry.run.spec
    best, rejected, fitting = None, [], []
    def affinity(slot: Slot) -> str | None:
        if spec.affinity and not book.runs_with(slot.name, spec.affinity, name):
            return f"{slot.name}: no live run with {_labels(spec.affinity)} (affinity)"
        if spec.antiAffinity and book.runs_with(slot.name, spec.antiAffinity, name):
            return (f"{slot.name}: runs {', '.join(book.runs_with(slot.name, spec.antiAffinity, name))} "
                    f"with {_labels(spec.antiAffinity)} (anti-affinity)")
        return None

    for slot in candidates:
        option, no = _judge(slot, res, wanted, selector, affinity)
        if option is None:
            rejected.append(no)
            continue
        fitting.append(slot.name)
        if best is None or option < best[0]:
            best = (option, slot)
    if best is not None:
        (left, _, _, _, t), slot = best
        gpus = slot.hold(res, t)
        book.placed_on(slot.name, name)
        model = f" {t}" if t else ""
        considered = [f"{slot.name}: chosen (owned" + (f"; {left}{model} GPU(s) left free)" if res.gpu_count else ")")]
        considered += [f"{n}: fits, ranked lower" for n in fitting if n != slot.name][:SHOWN]
        considered += _shown(rejected)
        return [Change(name, action, code, why, "Running", identity=ident, machine=slot.name, backend=eff.backend,
                       gpus=gpus, kill=stale, resume_from=resume_from, considered=considered, **base)]
    shown = _shown(rejected)
    if fallback:
        from .rentals import place_rental

        out = place_rental(book, name, entry, eff, book.previous.get(name), ident, action, code, why, stale, base,
                           resume_from, target_any=True)
        out[-1].considered = shown + ["owned machines are full: renting"] + out[-1].considered
        return out
    return [Change(name, Action.WAIT, "NoCapacity", "no capacity: " + "; ".join(shown), "Pending", identity=ident,
                   kill=stale, retry_after=30.0, considered=shown, **base)]


def _preempt(name, entry, desired, candidates, res, ident, stale, base, book) -> Change | None:
    """Make room on one owned machine by stopping runs of lower priority, if the Policy allows it
    and it is enough: fewest victims first, then the lowest victim priority, then the machine's
    name. The victims are recorded in the book (their own change becomes a stop, back to Pending);
    this run waits for them and is placed on a later pass, before them (its priority is higher)."""
    from .quota import priority_of

    policy = desired.policy
    if policy is None or not policy.spec.preemption.enabled:
        return None
    mine, mine_class = priority_of(desired, entry)
    rule = policy.spec.preemption
    world, now = book.world, book.now
    best = None
    for slot in candidates:
        obs = world.machines.get(slot.name)
        if obs is None or not slot.reachable or slot.max_tasks == 0 or slot.draining is not None:
            continue
        victims = []
        for r in obs.runs.values():
            p = parse(r.identity)
            if not r.alive or p is None or p.name in book.preempted or p.name == name:
                continue
            value, _ = priority_of(desired, desired.runs.get(p.name))
            if value >= mine or (r.started_at is not None and now - r.started_at < rule.minRuntimeSeconds):
                continue
            victims.append((value, -(r.started_at or 0.0), p.name, r))
        victims.sort(key=lambda v: v[:3])
        free = slot.free_count(res.gpu_type)
        tasks = slot.tasks
        chosen = []
        wanted = {i for i, t in slot.gpu_types.items() if res.gpu_type is None or t.lower() == res.gpu_type.lower()}
        for v in victims:
            if free >= res.gpu_count and (slot.max_tasks is None or tasks < slot.max_tasks):
                break
            chosen.append(v)
            free += len(set(v[3].gpus) & wanted)
            tasks -= 1
        if not (free >= res.gpu_count and (slot.max_tasks is None or tasks < slot.max_tasks)) or not chosen:
            continue
        key = (len(chosen), max(v[0] for v in chosen), slot.name)
        if best is None or key < best[0]:
            best = (key, slot, chosen)
    if best is None:
        return None
    _, slot, chosen = best
    names = []
    for value, _, victim, r in chosen:
        book.preempted[victim] = (Kill(slot.name, r.identity, r.workspace, rule.graceSeconds),
                                  f"preempted by {name} ({mine_class or mine}) to make room on {slot.name}; "
                                  "it runs again when there is room, resuming from its last checkpoint")
        names.append(r.identity)
    return Change(name, Action.WAIT, "Preempting",
                  f"stopping {', '.join(names)} (lower priority) on {slot.name} to make "
                  "room; placed there once they have stopped", "Pending", identity=ident, kill=stale,
                  retry_after=max(1.0, rule.graceSeconds / 4), machine=None,
                  considered=[f"{slot.name}: room after preempting {', '.join(names)}"], **base)


def _accounted(plan: Plan) -> set[str]:
    """Identities some change of the plan already deals with."""
    covered: set[str] = set()
    for c in plan.changes:
        covered.update(k.identity for k in c.kill)
        covered.update(k.identity for k in c.cleanup)
        if c.collect_first is not None:
            covered.add(c.collect_first.identity)
        if c.identity:
            covered.add(c.identity)
    return covered


def _attempt(ident: str) -> str:
    """The attempt a node's identity belongs to (the identity itself for a one-machine attempt)."""
    p = parse(ident)
    return str(p) if p is not None else ident


def _fences(world: ObservedWorld, protected: set[str], covered: set[str], known: set[str], now: float,
            orphan_grace: float, warnings: list[str]) -> list[Change]:
    """Live instances no change accounts for (``covered``): an old attempt that came back, a
    foreign leftover. ``protected``: runs whose spec is invalid; what they run is left alone.

    An instance of a run the repository does not know at all (``known``: no spec, no status) is
    stopped only once it has run ``orphan_grace`` seconds, with a warning until then: it may
    belong to a newer checkout than this one. Anything not named like a run identity is never
    reported by the probe, so never touched."""
    out = []
    for m in world.machines.values():
        if not m.reachable:
            continue
        for ident, r in sorted(m.runs.items()):
            if r.alive and ident not in covered and _attempt(ident) not in covered:
                p = parse(ident)
                if p is not None and p.name in protected:
                    continue
                if p is not None and p.name not in known and r.started_at is not None:
                    until = r.started_at + orphan_grace
                    if now < until:
                        warnings.append(f"{ident} runs on {m.name} but no spec or status names {p.name}; "
                                        f"it is stopped at {iso(until)} unless a spec claims it")
                        continue
                why = (f"{ident} is alive on {m.name} but no spec or status names {p.name}"
                       if p is not None and p.name not in known else
                       f"{ident} is alive on {m.name} but is not the run's current instance")
                out.append(Change(p.name if p else ident, Action.TERMINATE, "Fenced", why,
                                  None, p.generation if p else 0, p.attempt if p else 0,
                                  kill=[Kill(m.name, ident, r.workspace)]))
    return out


def _leftovers(plan: Plan, world: ObservedWorld, protected: set[str], known: set[str],
               covered: set[str]) -> list[Change]:
    """Finished or never-started workspaces that are no run's current instance: collect and clean.

    A fenced instance, a lost one, or a staged bundle a crash left behind would otherwise stay on
    its machine for ever (and keep its run from settling). Each is collected once: its logs are
    fetched into the local bundle folder and its workspace is marked collected. The workspace is
    removed when nothing can need it again: a bundle that never started, an instance of another
    generation than the run's current one (retries resume only within a generation), or one of a
    run the repository does not know at all. Earlier attempts of the current generation stay until
    the run's final collection removes them with the rest.
    """
    current_gen = {c.name: c.generation for c in plan.changes if c.phase is not None}
    out = []
    for m in world.machines.values():
        if not m.reachable:
            continue
        for ident, r in sorted(m.runs.items()):
            if r.alive or r.collected or r.state == "unknown" or ident in covered or _attempt(ident) in covered:
                continue
            p = parse(ident)
            if p is None or p.name in protected:
                continue
            # A local workspace is also the attempt's local record (remote ones are fetched into
            # one): it stays, marked collected, while its run is known.
            remove = (r.state == "staged" or p.name not in known
                      or (m.name != LOCAL and current_gen.get(p.name) != p.generation))
            what = "staged but never started" if r.state == "staged" else r.state
            out.append(Change(p.name, Action.COLLECT, "Leftover",
                              f"{ident} on {m.name} ({what}) is not the run's current instance; "
                              + ("collecting and removing it" if remove else "collecting it"),
                              None, p.generation, p.attempt, identity=ident, machine=m.name,
                              workspace=r.workspace, remove=remove, ran=r.state != "staged"))
    return out


def _short(digest: str | None) -> str:
    return (digest or "none").removeprefix("sha256:")[:8]


def dumps(plan: Plan) -> str:
    return json.dumps(plan.to_json(), indent=2, sort_keys=True)
