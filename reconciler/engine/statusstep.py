"""The status step of a pass: each change's status summarized and written where it moved.

Kept out of loop.py, which holds the pass's order; this holds what a status file gets and when
(progress alone waits for ``status_progress_interval``, a steady run costs one check).
"""

from __future__ import annotations

import logging
from pathlib import Path

from reconciler.core.runstatus import iso, parse_iso
from reconciler.status import store as statuses
from reconciler.status.summarize import progress_only, same_ignoring_time, summarize, unchanged

log = logging.getLogger("reconciler")


def write(rec, result, previous: dict[str, statuses.RunStatus], spec_commits: dict[str, str], status_dir: Path,
          now: float) -> tuple[dict[str, str], dict[str, statuses.RunStatus], bool]:
    """Write the status file of every change whose status moved; return each run's phase after
    the pass, the statuses written (``result.written`` and ``result.transitions`` too), and whether
    every status was found unchanged without asking ``summarize`` (engine/steady.py keeps that).
    ``rec``: the pass's Reconciler (loop.py)."""
    plan, world = result.plan, result.world
    by_name = {o.name: o for o in result.outcomes if not o.side}
    phases = {n: st.phase for n, st in previous.items()}
    written: dict[str, statuses.RunStatus] = {}
    moved = 0  # changes whose status summarize was asked for
    for change in plan.changes:
        if change.phase is None:
            continue
        prev = previous.get(change.name)
        obs = world.find(change.identity) if change.identity else None
        outcome = by_name.get(change.name)
        if outcome is None and unchanged(prev, change, obs):  # summarize would return prev
            continue
        moved += 1
        new = summarize(prev, change, outcome, obs, now, spec_commits.get(change.spec_path or ""))
        if new is prev or same_ignoring_time(prev, new):
            continue
        if _progress_can_wait(rec, prev, new, now):
            new.observed_at = iso(now)  # the next pass and the live page read it at once; git later
            statuses.write_live(rec.cfg.state_dir, new)
            continue
        if change.name in rec._as_filed:
            statuses.drop_live(rec.cfg.state_dir, change.name)
        new.observed_at = iso(now)
        try:
            wrote = statuses.write_if_changed(status_dir, new)
        except statuses.UnsafeName as e:  # defence in depth: names are DNS labels by validation
            log.error("not writing a status file: %s", e)
            continue
        if wrote:
            phases[change.name] = new.phase
            result.written.append(change.name)
            written[change.name] = new
            rec.status_cache.remember(status_dir, new)
            before = prev.phase if prev else "-"
            if before != new.phase or (prev and (prev.attempt, prev.generation) != (new.attempt, new.generation)):
                ident = change.identity or ""
                result.transitions.append(f"{change.name}: {before} → {new.phase} [{ident}] {change.reason}"[:300])
    return phases, written, moved == 0


def _progress_can_wait(rec, prev: statuses.RunStatus | None, new: statuses.RunStatus, now: float) -> bool:
    """A change of progress alone, while the status file was written less than
    ``status_progress_interval`` ago: the file keeps its older progress until then. The time
    is the file's own ``observed_at``, so a ``--once`` from cron batches the same way."""
    if prev is None or not progress_only(prev, new):
        return False
    written = parse_iso((rec._as_filed.get(prev.name) or prev).observed_at)
    return written is not None and now - written < rec.cfg.status_progress_interval
