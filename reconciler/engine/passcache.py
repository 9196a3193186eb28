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
from typing import TYPE_CHECKING, Any

import reconciler
from reconciler.core.diagnostics import Diagnostic
from reconciler.spec.specfile import SpecCache, SpecFile

if TYPE_CHECKING:
    from reconciler.status.ledger import Ledger

log = logging.getLogger("reconciler")

NAME = "pass-cache.json"
FORMAT = 2
MAX_BYTES = 256 << 20  # a 100,000-spec tree writes about 30 MB
# The modules whose output the cache holds: a change to any of them (an edited checkout of the
# reconciler, without a new version) makes the cache another code's.
_CODE = ("spec/load.py", "spec/specfile.py", "spec/checks", "spec/models", "engine/passcache.py",
         "engine/loop.py", "engine/uncommitted.py", "engine/quickpass.py", "status/store.py", "status/ledger.py",
         "planner/make.py", "gitops/repo.py")


def _row_fields() -> list[str]:
    from reconciler.status.ledger import Row  # the ledger's module costs its import only where rows are restored

    return [f.name for f in fields(Row)]


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
    clean: list | None = None  # the repository key the last commit step found status/ clean under


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
        header, _, body = _split(raw)
        if header.get("sha256") != hashlib.sha256(body).hexdigest():
            raise ValueError("a damaged cache")
        data = json.loads(body)
        base = os.path.join(root, "")
        files = [_file(base, r) for r in data["files"]]
        cross = _cross(data["cross"])
        settled = {n: _settled(s) for n, s in data["settled"].items()}
        dirty = data.get("dirty")
        dirty_key = dirty["key"] if isinstance(dirty, dict) else None
        dirty_paths = {_text(p) for p in dirty["paths"]} if isinstance(dirty, dict) else None
        ledger = _ledger(data["ledger"]) if data.get("ledger") is not None else None
        clean = data.get("clean")
        if clean is not None and type(clean) is not list:
            raise ValueError("bad status key")
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError) as e:
        log.debug("pass cache ignored (%s): it is rebuilt", str(e)[:200])
        return None
    for f in files:
        cache.adopt(f)
    cache.cross, cache.cross_head = cross["diags"], cross["head"]
    cache.changed.clear()
    cache.names_touched.clear()
    cache.context_touched = False
    return Restored(settled, dirty_key, dirty_paths, ledger, clean)


def save_changed(rec, desired=None) -> None:
    """Save what the reconciler ``rec`` (engine/loop.py) knows after a pass, when it learnt
    something a fresh process would redo: ``rec._saved`` is what was saved (or restored) last."""
    now = (rec.cache.hits, rec.settled, rec.dirty.key, rec._status_clean, rec.ledger._key)
    saved = rec._saved
    if (saved is not None and not rec.cache.tree_changed and saved[0] == now[0] and saved[2:] == now[2:]
            and len(saved[1]) == len(now[1]) and all(saved[1].get(n) is s for n, s in now[1].items())):
        return  # a settled run's entry is kept as the same object while it stays settled
    ledger = rec.ledger if rec.cfg.ledger else None
    # What a fresh process needs to prove that its pass would plan nothing (quickpass.py).
    quick = facts(desired, rec.cache, rec.settled, rec.dirty.key, rec.dirty.paths, ledger,
                    rec._status_clean, rec.cfg.repo / "status") if desired is not None else None
    if save(rec.cfg.state_dir, rec.cache, rec.settled, rec.dirty.key, rec.dirty.paths, ledger, quick,
            rec._status_clean):
        rec._saved = (now[0], dict(now[1]), *now[2:])


def facts(desired, cache, settled: dict, dirty_key: list | None, dirty: set[str] | None, ledger,
          status_clean: list | None, status_dir: Path) -> dict | None:
    """The quick section (what ``quickpass.py`` checks), or None when this tree needs a full pass each time.
    ``ledger``: the pass's Ledger (None without one); ``status_clean``: the repository key under
    which the commit step last found nothing to commit under status/ (None: not known)."""
    if (desired.fleets or desired.providers or desired.invalid_providers or desired.storages or desired.invalid
            or desired.diagnostics or dirty_key is None or dirty is None):
        return None
    if any(getattr(t.placement, "slurm", None) is not None for t in desired.templates.values()):
        return None  # a Slurm login host is one more machine to ask
    runs = desired.runs
    if any((s := settled.get(n)) is None or s.digest != e.digest or e.rel in dirty for n, e in runs.items()):
        return None  # a run the plan looks at, or one whose uncommitted spec the plan holds
    if any(s.digest is not None and n not in runs for n, s in settled.items()):
        return None
    files = cache.files()
    if len(files) != len(desired.files) or not all(f.ok and f.stat is not None for f in files):
        return None
    if ledger is not None and not set(ledger.rows) <= set(settled):
        return None  # a row without its status file: the README is written again
    from reconciler.spec.specfile import RACY_NS

    if any(max(f.stat[2], f.stat[3]) >= f.verified_ns - RACY_NS for f in files):
        return None  # read within its racy window: the next pass reads it again (and saves)
    clean = [status_clean, _ledger_files(status_dir)] if status_clean is not None else None
    files.sort(key=walk_order)
    return {"specs": stats_digest((f.rel, *f.stat) for f in files), "dirty_key": dirty_key,
            "status": stats_digest((n, *settled[n].key) for n in sorted(settled)),
            "ledger": ledger is not None, "readme": list(ledger._key) if ledger is not None and ledger._key else None,
            "clean": clean}


