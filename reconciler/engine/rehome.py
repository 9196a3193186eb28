"""Giving back the memory of a pass that parsed a large tree.

A pass that parses thousands of spec and status files (a start without the pass cache, a pull
that rewrote most of the tree) builds their parse trees, models and statuses in the same
small-object arenas (CPython's allocator, 1 MiB each, returned to the system only when every
object in them is gone) as the records that outlive the pass: each spec file's record, digest and
stat, each settled run's entry, each ledger row. The parse trees are freed when the pass ends,
but nearly every arena keeps a few of those records, so the process stays at the pass's peak
(measured at 10,000 settled runs: 194 MB after three passes from cold, 81 MB from the pass
cache, with about 25 MB alive either way).

So after such a pass, once the caller has let its result go (at the start of the next pass), the
records the pass cache holds are dropped and read back from the file that pass just wrote. With
nothing else of the large pass alive its arenas are empty and go back to the system, and the
records read back fill fresh ones. The reconciler is then in the state a new process started
from the pass cache is in; ``tests/engine/test_passcache.py`` holds the two to the same plans.
"""

from __future__ import annotations

import gc
import logging
import sys

from reconciler.core import identity, yamlemit
from reconciler.spec.specfile import SpecCache
from reconciler.status.ledger import Ledger

from . import observe, passcache

# Spec and status files parsed by one pass: below this, what they leave behind is small (a
# thousand files is about 10 MB of parse trees) and reading the pass cache back is not worth it.
REHOME_AFTER = 1000


def malloc_trim() -> None:
    """Hand what glibc's heap holds free back to the system (its own blocks larger than the
    small-object allocator's). Elsewhere there is nothing to do."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def worth_it(rec, saved_before: object) -> bool:
    """Whether the pass of ``rec`` (loop.py's Reconciler) that just ended parsed enough to leave its arenas fragmented, and wrote
    the pass cache (``rec._saved`` is a new object only then: the file holds this very state)."""
    parsed = rec.cache.parsed + rec.status_cache.parsed
    return (parsed >= REHOME_AFTER and rec._saved is not None and rec._saved is not saved_before
            and not getattr(rec, "_rehome_failed", False))


def rehome_if_due(rec) -> bool:
    """Rehome now what the last pass of ``rec`` left for the start of its next pass. The daemon
    calls it as soon as it has let the pass's result go, so that a large first pass's arenas go
    back right away rather than when the next pass comes (a resync later, minutes by default)."""
    if not getattr(rec, "_rehome", False):
        return False
    rec._rehome = False
    ok = rehome(rec)
    logging.getLogger("reconciler").debug("records read back from the pass cache" if ok else
                                          "records not read back: the next pass parses what it needs")
    return ok


def rehome(rec) -> bool:
    """Drop the records the pass cache holds, collect, and read them back from the file. False
    (and the reconciler left with empty caches, so that its next pass reads and parses what it
    needs, as a new process without a cache would) when the file is gone or no longer this
    code's; the state is correct either way, only the time of that pass differs."""
    rec.cache = SpecCache()
    rec.settled = {}
    rec.ledger = Ledger()
    rec._saved = None
    # What the last pass compared edits with (focus.py) holds every run's digest: kept, it would
    # pin the pass's arenas as the records did. The next pass then looks at everything.
    rec.focus.runs = rec.focus.context = None
    # The memos of values the pass formatted and parsed (every status's strings, every identity)
    # are as scattered as the records: a daemon whose first pass wrote 10,000 status files stayed
    # at 160 MB with them, 104 MB without. They fill again with what later passes use.
    for memo in (yamlemit._style, yamlemit._key, identity.split, observe._identity):
        memo.cache_clear()
    # The spec records and their run entries point at each other: only the cyclic collector
    # frees them, and the previous pass froze them out of its sight (loop.py, _gc).
    gc.unfreeze()
    gc.collect()
    # CPython's cache of attribute lookups on types (4096 slots) holds the name string of each
    # lookup it keeps, names built at run time included ('do_' + method: each HTTP request served
    # while the pass ran builds one). Allocated in the middle of the pass, those few strings kept
    # about half the daemon's arenas from going back (10,000 specs, ~130 requests during the
    # first pass: 104-109 arenas, 135-140 MB; cleared: 52-53, 84 MB). It refills as lookups come.
    # sys._clear_type_cache: https://docs.python.org/3/library/sys.html
    clear_type_cache = getattr(sys, "_clear_type_cache", None)
    if clear_type_cache is not None:
        clear_type_cache()
    malloc_trim()
    restored = passcache.restore(rec.cfg.state_dir, rec.cfg.repo, rec.cache)
    rec.adopt(restored)
    if restored is None or not rec.settled and restored.settled:
        # Nothing (or not the settled runs) came back: the next pass parses what it needs, and
        # this process does not try again (a cache it cannot read back would cost that every time).
        rec._rehome_failed = True
        return False
    return True
