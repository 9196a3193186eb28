"""A daemon's pass woken by an edit of a few runs looks afresh at those runs on this machine only.

Why: observing this machine in full (every workspace judged, every process on the host scanned)
was most of the time from an edited spec to its process. The runs whose spec came, went or changed
since the last pass are the pass's *focus*; their workspaces are probed afresh, and the rest of
this machine's report is the one kept from its last full probe (machines/local_memo.py, which says
when it may not be used), so the /proc scan is made only when a focused run has a workspace that
needs it (an edit of a running run: its attempts must be seen, and fenced, as in any pass).

What keeps this as safe as a full look:

- only a long-lived reconciler (the daemon) focuses; ``reconcile --once`` looks at everything;
- only when this machine is the only one (no Fleet, Provider, Storage or Slurm template) and no
  file of another kind than Run changed;
- the kept report is at most ``resync_interval`` old and nothing was done on this machine through
  this process since it was taken: a pass that acted there probes it in full again at its end
  (``after_apply``), off the path of its launches;
- a workspace new in the root since is probed afresh whatever its name (another reconciler's
  launch, a look-alike): what takes room on this machine is never missed;
- every kept entry that could have moved is checked (a stat or two, and the wrapper's own
  ``/proc`` entry): a running workspace whose result appeared or whose wrapper no longer leads its
  process group (it died, or was killed outside the reconciler), one without a pid yet or in a
  container, a staged one launched since: that run is probed afresh too, so a death is seen in
  the pass that comes next, as before;
- a plan that would act on a run not probed afresh (a relaunch, a stop, a fence, a removal) is
  not applied: the pass looks at this machine in full and plans again (``widen``), so nothing is
  ever started or stopped on an older look than a full pass would have had.

What a focused pass does not see, until the next full look (at most ``resync_interval`` later, or
at the end of any pass that acts here): a process started by hand with the identity of an attempt
that has ended and shows no process (nothing of the attempt can start one: a process carries an
identity only if the wrapper's job or one of its descendants started it, and those were counted).
"""

from __future__ import annotations

import logging

from reconciler.core.names import LOCAL

log = logging.getLogger("reconciler")

FOCUS_MAX = 256  # changed runs: more than this (a large pull) is a full look anyway


class State:
    """What the next pass compares with: each run's digest (or its invalidity) and the other
    kinds' objects, as the last pass loaded them; and this pass's focus (None: a full look)."""

    def __init__(self) -> None:
        self.runs: dict[str, str] | None = None
        self.context: tuple | None = None
        self.focus: frozenset[str] | None = None
        self.transport = None


def _runs(desired) -> dict[str, str]:
    runs = {name: e.digest for name, e in desired.runs.items()}
    runs.update((name, "invalid: " + why) for name, why in desired.invalid.items())
    return runs


def _context(desired) -> tuple:
    """The objects of the other kinds, by identity: the spec cache keeps an unchanged file's."""
    return (tuple(map(id, desired.templates.values())), tuple(map(id, desired.fleets.values())),
            tuple(map(id, desired.providers.values())), tuple(map(id, desired.storages.values())),
            id(desired.policy), tuple(sorted(desired.invalid_providers)))


def changed(s: State, desired, tree_changed: bool) -> frozenset[str] | None:
    """The runs that came, went or changed since the last pass (None: no comparison possible, or
    something else changed); records this pass's for the next."""
    if not tree_changed and s.runs is not None:
        return frozenset()  # (an invalidity that a new commit moved joins a later focus: safe)
    runs, context = _runs(desired), _context(desired)
    before, before_context = s.runs, s.context
    s.runs, s.context = runs, context
    if before is None or context != before_context:
        return None
    out = {n for n, d in runs.items() if before.get(n) != d}
    out.update(n for n in before if n not in runs)
    return frozenset(out)


def begin(rec, desired, previous: dict, pool) -> None:
    """Before the pass observes: set this machine's transport to keep its reports and, when the
    pass may focus, the runs to look at afresh."""
    if rec.connections is None:  # a process of its own (--once) looks at everything, and keeps nothing
        return
    s = rec.focus
    s.focus, s.transport = None, None
    focus = changed(s, desired, rec.cache.tree_changed)
    t = pool.get(LOCAL)
    if not hasattr(t, "memo_age"):
        return
    t.memo_age, t.focus = rec.cfg.resync_interval, None
    s.transport = t
    if not focus or len(focus) > FOCUS_MAX or desired.fleets or desired.providers or desired.storages \
            or desired.invalid_providers or any(tp.placement.slurm is not None for tp in desired.templates.values()):
        return
    if pool.machines(previous) != [LOCAL]:
        return
    t.focus = s.focus = focus


def observed(rec) -> frozenset[str] | None:
    """The runs the pass's observation looked at afresh: its focus, and the runs whose kept
    entries it found moved (None: it looked at everything)."""
    s = rec.focus
    if s.focus is not None:
        s.focus = s.transport.focus if s.transport is not None else None
    return s.focus


def note(rec) -> None:
    """Say in the debug log what the pass's observation looked at afresh."""
    focus = observed(rec)
    if focus is not None:
        log.debug("this machine: looked afresh at %d run(s) only: %s", len(focus), ", ".join(sorted(focus)[:10]))


def widen(rec, plan) -> bool:
    """Whether a focused pass planned to act on a run outside its focus: it must then look at
    this machine in full and plan again. Sets the transport to do so."""
    focus = observed(rec)
    if focus is None or not any(c.mutates and c.name not in focus for c in plan.changes):
        note(rec)
        return False
    s = rec.focus
    s.focus = None
    s.transport.focus = None
    return True


def after_apply(rec, plan) -> None:
    """A pass that acted on this machine probes it in full again, so the next focused pass starts
    from a report that shows what this one did (off the path of this pass's launches)."""
    s = rec.focus
    t, s.transport = s.transport, None
    if t is None or not any(c.mutates for c in plan.changes):
        return
    from reconciler.machines import local_memo

    try:
        local_memo.refresh(t.root)
    except Exception as e:  # noqa: BLE001 - the launches are done: without a report, the next pass looks in full
        local_memo.forget(t.root)
        log.warning("this machine could not be looked at after the pass's launches: %s: %s", type(e).__name__, e)
