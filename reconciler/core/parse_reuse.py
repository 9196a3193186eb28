"""Reusing the parse of a run entry that a machine sent before, value for value.

A steady fleet says the same thing about most of its runs pass after pass, and validating ten
thousand unchanged entries again was a third of a steady pass. The parse of an entry is a pure
function of the run identity and the entry's decoded values, so an entry identical to one parsed
before, under the same identity, may take that parse: nothing a machine sends is taken without
having been validated as these very values.

Identical means equal as JSON values *with their types*: ``marshal``'s encoding tells ``1`` from
``1.0``, from ``true`` and ``-0.0`` from ``0.0`` (Python's ``==`` does not), and the entries are
compared by a 128-bit BLAKE2b digest of it. Two fields move between passes while nothing else
does: the launch wrapper's heartbeat age (every pass, for every live run) and the count of
processes carrying the identity (``live``: a job's helpers and the wrapper's own come and go).
They are left out of the digest and parsed afresh on every use. A reply whose runs are all as
the same machine's last reply said (those two aside) is taken whole; else each entry is looked
up on its own. Every use hands out a copy: later steps of a pass annotate their reports.

Bounded: the entries of the last two observations (one holds what the current one has used or
parsed so far, the other the previous one's), at most MAX_ENTRIES each; an entry that is not an
object, or cannot be encoded, is simply parsed.
"""

from __future__ import annotations

import copy
import hashlib
import marshal
import threading
from typing import Any, Callable

from .observed import ObservedRun

MAX_ENTRIES = 100_000  # identities remembered per observation: ten times the largest fleet measured
VOLATILE = ("heartbeat_age", "live")  # move between passes; not part of what is compared
_VOLATILE = frozenset(VOLATILE)


def digest(raw: dict) -> bytes | None:
    """The digest of an entry's values and types without its volatile fields; None when it cannot
    be encoded (nothing a JSON decoder makes, except nesting past marshal's depth)."""
    raw = _stripped(raw)
    try:
        return hashlib.blake2b(marshal.dumps(raw), digest_size=16).digest()
    except (ValueError, TypeError, RecursionError):
        return None


def fresh(report: ObservedRun) -> ObservedRun:
    """A copy of a remembered report that shares no list or mapping with it."""
    was = report.__dict__
    out = object.__new__(ObservedRun)
    new = out.__dict__
    new.update(was)
    for name in _LISTS:
        new[name] = was[name][:]
    if was["progress"] is not None:  # numbers and a time (boundary.clean_progress): one level
        new["progress"] = was["progress"].copy()
    for name in _NESTED:
        if was[name] is not None:
            new[name] = copy.deepcopy(was[name])
    return out


_LISTS = ("gpus", "curve", "checkpoints", "nodes", "unreachable")
_NESTED = ("gang", "slurm_end", "uploads", "outputs")


Template = tuple[ObservedRun, bool]  # a remembered report (never changed), whether it reads the volatile fields
Refresh = Callable[[ObservedRun, dict], None]  # sets a report's volatile fields from its entry, checked


def _stripped(raw: Any) -> Any:
    if isinstance(raw, dict) and not _VOLATILE.isdisjoint(raw):
        raw = {k: v for k, v in raw.items() if k not in _VOLATILE}
    return raw



def _use(template: Template, raw: Any, refresh: Refresh) -> ObservedRun:
    out = fresh(template[0])
    if template[1]:
        refresh(out, raw)
    return out


class ParseMemo:
    """What the last two observations parsed: per identity (digest, template) of its entry, and
    per source (a machine) the digest of its reply's whole runs with their templates."""

    def __init__(self, limit: int = MAX_ENTRIES) -> None:
        self.limit = limit
        self._current: dict[str, tuple[bytes, Template]] = {}
        self._previous: dict[str, tuple[bytes, Template]] = {}
        # Source → (digest of its reply's runs, each run's template, the entries refused).
        self._replies: dict[str, tuple[bytes, dict[str, Template], list[str]]] = {}
        self._replies_before: dict[str, tuple[bytes, dict[str, Template], list[str]]] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.observations = 0  # rotations: engine/steady.py knows by it which observation came last

    def rotate(self) -> None:
        """A new observation begins: what the one before last parsed and this one did not use goes."""
        with self._lock:
            self.observations += 1
            self._previous, self._current = self._current, {}
            self._replies_before, self._replies = self._replies, {}

    def same_runs(self, source: str, runs: dict,
                  refresh: Refresh) -> tuple[bytes | None, tuple | None]:
        """The digest of a reply's whole ``runs`` (volatile fields left out) and, when ``source``
        sent identical runs the last time, (reports, refusals) parsed from them then: fresh copies,
        with each volatile field read from ``runs`` now."""
        try:
            key = hashlib.blake2b(marshal.dumps({i: _stripped(r) for i, r in runs.items()}),
                                  digest_size=16).digest()
        except (ValueError, TypeError, RecursionError):
            return None, None
        found = self._replies.get(source) or self._replies_before.get(source)
        if found is None or found[0] != key:
            return key, None
        self._replies[source] = found
        self.hits += len(found[1])
        return key, ({ident: _use(t, runs[ident], refresh) for ident, t in found[1].items()}, list(found[2]))

    def keep_runs(self, source: str, key: bytes, reports: dict[str, ObservedRun], refused: list[str],
                  templates: dict[str, Template]) -> None:
        """What ``runs`` with digest ``key`` from ``source`` parsed to, for its next identical reply.
        ``templates``: those ``parse`` found or made for its entries (shared: one copy a run)."""
        if len(self._replies) < self.limit:
            kept = {ident: templates.get(ident) or (fresh(r), False) for ident, r in reports.items()}
            self._replies[source] = (key, kept, list(refused))

    def parse(self, identity: str, raw: Any, parse: Callable[[str, Any], tuple[ObservedRun, bool]],
              refresh: Refresh, templates: dict | None = None) -> ObservedRun:
        """``parse(identity, raw)`` → (report, whether it read the volatile fields), or its earlier
        result for identical values, with those fields read from ``raw`` now. ``templates``
        gains the template used (see keep_runs)."""
        key = digest(raw) if isinstance(raw, dict) else None
        if key is None:
            report, reads_volatile = parse(identity, raw)
            if templates is not None:
                templates[identity] = (fresh(report), reads_volatile)
            return report
        found = self._current.get(identity) or self._previous.get(identity)
        if found is not None and found[0] == key:
            self.hits += 1
            if len(self._current) < self.limit:
                self._current[identity] = found
            template = found[1]
            out = _use(template, raw, refresh)
        else:
            self.misses += 1
            out, reads_volatile = parse(identity, raw)
            template = (fresh(out), reads_volatile)
            if len(self._current) < self.limit:
                self._current[identity] = (key, template)
        if templates is not None:
            templates[identity] = template
        return out


__all__ = ["ParseMemo", "Refresh", "digest", "fresh", "MAX_ENTRIES", "VOLATILE"]
