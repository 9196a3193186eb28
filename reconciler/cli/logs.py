"""``reconcile logs NAME``: a run's stdout and stderr, wherever it runs.

The run's status names its machine and workspace; the logs are read there through the same
transport the reconciler uses (a shell on this machine, or one command over SSH per file and
poll). A run that is over, or whose remote workspace was removed after collection, is read from
the collected copy in ``.reconciler/bundles/<identity>``. ``--follow`` polls until the run has a
result (``runtime/result.json``), then prints what was written last and exits.

Each read is one command that prints ``<size> <done>`` (the first read of a file also the number
of lines it has) and then the bytes up to that size, so the next read starts exactly where this
one stopped, whatever the job writes in between. The first read shows the last ``--lines`` lines
(0: all of them) and says on stderr when that is not the whole file.

``--json`` prints one JSON object per line, ``{"stream": "stdout"|"stderr", "line": TEXT}``, TEXT
without its newline; a line still being written is printed once it is complete (or the run ends).

Both streams (the default) are interleaved in the order their lines were written when the run
keeps ``artifacts/logs.index`` (``logs_merge.py``; read like the logs, parsed by
``core/logindex.py``); a run without one prints stdout, then stderr, as before.
"""

from __future__ import annotations

import base64
import codecs
import errno
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path

from reconciler.status import store as statuses
from reconciler.core.runstatus import TERMINAL
from reconciler.core.config import Config
from reconciler.core.errors import ReconcilerError
from reconciler.core.names import LOCAL
from reconciler.spec.load import load_tree
from reconciler.machines.pool import recorded_pool

from .logs_merge import Merger, stamp
from reconciler.core.logindex import MAX_INDEX_BYTES, LogIndex

STREAMS = {"stdout": ["artifacts/stdout.log"], "stderr": ["artifacts/stderr.log"],
           "both": ["artifacts/stdout.log", "artifacts/stderr.log"]}
# The most bytes one read takes from a file: the first read's last lines come from at most this
# much of its end, and a long log (``--lines 0``, or a job writing faster than the poll) is read
# in pieces of this size, so a log of any size never has to fit in memory at once.
READ_BYTES = 4 << 20
# What a job can write that a terminal acts on instead of showing: C0 and C1 controls (escape
# sequences: OSC 52 clipboard writes, title changes, cursor moves that hide lines; ``\r`` overwrites)
# and the invisible format characters that reorder or hide text (bidirectional overrides,
# zero-width characters). ``\n`` and ``\t`` stay.
_TERMINAL_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e"
                              "\u2060-\u206f\ufeff\ufff9-\ufffb]")


def _escape_char(m: re.Match) -> str:
    c = ord(m.group())
    if c == 0x0D:
        return "\\r"  # a carriage return shows where it was, and overwrites nothing
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def escape_for_terminal(text: str) -> str:
    """``text`` with everything a terminal would act on written out as ``\\xNN`` or ``\\uNNNN``."""
    return _TERMINAL_UNSAFE.sub(_escape_char, text)


def read_script(ws: str, rel: str, offset: int | None, lines: int) -> str:
    """Shell that prints "SIZE DONE START COUNT" (or "gone 0"), then, base64-encoded (so the bytes
    arrive exactly as the job wrote them), COUNT bytes of the file from START, never past SIZE nor
    more than ``READ_BYTES``. START is ``offset``; on the first read (``offset`` None) with
    ``lines`` it is where the last ``READ_BYTES`` before SIZE begin, and the header also gives
    TOTAL, the file's lines (a last one without its newline counts)."""
    d, f = shlex.quote(ws), shlex.quote(f"{ws}/{rel}")
    script = (f"[ -d {d} ] || {{ echo 'gone 0'; exit 0; }}\n"
              "command -v base64 >/dev/null 2>&1 || { echo 'nobase64 0'; exit 0; }\n"
              f"done=0; [ -e {d}/runtime/result.json ] && done=1\n"
              f"s=$(( $(wc -c 2>/dev/null < {f} || echo 0) ))\n")
    if offset is None and lines > 0:
        script += f"b=$(( s > {READ_BYTES} ? s - {READ_BYTES} : 0 ))\n"
    else:
        script += f"b={int(offset or 0)}\n"
    script += f"n=$(( s - b )); [ $n -gt {READ_BYTES} ] && n={READ_BYTES}; [ $n -lt 0 ] && n=0\n"
    if offset is None:
        script += ("t=0\n"
                   f'[ "$s" -gt 0 ] && t=$(( $(head -c "$s" {f} | wc -l) + 1'
                   f' - $(head -c "$s" {f} | tail -c 1 | wc -l) ))\n'
                   'echo "$s $done $b $n $t"\n')
    else:
        script += 'echo "$s $done $b $n"\n'
    return script + f'[ "$n" -gt 0 ] && tail -c +$(( b + 1 )) {f} | head -c "$n" | base64\nexit 0\n'


