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
"""

from __future__ import annotations

import json
import shlex
import sys
import time

from . import status as statuses
from .config import Config
from .errors import ReconcilerError
from .plan import LOCAL
from .spec.load import load_tree
from .transports import recorded_pool

STREAMS = {"stdout": ["artifacts/stdout.log"], "stderr": ["artifacts/stderr.log"],
           "both": ["artifacts/stdout.log", "artifacts/stderr.log"]}


def read_script(ws: str, rel: str, offset: int | None, lines: int) -> str:
    """Shell that prints "SIZE DONE" (or "gone 0"), then the bytes after ``offset``, never past
    SIZE; on the first read (``offset`` None) "SIZE DONE TOTAL", TOTAL the file's lines (a last one
    without its newline counts), then its last ``lines`` lines, or all of them for 0."""
    d, f = shlex.quote(ws), shlex.quote(f"{ws}/{rel}")
    head = (f"[ -d {d} ] || {{ echo 'gone 0'; exit 0; }}\n"
            f"done=0; [ -e {d}/runtime/result.json ] && done=1\n"
            f"s=$(( $(wc -c 2>/dev/null < {f} || echo 0) ))\n")
    if offset is None:
        tail = f" | tail -n {int(lines)}" if lines > 0 else ""
        return head + ("n=0\n"
                       f'[ "$s" -gt 0 ] && n=$(( $(head -c "$s" {f} | wc -l) + 1'
                       f' - $(head -c "$s" {f} | tail -c 1 | wc -l) ))\n'
                       'echo "$s $done $n"\n'
                       f'[ "$s" -gt 0 ] && head -c "$s" {f}{tail}\nexit 0\n')
    return head + ('echo "$s $done"\n'
                   f'[ "$s" -gt {offset} ] && head -c "$s" {f} | tail -c +{offset + 1}\nexit 0\n')


class _JsonLines:
    """Bytes read from each stream → one ``{"stream", "line"}`` object per complete line."""

    def __init__(self) -> None:
        self.partial: dict[str, str] = {}

    def write(self, stream: str, text: str, final: bool) -> None:
        pieces = (self.partial.pop(stream, "") + text).split("\n")
        rest = pieces.pop()  # after the last newline: the start of a line still being written
        if rest and final:
            pieces.append(rest)
        elif rest:
            self.partial[stream] = rest
        for line in pieces:
            sys.stdout.write(json.dumps({"stream": stream, "line": line}, ensure_ascii=False) + "\n")
        sys.stdout.flush()

    def flush(self) -> None:
        for stream in list(self.partial):
            self.write(stream, "", final=True)


def follow_logs(cfg: Config, name: str, stream: str, lines: int, follow: bool, interval: float = 0.5,
                as_json: bool = False) -> int:
    st = statuses.load_all(cfg.repo / "status").get(name)
    if st is None or st.handle is None or not st.handle.workspace:
        print(f"reconcile logs: run {name!r} has not been launched (no status handle)", file=sys.stderr)
        return 1
    machine, ws = st.handle.machine or LOCAL, st.handle.workspace
    # The copy collected after the run (named by its identity; without one there is none to find).
    # A run on several machines: node 0's (the handle's machine and workspace are node 0's too).
    ident = st.handle.nodes[0]["identity"] if st.handle.nodes else st.handle.identity
    collected = cfg.state_dir / "bundles" / ident if ident else None

    def has_copy() -> bool:  # asked again when a workspace is gone: collection may have happened meanwhile
        return machine != LOCAL and collected is not None and collected.is_dir()

    pool = recorded_pool(cfg, load_tree(cfg.repo), {name: st})
    try:
        if st.phase in statuses.TERMINAL and has_copy():
            machine, ws = LOCAL, str(collected)
        t = pool.get(machine)
        offsets: dict[str, int | None] = {f: None for f in STREAMS[stream]}
        out = _JsonLines() if as_json else None

        def read(f: str) -> tuple[str, str, str]:
            header, _, body = t.sh(read_script(ws, f, offsets[f], lines), timeout=60).out.partition("\n")
            size, done, total = (header.split() + ["", "", ""])[:3]
            if offsets[f] is None and lines and total.isdigit() and int(total) > lines:
                print(f"reconcile logs: showing the last {lines} lines of {total} of {f.rsplit('/', 1)[-1]}; "
                      "use --lines 0 for all", file=sys.stderr)
            return size, done, body

        while True:
            first_done = None
            for f in STREAMS[stream]:
                size, done, body = read(f)
                if size == "gone":
                    if not has_copy():
                        print(f"reconcile logs: the workspace of {st.handle.identity} is gone from {machine}",
                              file=sys.stderr)
                        return 1
                    machine, ws, t = LOCAL, str(collected), pool.get(LOCAL)  # removed after collection
                    size, done, body = read(f)
                if first_done is None:
                    first_done = done.strip() == "1"
                if out is not None:
                    out.write(f.rsplit("/", 1)[-1].removesuffix(".log"), body, final=not follow)
                elif body:
                    # A last line without its newline gets one, unless more may follow on it.
                    sys.stdout.write(body if follow or body.endswith("\n") else body + "\n")
                    sys.stdout.flush()
                offsets[f] = int(size) if size.strip().isdigit() else (offsets[f] or 0)
            # Done when the result existed before this round's reads began: they saw every byte.
            if not follow or first_done:
                if out is not None:
                    out.flush()
                return 0
            time.sleep(interval)
    except ReconcilerError as e:
        print(f"reconcile logs: {e}", file=sys.stderr)
        return 1
    finally:
        pool.close()
