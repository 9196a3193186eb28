"""Placing a launch on owned machines: the best machine with room, a constrained request judged
machine by machine, and what happens when none has room (preemption, a rental, or a wait).
"""

from __future__ import annotations

from reconciler.core.actions import Action
from reconciler.core.plan import Change, bulk_change

from .capacity import SHOWN, RoomIndex, Slot, _candidates, _judge, _shown
from .gangs import _place_gang
from .preemption import _preempt
from .rentals import place_rental
from .ruled_out import without as without_ruled_out


def _launch_action(stale: list, code: str) -> Action:
    """A launch that replaces something (stale instances, a failed attempt, another spec) is a relaunch."""
    return Action.RELAUNCH if (stale or code in RELAUNCH_CODES) else Action.LAUNCH


RELAUNCH_CODES = ("Relaunch", "SpecChanged", "GenerationTaken")


class Shape:
    """What every run of one effective spec shares when it is placed on owned machines, worked out
    once per plan: 10,000 queued runs are mostly a handful of shapes, so the per-run work is a
    look-up rather than reading the spec models again."""

    __slots__ = ("eff", "candidates", "index", "fallback", "gang", "wanted", "constrained", "memo_key", "gpu_type",
                 "gpu_count", "wanted_gpus")

    def __init__(self, eff, template, book):
        res = eff.resources
        self.gpu_type, self.gpu_count = res.gpu_type, res.gpu_count
        self.wanted_gpus = res.gpu_count * res.nodes  # what a launch counts against the team's quota
        self.eff = eff  # an Effective belongs to one template (its memo key names it)
        self.candidates = _candidates(book.slots, eff.placement, eff.target, book.candidates)
        self.fallback = template.placement.fallback == "rental"
        self.gang = res.nodes > 1
        self.wanted = res.wanted_types()
        # Judged machine by machine (_place_constrained); a run's own affinity or ruled-out machines add to it.
        self.constrained = bool(len(self.wanted) > 1 or res.gpu_memory_gb is not None or eff.selector
                                or res.cpu_count or res.memory_gb)
        self.memo_key = (eff.placement, eff.target, (res.gpu_type or "").lower(), res.gpu_count)
        self.index = None
        if not self.gang and not self.constrained:
            self.index = book.rooms.get(id(self.candidates))
            if self.index is None:
                self.index = book.rooms[id(self.candidates)] = RoomIndex(self.candidates)


def _place(name, entry, desired, slots, ident, code, why, stale, base, resume_from, book, eff=None) -> list[Change]:
    """Owned machines: every candidate is judged (the explanation lists them all); among those
    with room, a GPU run goes where the fewest matching GPUs stay free (packing keeps whole
    machines free for big runs), others where the fewest tasks run; then by name. With
    ``fallback: rental`` a run no owned machine has room for now rents one. ``slots``: the
    book's (kept for the callers; the book is what is read)."""
    eff = eff or book.effective(entry)  # the caller's, resolved once per plan
    spec = entry.run.spec
    shape = book.shapes.get(id(eff))
    if shape is None or shape.eff is not eff:  # pinned: an id is not reused while the shape holds it
        shape = book.shapes[id(eff)] = Shape(eff, desired.templates[spec.template], book)
        if shape.index is not None and not shape.gang and not shape.constrained and shape.candidates:
            book.plain[id(eff)] = shape  # a new run of it may take launch.new_run's short way
    res = eff.resources
    candidates = shape.candidates
    candidates, ruled = without_ruled_out(book, name, ident, candidates)  # ruled_out.py: the machine's ends
    action = Action.RELAUNCH if (stale or code in RELAUNCH_CODES) else Action.LAUNCH  # as _launch_action
    fallback = shape.fallback
    if shape.gang:
        return [_place_gang(name, eff, candidates, res, ident, action, code, why, stale, base, resume_from, book)]
    if not candidates and not fallback:
        return [Change(name, Action.WAIT, "NoMachine", f"no machine matches target {eff.target!r}", "Pending",
                       identity=ident, kill=stale, retry_after=60.0, **base)]
    if shape.constrained or spec.affinity or spec.antiAffinity or ruled:
        # Without affinity (judged per run) or machines ruled out for this run, every run of the
        # shape is judged alike: its verdicts can be kept while no room changes.
        same = shape if not (spec.affinity or spec.antiAffinity or ruled) else None
        return _place_constrained(name, eff, candidates, res, shape.wanted, ident, action, code, why, stale, base,
                                  resume_from, fallback, entry, book, same)
    return _place_plain(name, entry, desired, shape, candidates, ident, action, code, why, stale, base,
                        resume_from, book)


