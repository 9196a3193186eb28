"""Which local file changes wake the daemon, and when a burst of them is over.

A module of its own because the reaction time to an edit under ``specs/`` is mostly the
watcher's, and the benchmark's floor (benchmarks/daemon_bench.py: a bare watcher that only starts
a process) must watch with the same filter and the same step: both read them from here.

watchfiles hands over a batch once ``step`` milliseconds pass without a new change (its
``watch`` and ``debounce``/``step``/``rust_timeout`` parameters,
https://watchfiles.helpmanual.io/api/watch/), so one saved file (an editor's write and rename)
wakes a pass one to two steps after it lands. A burst must not be cut in two: a writer that pauses
longer than a step on a loaded machine (measured on 2 cores at a load average of 15: in 6% of
bursts of 50 atomic writes some gap was over 20 ms) would launch half of it in one pass and the
rest in the next. So a batch that touches more
than one file, or that comes with a write of git's index (a pull, a checkout, a commit: the files
land before the branch moves, and the pass must see the commit that holds them), is held until
nothing under the checkout has changed for ``quiet`` seconds (the ``debounce`` setting), and at
most ``MAX_HOLD`` seconds. A batch of git's index alone (the daemon's own ``git status`` and status
commits, a user's ``git add``) wakes nothing.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Iterator

WATCHED = ("specs", "execution_templates")
STEP_MS = 20  # a single saved file is handed over 20 to 40 ms after it lands
MAX_HOLD = 2.0  # seconds: a burst that never goes quiet still gets a pass this often
# git takes its index lock before it writes the files and renames it into place after: a file
# handed over this soon after a write of the index is part of a git operation. Writes of the daemon
# itself (``git status`` in every pass, its commits and fetches) are told apart by ``own_git``.
GIT_WINDOW = 0.1
ADDED = 1  # watchfiles.Change.added


class Filter:
    """watchfiles' filter: what is under ``specs/`` and ``execution_templates/`` (and those folders
    themselves), and git's index, which tells a git operation in the checkout from an edit."""

    def __init__(self, root: str):
        self.root = root
        self.prefixes = tuple(os.path.join(root, d) + os.sep for d in WATCHED)
        self.folders = frozenset(os.path.join(root, d) for d in WATCHED)
        self.index = os.path.join(root, ".git", "index")  # also index.lock, which git renames into place

    def __call__(self, change, path: str) -> bool:  # noqa: ARG002
        return self.spec(path) or path.startswith(self.index)

    def spec(self, path: str) -> bool:
        return path.startswith(self.prefixes) or path in self.folders


def settings(quiet: float) -> dict:
    """watchfiles' timing: batches after a quiet ``STEP_MS``; with no change at all for ``quiet``
    seconds it hands over an empty batch, which ends a held burst."""
    return dict(step=STEP_MS, debounce=int(MAX_HOLD * 1000), rust_timeout=max(STEP_MS, int(quiet * 1000)),
                yield_on_timeout=True, raise_interrupt=False)


def _files(changes: set) -> int:
    """How many files a batch touched, up to 2: a file created and gone within the batch (an
    editor's temporary, the ``.tmp`` of an atomic write) is not one."""
    added = {p for c, p in changes if c == ADDED}
    seen = set()
    for _, p in changes:
        if p not in seen and (p not in added or os.path.lexists(p)):
            seen.add(p)
            if len(seen) > 1:
                break
    return len(seen)


class Batches:
    """The settled batches of spec changes under ``root``, as sets of absolute paths."""

    def __init__(self, root: str, quiet: float, own_git: Callable[[], bool] = lambda: False):
        self.filter = Filter(root)
        self.root = root
        self.quiet = quiet
        self.own_git = own_git  # whether the daemon itself has just been using git in the checkout

    def changes(self, stop_event) -> Iterator[set[str]]:
        from watchfiles import watch

        held: set = set()
        since = 0.0
        git_at = float("-inf")  # when git last wrote its index
        for batch in watch(self.root, watch_filter=self.filter, stop_event=stop_event, **settings(self.quiet)):
            specs = {(c, p) for c, p in batch if self.filter.spec(p)}
            if len(specs) < len(batch) and not self.own_git():
                git_at = time.monotonic()
            if batch and not held:
                files = _files(specs)
                if not files:
                    continue  # git's index alone (a status commit, staging), or temporaries: nothing to read
                if files == 1 and time.monotonic() - git_at > GIT_WINDOW:
                    yield {p for _, p in specs}  # one file, no git operation: at once
                    continue
            if batch:
                if not held:
                    since = time.monotonic()
                held |= specs
                if time.monotonic() - since < MAX_HOLD:
                    continue
            if held:  # quiet for ``quiet`` seconds (an empty batch), or held for MAX_HOLD
                yield {p for _, p in held}
                held = set()
