"""The cyclic garbage collector around a pass: off while the pass runs, and what outlives the pass
frozen out of its sight.

A steady pass over 10,000 runs allocates a few hundred thousand container objects that live
until it ends (the observed world and its copies of the reports, the plan's changes and their
lists). With the collector's default thresholds each of them is walked by young collections while
the pass runs, and now and then by a full one: 0.1 to 0.3 s of CPU per steady pass at 10,000 runs
(measured with ``gc.callbacks`` under benchmarks/scale_bench.py), and none of it finds garbage: a
steady pass makes no reference cycle (``gc.collect()`` at its end finds no unreachable object),
and what it drops reference counting frees. So the collector is off while a pass runs, except a
process's first pass: it parses every spec, and its parse trees' cycles are collected as it goes
(held to the pass's end they pinned some 40 MB more of the allocator's arenas for good). A pass that
did work (applied a change, wrote a status, parsed files) may have made cycles (exceptions,
connections): it is collected once at its end. Every FULL_GC_EVERY passes everything is looked at
once, the frozen caches included.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

from .rehome import malloc_trim

FULL_GC_EVERY = 50
TRIM_AFTER = 1000  # spec files: a first pass this large leaves freed parse trees in malloc's arenas


@contextmanager
def paused() -> Iterator[None]:
    """The collector off for the block (as it was after it: a caller that turned it off keeps it off)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def after_pass(passes: int, spec_files: int, busy: bool) -> None:
    """At the end of pass number ``passes``: what the pass leaves behind is mostly caches that live
    as long as the process (parsed specs and statuses), frozen so that the collector does not walk
    them again and again (a third of a big pass's time otherwise). ``busy``: the pass did work, so
    its own cycles are collected before that. ``spec_files``: the spec cache's size."""
    if passes == 1 and spec_files >= TRIM_AFTER:
        malloc_trim()
    if passes % FULL_GC_EVERY == 0:
        gc.unfreeze()
        gc.collect()
    elif busy:
        gc.collect()
    gc.freeze()