def _place_plain(name, entry, desired, shape: Shape, candidates, ident, action, code, why, stale, base,
                 resume_from, book) -> list[Change]:
    """A plain request (one machine, a GPU count of one model, no selector, affinity or ruled-out
    machine): the room index's best machine, else the kept reason there is none."""
    # Within one plan capacity only shrinks: once a request found no room among these candidates,
    # the same request finds none again (10,000 waiting runs must not each judge every machine).
    known = book.no_room.get(shape.memo_key)
    if known is None:
        slot = shape.index.best(shape.gpu_type, shape.gpu_count)
        if slot is not None:
            return [_chosen(name, shape, slot, candidates, ident, action, code, why, stale, base, resume_from,
                            book)]
    return _without_room(name, entry, desired, shape, candidates, ident, action, code, why, stale, base, resume_from,
                         book, known)


def _without_room(name, entry, desired, shape: Shape, candidates, ident, action, code, why, stale, base,
                  resume_from, book, known) -> list[Change]:
    """A plain request the room index has no machine for: a preemption, a rental with ``fallback:
    rental``, else a wait. ``known``: the kept reason there is none (None: worked out now, and kept)."""
    if known is None:
        known = book.no_room[shape.memo_key] = _no_room(candidates, shape.eff.resources, none_fit=True)
    rejected, reason = known
    if not shape.fallback:
        pre = (_preempt(name, entry, desired, candidates, shape.eff.resources, ident, stale, base, book)
               if book.preempts else None)
        if pre is not None:
            pre.considered = rejected + pre.considered
            return [pre]
        # The explanation is the same for every run of this request: built once, each change its own list.
        return [bulk_change(name, Action.WAIT, "NoCapacity", reason, "Pending", base, ident, None, None, [], stale,
                            30.0, None, list(rejected))]
    out = place_rental(book, name, entry, shape.eff, book.previous.get(name), ident, action, code, why, stale,
                       base, resume_from, target_any=True)
    out[-1].considered = rejected + ["owned machines are full: renting"] + out[-1].considered
    return out


def _no_room(candidates: list[Slot], res, none_fit: bool = False) -> tuple[list[str], str]:
    """Why a plain request fits nowhere: the first machines' verdicts and how many more there
    are, and the wait's reason built from them. ``none_fit``: the room index found no candidate
    with room, so every one is without (only the first SHOWN are judged, for their verdicts)."""
    if none_fit:
        head = [(other.name, other.why_not(res.gpu_count, res.gpu_type)) for other in candidates[:SHOWN]]
        if all(why is not None for _, why in head):
            rejected = [f"{n}: {why}" for n, why in head]
            if len(candidates) > SHOWN:
                rejected.append(f"… and {len(candidates) - SHOWN} more machine(s) without room")
            return rejected, "no capacity: " + "; ".join(rejected)
    rejected, shown = [], 0
    for other in candidates:
        if not other.fits(res.gpu_count, res.gpu_type):
            shown += 1
            if shown <= SHOWN:
                rejected.append(f"{other.name}: {other.why_not(res.gpu_count, res.gpu_type)}")
    if shown > SHOWN:
        rejected.append(f"… and {shown - SHOWN} more machine(s) without room")
    return rejected, "no capacity: " + "; ".join(rejected)


