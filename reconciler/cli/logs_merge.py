"""``reconcile logs``: stdout and stderr interleaved in the order their lines were written.

The run's wrapper keeps ``artifacts/logs.index`` beside the two logs (``runtime/log_stamp.py``):
when each log grew. Each line gets the time of the first record of its stream that covers its
first byte (``core.logindex``), and the lines of both streams are printed by that time, stdout's
first on a tie. A line no record covers yet (the watcher polls; or it died) waits a few reads for
one while following, and is printed in its stream's order at the end of what was read otherwise.

On a terminal each line is labelled with its stream (``out | ``, ``err | ``); a pipe or a file gets
the job's bytes interleaved, unlabelled (``--raw``: the bytes as written); ``--json`` has
``stream``. ``--timestamps`` puts the line's time (UTC, milliseconds) before it.
"""

from __future__ import annotations

import time
from collections import deque

from reconciler.core.logindex import LogIndex

RANK = {"stdout": 0, "stderr": 1}
LABELS = {"stdout": b"out | ", "stderr": b"err | "}
HOLD_ROUNDS = 4  # reads a line without a record waits for one while following
# Lines held for their place, at most: past it, what waits for a record is printed in its stream's
# order (a log of gigabytes that no record covers must not be held whole).
MAX_HELD_BYTES = 16 << 20


def stamp(t: float | None) -> bytes:
    if t is None:
        return b"-".rjust(24) + b" "
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))
    return f"{whole}.{int(t * 1000) % 1000:03d}Z ".encode()


class Merger:
    """Lines fed per stream with their offset in the log; printed by time through ``out`` (the
    terminal, raw or JSON printer)."""

    def __init__(self, out, index: LogIndex, labels: bool, timestamps: bool):
        self.out, self.index, self.labels, self.timestamps = out, index, labels, timestamps
        self.queues: dict[str, deque] = {s: deque() for s in RANK}
        self.partial: dict[str, bytes] = {s: b"" for s in RANK}
        self.start: dict[str, int | None] = {s: None for s in RANK}
        self.sizes: dict[str, int] = {s: 0 for s in RANK}
        self.held = 0
        self.held_bytes = 0
        self._last_stamp: tuple = (object(), b"")

    def feed(self, stream: str, start: int, data: bytes, size: int) -> None:
        """``data`` read from ``stream``'s log at ``start`` (which held ``size`` bytes then)."""
        self.sizes[stream] = max(self.sizes[stream], size)
        if self.start[stream] is None or start != self.start[stream] + len(self.partial[stream]):
            self.partial[stream], self.start[stream] = b"", start  # the first piece read
        buf, at, pos = self.partial[stream] + data, self.start[stream], 0
        q = self.queues[stream]
        while (nl := buf.find(b"\n", pos)) >= 0:
            q.append((at + pos, buf[pos:nl + 1]))
            self.held_bytes += nl + 1 - pos
            pos = nl + 1
        self.partial[stream], self.start[stream] = buf[pos:], at + pos

    def _time(self, stream: str) -> float | None:
        return self.index.time_of(stream, self.queues[stream][0][0], self.sizes[stream])

    def emit(self, final: bool, reading: set[str] = frozenset()) -> None:
        """Print every line whose place is known: ``reading``, the streams with more to read
        now (a line of theirs still to come may be earlier); ``final``: everything, a last line
        without its newline too."""
        if final:
            for s in RANK:
                if self.partial[s]:
                    self.queues[s].append((self.start[s], self.partial[s]))
                    self.held_bytes += len(self.partial[s])
                    self.partial[s] = b""
        while True:
            heads = {s: self._time(s) for s in RANK if self.queues[s]}
            if not heads or (not final and any(s in reading for s in RANK if s not in heads)):
                break
            s = min(heads, key=lambda x: (heads[x] is None, heads[x] or 0.0, RANK[x]))
            if heads[s] is None and not final and self.held < HOLD_ROUNDS and self.held_bytes < MAX_HELD_BYTES:
                self.held += 1
                break
            self.held = 0
            others = [t for x, t in heads.items() if x != s]
            self._run(s, heads[s], others[0] if others else None)
        if final and hasattr(self.out, "flush"):
            self.out.flush()

    def _run(self, stream: str, t: float | None, limit: float | None) -> None:
        """The head line of ``stream`` and those after it that come before the other stream's
        head (at ``limit``; stdout's first on a tie), printed together."""
        q, batch, end = self.queues[stream], [], -1
        while q:
            if batch and q[0][0] >= end:  # past the record the lines so far share
                t, end = self.index.span_of(stream, q[0][0], self.sizes[stream])
                if t is None or (limit is not None and (t > limit or t == limit and RANK[stream])):
                    break
            elif not batch and t is not None:
                end = self.index.span_of(stream, q[0][0], self.sizes[stream])[1]
            line = q.popleft()[1]
            self.held_bytes -= len(line)
            batch.append((t, line if line.endswith(b"\n") else line + b"\n"))
        if not hasattr(self.out, "prefix"):  # JSON: a line per object, the stream named in it
            for when, line in batch:
                self.out.write(stream, line, final=False, when=when)
            return
        label = LABELS[stream] if self.labels else b""
        if self.timestamps:
            data = b"".join(self._stamp(when) + label + line for when, line in batch)
        else:
            data = b"".join(label + line for _, line in batch) if label else b"".join(line for _, line in batch)
        self.out.write(stream, data, final=False)  # the label and time are ASCII: safe for every printer

    def _stamp(self, t: float | None) -> bytes:
        if self._last_stamp[0] != t:  # lines of one record share a time
            self._last_stamp = (t, stamp(t))
        return self._last_stamp[1]
