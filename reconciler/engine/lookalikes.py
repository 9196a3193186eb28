"""When the reconciler first saw each live instance that carries no start time of its own.

A look-alike of a run (named like a run identity, in this repository's workspace root) that no
spec or status names is stopped only after ``orphan_grace`` from its start: it may be a newer
checkout's launch. A workspace without ``runtime/started_at`` (a launch that died half-way, or one
made by hand) has no start to count from; its start is then the first pass that saw it alive. That
moment must outlive the pass and a restart of the reconciler (a restart must not make the grace
start over, nor end it at once), and it is nobody's status, so it is kept in a small file of the
checkout's own state folder (``.reconciler/first-seen.json``), never in git.

Entries of a machine that does not answer are kept (its instances are not known to be gone); the
others are dropped as soon as their instance is no longer seen, so the file stays as small as the
set of such instances.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

from reconciler.core.observed import ObservedWorld

log = logging.getLogger(__name__)

FILE = "first-seen.json"
MAX_ENTRIES = 10_000  # start-less live instances: far more than any fleet holds


def key(machine: str, identity: str) -> str:
    return f"{machine} {identity}"


def load_times(path: Path, what: str, limit: int = MAX_ENTRIES) -> dict[str, float]:
    """A state file of ``key → time`` (``what`` says in the warning what a broken one costs):
    written by this reconciler only, still read leniently and bounded."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.warning("%s unreadable (%s): %s", path, e, what)
        return {}
    if not isinstance(raw, dict):
        return {}
    return {k: float(v) for k, v in list(raw.items())[:limit]
            if isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def save_times(path: Path, times: dict[str, float]) -> None:
    """Replace the file whole (a reader never sees half of it); a failure is logged only."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(times, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:  # remembered for this pass only
        log.warning("cannot write %s: %s", path, e)


def first_seen(state_dir: Path, world: ObservedWorld, now: float) -> dict[str, float]:
    """``machine identity`` → when a pass first saw that live, start-less instance (``now`` for
    the ones seen for the first time); the file is rewritten when that set changed."""
    path = Path(state_dir) / FILE
    old = load_times(path, "first-seen times start from now")  # a broken file: nothing is stopped early
    seen: dict[str, float] = {}
    for m in world.machines.values():
        if not m.reachable:
            seen.update({k: t for k, t in old.items() if k.split(" ", 1)[0] == m.name})
            continue
        for ident, r in m.runs.items():
            if r.alive and r.started_at is None:
                k = key(m.name, ident)
                seen[k] = min(old.get(k, now), now)
    if seen != old:
        save_times(path, seen)
    return seen