def _chosen(name, shape: Shape, slot: Slot, candidates: list[Slot], ident, action, code, why, stale, base,
            resume_from, book) -> Change:
    """The launch on ``slot``, the machine a plain request goes to: its room taken, and the
    explanation (how many others fit, how many have no room)."""
    index, gpu_type, count = shape.index, shape.gpu_type, shape.gpu_count
    fitting = index.fitting(gpu_type, count)
    others = index.fitting_names(gpu_type, count) if fitting <= SHOWN + 1 else ()
    left = slot.free_count(gpu_type) - count
    gpus = slot.take(count, gpu_type)
    book.room_changed(slot)
    book.placed_on(slot.name, name)
    considered = [f"{slot.name}: chosen" + (f" (owned; {left} matching GPU(s) left free)"
                                            if count else f" (owned; {slot.tasks - 1} other task(s))")]
    if others:
        considered += [f"{n}: fits, ranked lower" for n in others if n != slot.name]
    if fitting > SHOWN + 1:
        considered.append(f"{fitting - 1} other machine(s) fit, ranked lower")
    if len(candidates) > fitting:
        considered.append(f"{len(candidates) - fitting} machine(s) without room")
    return bulk_change(name, action, code, why, "Running", base, ident, slot.name, shape.eff.backend, gpus, stale,
                       None, resume_from, considered)


def _labels(wanted: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(wanted.items()))


def _place_constrained(name, eff, candidates, res, wanted, ident, action, code, why, stale, base, resume_from,
                       fallback, entry, book, same=None) -> list[Change]:
    """A run with a selector, a least GPU memory or several acceptable GPU models: every machine
    is judged (the room index serves the plain requests that make up the bulk of a queue).
    ``same``: the run's Shape when every run of it is judged alike; a request of it that found no
    room is then not judged again until some machine's room changes (a queue of such runs
    waiting behind a full fleet costs one look-up each, not a look at every machine)."""
    room = candidates[0].room if candidates else None
    judged = book.judged.get(same) if same is not None and room is not None else None
    if judged is not None and judged[0] == room[0]:
        return _no_room_constrained(name, eff, entry, judged[1], ident, action, code, why, stale, base,
                                    resume_from, fallback, book)
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
        book.room_changed(slot)
        book.placed_on(slot.name, name)
        model = f" {t}" if t else ""
        considered = [f"{slot.name}: chosen (owned" + (f"; {left}{model} GPU(s) left free)" if res.gpu_count else ")")]
        considered += [f"{n}: fits, ranked lower" for n in fitting if n != slot.name][:SHOWN]
        considered += _shown(rejected)
        return [Change(name, action, code, why, "Running", identity=ident, machine=slot.name, backend=eff.backend,
                       gpus=gpus, kill=stale, resume_from=resume_from, considered=considered, **base)]
    shown = _shown(rejected)
    if same is not None and room is not None:
        book.judged[same] = (room[0], shown)
    return _no_room_constrained(name, eff, entry, shown, ident, action, code, why, stale, base, resume_from,
                                fallback, book)


def _no_room_constrained(name, eff, entry, shown, ident, action, code, why, stale, base, resume_from, fallback,
                         book) -> list[Change]:
    """A constrained request no owned machine can hold now (``shown``: the verdicts): a rental
    with ``fallback: rental``, else a wait."""
    if fallback:
        out = place_rental(book, name, entry, eff, book.previous.get(name), ident, action, code, why, stale, base,
                           resume_from, target_any=True)
        out[-1].considered = shown + ["owned machines are full: renting"] + out[-1].considered
        return out
    return [Change(name, Action.WAIT, "NoCapacity", "no capacity: " + "; ".join(shown), "Pending", identity=ident,
                   kill=stale, retry_after=30.0, considered=list(shown), **base)]
