"""What one pass learnt that the next process can reuse: the pass cache in the working state.

A fresh process (``reconcile --once`` from cron or CI) would otherwise parse every spec file and
the status file of every finished run, seconds for a large tree, to plan nothing. The cache holds,
per valid spec file, the stat and content hash it was checked under and what a pass needs without
its model (kind, names, a Run's digest and secret names); the cross-file checks' results; the
settled runs (finished and untouched: spec digest, status file key); and the last answer of the
uncommitted-spec check with what it depends on.

It is an optimisation only and is trusted for nothing it cannot check: each spec file's stat is
compared (git's racy-clean rule included, see ``reconciler/spec/specfile.py``), each settled
run's status file key and spec digest are compared as the daemon compares them, and the whole
file is refused (and rebuilt) when it is truncated, corrupt, larger than ``MAX_BYTES``, of another
format, or written by other code (the package version and the stats of the modules whose output
it holds). It is written to a temporary file and renamed, so a process killed while writing
leaves the old cache or none. Deleting it costs one slow pass.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import Any

import reconciler
from reconciler.core.diagnostics import Diagnostic
from reconciler.spec.specfile import SpecCache, SpecFile
from reconciler.status.ledger import Ledger, Row

log = logging.getLogger("reconciler")

NAME = "pass-cache.json"
FORMAT = 1
MAX_BYTES = 256 << 20  # a 100,000-spec tree writes about 30 MB
# The modules whose output the cache holds: a change to any of them (an edited checkout of the
# reconciler, without a new version) makes the cache another code's.
_CODE = ("spec/load.py", "spec/specfile.py", "spec/checks", "spec/models", "engine/passcache.py",
         "engine/loop.py", "engine/uncommitted.py", "status/store.py", "planner/make.py")

_ROW_FIELDS = [f.name for f in fields(Row)]


@dataclass(frozen=True, slots=True)
class Settled:
    digest: str | None  # the run's spec digest when it settled (None: no spec any more)
    key: tuple[int, int, int]  # its status file's inode, size and mtime
    phase: str
    provider: str | None = None  # where its rentals were, for the provider's budget
    cost: float = 0.0  # what they cost (its status's cost.so_far)


@dataclass
class Restored:
    settled: dict[str, Settled]
    dirty_key: list | None
    dirty: set[str] | None
    ledger: tuple[dict, list | None] | None  # the ledger's rows and its README's key, if saved


def code_stamp() -> str:
    """The version and the stats of the modules above: cheap, and different for other code."""
    base = os.path.dirname(reconciler.__file__)
    parts = [reconciler.__version__, str(FORMAT)]
    for rel in _CODE:
        full = os.path.join(base, rel)
        names = sorted(n for n in os.listdir(full) if n.endswith(".py")) if os.path.isdir(full) else [""]
        for n in names:
            try:
                st = os.stat(os.path.join(full, n) if n else full)
            except OSError:
                continue
            parts.append(f"{rel}/{n}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def cache_path(state_dir: Path) -> Path:
    return state_dir / NAME


def restore(state_dir: Path, root: Path, cache: SpecCache) -> Restored | None:
    """Fill ``cache`` from the saved pass cache; None (and ``cache`` untouched) when there is none
    that this code can trust."""
    try:
        with open(cache_path(state_dir), "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except OSError:
        return None
    try:
        if len(raw) > MAX_BYTES:
            raise ValueError("too large")
        head, _, body = raw.partition(b"\n")
        header = json.loads(head)
        if (not isinstance(header, dict) or header.get("format") != FORMAT or header.get("code") != code_stamp()
                or header.get("sha256") != hashlib.sha256(body).hexdigest()):
            raise ValueError("another code's cache, or a damaged one")
        data = json.loads(body)
        base = os.path.join(root, "")
        files = [_file(base, r) for r in data["files"]]
        cross = _cross(data["cross"])
        settled = {n: _settled(s) for n, s in data["settled"].items()}
        dirty = data.get("dirty")
        dirty_key = dirty["key"] if isinstance(dirty, dict) else None
        dirty_paths = {_text(p) for p in dirty["paths"]} if isinstance(dirty, dict) else None
        ledger = _ledger(data["ledger"]) if data.get("ledger") is not None else None
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError) as e:
        log.debug("pass cache ignored (%s): it is rebuilt", str(e)[:200])
        return None
    for f in files:
        cache.adopt(f)
    cache.cross, cache.cross_head = cross["diags"], cross["head"]
    cache.changed.clear()
    cache.names_touched.clear()
    cache.context_touched = False
    return Restored(settled, dirty_key, dirty_paths, ledger)


def save(state_dir: Path, cache: SpecCache, settled: dict[str, Settled], dirty_key: list | None,
         dirty: set[str] | None, ledger: Ledger | None = None) -> bool:
    """Write the cache (temporary file, then rename); False when it could not be written."""
    body = json.dumps({
        "files": [_record(f) for f in cache.files() if f.ok and f.stat is not None],
        "cross": {"head": cache.cross_head,
                  "diags": {rel: [[d.path, d.line, d.col, d.message] for d in ds]
                            for rel, ds in (cache.cross or {}).items() if ds}},
        "settled": {n: [s.digest, list(s.key), s.phase, s.provider, s.cost] for n, s in settled.items()},
        "dirty": {"key": dirty_key, "paths": sorted(dirty)} if dirty is not None and dirty_key is not None else None,
        # A settled run's status is not read, so its ledger row comes from here in a new process.
        "ledger": {"fields": _ROW_FIELDS, "key": list(ledger._key) if ledger._key else None,
                   "rows": [astuple(r) for r in ledger.rows.values()]} if ledger is not None else None,
    }, separators=(",", ":")).encode()
    header = json.dumps({"format": FORMAT, "code": code_stamp(), "sha256": hashlib.sha256(body).hexdigest()})
    path = cache_path(state_dir)
    tmp = path.with_name(f".{NAME}.{os.getpid()}.tmp")
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as fh:
            fh.write(header.encode() + b"\n" + body)
        os.replace(tmp, path)
        return True
    except OSError as e:
        log.info("pass cache not written: %s", e)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False


def _record(f: SpecFile) -> list:
    assert f.stat is not None
    return [f.rel, *f.stat, f.verified_ns, f.sha, f.kind, f.name_hint, f.meta_name, f.digest, list(f.secrets),
            f.repo_refs, f.expect]


def _file(root: str, r: Any) -> SpecFile:
    rel, ino, size, mtime, ctime, verified, sha, kind, hint, meta, digest, secrets, refs, expect = r
    # One expression per record: restoring runs once per file of the tree in every new process.
    if not (type(rel) is str and type(ino) is int and type(size) is int and type(mtime) is int
            and type(ctime) is int and type(verified) is int and type(sha) is str and type(kind) is str
            and (hint is None or type(hint) is str) and (meta is None or type(meta) is str)
            and (digest is None or type(digest) is str) and (expect is None or type(expect) is str)
            and type(refs) is bool and type(secrets) is list and all(type(x) is str for x in secrets)):
        raise ValueError("bad file record")
    if rel.startswith("/") or ".." in rel.split("/"):
        raise ValueError(f"bad path {rel!r}")
    f = SpecFile(root + rel, rel, sha, kind, name_hint=hint)
    f.stat = (ino, size, mtime, ctime)
    f.verified_ns, f.meta_name, f.digest, f.expect, f.repo_refs = verified, meta, digest, expect, refs
    f.secrets = tuple(secrets)
    f._valid = True
    return f


def _cross(c: Any) -> dict:
    diags = {_text(rel): [Diagnostic(_text(p), _int(line), _int(col), _text(m)) for p, line, col, m in ds]
             for rel, ds in c["diags"].items()}
    return {"head": _opt(c["head"]), "diags": diags}


def _ledger(d: Any) -> tuple[dict, list | None]:
    if d["fields"] != _ROW_FIELDS:
        raise ValueError("another ledger")
    types = [{"str": str, "int": int, "bool": bool}.get(str(f.type), object) for f in fields(Row)]
    rows = {}
    for values in d["rows"]:
        if type(values) is not list or list(map(type, values)) != types:
            raise ValueError("bad ledger row")
        rows[values[0]] = Row(*values)
    key = d["key"]
    return rows, [_int(k) for k in key] if key is not None else None


def _settled(s: Any) -> Settled:
    digest, key, phase, provider, cost = s
    if not (type(key) is list and len(key) == 3 and all(type(k) is int for k in key) and type(phase) is str
            and (digest is None or type(digest) is str) and (provider is None or type(provider) is str)
            and type(cost) in (int, float)):
        raise ValueError("bad settled entry")
    return Settled(digest, tuple(key), phase, provider, float(cost))


def _text(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError("expected a string")
    return v


def _opt(v: Any) -> str | None:
    return None if v is None else _text(v)


def _int(v: Any) -> int:
    if type(v) is not int:
        raise ValueError("expected an integer")
    return v
