"""Checkpoints copied off rented machines while their runs train.

A rental can vanish with everything on it. So while a run trains on one, each new complete
checkpoint (its ``trainer_state.json`` is written last) is copied to the reconciler host's bundle
store, ``.reconciler/checkpoints/<run>/g<generation>/checkpoint-N``: only the newest, only once,
under a bandwidth limit, into a temporary folder renamed into place when whole (a copy cut short
is never mistaken for a checkpoint). The newest copy is all a resume needs: older ones are removed.
When the run is relaunched on another machine, the newest copy of its generation is staged with
the bundle (``inputs/.reconciler/resume/checkpoint-N``) and training resumes from it.

Object storage instead of this host's disk is a matter of replacing ``save`` and ``latest``
(docs/rentals.md says how a team would point them at a bucket).
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

def root(state_dir: Path) -> Path:
    return Path(state_dir) / "checkpoints"


def folder(state_dir: Path, name: str, generation: int) -> Path:
    return root(state_dir) / name / f"g{generation}"


def saved(state_dir: Path, names: set[str] | None = None) -> dict[tuple[str, int], set[str]]:
    """(run, generation) → the checkpoints copied so far (whole ones only)."""
    out: dict[tuple[str, int], set[str]] = {}
    base = root(state_dir)
    if not base.is_dir():
        return out
    for run_dir in base.iterdir():
        if names is not None and run_dir.name not in names:
            continue
        for gen_dir in run_dir.glob("g*"):
            if gen_dir.name[1:].isdigit():
                out[(run_dir.name, int(gen_dir.name[1:]))] = {p.name for p in gen_dir.glob("checkpoint-*")
                                                              if p.is_dir()}
    return out


def latest(state_dir: Path, name: str, generation: int) -> Path | None:
    d = folder(state_dir, name, generation)
    found = [p for p in d.glob("checkpoint-*") if p.is_dir() and p.name[11:].isdigit()]
    return max(found, key=lambda p: int(p.name[11:])) if found else None


class Throttled:
    """A file wrapper that holds writes to ``rate`` bytes per second."""

    def __init__(self, f, rate: float):
        self.f, self.rate = f, rate
        self.t0, self.n = time.monotonic(), 0

    def write(self, data: bytes) -> None:
        self.f.write(data)
        self.n += len(data)
        ahead = self.n / self.rate - (time.monotonic() - self.t0)
        if ahead > 0:
            time.sleep(ahead)


def save(transport, identity: str, rel: str, state_dir: Path, name: str, generation: int,
         mb_per_s: float | None) -> Path:
    """Copy the workspace folder ``rel`` (a checkpoint) into the store; returns where it is."""
    dest = folder(state_dir, name, generation)
    dest.mkdir(parents=True, exist_ok=True)
    final = dest / Path(rel).name
    if final.is_dir():
        return final
    tmp = dest / f".partial-{uuid.uuid4().hex[:8]}"
    wrap = (lambda f: Throttled(f, mb_per_s * 1e6)) if mb_per_s else None
    try:
        transport.fetch_folder(identity, rel, tmp, sink_wrapper=wrap)
        os.replace(tmp / rel, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    step = int(final.name[11:]) if final.name[11:].isdigit() else None
    for old in dest.glob("checkpoint-*"):  # the newest copy is all a resume needs
        if old != final and step is not None and old.name[11:].isdigit() and int(old.name[11:]) < step:
            shutil.rmtree(old, ignore_errors=True)
    return final