def stats_digest(entries) -> str:
    """One hash of (name, stat numbers...) entries, in the order given (a quick pass meets them in
    the same order: the loader's walk, sorted status names). A name holds no NUL and the numbers
    are digits, so each NUL-ended field is read back one way."""
    h = hashlib.sha256()
    for name, *numbers in entries:
        h.update(name.encode("utf-8", "surrogateescape") + _FIELDS[len(numbers)] % tuple(numbers))
    return h.hexdigest()


_FIELDS = {n: b"\0" + b"\0".join([b"%d"] * n) + b"\0" for n in (3, 4)}  # NUL before and after each number


def walk_order(f: SpecFile) -> tuple:
    """Where ``spec/tree.py``'s walk meets a file: the spec folders in their order, then in each
    folder its files by name before its sub-folders by name."""
    from reconciler.spec.tree import SPEC_DIRS

    top, *parts = f.rel.split("/")
    return (SPEC_DIRS.index(top) if top in SPEC_DIRS else len(SPEC_DIRS),
            [(1, p) for p in parts[:-1]] + [(0, parts[-1] if parts else "")])


def _ledger_files(status_dir: Path) -> dict[str, list[int]] | None:
    """The files of status/ that ``git status`` would report and the settled keys do not cover:
    the ledger's (README.md, *.svg) and hidden *.yaml, by name, with their stats."""
    out: dict[str, list[int]] = {}
    try:
        with os.scandir(status_dir) as entries:
            for e in entries:
                n = e.name
                if n == "README.md" or n.endswith(".svg") or (n.endswith(".yaml") and n.startswith(".")):
                    s = e.stat(follow_symlinks=False)
                    out[n] = [s.st_ino, s.st_size, s.st_mtime_ns]
    except FileNotFoundError:
        pass
    except OSError:
        return None
    return out


def _split(raw: bytes) -> tuple[dict, bytes, bytes]:
    """(header, quick section, body) of a cache file this code wrote; ValueError otherwise."""
    if len(raw) > MAX_BYTES:
        raise ValueError("too large")
    head, _, rest = raw.partition(b"\n")
    quick, _, body = rest.partition(b"\n")
    header = json.loads(head)
    if not isinstance(header, dict) or header.get("format") != FORMAT or header.get("code") != code_stamp():
        raise ValueError("another code's cache, or a damaged one")
    return header, quick, body


def read_quick(state_dir: Path) -> dict | None:
    """The quick section alone (``quickpass.py`` reads it), checked against its hash; None when
    there is none this code can trust. Its values are checked by their reader."""
    try:
        with open(cache_path(state_dir), "rb") as fh:  # two lines: the body is never read (its size is memory)
            head = fh.readline(1 << 16)
            quick = fh.readline(MAX_BYTES + 1)
        header, _, _ = _split(head)
        quick = quick.rstrip(b"\n")
        if header.get("quick") != hashlib.sha256(quick).hexdigest():
            raise ValueError("a damaged cache")
        doc = json.loads(quick)
    except (OSError, ValueError, RecursionError) as e:
        log.debug("pass cache not used for a quick pass (%s)", str(e)[:200])
        return None
    return doc if isinstance(doc, dict) else None


def save(state_dir: Path, cache: SpecCache, settled: dict[str, Settled], dirty_key: list | None,
         dirty: set[str] | None, ledger: Ledger | None = None, quick: dict | None = None,
         status_clean: list | None = None) -> bool:
    """Write the cache (temporary file, then rename); False when it could not be written.
    ``quick``: what a quick pass checks (see ``quickpass.py``), when this tree allows one."""
    body = json.dumps({
        "files": [_record(f) for f in cache.files() if f.ok and f.stat is not None],
        "cross": {"head": cache.cross_head,
                  "diags": {rel: [[d.path, d.line, d.col, d.message] for d in ds]
                            for rel, ds in (cache.cross or {}).items() if ds}},
        "settled": {n: [s.digest, list(s.key), s.phase, s.provider, s.cost] for n, s in settled.items()},
        "dirty": {"key": dirty_key, "paths": sorted(dirty)} if dirty is not None and dirty_key is not None else None,
        # A settled run's status is not read, so its ledger row comes from here in a new process.
        "ledger": {"fields": _row_fields(), "key": list(ledger._key) if ledger._key else None,
                   "rows": [astuple(r) for r in ledger.rows.values()]} if ledger is not None else None,
        "clean": status_clean,
    }, separators=(",", ":")).encode()
    quick_line = json.dumps(quick, separators=(",", ":")).encode()
    header = json.dumps({"format": FORMAT, "code": code_stamp(), "sha256": hashlib.sha256(body).hexdigest(),
                         "quick": hashlib.sha256(quick_line).hexdigest()})
    path = cache_path(state_dir)
    tmp = path.with_name(f".{NAME}.{os.getpid()}.tmp")
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as fh:
            fh.write(header.encode() + b"\n" + quick_line + b"\n" + body)
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
    from reconciler.status.ledger import Row

    if d["fields"] != _row_fields():
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
