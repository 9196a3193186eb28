"""A launch of a run: the wait while a secret is missing or the team is over its quota, then its
placement (a Slurm cluster, a rental, or owned machines) and the quota it uses.

Every launch of a run's lifecycle comes through here (a new run, a relaunch after a failure or a
preemption, a staged instance finished), so each one is judged by the same rules.
"""

from __future__ import annotations

from reconciler.core.actions import Action
from reconciler.core.identity import make
from reconciler.core.names import slurm_machine
from reconciler.core.plan import Change, Kill, bulk_change
from reconciler.core.runstatus import RunStatus
from reconciler.spec.load import DesiredState, RunEntry
from reconciler.spec.resolve import effective

from .book import PlanBook
from .placement import _chosen, _launch_action, _place, _without_room
from .quota import _offer_gpus
from .rentals import place_rental

STARTS = (Action.LAUNCH, Action.RELAUNCH, Action.PROVISION)  # what takes room and quota


def launch(name: str, entry: RunEntry, prev: RunStatus | None, desired: DesiredState, book: PlanBook,
           missing: list[str], stale: list[Kill], base: dict, gen: int, next_attempt: int, code: str, why: str,
           resume_from: str | None = None) -> list[Change]:
    """The changes of a launch: the run's own change last (a rental placement may put the
    release of a rental that timed out before it). The run's lifecycle binds the arguments up to
    ``gen``; the rest are the launch's own."""
    run = entry.run
    ident = make(name, gen, next_attempt)
    if missing:
        # Staging nothing and spending no attempt: the launch happens on the first pass after
        # the secret is set. Stale instances are still stopped: they run a spec not wanted.
        return [Change(name, Action.WAIT, "SecretMissing",
                       f"secret(s) {', '.join(missing)} not set on the reconciler host; "
                       f"{ident} launches once they are",
                       "Pending", identity=ident, kill=stale,
                       retry_after=30.0, **base)]
    if resume_from is None and next_attempt > 1 and getattr(run.spec.task, "resume", "never") == "auto":
        # A relaunch finished on a later pass (its rental was being provisioned, or it was
        # staged by a pass that died) resumes like the pass that decided it would have.
        resume_from = make(name, gen, next_attempt - 1)
    template = desired.templates[run.spec.template]
    eff = book.effective(entry) if book is not None else effective(run, template)
    quotas = getattr(book, "quotas", None)
    nbase = base if base["attempt"] == next_attempt else dict(base, attempt=next_attempt)
    wanted_gpus = eff.resources.gpu_count * eff.resources.nodes
    if quotas is not None:
        over = quotas.exceeded(name, wanted_gpus)
        if over:
            return [Change(name, Action.WAIT, "QuotaExceeded", over, "Pending", identity=ident,
                           kill=stale, retry_after=60.0, **nbase)]
    placement = template.placement
    if placement.slurm is not None:
        # The cluster's scheduler places it: the run is submitted, and waits in Slurm's queue
        # (with Slurm's reason in the status) rather than in this reconciler's.
        out = [_submit(name, placement.slurm, eff, ident, code, why, stale, nbase, resume_from)]
    elif placement.kind == "rental" and book is not None:
        action = _launch_action(stale, code)
        out = place_rental(book, name, entry, eff, prev, ident, action, code, why, stale, nbase, resume_from)
    else:
        out = _place(name, entry, desired, book.slots, ident, code, why, stale, nbase, resume_from, book, eff)
    c = out[-1]
    if quotas is not None and c.action in STARTS:
        _count(quotas, desired, name, c, wanted_gpus)
    return out


