"""A host launch on this machine is not recorded in the launch journal (engine/apply.py
``in_process``): a reconciler killed at any step of it leaves nothing that lands later, so its
successor on the checkout waits for nothing and never starts the identity twice. Real git, real
processes (the killed reconciler is a process of its own), a real /proc."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reconciler.core import config
from reconciler.engine.inflight import FILE, Journal
from reconciler.engine.loop import Reconciler
from tests.repo_helpers import pass_until
from tests.world import World, run_spec

FAST = {"launch_ttl": 30.0, "launch_clock_margin": 5.0}  # a hold would outlast the test by far
ROOT = Path(__file__).resolve().parents[2]

# The reconciler's pass in a process of its own, killed (os._exit: no handler, no flush) at one
# step of the in-process launch: after the claim and deadline check ("guard", before
# runtime/launched_at), or once the wrapper was started ("started", before its pid is awaited).
CHILD = textwrap.dedent("""
    import json, os, sys
    from reconciler.core import config
    from reconciler.engine.loop import Reconciler
    from reconciler.machines import local_launch
    where, repo, flags = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    if where == "guard":
        real = local_launch._guard
        def guard(*a):
            real(*a)
            os._exit(137)
        local_launch._guard = guard
    else:
        local_launch.wait_for_pid = lambda *a: os._exit(137)
    Reconciler(config.load(repo, flags=flags), keep_connections=True).run_pass()
""")


def _wrappers(identity: str) -> list[int]:
    """The live launch wrappers of ``identity`` on this machine, from /proc: each leads its own
    process group (its heartbeat, a subshell, has the same command line and is left out)."""
    out = []
    for e in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{e}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{e}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if argv[:3] == [b"sh", b"scripts/launch.sh", identity.encode()] and stat[0] not in ("Z", "X") \
                and stat[2] == e:
            out.append(int(e))
    return out


@pytest.mark.parametrize("where", ["guard", "started"])
def test_a_reconciler_killed_inside_a_local_launch_leaves_nothing_to_wait_for(tmp_path, where):
    with World(tmp_path, allow_dirty=False, **FAST) as w:
        w.add_run(run_spec("solo", "local-host", ["sh", "-c", "sleep 60"]))
        flags = {**w.flags, **FAST}
        child = subprocess.run([sys.executable, "-c", CHILD, where, str(w.repo), json.dumps(flags)],
                               capture_output=True, text=True, timeout=60,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert child.returncode == 137, child.stderr[-2000:]
        ws = w.local_root / "test" / "solo-g1-a1"
        assert (ws / "job.json").is_file() and (ws.parent / ".solo-g1-a1.claim").is_file()
        assert (ws / "runtime" / "launched_at").exists() == (where == "started")
        # What the journal holds for the successor: nothing of this launch.
        journal = json.loads((w.repo / ".reconciler" / FILE).read_text())
        assert journal["launches"] == []
        cfg = config.load(str(w.repo), flags=flags)
        assert Journal(cfg).proven  # a journal the successor can read: no blanket hold either
        rec = Reconciler(cfg, keep_connections=True)  # the successor, as the daemon keeps it
        change = rec.run_pass().plan.for_run("solo")
        assert change.code != "LaunchInFlight", change
        st = pass_until(rec, "solo", "Running", timeout=20)
        assert st.handle.identity == "solo-g1-a1"
        # Started once: adopted where the killed one had started it, else started now; one more
        # pass starts nothing more.
        rec.run_pass()
        assert len(_wrappers("solo-g1-a1")) == 1
