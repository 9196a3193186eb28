"""Placing a launch on owned machines: the best machine with room, a constrained request judged
machine by machine, and what happens when none has room (preemption, a rental, or a wait).
"""

from __future__ import annotations

from reconciler.core.actions import Action
from reconciler.core.plan import Change
from reconciler.spec.resolve import effective

from .capacity import SHOWN, RoomIndex, Slot, _candidates, _judge, _shown
from .gangs import _place_gang
from .preemption import _preempt
from .rentals import place_rental


def _launch_action(stale: list, code: str) -> Action:
    """A launch that replaces something (stale instances, a failed attempt, another spec) is a relaunch."""
    return Action.RELAUNCH if (stale or code in ("Relaunch", "SpecChanged", "GenerationTaken")) else Action.LAUNCH


def _place(name, entry, desired, slots, ident, code, why, stale, base, resume_from, book=None,
           eff=None) -> list[Change]:
    """Owned machines: every candidate is judged (the explanation lists them all); among those
    with room, a GPU run goes where the fewest matching GPUs stay free (packing keeps whole
    machines free for big runs), others where the fewest tasks run; then by name. With
    ``fallback: rental`` a run no owned machine has room for now rents one."""
    template = desired.templates[entry.run.spec.template]
    eff = eff or effective(entry.run, template)  # the caller's, resolved once per plan
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
        return [_chosen(name, eff, res, slot, index, candidates, ident, action, code, why, stale, base, resume_from,
                        book)]
    if not fallback and book is not None:
        pre = _preempt(name, entry, desired, candidates, res, ident, stale, base, book)
        if pre is not None:
            pre.considered = rejected + pre.considered
            return [pre]
    if fallback:
        out = place_rental(book, name, entry, eff, book.previous.get(name), ident, action, code, why, stale, base,
                           resume_from, target_any=True)
        out[-1].considered = rejected + ["owned machines are full: renting"] + out[-1].considered
        return out
    return [Change(name, Action.WAIT, "NoCapacity", "no capacity: " + "; ".join(rejected), "Pending",
                   identity=ident, kill=stale, retry_after=30.0, considered=rejected, **base)]


def _chosen(name, eff, res, slot: Slot, index: RoomIndex | None, candidates: list[Slot], ident, action, code, why,
            stale, base, resume_from, book) -> Change:
    """The launch on ``slot``, the machine a plain request goes to: its room taken, and the
    explanation (how many others fit, how many have no room)."""
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
    return Change(name, action, code, why, "Running", identity=ident, machine=slot.name,
                  backend=eff.backend, gpus=gpus, kill=stale, resume_from=resume_from, considered=considered,
                  **base)


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
        out = place_rental(book, name, entry, eff, book.previous.get(name), ident, action, code, why, stale, base,
                           resume_from, target_any=True)
        out[-1].considered = shown + ["owned machines are full: renting"] + out[-1].considered
        return out
    return [Change(name, Action.WAIT, "NoCapacity", "no capacity: " + "; ".join(shown), "Pending", identity=ident,
                   kill=stale, retry_after=30.0, considered=shown, **base)]
