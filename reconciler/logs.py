"""``reconcile logs NAME``: a run's stdout and stderr, wherever it runs.

The run's status names its machine and workspace; the logs are read there through the same
transport the reconciler uses (a shell on this machine, or one command over SSH per file and
poll). A run that is over, or whose remote workspace was removed after collection, is read from
the collected copy in ``.reconciler/bundles/<identity>``. ``--follow`` polls until the run has a
result (``runtime/result.json``), then prints what was written last and exits.

Each read is one command that prints ``<size> <done>`` and then the bytes up to that size, so
the next read starts exactly where this one stopped, whatever the job writes in between.
"""

from __future__ import annotations

import shlex
import sys
import time

from . import status as statuses
from .config import Config
from .errors import ReconcilerError
from .plan import LOCAL
from .spec.load import load_tree
from .transports import TransportPool

STREAMS = {"stdout": ["artifacts/stdout.log"], "stderr": ["artifacts/stderr.log"],
           "both": ["artifacts/stdout.log", "artifacts/stderr.log"]}


def read_script(ws: str, rel: str, offset: int | None, lines: int) -> str:
    """Shell that prints "SIZE DONE" (or "gone 0"), then the last ``lines`` lines (first read) or
    the bytes after ``offset``, never past SIZE."""
    d, f = shlex.quote(ws), shlex.quote(f"{ws}/{rel}")
    head = (f"[ -d {d} ] || {{ echo 'gone 0'; exit 0; }}\n"
            f"done=0; [ -e {d}/runtime/result.json ] && done=1\n"
            f"s=$(( $(wc -c 2>/dev/null < {f} || echo 0) ))\n"
            'echo "$s $done"\n')
    if offset is None:
        return head + f'[ "$s" -gt 0 ] && head -c "$s" {f} | tail -n {int(lines)}\nexit 0\n'
    return head + f'[ "$s" -gt {offset} ] && head -c "$s" {f} | tail -c +{offset + 1}\nexit 0\n'


def follow_logs(cfg: Config, name: str, stream: str, lines: int, follow: bool, interval: float = 0.5) -> int:
    st = statuses.load_all(cfg.repo / "status").get(name)
    if st is None or st.handle is None or not st.handle.workspace:
        print(f"reconcile logs: run {name!r} has not been launched (no status handle)", file=sys.stderr)
        return 1
    machine, ws = st.handle.machine or LOCAL, st.handle.workspace
    # The copy collected after the run (named by its identity; without one there is none to find).
    collected = cfg.state_dir / "bundles" / st.handle.identity if st.handle.identity else None

    def has_copy() -> bool:  # asked again when a workspace is gone: collection may have happened meanwhile
        return machine != LOCAL and collected is not None and collected.is_dir()

    pool = TransportPool(cfg, load_tree(cfg.repo))
    try:
        if st.phase in statuses.TERMINAL and has_copy():
            machine, ws = LOCAL, str(collected)
        t = pool.get(machine)
        offsets: dict[str, int | None] = {f: None for f in STREAMS[stream]}

        def read(f: str) -> tuple[str, str, str]:
            header, _, body = t.sh(read_script(ws, f, offsets[f], lines), timeout=60).out.partition("\n")
            size, _, done = header.partition(" ")
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
                if body:
                    # A last line without its newline gets one, unless more may follow on it.
                    sys.stdout.write(body if follow or body.endswith("\n") else body + "\n")
                    sys.stdout.flush()
                offsets[f] = int(size) if size.strip().isdigit() else (offsets[f] or 0)
            # Done when the result existed before this round's reads began: they saw every byte.
            if not follow or first_done:
                return 0
            time.sleep(interval)
    except ReconcilerError as e:
        print(f"reconcile logs: {e}", file=sys.stderr)
        return 1
    finally:
        pool.close()
