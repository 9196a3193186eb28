"""What a pass adds to its plan from what only the engine knows, before it applies it: the holds
for launches an earlier reconciler may have left in flight (inflight.py), the removal of
ended runs' workspaces once git holds their end (endclean.py), and a full look at this machine
where a look focused on the edited runs planned an act on another (focus.py)."""

from __future__ import annotations

import logging
import time

from . import endclean, focus, inflight

log = logging.getLogger("reconciler")


def journal(rec) -> inflight.Journal:
    """The reconciler's launch journal, read from its checkout's state folder once per process."""
    j = rec.__dict__.get("inflight")
    if j is None:
        j = rec.inflight = inflight.Journal(rec.cfg)
    return j


def before_apply(rec, dry_run: bool, desired, world, plan, previous: dict, skipped: set, pool, now: float):
    """The pass's (world, plan, now) to apply. The daemon holds the starts a predecessor's launch
    could collide with across passes (their waits in the statuses); a process of its own
    (``--once``: no connections kept between passes) waits them out inside its pass, then looks
    at the machines again and plans anew, so that a fresh clone's single pass still makes
    progress. A dry run's are left as they are: it launches nothing, and the ``--once`` it
    previews would wait its holds out, so its plan shows the starts."""
    if dry_run:
        return world, plan, now
    j = journal(rec)
    j.begin(now, bool(previous or skipped))
    until = inflight.hold(plan, world, previous, j, now)
    if until is not None and rec.connections is None:
        log.info("waiting %.1fs for launches an earlier reconciler may have left in flight", until - time.time())
        time.sleep(max(0.0, until - time.time()))
        now = time.time()
        world = rec._observe_world(desired, previous, skipped, pool, rec.cfg.repo / "status", now)
        plan = rec._plan(desired, world, previous, skipped, now)
        inflight.hold(plan, world, previous, j, now)  # nothing is left to hold by now
    endclean.add_removals(rec.cfg, plan, world, previous)
    if focus.widen(rec, plan):
        # A look focused on the edited runs, and a plan that acts on another run: that act needs
        # the full look a pass would have had (engine/focus.py), so the pass looks and plans again.
        world = rec._observe_world(desired, previous, skipped, pool, rec.cfg.repo / "status", now)
        plan = rec._plan(desired, world, previous, skipped, now)
        inflight.hold(plan, world, previous, j, now)
        endclean.add_removals(rec.cfg, plan, world, previous)
    return world, plan, now


def after_apply(rec, plan) -> None:
    """After the pass's launches answered: the journal's answers written in one go, and this
    machine probed in full again if the pass acted there (engine/focus.py)."""
    j = rec.__dict__.get("inflight")
    if j is not None:
        j.flush()
    focus.after_apply(rec, plan)


def kept(instance, cfg) -> bool:
    """Whether an ended instance's workspace is kept only until git holds its end (endclean.py):
    its run does not settle meanwhile, so later passes still look at it and remove it then."""
    return endclean.awaits_removal(instance, cfg)