def _count_lines(fd: int, size: int) -> int:
    n, pos, last = 0, 0, b"\n"
    while pos < size:
        block = os.pread(fd, min(1 << 20, size - pos), pos)
        if not block:
            break
        n, pos, last = n + block.count(b"\n"), pos + len(block), block[-1:]
    return n + (last != b"\n")


def local_read(ws: str, rel: str, offset: int | None, lines: int, roots: list) -> tuple[list[str], bytes]:
    """``read_script``'s answer for a workspace on this host, read without following a link: the
    workspace must lie inside ``roots`` (the local workspace root, the bundle store) and every
    folder and the file are opened with ``O_NOFOLLOW`` (``dashboard.open_inside``); a link, a FIFO
    or a path outside reads as an empty file, with a note on stderr."""
    from reconciler.daemon.dashboard import open_inside

    if not os.path.isdir(ws):
        return ["gone", "0"], b""
    done = "1" if os.path.lexists(os.path.join(ws, "runtime", "result.json")) else "0"
    try:
        fd = open_inside(os.path.join(ws, rel), roots)
    except OSError as e:
        if e.errno != errno.ENOENT:
            print(f"reconcile logs: {rel}: {e.strerror}", file=sys.stderr)
        fd = None
    else:
        if fd is None:
            print(f"reconcile logs: {rel} is not a regular file reached without a link inside the workspace "
                  "root or the bundle store; not shown", file=sys.stderr)
    if fd is None:
        return ["0", done, "0", "0"] + (["0"] if offset is None else []), b""
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - READ_BYTES) if offset is None and lines > 0 else min(int(offset or 0), size)
        data = os.pread(fd, min(size - start, READ_BYTES), start)
        header = [str(size), done, str(start), str(len(data))]
        if offset is None:
            header.append(str(_count_lines(fd, size)))
        return header, data
    finally:
        os.close(fd)


def last_lines(data: bytes, lines: int, cut: bool) -> bytes:
    """The last ``lines`` lines of ``data``; ``cut``: ``data`` starts inside a line, which is left out."""
    if cut:
        data = data[data.find(b"\n") + 1:] if b"\n" in data else b""
    if lines <= 0:
        return data
    body = data[:-1] if data.endswith(b"\n") else data
    at = len(body)
    for _ in range(lines):
        at = body.rfind(b"\n", 0, at)
        if at < 0:
            return data
    return data[at + 1:]


class _Terminal:
    """Bytes as text a terminal shows without acting on it (``escape_for_terminal``); bytes that
    are not UTF-8 show as ``\\xNN``. A character split between two reads is decoded whole."""

    def __init__(self) -> None:
        self.decoders: dict[str, codecs.IncrementalDecoder] = {}

    def write(self, stream: str, data: bytes, final: bool) -> None:
        dec = self.decoders.setdefault(stream, codecs.getincrementaldecoder("utf-8")("backslashreplace"))
        sys.stdout.write(escape_for_terminal(dec.decode(data, final)))
        sys.stdout.flush()

    def prefix(self, head: bytes) -> None:  # a line's label and time: ASCII the reconciler wrote
        sys.stdout.write(head.decode("ascii"))


class _Raw:
    """The bytes as the job wrote them."""

    def write(self, stream: str, data: bytes, final: bool) -> None:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()

    def prefix(self, head: bytes) -> None:
        sys.stdout.flush()
        sys.stdout.buffer.write(head)


class _JsonLines:
    """Bytes read from each stream → one ``{"stream", "line"}`` object per complete line."""

    def __init__(self, timestamps: bool = False) -> None:
        self.partial: dict[str, str] = {}
        self.decoders: dict[str, codecs.IncrementalDecoder] = {}
        self.timestamps = timestamps

    def write(self, stream: str, data: bytes | str, final: bool, when: float | None = None) -> None:
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogateescape")
        dec = self.decoders.setdefault(stream, codecs.getincrementaldecoder("utf-8")("replace"))
        text = dec.decode(data, final)
        pieces = (self.partial.pop(stream, "") + text).split("\n")
        rest = pieces.pop()  # after the last newline: the start of a line still being written
        if rest and final:
            pieces.append(rest)
        elif rest:
            self.partial[stream] = rest
        for line in pieces:
            row = {"stream": stream, "line": line}
            if self.timestamps:  # the merged reading's time of the line (logs_merge), null when unknown
                row["time"] = stamp(when).decode().strip() if when is not None else None
            sys.stdout.write(json.dumps(row, ensure_ascii=False) + "\n")
        sys.stdout.flush()

    def flush(self) -> None:
        for stream in list(self.partial):
            self.write(stream, b"", final=True)