def new_run(name: str, entry: RunEntry, desired: DesiredState, book: PlanBook, missing: list[str]) -> list[Change]:
    """The launch of a new run, as lifecycle.new_run gives it (generation 1, attempt 1, nothing
    stale, no earlier attempt to resume), with the layers between taken out for the bulk of a
    queue: a plain request of a shape this plan has already placed on owned machines
    (``book.plain``: its ``placement.Shape`` has a room index) goes from the quota check straight
    to the room index, the same steps ``launch``, ``_place`` and ``_place_plain`` take for it.
    Every other run, and the first of each shape, takes ``launch``."""
    read = book.reads.get(name)  # the spec as PlanBook.read_runs read it: its models are not touched again
    if read is None:
        return launch(name, entry, None, desired, book, missing, [], {
            "generation": 1, "attempt": 1, "spec_digest": entry.digest, "spec_path": entry.rel}, 1, 1, "NewRun",
            "new run")
    eff = read[5]
    if eff is None:
        eff = book.effective(entry)
    shape = book.plain.get(id(eff))
    base = {"generation": 1, "attempt": 1, "spec_digest": read[2], "spec_path": read[3]}
    if shape is None or missing or read[4] or (book.ruled_out and book.ruled_out.get(name)):
        return launch(name, entry, None, desired, book, missing, [], base, 1, 1, "NewRun", "new run")
    ident = f"{name}-g1-a1"  # identity.make(name, 1, 1), without its tuple (tests/planner/test_bulk_change.py)
    quotas, wanted_gpus = book.quotas, shape.wanted_gpus
    if quotas is not None:
        over = quotas.exceeded_by(read[1], wanted_gpus)  # read[1]: the run's team, as quotas.team gives it
        if over:
            return [bulk_change(name, Action.WAIT, "QuotaExceeded", over, "Pending", base, ident, None, None, [], [],
                                60.0, None, [])]
    known = book.no_room.get(shape.memo_key)
    if known is None:
        slot = shape.index.best(shape.gpu_type, shape.gpu_count)
        if slot is not None:
            c = _chosen(name, shape, slot, shape.candidates, ident, Action.LAUNCH, "NewRun", "new run", [], base, None,
                        book)
            if quotas is not None:
                note = quotas.launched(read[1], wanted_gpus)
                if note:
                    c.considered.append(note)
            return [c]
    elif not shape.fallback and not book.preempts:
        # The wait _without_room gives a request that found no room before (most of a long queue).
        return [bulk_change(name, Action.WAIT, "NoCapacity", known[1], "Pending", base, ident, None, None, [], [],
                            30.0, None, list(known[0]))]
    out = _without_room(name, entry, desired, shape, shape.candidates, ident, Action.LAUNCH, "NewRun", "new run", [],
                        base, None, book, known)
    c = out[-1]
    if quotas is not None and c.action in STARTS:
        _count(quotas, desired, name, c, wanted_gpus)
    return out


def _count(quotas, desired: DesiredState, name: str, c: Change, wanted_gpus: int) -> None:
    """The launch's GPUs (a new rental's: its offer's) and price added to its team's usage; a
    launch past the team's own maxGpus says whose unused quota it borrows."""
    note = quotas.borrowing(name, wanted_gpus)
    if note:
        c.considered = c.considered + [note]
    gpus = wanted_gpus
    if c.rental and c.action == Action.PROVISION:
        gpus = _offer_gpus(desired, c.rental.get("provider"), c.rental.get("offer")) or gpus
    quotas.add(name, gpus, (c.rental or {}).get("price_per_hour") or 0.0 if c.action == Action.PROVISION else 0.0)


def _submit(name: str, s, eff, ident: str, code: str, why: str, stale: list[Kill], base: dict,
            resume_from: str | None) -> Change:
    """A launch on a Slurm cluster (``s``: the template's placement.slurm): submitted, not placed."""
    action = _launch_action(stale, code)
    where = slurm_machine(s)
    part = f"partition {s.partition}" if s.partition else "the default partition"
    return Change(name, action, code, why, "Pending", identity=ident, machine=where,
                  backend=eff.backend, kill=stale, resume_from=resume_from,
                  considered=[f"{where}: submitted to {part}; Slurm chooses the node(s)"], **base)
