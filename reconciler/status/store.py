"""Status files: the reconciler's record of what it saw and did, one YAML file per run.

Status is lenient on read (unknown keys from a newer reconciler are ignored, a broken file reads
as "no status") and deterministic on write (fixed key order, no timestamps that change unless the
status changed), so an unchanged status is byte-identical and makes no commit. What goes into a
status is computed by ``summarize.py``; this module only writes and reads the files.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from ruamel.yaml import YAML

from reconciler.core.runstatus import RunStatus
from .dirwatch import DirWatch
from reconciler.spec.models.common import DNS_LABEL, DNS_LABEL_MAX
from reconciler.core.yamlemit import Flow, pyyaml_dump
from reconciler.core.yamlemit import dump as emit_yaml

# Status files from which a folder is watched rather than its files stat-ed every pass: below this
# the stats cost less than a millisecond.
WATCH_FROM = 1000

_ORDER = ["apiVersion", "kind", "name", "phase", "generation", "attempt", "message", "exit_code", "preemptions", "ruled_out",
          "retry_at", "spec", "handle", "cost", "placement", "conditions", "progress", "loss_curve", "artifacts", "outputs", "provenance", "history",
          "created_at", "observed_at"]


def _yaml() -> YAML:
    """The reader for status files libyaml refuses (or when PyYAML lacks libyaml)."""
    return YAML(typ="safe", pure=True)


# A status holds what machines and jobs said (messages, artifact names, progress keys), and
# anyone who can push can write one. Text is written out so that any of it can be written and
# read back: every character that is not printable, line breaks and tabs apart (controls, NUL,
# lone surrogates from a JSON "\ud800", which no UTF-8 writer takes, bidirectional overrides,
# zero-width characters), as ``\xNN``/``\uNNNN`` text, at most TEXT_LIMIT characters; keys at
# most KEY_LIMIT, because YAML writes a longer key as an explicit "? " key that the fast reader
# does not take; integers of thousands of digits as text (``>1e308``); nesting at most
# NEST_LIMIT deep. The same value always gives the same
# text, so an unchanged status stays byte-identical.
TEXT_LIMIT = 8192
KEY_LIMIT = 100
NEST_LIMIT = 24
_UNWRITABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u206f"
                         "\ud800-\udfff\ufeff\ufff9-\ufffb\ufffe\uffff]")


def _escaped(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def writable_text(text: str, limit: int = TEXT_LIMIT) -> str:
    """``text`` as a status file can always hold it (see above)."""
    if len(text) > limit:
        text = text[: limit - 1] + "\u2026"
    if text.isascii() and text.isprintable():
        return text
    out = _UNWRITABLE.sub(_escaped, text)
    if not out.replace("\n", "").replace("\t", "").isprintable():  # unassigned code points and the like
        out = "".join(c if c.isprintable() or c in "\n\t" else _escaped_char(c) for c in out)
    return out if len(out) <= limit else out[: limit - 1] + "\u2026"


def _escaped_char(c: str) -> str:
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


_SCALARS = (float, bool, type(None))


def writable(value: Any, depth: int = 0) -> Any:
    """``value`` (a status's JSON data) with its text, keys and numbers as a status file can hold them."""
    t = type(value)
    if t is str:  # the common case first: plain short text is returned as it is
        return value if len(value) <= TEXT_LIMIT and value.isascii() and value.isprintable() else writable_text(value)
    if t in _SCALARS:
        return value
    if t is int:
        # Python refuses to print an int of more than 4,300 digits (sys.set_int_max_str_digits):
        # past ~3,900 (13,000 bits), the value as the ledger shows one beyond a float's range.
        return value if value.bit_length() <= 13_000 else (">1e308" if value > 0 else "<-1e308")
    if depth >= NEST_LIMIT:
        return "\u2026"
    if t is dict:
        # Plain short text and small ints, most of a status, are kept here without a call each.
        return {(k if type(k) is str and len(k) <= KEY_LIMIT and k.isascii() and k.isprintable()
                 else writable_text(str(k), KEY_LIMIT)):
                (v if (type(v) is str and len(v) <= TEXT_LIMIT and v.isascii() and v.isprintable())
                 or type(v) is bool or v is None else writable(v, depth + 1))
                for k, v in value.items()}
    if t is list or t is tuple:
        if t is list and len(value) == 2 and type(value[0]) is int and type(value[1]) is float \
                and value[0].bit_length() <= 64:
            return value  # a loss curve's point, 120 of them a status: no call per number
        return [writable(v, depth + 1) for v in value]
    return writable_text(repr(value)[:TEXT_LIMIT])


def _plain(value: Any, depth: int = 0) -> Any:
    """A model as plain data, without pydantic's serializer (and its depth limit)."""
    if depth > NEST_LIMIT:
        return "\u2026"
    if isinstance(value, BaseModel):
        return {k: _plain(v, depth + 1) for k in type(value).model_fields
                if (v := getattr(value, k)) is not None}
    if isinstance(value, dict):
        return {k: _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # as pydantic's JSON mode writes them
    return value


def ordered(status: RunStatus) -> dict[str, Any]:
    """The file's data: fixed key order, no empty fields, the loss curve's points as flow lists."""
    try:
        data = status.model_dump(mode="json", exclude_none=True)
    except ValueError:  # nesting deeper than pydantic serializes (a pushed status, say): cut by ``writable``
        data = _plain(status)
    data = writable(data)
    out: dict[str, Any] = {"apiVersion": "reconciler/v1", "kind": "RunStatus"}
    for key in _ORDER[2:]:
        if key in data and data[key] not in ([], {}, ""):
            out[key] = data[key]
    if "loss_curve" in out:
        out["loss_curve"] = [Flow(p) for p in out["loss_curve"]]
    return out


def dump(status: RunStatus) -> str:
    """The file text. Written by ``yamlemit`` (PyYAML's text, without PyYAML's cost per node, which
    matters when a first pass writes thousands of files), or by PyYAML for what that leaves to it."""
    data = ordered(status)
    text = emit_yaml(data)
    return ("# Written by the reconciler. Do not edit: it is rewritten on every change.\n"
            + (text if text is not None else pyyaml_dump(data)))


class StatusCache:
    """Parsed status files by (inode, size, mtime): a long-lived process re-reads only files that changed.

    Status files are replaced atomically (a new inode) by ``write_if_changed`` and rewritten by git
    on checkout, so the key changes whenever the content can have. The cached objects are shared:
    callers must not mutate them (``summarize`` works on a deep copy).
    """

    def __init__(self) -> None:
        self._items: dict[str, tuple[tuple[int, int, int], RunStatus | None]] = {}
        # Whether the last load_all found a status file new, changed or gone (the commit step
        # asks git about status/ only then, or after a write).
        self.changed = True
        self._listed = -1
        self.parsed = 0  # files the last load_all parsed (a large number: see engine/rehome.py)
        # A watch of the folder (dirwatch.py) and the files of the last full scan it vouches for.
        self.watch: DirWatch | None = None
        self._listing: list | None = None
        self._watched = False
        self._reused = False  # the last load_all took the kept listing (its files are as listed)
        self._names: frozenset[str] | None = None  # the run names of the kept listing, made once

    def forget(self, name: str) -> None:
        self._items.pop(f"{name}.yaml", None)

    def present(self) -> frozenset[str] | None:
        """The names of the status files the last ``load_all`` found, when it took them from the
        kept listing (the watch saw nothing since the scan): what a caller would otherwise list
        the folder again for. None when that load scanned."""
        if not self._reused or self._listing is None:
            return None
        if self._names is None:
            self._names = frozenset(name[:-5] for name, _, _ in self._listing)
        return self._names

    def listing(self, folder: Path) -> list | None:
        """The last full scan's files when the folder watch saw nothing since; else None, and a
        full scan follows (the watch, drained, is in place before it when ``_watched``)."""
        self._watched = self._reused = False
        if self.watch is None or self.watch.path != os.fspath(folder):
            return None
        quiet = self.watch.unchanged()
        if quiet and self._listing is not None:
            self._reused = True
            return self._listing
        self._listing = self._names = None
        self._watched = self.watch.armed
        return None

    def scanned(self, folder: Path, files: list, trusted: bool) -> None:
        """A full scan's files: kept for ``listing`` when ``trusted``; a large folder gets a watch."""
        self._listing, self._names = (files if trusted else None), None
        if len(files) >= WATCH_FROM and (self.watch is None or self.watch.path != os.fspath(folder)):
            if self.watch is not None:
                self.watch.close()
            self.watch = DirWatch(folder)
            self.watch.unchanged()  # in place from now: the next scan can be trusted

    def remember(self, status_dir: Path, st: RunStatus) -> None:
        """The status this process just wrote: the next pass need not parse the file again."""
        key = file_key(status_dir / f"{st.name}.yaml")
        if key is not None:
            self._items[f"{st.name}.yaml"] = (key, st)


def _parse_status(path: Path, y: YAML | None) -> RunStatus | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, ValueError):
        return None
    return parse_text(text, path.stem, y)


def parse_text(text: str, name: str, y: YAML | None = None) -> RunStatus | None:
    """A status file's text → its status, or None when it is not the status of run ``name``."""
    try:
        try:  # libyaml when available: a cold start over 10,000 status files in seconds, not minutes
            from reconciler.core.yamlsafe import fast_load

            data = fast_load(text)
        except Exception:  # noqa: BLE001 - anything unusual: the pure-Python reader decides
            data = (y or _yaml()).load(text)
        if isinstance(data, dict):
            st = RunStatus.model_validate(data)
            if st.name == name:
                return st
    except Exception:  # noqa: BLE001 - lenient on read: YAML and validation errors alike
        pass
    return None


def file_key(path: Path) -> tuple[int, int, int] | None:
    """What changes whenever a status file's content can have: inode, size, mtime."""
    try:
        s = path.stat()
    except OSError:
        return None
    return (s.st_ino, s.st_size, s.st_mtime_ns)


def load_all(status_dir: Path, cache: StatusCache | None = None,
             skip: dict[str, tuple[int, int, int]] | None = None,
             skipped: set[str] | None = None) -> dict[str, RunStatus]:
    """Every readable status file; a file that cannot be read counts as absent (and is rewritten).

    ``skip`` maps run names to the file key they had when the caller last saw them settled; such a
    file, if unchanged, is neither parsed nor returned nor kept in the cache. With a ``cache``
    whose folder watch saw nothing since the last scan (``dirwatch.py``), the files are not even
    stat-ed: their keys are the last scan's.
    """
    out: dict[str, RunStatus] = {}
    if cache is None and not skip:
        for name, path in _names(status_dir):
            st = _parse_status(Path(path), None)
            if st is not None:
                out[st.name] = st
        return out
    files = cache.listing(status_dir) if cache is not None else None
    if files is None:
        files = _scan(status_dir, cache)
    y = None  # ruamel's reader, made only for a file libyaml refuses
    seen: dict[str, tuple[tuple[int, int, int], RunStatus | None]] = {}
    items = cache._items if cache is not None else {}
    parsed = 0
    for name, key, path in files:
        if skip and skip.get(name[:-5]) == key:
            if skipped is not None:
                skipped.add(name[:-5])
            continue
        hit = items.get(name)
        if hit is not None and hit[0] == key:
            st = hit[1]
        else:
            items.pop(name, None)  # let the stale copy go before parsing the new one
            st = _parse_status(Path(path), y)
            parsed += 1
        seen[name] = (key, st)
        if st is not None:
            out[st.name] = st
    if cache is not None:
        cache._items = seen
        # A file gone shows in the count (one that came, or changed, was parsed).
        cache.changed, cache._listed = bool(parsed) or len(files) != cache._listed, len(files)
        cache.parsed = parsed
    return out


def _names(status_dir: Path) -> list[tuple[str, str]]:
    """(file name, path) of the status files, sorted; none when there is no folder."""
    try:
        with os.scandir(status_dir) as entries:
            return sorted((e.name, e.path) for e in entries if e.name.endswith(".yaml") and not e.name.startswith("."))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _scan(status_dir: Path, cache: StatusCache | None) -> list[tuple[str, tuple[int, int, int], str]]:
    """(file name, key, path) of the status files, sorted. Handed to ``cache`` for the next pass
    when its watch was in place before the scan began and every file is one it sees all changes
    of: a plain file (not a symbolic link) with a single link."""
    watched = cache is not None and cache._watched
    out = []
    plain = True
    try:
        with os.scandir(status_dir) as entries:
            for e in entries:
                name = e.name
                if name.endswith(".yaml") and not name.startswith("."):
                    try:
                        s = e.stat()
                    except OSError:
                        continue
                    if s.st_nlink != 1 or e.is_symlink():
                        plain = False
                    out.append((name, (s.st_ino, s.st_size, s.st_mtime_ns), e.path))
    except (FileNotFoundError, NotADirectoryError):
        pass
    out.sort()
    if cache is not None:
        cache.scanned(status_dir, out, watched and plain)
    return out


_KEY_LINES = re.compile(r"^(phase|generation|attempt): (\S+)$", re.MULTILINE)


def head_key(text: str | None) -> tuple[str, int, int] | None:
    """(phase, generation, attempt) of a status file's text, from its top-level lines (``dump``
    writes them in a fixed order and form), without parsing the whole document."""
    if text is None:
        return None
    found = dict(_KEY_LINES.findall(text[:2048]))
    try:
        return found["phase"], int(found.get("generation", 0)), int(found.get("attempt", 0))
    except (KeyError, ValueError):  # not a status file as dump writes it: unknown, like an unreadable one
        return None


def load_one(status_dir: Path, name: str) -> RunStatus | None:
    if not _safe(name):
        return None
    return _parse_status(status_dir / f"{name}.yaml", _yaml())


# A run name as validation admits it (a DNS label): the only names a status path is built from.
SAFE_NAME = re.compile(DNS_LABEL)


def _safe(name: str) -> bool:
    return bool(SAFE_NAME.match(name)) and len(name) <= DNS_LABEL_MAX


class UnsafeName(ValueError):
    """A status file name that is not a DNS label: it could lead outside status/."""


def status_path(status_dir: Path, name: str) -> Path:
    """``status/<name>.yaml``, checked: only a DNS label (no '/', no '.') names it, so the path
    cannot leave ``status_dir``."""
    if not _safe(name):
        raise UnsafeName(f"{name!r} is not a valid run name; no status file is written for it")
    return status_dir / f"{name}.yaml"


def write_if_changed(status_dir: Path, status: RunStatus) -> bool:
    """Atomically write a status file; return whether its bytes changed."""
    path = status_path(status_dir, status.name)
    text = dump(status)
    try:
        return replace_if_changed(path, text)
    except FileNotFoundError:  # no status/ yet: made once, not checked before every file
        status_dir.mkdir(parents=True, exist_ok=True)
        return replace_if_changed(path, text)


def live_dir(state_dir: Path) -> Path:
    """Statuses whose progress moved but whose files wait for ``status_progress_interval``: the
    newest state for the live page, in the reconciler's working state (never committed)."""
    return state_dir / "live-status"


def write_live(state_dir: Path, status: RunStatus) -> None:
    write_if_changed(live_dir(state_dir), status)


def drop_live(state_dir: Path, name: str) -> None:
    """The status file has caught up: its live copy is no longer newer."""
    try:
        status_path(live_dir(state_dir), name).unlink()
    except (FileNotFoundError, UnsafeName):
        pass


def overlay_live(statuses: dict[str, RunStatus], state_dir: Path, cache: "StatusCache | None" = None) -> dict[str, RunStatus]:
    """Replace each status by its live copy where that is newer and of the same generation,
    attempt and phase (a live copy is progress only, never a transition the file has not seen).
    Returns the replaced runs' statuses as their files hold them."""
    d = live_dir(state_dir)
    if not d.is_dir():
        return {}
    files: dict[str, RunStatus] = {}
    for name, st in load_all(d, cache).items():
        cur = statuses.get(name)
        if (cur is not None and (cur.generation, cur.attempt, cur.phase) == (st.generation, st.attempt, st.phase)
                and (st.observed_at or "") > (cur.observed_at or "")):
            files[name] = cur
            statuses[name] = st
    return files


def load_with_live(status_dir: Path, state_dir: Path, cache: "StatusCache | None" = None) -> dict[str, RunStatus]:
    """The status files, each with its live copy where that is newer (the live page's view)."""
    files = load_all(status_dir, cache)
    overlay_live(files, state_dir)
    return files


def replace_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` unless it already holds exactly that; atomic, so a reader never
    sees half a file. Returns whether it wrote.

    A file that exists is replaced by a temporary file renamed over it. A new file is created in
    place when its text fits in one page: creating a file is what a first pass over thousands of
    runs waits on (0.2-0.6 ms each on this project's ext4 VM, see docs/benchmarks.md), and the
    temporary's rename added as much again. A reader then finds no file, an empty one (read as no
    status, as before it existed) or the whole text: Linux copies a write into the page before it
    grows the file's size, page by page (mm/filemap.c, generic_perform_write)."""
    data = text.encode("utf-8")
    if len(data) <= _PAGE:
        try:  # a new file: one call makes it (no failed open to learn that it is new)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            pass
        else:
            try:
                _write_all(fd, data)
            except OSError:  # a full disk, say: no half file is left under the name
                os.unlink(path)
                raise
            return True
    try:
        with open(path, "rb") as fh:
            if fh.read() == data:
                return False
    except OSError:
        pass
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp")
    _write_all(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), data)
    os.replace(tmp, path)
    return True


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _write_all(fd: int, data: bytes) -> None:
    """Write ``data`` to ``fd`` (one write call for a page or less) and close it."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