class _Source:
    """Where a run's log files are read from, and how far each has been read. The place can change
    under a follow: a workspace removed after collection is read from the collected copy."""

    def __init__(self, machine: str, ws: str, collected: Path | None, roots: list, lines: int):
        self.machine, self.ws, self.collected, self.roots, self.lines = machine, ws, collected, roots, lines
        self.t = None
        self.offsets: dict[str, int | None] = {}

    def has_copy(self) -> bool:  # asked again when a workspace is gone: collection may have happened meanwhile
        return self.machine != LOCAL and self.collected is not None and self.collected.is_dir()

    def read(self, f: str) -> tuple[list[str], bytes]:
        if self.t is None:
            return local_read(self.ws, f, self.offsets[f], self.lines, self.roots)
        script = read_script(self.ws, f, self.offsets[f], self.lines)
        header, _, body = self.t.sh(script, timeout=60).out.partition("\n")
        try:
            data = base64.b64decode(body)
        except ValueError:  # cut short: read again from the same offset next time
            return ["", ""], b""
        return header.split(), data


def follow_logs(cfg: Config, name: str, stream: str, lines: int, follow: bool, interval: float = 0.5,
                as_json: bool = False, raw: bool | None = None, timestamps: bool = False) -> int:
    """``raw``: write the bytes as they are; None: only when stdout is not a terminal (a pipe or a
    file gets the exact log, a terminal the log with its control characters escaped).
    ``timestamps``: each line's time, from the run's log index (both streams only)."""
    st = statuses.load_all(cfg.repo / "status").get(name)
    if st is None or st.handle is None or not st.handle.workspace:
        print(f"reconcile logs: run {name!r} has not been launched (no status handle)", file=sys.stderr)
        return 1
    machine, ws = st.handle.machine or LOCAL, st.handle.workspace
    # The copy collected after the run (named by its identity; without one there is none to find).
    # A run on several machines: node 0's (the handle's machine and workspace are node 0's too).
    ident = st.handle.nodes[0]["identity"] if st.handle.nodes else st.handle.identity
    collected = cfg.state_dir / "bundles" / ident if ident else None
    # Where a workspace on this host may be read: a status file names the path, and anyone who can
    # push can write one.
    roots = [cfg.local_root, cfg.state_dir / "bundles"]
    src = _Source(machine, ws, collected, roots, lines)

    if raw is None:
        raw = not sys.stdout.isatty()
    pool = recorded_pool(cfg, load_tree(cfg.repo), {name: st})
    try:
        if st.phase in TERMINAL and src.has_copy():
            src.machine, src.ws = LOCAL, str(collected)
        src.t = pool.get(src.machine) if src.machine != LOCAL else None
        src.offsets = {f: None for f in STREAMS[stream]}
        out = _JsonLines(timestamps) if as_json else _Raw() if raw else _Terminal()
        if stream == "both":
            index = LogIndex()
            rc = _read_index(src, index, st.handle.identity)
            if rc is not None:
                return rc
            if index.present:
                merger = Merger(out, index, labels=not raw and not as_json, timestamps=timestamps)
                return _follow_merged(src, merger, follow, interval, st.handle.identity)
        if timestamps:
            print("reconcile logs: no times to show: " + ("they are kept for both streams together (--stream "
                  "both)" if stream != "both" else "this run's logs have no index (a version before it, or no "
                  "python on the machine)"), file=sys.stderr)

        while True:
            first_done = None
            for f in STREAMS[stream]:
                rc, done = _read_file(src, f, out, follow, st.handle.identity)
                if rc is not None:
                    return rc
                if first_done is None:
                    first_done = done
            # Done when the result existed before this round's reads began: they saw every byte.
            if not follow or first_done:
                if isinstance(out, _JsonLines):
                    out.flush()
                return 0
            time.sleep(interval)
    except ReconcilerError as e:
        print(f"reconcile logs: {e}", file=sys.stderr)
        return 1
    finally:
        pool.close()


def _fetch(src: _Source, f: str, identity: str | None) -> tuple[int | None, list[str], bytes]:
    """One read of ``f`` (from the collected copy once the workspace is gone); an exit status
    when the logs cannot be read."""
    header, body = src.read(f)
    if header[:1] == ["nobase64"]:
        print(f"reconcile logs: {src.machine} has no base64 command (coreutils), which reading "
              "a log there needs", file=sys.stderr)
        return 1, header, body
    if header[:1] == ["gone"]:
        if not src.has_copy():
            print(f"reconcile logs: the workspace of {identity} is gone from {src.machine}",
                  file=sys.stderr)
            return 1, header, body
        src.machine, src.ws, src.t = LOCAL, str(src.collected), None  # removed after collection
        header, body = src.read(f)
    return None, header, body


