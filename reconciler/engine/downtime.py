"""Since when each silent machine has been silent, and which machines this process has heard from.

A start of a new identity waits while a machine that could hold a launch git never heard of does
not answer (planner/fence.py ``hold_unseen_launches``), for at most the unreachable grace. The
grace needs a start that outlives the pass: a machine no status names (the usual case for such a
hold) would otherwise be "silent since now" on every pass, and a dead machine would hold every
new run of its target for ever. The first pass that found it silent is kept in the checkout's
state folder (``.reconciler/down-since.json``, never in git), so ``--once`` from cron counts the
same grace as the daemon; an entry goes as soon as its machine answers.

A machine that answered a pass of this process cannot hold an unrecorded launch: that pass saw
every instance on it, and the statuses it wrote number past (or adopt) them. So it is marked
``heard`` and never holds a start, even after it falls silent.
"""

from __future__ import annotations

from pathlib import Path

from reconciler.core.observed import ObservedWorld

from .lookalikes import load_times, save_times

FILE = "down-since.json"


def mark(state_dir: Path, world: ObservedWorld, heard: set[str], now: float) -> None:
    """Date each silent machine's silence from the first pass that found it (the earlier of that
    and what the statuses say), and mark the machines this process has heard from."""
    path = Path(state_dir) / FILE
    old = load_times(path, "silent machines counted from now")  # a broken file: a hold lasts longer
    down: dict[str, float] = {}
    for m in world.machines.values():
        if m.reachable:
            heard.add(m.name)
            continue
        since = min(old.get(m.name, now), m.unreachable_since or now, now)
        down[m.name] = m.unreachable_since = since
        m.heard = m.name in heard
    if down != old:
        save_times(path, down)
