"""Machines ruled out for a run: a permanent end that is the machine's, not the spec's.

Why: a precheck that finds no interpreter (or one this login cannot run, or a virtualenv whose
interpreter lies in a folder it cannot read), no CUDA driver or none of the GPUs the run was
given, a docker that cannot give GPUs or lacks the image, says nothing about the run's spec.
Retrying on that machine burns retries on something that cannot change by itself, and failing the
run is wrong when another machine could take it. So such an end (``ObservedRun.scope ==
"machine"``) rules the machine out for the run:

- the status keeps the list (``ruled_out``: machine, reason, attempt), so every later pass, and a
  ``--once`` from cron on another host, agrees; a new generation (the spec changed) starts with none;
- the next attempt is placed on another machine (placement skips the ruled-out ones) and is not
  counted as a retry: the run did nothing wrong, and the machines there are bound how many such
  attempts there can be;
- when no other machine can take it (local placement, a Slurm cluster, every fleet machine of the
  target ruled out), the run fails with the reason, as any permanent failure.

A run on several machines (a gang) is left to the restart policy: its end names no single node.
"""

from __future__ import annotations

from reconciler.core.actions import Action
from reconciler.core.identity import parse
from reconciler.core.plan import Change, Kill
from reconciler.core.runstatus import RunStatus

from .book import PlanBook
from .capacity import _candidates

MAX_RULED_OUT = 50  # entries one status keeps (a fleet larger than that is ruled out from its newest 50)
# Rentals ruled out before the run fails: each rental is a new machine, so without a bound an offer
# whose machines all lack the driver would rent one after the other, none counted as a retry.
RENTAL_TRIES = 3


def recorded(prev: RunStatus | None, generation: int) -> list[dict]:
    """The machines ruled out for this generation, as the status keeps them; an entry that is not
    one (the status file is anyone's who can push) is skipped."""
    entries = getattr(prev, "ruled_out", None) if prev is not None and prev.generation == generation else None
    out = []
    for e in entries if isinstance(entries, list) else ():
        if isinstance(e, dict) and isinstance(e.get("machine"), str) and e["machine"]:
            attempt = e.get("attempt")
            out.append({"machine": e["machine"][:253], "reason": str(e.get("reason") or "")[:300],
                        "attempt": attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else 0})
    return out[-MAX_RULED_OUT:]


def machines(book, name: str, ident: str) -> set[str]:
    """The machines the run may not use: its status's, and those this plan ruled out."""
    prev = book.previous.get(name)
    planned = book.ruled_out.get(name)
    if not planned and (prev is None or not getattr(prev, "ruled_out", None)):
        return set()  # the common case, without parsing the identity
    p = parse(ident)
    found = {e["machine"] for e in recorded(prev, p.generation)} if p is not None else set()
    return found | (planned or set())


def without(book, name: str, ident: str, candidates: list) -> tuple[list, bool]:
    """``candidates`` less the run's ruled-out machines, and whether any were (such a run is
    judged machine by machine: the plan's room index and memo serve the candidate lists as
    they are)."""
    ruled = machines(book, name, ident) if book is not None else set()
    if not ruled:
        return candidates, False
    return [s for s in candidates if s.name not in ruled], True


def _another(book, entry, ruled: set[str]) -> bool:
    """Whether a machine the run may still use exists for its placement (room aside: a machine
    that is busy now can take it later)."""
    template = book.desired.templates.get(entry.run.spec.template)
    if template is None or template.placement.slurm is not None or template.placement.kind == "local":
        return False
    if template.placement.kind == "ssh":
        eff = book.effective(entry)
        if any(s.name not in ruled for s in _candidates(book.slots, eff.placement, eff.target)):
            return True
    rented = sum(1 for m in ruled if m not in book.slots)  # ruled-out machines that are no fleet's
    return (template.placement.kind == "rental" or template.placement.fallback == "rental") and rented < RENTAL_TRIES


def elsewhere(name, entry, prev, ident, obs, why, launch, base) -> tuple[list[Change] | None, list[dict] | None]:
    """After an end: the next attempt on another machine when the end was the machine's (None
    otherwise), and the run's ruled-out machines to record (None: unchanged)."""
    if obs is None or not obs.permanent or obs.scope != "machine" or obs.nodes or not obs.machine:
        return None, None
    # The plan's book, bound into the run's launch (lifecycle.py), so the lifecycle passes nothing new.
    book = next((a for a in getattr(launch, "args", ()) if isinstance(a, PlanBook)), None)
    if book is None:
        return None, None
    ruled = recorded(prev, base["generation"])
    if all(e["machine"] != obs.machine for e in ruled):
        ruled = (ruled + [{"machine": obs.machine, "reason": (obs.message or why)[:300],
                           "attempt": base["attempt"]}])[-MAX_RULED_OUT:]
    names = {e["machine"] for e in ruled}
    book.ruled_out[name] = names
    if not _another(book, entry, names):
        return None, ruled
    changes = launch(base["attempt"] + 1, "Relaunch", f"{why}; {obs.machine} is ruled out for this run: "
                                                      "placing it on another machine (not counted as a retry)")
    c = changes[-1]
    c.ruled_out = ruled
    if not obs.collected and c.action in (Action.RELAUNCH, Action.PROVISION):
        c.collect_first = Kill(obs.machine, obs.identity, obs.workspace)  # its logs and precheck report
    return changes, ruled


def not_retries(prev: RunStatus | None, generation: int) -> int:
    """Attempts of this generation that ended on a ruled-out machine: not counted as retries."""
    return len(recorded(prev, generation))