def _read_file(src: _Source, f: str, out, follow: bool, identity: str | None) -> tuple[int | None, bool]:
    """One round's read of one log file, in pieces of at most READ_BYTES up to the size the first
    piece saw. Return an exit status when the logs cannot be read (None: go on), and whether the
    run had its result before the first piece was read."""
    target = None
    first_done = None
    while True:
        rc, header, body = _fetch(src, f, identity)
        if rc is not None:
            return rc, False
        size, done, start, count, total = (header + ["", "", "", "", ""])[:5]
        if first_done is None:
            first_done = done == "1"
        if not (size.isdigit() and start.isdigit() and count.isdigit()) or len(body) != int(count):
            break  # an answer cut short: the next round reads from the same offset
        size_n, start_n = int(size), int(start)
        if src.offsets[f] is None and src.lines > 0:
            body = _first_lines(body, src.lines, start_n > 0, total, f)
        if target is None:
            target = size_n
        src.offsets[f] = start_n + int(count)
        last_piece = src.offsets[f] >= min(size_n, target)
        if isinstance(out, _JsonLines):
            out.write(f.rsplit("/", 1)[-1].removesuffix(".log"), body, final=not follow and last_piece)
        elif body:
            # A last line without its newline gets one, unless more may follow on it.
            end = b"\n" if not follow and last_piece and not body.endswith(b"\n") else b""
            out.write(f, body + end, final=last_piece and not follow)
        if last_piece or not body:
            break
    return None, first_done


def _first_lines(body: bytes, lines: int, cut: bool, total: str, f: str) -> bytes:
    """The last ``lines`` lines of a file's first piece; say on stderr when that is not all of it."""
    body = last_lines(body, lines, cut)
    shown = body.count(b"\n") + (bool(body) and not body.endswith(b"\n"))
    if total.isdigit() and int(total) > shown:
        more = " (as many as its last 4 MiB hold)" if cut and shown < lines else ""
        print(f"reconcile logs: showing the last {shown} lines{more} of {total} of "
              f"{f.rsplit('/', 1)[-1]}; use --lines 0 for all", file=sys.stderr)
    return body


INDEX = "artifacts/logs.index"


def _read_index(src: _Source, index: LogIndex, identity: str | None) -> int | None:
    """What the index holds beyond what was read of it (at most ``logindex.MAX_INDEX_BYTES`` in
    all); an exit status when the logs cannot be read."""
    src.offsets.setdefault(INDEX, 0)
    while True:
        rc, header, body = _fetch(src, INDEX, identity)
        if rc is not None:
            return rc
        size, _, start, count = (header + ["", "", "", ""])[:4]
        if not (size.isdigit() and start.isdigit() and count.isdigit()) or len(body) != int(count):
            return None  # cut short: read again next time
        if int(start) != src.offsets[INDEX]:
            return None  # the index shrank: it is not the one read so far; keep what was read
        index.feed(body)
        src.offsets[INDEX] = int(start) + len(body)
        if not body or src.offsets[INDEX] >= int(size) or index.read >= MAX_INDEX_BYTES:
            return None


def _read_piece(src: _Source, f: str, merger: Merger, targets: dict, identity: str | None):
    """One piece of one log into ``merger``: (exit status or None, the run had its result before
    it, this log has nothing more to read this round)."""
    rc, header, body = _fetch(src, f, identity)
    if rc is not None:
        return rc, False, True
    size, done, start, count, total = (header + ["", "", "", "", ""])[:5]
    if not (size.isdigit() and start.isdigit() and count.isdigit()) or len(body) != int(count):
        return None, done == "1", True  # cut short: read again from the same offset next round
    got = len(body)
    if src.offsets[f] is None and src.lines > 0:
        body = _first_lines(body, src.lines, int(start) > 0, total, f)
    name = f.rsplit("/", 1)[-1].removesuffix(".log")
    merger.feed(name, int(start) + got - len(body), body, int(size))
    src.offsets[f] = int(start) + got
    targets.setdefault(f, int(size))
    return None, done == "1", not got or src.offsets[f] >= min(int(size), targets[f])


def _follow_merged(src: _Source, merger: Merger, follow: bool, interval: float, identity: str | None) -> int:
    """Both logs, a piece of each in turn, printed in the order their lines were written."""
    files = STREAMS["both"]
    while True:
        targets: dict = {}
        caught = {f: False for f in files}
        first_done = None
        while not all(caught.values()):
            for f in files:
                if caught[f]:
                    continue
                rc, done, caught[f] = _read_piece(src, f, merger, targets, identity)
                if rc is not None:
                    return rc
                first_done = done if first_done is None else first_done
            merger.emit(False, {f.rsplit("/", 1)[-1].removesuffix(".log") for f in files if not caught[f]})
        if not follow or first_done:
            merger.emit(True)
            return 0
        time.sleep(interval)
        rc = _read_index(src, merger.index, identity)
        if rc is not None:
            return rc
