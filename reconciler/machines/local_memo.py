"""This machine's last full probe report, so that a pass woken by a spec edit need not look at
every process on the host again.

Why: a full probe of this machine judges every workspace and scans ``/proc`` (every process's
``stat`` and environment), so it grows with everything else the host runs; on a loaded two-core
machine it was most of the time between an edited spec and its process. A pass that an edit of a
few runs woke (the engine decides which: engine/focus.py) needs a fresh look only at those runs'
workspaces; for the others it plans on this report, kept from the last full probe, with each
workspace that a later focused probe looked at again replaced by that newer look.

When the report is not used (a full probe instead):

- it is older than the age the engine allows (the daemon's ``resync_interval``), counted from the
  full probe that made it, so no run is planned on a look older than an idle daemon's resync;
- anything was done on this machine through a transport of this process since (a launch, a stop,
  a collection, a command): what we did ourselves is never read back from a report taken before it
  (the engine probes again in full after a pass that acted: ``refresh``);
- the root cannot be listed, or the full probe failed.

A workspace that appeared in the root since the report (a launch by another reconciler of the same
repository, a look-alike made by hand) is judged afresh, whatever its name; one that is gone is
left out. What the report cannot show until the next full probe: a process of a run outside the
focus that started or ended since, or changed files in a workspace that was already there. The
engine plans nothing that acts on such a run from it (a plan that would falls back to a full
probe), so it is only ever a status written a little later.
"""

from __future__ import annotations

import os
import threading
import time

from reconciler.runtime import probe as agent_module
from reconciler.runtime.readings import leader_alive

_lock = threading.Lock()
_reports: dict[str, "Report"] = {}
_actions: dict[str, int] = {}  # root → things done there through a transport of this process


class Report:
    __slots__ = ("args", "runs", "listing", "at", "actions")

    def __init__(self, args: dict, runs: dict, listing: frozenset[str], at: float, actions: int):
        self.args, self.runs, self.listing, self.at, self.actions = args, runs, listing, at, actions


def acted(root: str) -> None:
    """Something was done in ``root``'s workspaces: the report taken before it is not used."""
    with _lock:
        _actions[root] = _actions.get(root, 0) + 1


def listing(root: str) -> frozenset[str]:
    """The entries of ``root`` named like a run identity (OSError when it cannot be listed)."""
    match = agent_module.IDENTITY.match
    return frozenset(e for e in os.listdir(root) if match(e))


def full(root: str, args: dict) -> dict:
    """A full probe of ``root``, kept as the report focused probes start from."""
    with _lock:
        actions = _actions.get(root, 0)
    at = time.monotonic()
    try:
        entries = listing(root)
    except OSError:
        entries = None
    report = agent_module.dispatch(args)
    if entries is not None and not report.get("error") and isinstance(report.get("runs"), dict):
        with _lock:
            _reports[root] = Report(dict(args), report["runs"], entries, at, actions)
    else:
        forget(root)
    return report


def focused(root: str, args: dict, focus: frozenset[str], max_age: float) -> tuple[dict, frozenset[str]] | None:
    """The report with the workspaces of the runs in ``focus`` judged afresh, and of every run
    whose kept entry may have moved (``_current``) or that has a workspace new since; and the
    names of all the runs judged afresh. None when the kept report may not be used (then probe
    in full)."""
    with _lock:
        kept = _reports.get(root)
        if kept is None or kept.actions != _actions.get(root, 0) or time.monotonic() - kept.at > max_age:
            return None
    try:
        entries = listing(root)
    except OSError:
        return None
    name = agent_module.IDENTITY.match
    now = time.time()
    only = set(focus) | {name(e).group("name") for e in entries - kept.listing}
    carried: dict[str, dict] = {}
    for ident, r in kept.runs.items():
        run = name(ident).group("name")
        if ident not in entries or run in only:
            continue
        current = _current(root, ident, r, now)
        if current is None:
            only.add(run)
        else:
            carried[ident] = current
    fresh = agent_module.dispatch(dict(args, only=sorted(only)))
    if fresh.get("error") or not isinstance(fresh.get("runs"), dict):
        return fresh, frozenset(only)
    runs = {ident: r for ident, r in carried.items() if name(ident).group("name") not in only}
    runs.update(fresh["runs"])
    with _lock:
        if _reports.get(root) is kept:
            # Each entry is a true look at its workspace, the newer ones from this probe: a later
            # focused pass never plans on an older look than a status was written from.
            kept.runs, kept.listing, kept.args = runs, entries, dict(args)
    return dict(fresh, runs=runs), frozenset(only)


def _current(root: str, ident: str, r: dict, now: float) -> dict | None:
    """A kept entry as a probe would report it now, or None when that takes a probe: a running
    workspace whose result appeared or whose wrapper (the leader of its process group) no longer
    lives, one that runs in a container or has no pid yet, a staged one that was launched since, an
    unreadable one. A running one's heartbeat age is read again (one stat)."""
    state = r.get("state")
    rt = os.path.join(root, ident, "runtime")
    if state == "staged":
        return None if os.path.lexists(os.path.join(rt, "launched_at")) else r
    if state in ("succeeded", "failed", "terminated", "lost"):
        return r
    if state != "running" or r.get("container") or not isinstance(r.get("pid"), int):
        return None
    if os.path.lexists(os.path.join(rt, "result.json")) or not leader_alive(r["pid"], ident):
        return None
    try:
        beat = os.stat(os.path.join(rt, "heartbeat")).st_mtime
    except OSError:
        return r if "heartbeat_age" not in r else None
    return dict(r, heartbeat_age=round(now - beat, 3))


def refresh(root: str) -> bool:
    """Probe ``root`` in full again with the arguments of its last probe (after a pass acted
    there); whether there was a report to refresh."""
    with _lock:
        kept = _reports.get(root)
    if kept is None:
        return False
    full(root, kept.args)
    return True


def age(root: str) -> float | None:
    with _lock:
        kept = _reports.get(root)
    return None if kept is None else time.monotonic() - kept.at


def forget(root: str) -> None:
    with _lock:
        _reports.pop(root, None)
