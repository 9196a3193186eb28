"""A run's log index (``artifacts/logs.index``, written on the machine by ``runtime/log_stamp.py``),
read at the trust boundary.

The index comes from the machine, so it is a claim, not a fact: a line that is not exactly a
record, a time out of range, a size that goes back or lies past what the log holds is skipped, and
so is everything past ``MAX_INDEX_BYTES`` or ``MAX_RECORDS``. What is left can only misplace a
line among the run's own output, never fail more than that: a log without a usable record reads
in its own order, as before the index existed.
"""

from __future__ import annotations

import bisect
import re

HEADER = b"# reconciler log index v1"
STREAMS = {"o": "stdout", "e": "stderr"}
MAX_INDEX_BYTES = 16 << 20  # the writer stops at 12 MiB; past this, nothing is read
MAX_RECORDS = 400_000  # per stream
MAX_LINE = 64
MAX_TIME = 1e11  # unix seconds, year ~5000: beyond is garbage
MAX_SIZE = 1 << 50
_RECORD = re.compile(rb"(\d{1,11}(?:\.\d{1,6})?) ([oe]) (\d{1,16})")


class LogIndex:
    """Records fed as the index is read (in pieces, a line possibly split between two), and the
    time each log offset was written."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {s: [] for s in STREAMS.values()}
        self.sizes: dict[str, list[int]] = {s: [] for s in STREAMS.values()}
        self.partial = b""
        self.read = 0
        self.present = False  # the header was seen: the run's wrapper keeps an index

    def feed(self, data: bytes) -> None:
        room = MAX_INDEX_BYTES - self.read
        if room <= 0:
            return
        data = data[:room]
        self.read += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        if len(self.partial) > MAX_LINE:
            self.partial = b""  # no record is that long: the rest of it is skipped with it
        for line in lines:
            self._line(line)

    def _line(self, line: bytes) -> None:
        if line == HEADER:
            self.present = True
            return
        m = _RECORD.fullmatch(line) if len(line) <= MAX_LINE else None
        if m is None:
            return
        t, stream, size = float(m.group(1)), STREAMS[m.group(2).decode()], int(m.group(3))
        times, sizes = self.times[stream], self.sizes[stream]
        if not 0 < t < MAX_TIME or size > MAX_SIZE or len(times) >= MAX_RECORDS:
            return
        if times and (t < times[-1] or size <= sizes[-1]):
            return  # a stream's records only go forward
        times.append(t)
        sizes.append(size)

    def time_of(self, stream: str, offset: int, log_size: int | None = None) -> float | None:
        """When the byte at ``offset`` of ``stream``'s log was written: the first record whose size
        is above it; None when no record covers it yet (or the record claims more than the log
        holds, ``log_size``)."""
        return self.span_of(stream, offset, log_size)[0]

    def span_of(self, stream: str, offset: int, log_size: int | None = None) -> tuple[float | None, int]:
        """``time_of``, and the offset up to which the same record covers the log (every byte
        before it has that time)."""
        sizes = self.sizes.get(stream) or []
        i = bisect.bisect_right(sizes, offset)
        if i >= len(sizes) or (log_size is not None and sizes[i] > log_size):
            return None, offset + 1
        return self.times[stream][i], sizes[i]
