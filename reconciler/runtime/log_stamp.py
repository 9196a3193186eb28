#!/usr/bin/env python3
"""Times for the lines of a run's stdout and stderr, so ``reconcile logs`` can interleave them.

The job keeps writing straight into ``artifacts/stdout.log`` and ``artifacts/stderr.log``: the
files stay byte-identical to what it wrote, and nothing sits between the job and them. This
watcher only looks at the two files' sizes and appends a record to ``artifacts/logs.index`` each
time one of them has grown:

    # reconciler log index v1          (the first line; the wrapper writes it)
    <unix seconds, 3 decimals> <o|e> <size>

"stdout (``o``) or stderr (``e``) held <size> bytes at that time": a line that starts at byte B
was written no later than the first record of its stream whose size is above B, and after the
record before it (the poll interval bounds the difference).

Why it watches instead of sitting on a pipe: a process between the job and its files can kill the
job (SIGPIPE when it dies), block it (a full pipe when it stalls or the disk is full), or hold
the end of the run open (a child of the job that inherits the pipe). Looking at sizes does none
of that: this script can crash, be killed or find the disk full, and the job, its exit code and
the wrapper's wait are what they would be without it. A job that writes 1 GB without a newline
costs it nothing but a record per poll.

Bounded: it polls every 10 ms while a file grows and backs off to 0.25 s while none does; it
records more coarsely as the index grows (every 0.1 s past 1 MiB, every second past 4 MiB, every
10 s past 8 MiB) and stops recording at 12 MiB (days of output on both streams). It exits when
the wrapper (``--watch-pid``) is gone or on SIGTERM, after a last look. Standard library only: it
runs with the machine's python.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

HEADER = b"# reconciler log index v1\n"
FAST, SLOW = 0.01, 0.25
# (index size from which, the least seconds between two records of one stream)
COARSER = ((12 << 20, None), (8 << 20, 10.0), (4 << 20, 1.0), (1 << 20, 0.1), (0, 0.0))


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _gap(written: int) -> float | None:
    for at, gap in COARSER:
        if written >= at:
            return gap
    return 0.0


class Watcher:
    """The last size and record of each stream, and the index it appends to."""

    def __init__(self, index: str, files: dict[str, str]):
        self.files = files
        self.sizes = {s: 0 for s in files}
        self.last_t = {s: 0.0 for s in files}
        self.last_record = {s: 0.0 for s in files}
        self.fd = os.open(index, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.written = _size(index)

    def look(self) -> bool:
        """One poll: a record for each stream that grew (unless the index is too big for one now);
        whether any grew."""
        grew = False
        for s, path in self.files.items():
            size = _size(path)
            if size <= self.sizes[s]:
                continue
            grew = True
            now = max(time.time(), self.last_t[s])  # never back in time within a stream
            gap = _gap(self.written)
            if gap is None or now - self.last_record[s] < gap:
                continue  # the next record covers these bytes too
            line = b"%.3f %s %d\n" % (now, s.encode(), size)
            try:
                self.written += os.write(self.fd, line)  # one write below PIPE_BUF: appended whole
            except OSError:
                self.written = COARSER[0][0]  # a full disk: stop recording, never stop the job
                continue
            self.sizes[s], self.last_t[s], self.last_record[s] = size, now, now
        return grew


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Record when a run's stdout and stderr grow.")
    p.add_argument("--index", required=True)
    p.add_argument("--stdout", required=True)
    p.add_argument("--stderr", required=True)
    p.add_argument("--watch-pid", type=int, required=True)
    args = p.parse_args(argv)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        w = Watcher(args.index, {"o": args.stdout, "e": args.stderr})
    except OSError as e:
        print(f"log_stamp: {e}", file=sys.stderr)
        return 0
    delay = FAST
    while not stop and _alive(args.watch_pid):
        delay = FAST if w.look() else min(SLOW, delay * 2)
        time.sleep(delay)
    w.look()  # what was written between the last poll and the end
    return 0


if __name__ == "__main__":
    sys.exit(main())
