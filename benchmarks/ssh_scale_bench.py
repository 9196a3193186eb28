"""Benchmark: the daemon's CPU per machine and the wall time of a pass, over real SSH.

Starts K sshd servers on loopback (tests/infra/sshd.py, one per address 127.0.0.2 ...; user rctest;
needs root), a Fleet of K machines with no runs, and runs the reconciler's passes twice over:
with its connections kept from pass to pass (the daemon) and with fresh ones each pass (one-shot
commands). Prints, for steady passes: wall time per pass, and the reconciler process's CPU time
(all its threads) per machine per pass. The probe's own CPU runs on the machines, not here.

Targets with connections kept: ≤ 1 ms of CPU per machine per pass, ≤ 1 s wall for 100 machines.

``--watched N`` adds N names to the list of watched runs every probe carries (a fleet of N runs;
none of them has a workspace on these machines) and measures the kept connections twice,
alternated: with the helper keeping the list (sent once, then by reference) and with the list
sent whole on every probe (as before the helper kept it). ``--churn K`` replaces K of those names
every pass (runs that start and settle), so the list changes every pass: with the helper keeping
it, each machine is sent the change; alternated with the list sent whole.

    sudo python benchmarks/ssh_scale_bench.py [--machines 100] [--passes 5] [--watched 10000] [--churn 10]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from reconciler.core import config  # noqa: E402
from reconciler.engine.loop import Reconciler  # noqa: E402
from tests.infra.sshd import SshServer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machines", type=int, default=100)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--idle", type=float, default=5.0, help="seconds to measure the kept connections' idle cost")
    ap.add_argument("--profile", action="store_true", help="print a profile of one kept-connection pass")
    ap.add_argument("--watched", type=int, default=0, help="names of runs watched besides the fleet's own")
    ap.add_argument("--churn", type=int, default=0, help="watched names replaced every pass")
    args = ap.parse_args()
    if args.watched:
        from reconciler.engine import loop

        extra = [f"w-{i:05d}" for i in range(args.watched)]
        watch = loop.names_to_watch
        turn = [0]

        def watched(*a, **k):
            if args.churn:  # the oldest K names settle, K new ones start
                turn[0] += 1
                del extra[:args.churn]
                extra.extend(f"w-{args.watched + turn[0] * args.churn + i:05d}" for i in range(args.churn))
            return sorted(watch(*a, **k) + extra)

        loop.names_to_watch = watched
    scratch = Path(tempfile.mkdtemp(prefix="rc-sshscale-"))
    servers: list[SshServer] = []
    try:
        for i in range(args.machines):
            servers.append(SshServer(scratch / f"sshd-{i}", host=f"127.0.{i // 250}.{i % 250 + 2}").start())
        repo = scratch / "repo"
        (repo / "specs" / "fleets").mkdir(parents=True)
        (repo / "execution_templates").mkdir()
        machines = [{"name": f"m{i:03d}", "ssh": {"host": s.host, "port": s.port, "user": s.user,
                                                   "identity_file": str(s.identity_file), "host_key": s.host_key},
                     "workspace_root": f"/tmp/rc-sshscale-ws/{i}"} for i, s in enumerate(servers)]
        (repo / "specs" / "fleets" / "dc.yaml").write_text(yaml.safe_dump({
            "apiVersion": "reconciler/v1", "kind": "Fleet", "metadata": {"name": "dc"}, "spec": {"machines": machines}}))
        for a in (["init", "-q", "-b", "main"], ["add", "-A"], ["-c", "user.name=b", "-c", "user.email=b@x",
                                                                  "commit", "-q", "-m", "fleet"]):
            subprocess.run(["git", "-C", str(repo), *a], check=True)
        cfg = config.load(str(repo), flags={"push": False, "namespace": "bench", "parallel_machines": 32,
                                            "workspace_root": str(scratch / "ws")})
        modes = [(True, False), (True, True)] * 2 if args.watched else [(True, False), (False, False)]
        for keep, whole in modes:
            rec = Reconciler(cfg, keep_connections=keep)
            rec.run_pass()  # connects (and stages the probe) once
            walls, cpus = [], []
            for _ in range(args.passes):
                if whole:  # the helper is told nothing is kept: the list goes whole
                    for conn in (rec.connections or {}).values():
                        t = conn[1] if isinstance(conn, tuple) else conn
                        t._resident_names = None
                t0, c0 = time.perf_counter(), time.process_time()
                result = rec.run_pass()
                walls.append(time.perf_counter() - t0)
                cpus.append(time.process_time() - c0)
                assert all(m.reachable for m in result.world.machines.values()), "a machine did not answer"
            idle = ""
            if keep:  # what the open connections (and their helpers) cost while nothing happens
                c0 = time.process_time()
                time.sleep(args.idle)
                idle = (f"; idle between passes: {(time.process_time() - c0) / args.idle / args.machines * 1e6:.1f} µs "
                        f"CPU per connection per second")
            if keep and "--profile" in sys.argv:
                import cProfile
                import pstats

                cProfile.runctx("rec.run_pass()", globals(), {"rec": rec}, "/tmp/ssh_scale.prof")
                pstats.Stats("/tmp/ssh_scale.prof").sort_stats("tottime").print_stats(25)
            rec.close()
            how = "whole" if whole else f"as a change of {args.churn} names each pass" if args.churn else "by reference"
            sent = f", {args.watched} names watched, sent {how}" if args.watched else ""
            print(f"{args.machines} machines over SSH, connections {'kept' if keep else 'new each pass'}{sent}: "
                  f"{statistics.median(walls):.2f}s wall per pass, "
                  f"{statistics.median(cpus) / args.machines * 1000:.2f} ms CPU per machine per pass{idle}")
    finally:
        for s in servers:
            s.close()
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree("/tmp/rc-sshscale-ws", ignore_errors=True)


if __name__ == "__main__":
    main()
