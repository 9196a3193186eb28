"""Since when each silent machine has been silent.

A start of a new identity waits while a machine that could hold a launch git never heard of does
not answer (planner/fence.py ``hold_unseen_launches``), for at most the unreachable grace. The
grace needs a start that outlives the pass: a machine no status names (the usual case for such a
hold) would otherwise be "silent since now" on every pass, and a dead machine would hold every
new run of its target for ever. The first pass that found it silent is kept in the checkout's
state folder (``.reconciler/down-since.json``, never in git), so ``--once`` from cron counts the
same grace as the daemon; an entry goes as soon as its machine answers.

Having heard from a machine earlier does not free it from the hold: a launch whose answer was lost
(the connection dropped while the launch went on: "exit -1") may land after that machine's last
answer, made by this very process.
"""

from __future__ import annotations

from pathlib import Path

from reconciler.core.observed import ObservedWorld

from .lookalikes import load_times, save_times

FILE = "down-since.json"


def mark(state_dir: Path, world: ObservedWorld, now: float) -> None:
    """Date each silent machine's silence from the first pass that found it (the earlier of that
    and what the statuses say)."""
    path = Path(state_dir) / FILE
    old = load_times(path, "silent machines counted from now")  # a broken file: a hold lasts longer
    down: dict[str, float] = {}
    for m in world.machines.values():
        if m.reachable:
            continue
        since = min(old.get(m.name, now), m.unreachable_since or now, now)
        down[m.name] = m.unreachable_since = since
    if down != old:
        save_times(path, down)
