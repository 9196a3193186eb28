"""The trust boundary for ``runtime/uploads.json``: what a machine says it uploaded to its Storage.

A run with a Storage uploads its checkpoints and artifacts from the machine, and reports them in
``runtime/uploads.json``; the reconciler turns that report into the status's ``outputs`` and the
provenance manifest, and a later attempt resumes from what it names. So the file is read like any
reply of a machine: bounded, every field checked, and every URI held to the run's own folder of
the bucket (``store:<base>/...``): a machine that names another run's checkpoint, or any other
place, is refused. A refused file fails only the run's outputs reading (``BadUploads``, with a
one-line reason), never the probe or the pass.

Pure: no network, no process, no file (the planner's layer may import it).
"""

from __future__ import annotations

import math
import re
from typing import Any

MAX_TIME = 1e11  # unix seconds (as core/boundary.py): beyond is garbage

MAX_UPLOADED_CHECKPOINTS = 64
MAX_URI = 1024
MAX_BYTES = 1 << 60  # what one checkpoint may weigh: far beyond any model, short of garbage
MAX_FILES = 10_000_000
MACHINE_REMOTE = "store"
_NAME = re.compile(r"^checkpoint-[0-9]{1,12}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_PATH = re.compile(r"^[A-Za-z0-9_.=+-]{1,255}(/[A-Za-z0-9_.=+-]{1,255}){0,63}$")


class BadUploads(ValueError):
    """uploads.json that cannot be taken: the message says why, in one line."""


def clean_text(value: Any, limit: int) -> str:
    """Printable text only (as boundary.clean_text: this module sits below it)."""
    if not isinstance(value, str):
        return ""
    return "".join(c if c.isprintable() else " " for c in value[: limit * 4]).strip()[:limit]


def bounded_int(value: Any, lo: int, hi: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if lo <= value <= hi else None


def finite(value: Any, bound: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        f = float(value)
    except OverflowError:
        return None
    return f if math.isfinite(f) and abs(f) <= bound else None


def from_probe(raw: dict) -> tuple[dict | None, str | None]:
    """A probe entry's ``uploads`` (runtime/uploads.json, decoded on the machine): its shape
    checked, or why it was refused; (None, None) when the run has none."""
    if "uploads" not in raw:
        return None, None
    try:
        return parse_uploads(raw["uploads"]), None
    except BadUploads as e:
        return None, f"runtime/uploads.json refused: {clean_text(str(e), 300)}"


def _uri(value: Any, where: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_URI or not value.startswith(MACHINE_REMOTE + ":"):
        raise BadUploads(f"{where}: not a {MACHINE_REMOTE}: URI")
    path = value[len(MACHINE_REMOTE) + 1:]
    if not _PATH.fullmatch(path) or {".", ".."} & set(path.split("/")):
        raise BadUploads(f"{where}: not a plain path in the bucket")
    return value


def _under(uri: str, base: str | None, where: str) -> str:
    if base is not None and not uri.startswith(f"{MACHINE_REMOTE}:{base}/"):
        raise BadUploads(f"{where}: {clean_text(uri, 200)} is outside this run's folder {MACHINE_REMOTE}:{base}/")
    return uri


def _time(value: Any, where: str, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    t = finite(value, MAX_TIME)
    if t is None or t < 0:
        raise BadUploads(f"{where}: not a time")
    return t


def _checkpoint(raw: Any, base: str | None, i: int) -> dict:
    where = f"checkpoints[{i}]"
    if not isinstance(raw, dict):
        raise BadUploads(f"{where}: not an object")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise BadUploads(f"{where}.name: not checkpoint-N")
    uri = _under(_uri(raw.get("uri"), f"{where}.uri"), base, f"{where}.uri")
    if base is not None and uri != f"{MACHINE_REMOTE}:{base}/checkpoints/{name}":
        raise BadUploads(f"{where}.uri: not {MACHINE_REMOTE}:{base}/checkpoints/{name}")
    sha = raw.get("manifest_sha256")
    if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
        raise BadUploads(f"{where}.manifest_sha256: not a SHA-256 in hex")
    size, files = bounded_int(raw.get("bytes"), 0, MAX_BYTES), bounded_int(raw.get("files"), 0, MAX_FILES)
    if size is None or files is None:
        raise BadUploads(f"{where}: bytes or files is not a count in range")
    return {"name": name, "uri": uri, "manifest_sha256": sha, "bytes": size, "files": files,
            "uploaded_at": _time(raw.get("uploaded_at"), f"{where}.uploaded_at")}


def _resumed(raw: Any, base: str | None, pinned: str | None) -> dict | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise BadUploads("resumed_from: not an object")
    name, sha = raw.get("name"), raw.get("manifest_sha256")
    if not isinstance(name, str) or not _NAME.fullmatch(name) or not isinstance(sha, str) or not _SHA256.fullmatch(sha):
        raise BadUploads("resumed_from: name or manifest_sha256 is not valid")
    uri = _uri(raw.get("uri"), "resumed_from.uri")
    if uri != pinned:  # a pinned checkpoint may be another run's; anything else is this run's own
        _under(uri, base, "resumed_from.uri")
    return {"name": name, "uri": uri, "manifest_sha256": sha}


def parse_uploads(raw: Any, base: str | None = None, pinned: str | None = None) -> dict:
    """uploads.json (decoded) → a clean dict in the file's own shape, machine URIs (``store:``)
    kept; checkpoints sorted newest first. ``base``: the run generation's folder the URIs must lie
    in (None: shape only); ``pinned``: the one URI outside it ``resumed_from`` may name (the
    checkpoint the run was told to start from). Raises BadUploads."""
    if not isinstance(raw, dict):
        raise BadUploads("not an object")
    if raw.get("schema_version") != 1:
        raise BadUploads("schema_version is not 1")
    listed = raw.get("checkpoints", [])
    if not isinstance(listed, list) or len(listed) > MAX_UPLOADED_CHECKPOINTS:
        raise BadUploads(f"checkpoints: not a list of at most {MAX_UPLOADED_CHECKPOINTS}")
    ckpts = [_checkpoint(c, base, i) for i, c in enumerate(listed)]
    if len({c["name"] for c in ckpts}) != len(ckpts):
        raise BadUploads("checkpoints: a name is listed twice")
    ckpts.sort(key=lambda c: int(c["name"].split("-")[1]), reverse=True)
    arts = raw.get("artifacts")
    artifacts = None
    if arts is not None:
        if not isinstance(arts, dict) or not isinstance(arts.get("final", False), bool):
            raise BadUploads("artifacts: not an object with a boolean final")
        artifacts = {"uri": _under(_uri(arts.get("uri"), "artifacts.uri"), base, "artifacts.uri"),
                     "uploaded_at": _time(arts.get("uploaded_at"), "artifacts.uploaded_at", optional=True),
                     "final": bool(arts.get("final", False))}
    err = raw.get("error")
    if err is not None and not isinstance(err, str):
        raise BadUploads("error: not a string")
    return {"schema_version": 1, "checkpoints": ckpts, "artifacts": artifacts,
            "resumed_from": _resumed(raw.get("resumed_from"), base, pinned),
            "error": (clean_text(err.splitlines()[0] if err.strip() else "", 300) or None) if err else None}


__all__ = ["BadUploads", "parse_uploads", "from_probe", "MAX_UPLOADED_CHECKPOINTS", "MACHINE_REMOTE"]
