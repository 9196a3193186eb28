"""One machine's changes in order, with the launches among them a few at once.

apply.py runs machines in parallel and one machine's changes in order, so that a stop that frees
a GPU comes before the launch that takes it. A burst of new specs is a stretch of plain launches
on one machine: none stops or collects anything first, so none of them can free what another
needs, and their order does not matter. Run one after another they cost a bundle build and a
wrapper start each (50 specs: half a minute on a loaded two-core VM); here such a stretch runs
``launch_width`` at once, the width the machine's transport says it can take (this machine: a
few; a transport that says nothing: one, as before). Every change still runs exactly once and its
outcome is in the changes' order: the statuses are written after all of them have answered.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

from reconciler.core.actions import Action
from reconciler.core.plan import Change

T = TypeVar("T")


def plain_launch(c: Change) -> bool:
    """A launch that stops, collects and provisions nothing first, on one machine."""
    return (c.action in (Action.LAUNCH, Action.RELAUNCH) and not c.kill and c.collect_first is None
            and not c.nodes and c.rental is None and bool(c.machine))


def in_order(changes: list[Change], one: Callable[[Change], T], transport_for: Callable[[str], object]) -> list[T]:
    """``one`` over ``changes`` in order, each stretch of plain launches on one machine
    ``launch_width`` at once; the results in the changes' order."""
    out: list[T] = []
    i = 0
    while i < len(changes):
        j = i
        while j < len(changes) and plain_launch(changes[j]) and changes[j].machine == changes[i].machine:
            j += 1
        width = _width(transport_for, changes[i].machine) if j - i > 1 else 1
        if width > 1:
            with ThreadPoolExecutor(max_workers=min(width, j - i), thread_name_prefix="launch") as pool:
                out.extend(pool.map(one, changes[i:j]))
            i = j
        else:
            out.append(one(changes[i]))
            i += 1
    return out


def _width(transport_for: Callable[[str], object], machine: str | None) -> int:
    try:
        return max(1, int(getattr(transport_for(machine), "launch_width", 1)))
    except Exception:  # noqa: BLE001 - a machine that cannot be reached: its launches fail one by one
        return 1
