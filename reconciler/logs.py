"""``reconcile logs NAME``: a run's stdout and stderr, wherever it runs.

The run's status names its machine and workspace; the logs are read there through the same
transport the reconciler uses (a local file read, or ``tail`` over SSH). ``--follow`` polls until
the run has a result.
"""

from __future__ import annotations

import shlex
import sys
import time

from . import status as statuses
from .config import Config
from .spec.load import load_tree
from .transports import TransportPool

STREAMS = {"stdout": ["artifacts/stdout.log"], "stderr": ["artifacts/stderr.log"],
           "both": ["artifacts/stdout.log", "artifacts/stderr.log"]}


def follow_logs(cfg: Config, name: str, stream: str, lines: int, follow: bool, interval: float = 0.5) -> int:
    st = statuses.load_all(cfg.repo / "status").get(name)
    if st is None or st.handle is None or not st.handle.workspace:
        print(f"reconcile logs: run {name!r} has not been launched (no status handle)", file=sys.stderr)
        return 1
    pool = TransportPool(cfg, load_tree(cfg.repo))
    try:
        t = pool.get(st.handle.machine or "local")
        ws = st.handle.workspace
        if st.handle.machine not in (None, "local") and st.phase in statuses.TERMINAL:
            ws = str(cfg.repo / ".reconciler" / "bundles" / st.handle.identity)  # collected copy
            from .transports import TransportPool as _P  # noqa: F401
            t = pool.get("local")
        offsets = {f: 0 for f in STREAMS[stream]}
        first = True
        while True:
            for f in STREAMS[stream]:
                path = f"{ws}/{f}"
                if first:
                    r = t.sh(f"tail -n {int(lines)} {shlex.quote(path)} 2>/dev/null; wc -c < {shlex.quote(path)} 2>/dev/null",
                             timeout=30)
                    body, _, size = r.out.rpartition("\n" if r.out.count("\n") > 1 else "\0")
                    text = r.out.splitlines()
                    size_line = text[-1] if text else "0"
                    out = "\n".join(text[:-1])
                    if out:
                        print(out)
                    offsets[f] = int(size_line) if size_line.strip().isdigit() else 0
                else:
                    r = t.sh(f"tail -c +{offsets[f] + 1} {shlex.quote(path)} 2>/dev/null", timeout=30)
                    if r.out:
                        sys.stdout.write(r.out)
                        sys.stdout.flush()
                        offsets[f] += len(r.out.encode())
            first = False
            if not follow:
                return 0
            done = t.sh(f"test -e {shlex.quote(ws)}/runtime/result.json", timeout=30).rc == 0
            if done:
                # one last read for the lines written just before the end
                for f in STREAMS[stream]:
                    r = t.sh(f"tail -c +{offsets[f] + 1} {shlex.quote(ws + '/' + f)} 2>/dev/null", timeout=30)
                    if r.out:
                        sys.stdout.write(r.out)
                return 0
            time.sleep(interval)
    finally:
        pool.close()
