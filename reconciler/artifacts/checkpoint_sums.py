"""Checkpoint checksums for ``reconcile provenance --diff``: the sha256 of each checkpoint's manifest.

A run with a Storage records, per checkpoint it uploaded, the sha256 of the checkpoint's manifest
(``status.outputs.checkpoints``): one value that stands for every file of the checkpoint, since
the manifest lists each file with its own sha256. Comparing them by checkpoint name says whether
two runs (a run and its reproduction, or two attempts) hold the same checkpoint. They are read
from the status files, not the bucket: the diff needs no credentials, and ``reconcile artifacts``
is the command that checks the bucket against them. The comparison is for information, like the
``run`` half: a manifest also records when and by which attempt it was uploaded, so two
independent runs never have equal checksums even when their weights agree.
"""

from __future__ import annotations

import re

from reconciler.core.identity import parse
from reconciler.status import store as statuses

SHA256 = re.compile(r"^[0-9a-f]{64}$")
NAME = re.compile(r"^checkpoint-[0-9]{1,12}$")
MAX_CHECKPOINTS = 200


def recorded_outputs(st) -> dict | None:
    """A status's ``outputs`` mapping, or None."""
    rec = getattr(st, "outputs", None)
    return rec if isinstance(rec, dict) else None


def sums(status_dir, name_or_identity: str) -> dict[str, str] | None:
    """checkpoint name → its manifest's sha256, as the run's status records them; None when the
    run records no outputs (no Storage), or an identity of another generation than the status's."""
    ident = parse(name_or_identity)
    name = ident.name if ident is not None else name_or_identity
    st = statuses.load_one(status_dir, name)
    if st is None or (ident is not None and ident.generation != st.generation):
        return None
    rec = recorded_outputs(st)
    listed = rec.get("checkpoints") if isinstance(rec, dict) else None
    if not isinstance(listed, list):
        return None
    out = {}
    for c in listed[:MAX_CHECKPOINTS]:
        if (isinstance(c, dict) and isinstance(c.get("name"), str) and NAME.match(c["name"])
                and isinstance(c.get("manifest_sha256"), str) and SHA256.match(c["manifest_sha256"])):
            out[c["name"]] = c["manifest_sha256"]
    return out


def diff(a: dict[str, str] | None, b: dict[str, str] | None) -> list[dict]:
    """The checkpoints whose manifest checksums differ (or that one side lacks), by step."""
    a, b = a or {}, b or {}
    keys = sorted(set(a) | set(b), key=lambda n: int(n.split("-", 1)[1]))
    return [{"checkpoint": k, "a": a.get(k), "b": b.get(k)} for k in keys if a.get(k) != b.get(k)]


def text(a: dict[str, str] | None, b: dict[str, str] | None) -> list[str]:
    """The diff's lines, for information (they never change the exit code)."""
    if a is None and b is None:
        return []
    if a is None or b is None:
        return ["checkpoints: only one of them records checkpoints in a Storage"]
    rows = diff(a, b)
    if not rows:
        return [f"checkpoints: identical manifest checksums ({len(a)} checkpoint(s))"]
    out = [f"checkpoints: {len(rows)} of {len(set(a) | set(b))} differ (manifest sha256)"]
    out += [f"  {r['checkpoint']}: {r['a'] or '-'} -> {r['b'] or '-'}" for r in rows]
    return out
