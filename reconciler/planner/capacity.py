"""Room on owned machines: what each machine has free, which machines a request may use, and the
index that finds the best of them without looking at every one.

The numbers start from the Fleet and the observed machines and shrink as one plan places runs; the
same room decides every placement, so a plan never hands out a GPU twice.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable

from reconciler.core.identity import parse
from reconciler.core.names import LOCAL
from reconciler.core.observed import ObservedWorld
from reconciler.core.plan import PlanSettings
from reconciler.spec.load import DesiredState
from reconciler.spec.resolve import effective


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
    gpu_error: str | None = None  # foreign_gpus: avoid and its GPUs' processes unknown: none is handed out
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
    # Shared by one plan's slots: how many times any of them changed (a verdict computed at one
    # count holds while it stays; see placement.py's constrained memo). None: not counted.
    room: list | None = field(default=None, repr=False, compare=False)
    _of_type: dict = field(default_factory=dict, repr=False, compare=False)  # GPU type → its GPU indexes

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
        if self.gpu_error:  # foreign_gpus: avoid, and who uses the GPUs is unknown: none is free
            return []
        of_type = self._of_type
        if not of_type:  # the machine's GPUs do not change within a plan: sorted and sorted by type once
            of_type[None] = every = sorted(self.gpu_types)
            for i in every:
                of_type.setdefault(self.gpu_types[i].lower(), []).append(i)
        used = self.used_gpus
        return [i for i in of_type.get(gpu_type.lower() if gpu_type else None, ()) if i not in used]

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
            if self.gpu_error:
                others = f" (GPUs withheld, foreign_gpus: avoid: {self.gpu_error})"
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
        if self.room is not None:
            self.room[0] += 1

    def take(self, gpu_count: int, gpu_type: str | None) -> list[int]:
        got = self._free(gpu_type)[:gpu_count]
        self.used_gpus.update(got)
        self.tasks += 1
        counts = self._counts
        if got and counts:
            # The counts _free would give now, kept rather than rebuilt: each GPU taken was free, so
            # it leaves the count of its own type and that of any type (the room index re-reads
            # every type's count after each placement). GPUs of one asked-for type are all of it.
            if gpu_type:
                key = gpu_type.lower()
                if key in counts:
                    counts[key] -= len(got)
            else:
                types = self.gpu_types
                for i in got:
                    key = types[i].lower()
                    if key in counts:
                        counts[key] -= 1
            if None in counts:
                counts[None] -= len(got)
        if self.room is not None:
            self.room[0] += 1
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
    room = [0]
    for slot in slots.values():
        slot.room = room
    memo: dict = {}  # live runs of equal resources share one resolution
    for name, obs in world.machines.items():
        slot = slots.get(name)
        if slot is None:
            continue
        slot.reachable, slot.error = obs.reachable, obs.error
        slot.draining = obs.draining
        # A GPU someone uses by hand is not free, whatever the fleet says (foreign_gpus: avoid).
        slot.foreign_gpus = set(obs.foreign_gpus)
        slot.used_gpus.update(obs.foreign_gpus)
        slot.gpu_error = obs.gpu_error  # who uses its GPUs is unknown: fail closed (_free)
        for r in obs.runs.values():
            if r.alive:
                slot.tasks += 1
                slot.used_gpus.update(r.gpus)
                if slot.cpu_total is not None or slot.memory_total is not None:
                    p = parse(r.identity)
                    entry = desired.runs.get(p.name) if p is not None else None
                    template = desired.templates.get(entry.run.spec.template) if entry is not None else None
                    if template is not None:
                        res = effective(entry.run, template, memo).resources
                        slot.cpu_used += res.cpu_count or 0
                        slot.memory_used += res.memory_gb or 0.0
    return slots

SHOWN = 8  # machines an explanation names one by one; the rest are counted


def _shown(lines: list[str]) -> list[str]:
    """The first SHOWN verdicts, and how many more there are."""
    return lines[:SHOWN] + ([f"… and {len(lines) - SHOWN} more"] if len(lines) > SHOWN else [])


class RoomIndex:
    """Which candidate machines have room, by free GPUs of a type, so that placing a run costs a
    few look-ups rather than a look at every machine. The choice is the one a scan of every
    machine would make: fewest matching GPUs left free, then fewest tasks, then name (for a run
    without GPUs: fewest tasks, then name).

    Per GPU type, each available machine has an entry in the heap of its free-GPU number: one int,
    tasks * machines + its rank by name, so that the least entry is the machine with the fewest
    tasks, then the first by name (ints: cheap to compare, nothing allocated per entry). A
    placement pushes the one machine it took to where it stands now; the entry it leaves behind
    is dropped when it reaches the top of its heap (it is no longer the machine's entry). A count
    per free-GPU number says which heap holds the best machine: the first with any, from the
    number asked for up."""

    def __init__(self, candidates: list[Slot]):
        self.candidates = candidates
        self.by_name = {s.name: s for s in candidates}
        names = sorted(self.by_name)
        self.rank = {n: r for r, n in enumerate(names)}  # a machine's place in name order
        self.slot_of = [self.by_name[n] for n in names]  # rank → its Slot
        self.of_key: dict = {}  # gpu type key → its _Room

    def _room(self, key: str | None) -> "_Room":
        room = self.of_key.get(key)
        if room is None:
            room = self.of_key[key] = _Room(key, self.slot_of)
        return room

    def best(self, gpu_type: str | None, count: int) -> Slot | None:
        r = self._room(gpu_type.lower() if gpu_type else None).best(count)
        return self.slot_of[r] if r is not None else None

    def fitting(self, gpu_type: str | None, count: int) -> int:
        return sum(self._room(gpu_type.lower() if gpu_type else None).counts[count:])

    def fitting_names(self, gpu_type: str | None, count: int) -> list[str]:
        """The machines ``fitting`` counts, by name (asked only when there are a few)."""
        room = self._room(gpu_type.lower() if gpu_type else None)
        free_of, slot_of = room.free_of, self.slot_of
        return [slot_of[r].name for r in sorted(room.ranks_from(count)) if free_of[r] >= count]

    def changed(self, s: Slot) -> None:
        r = self.rank[s.name]
        available = s.available()  # the same for every GPU type: asked once
        code = s.tasks * len(self.slot_of) + r
        for key, room in self.of_key.items():
            if not available:
                room.leave(r)
                continue
            f = s.free_count(key)
            if room.code_of[r] != code or room.free_of[r] != f:
                room.move(r, f, code)


class _Room:
    """One GPU type's part of a RoomIndex (see there)."""

    __slots__ = ("free_of", "code_of", "counts", "heaps", "size")

    def __init__(self, key: str | None, slot_of: list[Slot]):
        n = self.size = len(slot_of)
        self.free_of = free_of = [-1] * n  # rank → its free GPUs of the type; -1: not available
        self.code_of = code_of = [-1] * n  # rank → its entry, tasks * n + rank; -1: none
        self.counts: list[int] = []  # free GPUs → how many available machines have that many
        self.heaps: list[list[int]] = []  # free GPUs → the heap of entries
        for r, s in enumerate(slot_of):
            if s.available():
                f = s.free_count(key)
                self._grow(f)
                free_of[r], code_of[r] = f, s.tasks * n + r
                self.counts[f] += 1
                self.heaps[f].append(code_of[r])
        for heap in self.heaps:
            heapq.heapify(heap)

    def _grow(self, f: int) -> None:
        while f >= len(self.counts):
            self.counts.append(0)
            self.heaps.append([])

    def best(self, count: int) -> int | None:
        """The rank of the best available machine with at least ``count`` free GPUs, or None."""
        counts, heaps, free_of, code_of, pop = self.counts, self.heaps, self.free_of, self.code_of, heapq.heappop
        best = None
        for f in range(count, len(counts)):
            if not counts[f]:
                continue
            heap = heaps[f]
            while True:  # a machine counted here has its entry in this heap: the loop ends
                e = heap[0]
                r = e % self.size
                if code_of[r] == e and free_of[r] == f:
                    break
                pop(heap)  # the machine left this entry since
            if count:
                return r  # the fewest free GPUs that fit: this heap holds the best
            if best is None or e < best:
                best = e  # without GPUs: the fewest tasks, then the name, over every free number
        return best % self.size if best is not None else None

    def ranks_from(self, count: int) -> set[int]:
        """Every rank with an entry in a heap of ``count`` free GPUs or more (stale ones too)."""
        size = self.size
        return {e % size for heap in self.heaps[count:] for e in heap}

    def leave(self, r: int) -> None:
        f = self.free_of[r]
        if f >= 0:
            self.counts[f] -= 1
            self.free_of[r] = self.code_of[r] = -1

    def move(self, r: int, f: int, code: int) -> None:
        old = self.free_of[r]
        if old != f:
            if old >= 0:
                self.counts[old] -= 1
            if f >= len(self.counts):
                self._grow(f)
            self.counts[f] += 1
            self.free_of[r] = f
        self.code_of[r] = code
        heapq.heappush(self.heaps[f], code)


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
