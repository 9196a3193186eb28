"""Benchmark: the real daemon's resident memory with a large tree, against its floor.

Starts ``python -m reconciler --repo CLONE`` (as benchmarks/daemon_bench.py does: a clone of a
bare repository in a scratch folder, every process on loopback) on S Run specs (default 10,000,
``desiredState: Stopped``, so nothing is launched), and prints VmRSS and VmHWM (/proc) of the
daemon:

1. after its first pass, which parses every spec, writes S status files, commits and pushes them
   (sampled once the push is over, before any second pass: the resync interval is long until then);
2. after N steady passes (nothing changed; each woken by a write of a file under specs/ that
   is no spec);

and the floor: a new interpreter that imports every module the daemon had imported (the list is
taken from a daemon run on a small tree of the same kind, at its exit) and holds nothing else.
The load average is printed with each figure. Target: ≤ 120 MB VmRSS at 10,000 specs.

    python benchmarks/daemon_memory.py [--specs 10000] [--passes 5] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from tests.infra._proc import free_port  # noqa: E402

import daemon_bench  # noqa: E402
from daemon_bench import Bench, load, mem, metrics, wait_for  # noqa: E402

# Runs the daemon as ``python -m reconciler`` would, and writes the names of the modules it
# imported to argv[1] when it exits (SIGTERM: the daemon returns, the interpreter exits).
LISTER = ("import atexit, runpy, sys\n"
          "out = sys.argv.pop(1)\n"
          "atexit.register(lambda: open(out, 'w').write('\\n'.join(sorted(sys.modules))))\n"
          "runpy.run_module('reconciler', run_name='__main__', alter_sys=True)\n")
FLOOR = ("import importlib, sys\n"
         "for m in open(sys.argv[1]).read().split():\n"
         "    if m != '__main__' and not m.endswith('.__main__') and m not in sys.modules:\n"
         "        try:\n"
         "            importlib.import_module(m)\n"
         "        except Exception:\n"
         "            pass\n"
         "f = dict(l.split(':', 1) for l in open('/proc/self/status') if l.startswith('Vm'))\n"
         "print(int(f['VmRSS'].split()[0]) / 1024, int(f['VmHWM'].split()[0]) / 1024)\n")


def passes(port: int) -> int:
    return int(metrics(port)["reconciler_pass_duration_seconds_count"])


def pushed_all(clone: Path) -> bool:
    """Whether the daemon's status commit has reached the remote (nothing ahead of it)."""
    out = subprocess.run(["git", "-C", str(clone), "rev-list", "--count", "@{u}..HEAD"],
                         capture_output=True, text=True)
    return out.returncode == 0 and out.stdout.strip() == "0" and (clone / "status").is_dir()


def module_list(b: Bench, out: Path) -> None:
    """The modules a daemon imports over a few passes, from a small tree (the same kinds of files)."""
    _, _, clone = b.setup("modules", 20)
    port = free_port()
    real = subprocess.Popen
    # Bench.start runs ``python -m reconciler``: the lister instead, the rest as it is.
    daemon_bench.subprocess.Popen = lambda argv, *a, **k: real(
        [argv[0], "-c", LISTER, str(out), *argv[3:]] if argv[1:3] == ["-m", "reconciler"] else argv, *a, **k)
    try:
        p = b.start(clone, port, b.tmp / "modules.log", RECONCILER_RESYNC_INTERVAL="1")
    finally:
        daemon_bench.subprocess.Popen = real
    wait_for(lambda: passes(port) >= 3, timeout=120, interval=0.1)
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=60)
    if not out.is_file():
        raise SystemExit("the small daemon wrote no module list")


def floor(modules: Path) -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", FLOOR, str(modules)], cwd=ROOT, capture_output=True, text=True,
                         check=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    rss, hwm = out.stdout.split()
    return float(rss), float(hwm)


def one_round(b: Bench, specs: int, n: int) -> dict:
    t0 = time.perf_counter()
    _, _, clone = b.setup(f"mem{len(b.procs)}", specs)
    print(f"  {specs} specs generated and pushed in {time.perf_counter() - t0:.1f} s")
    port = free_port()
    # No resync: the first pass is measured before any other pass can come.
    t0 = time.perf_counter()
    p = b.start(clone, port, b.tmp / f"mem{len(b.procs)}.log", RECONCILER_RESYNC_INTERVAL="3600")
    wait_for(lambda: pushed_all(clone), timeout=600, interval=0.2)
    first = mem(p.pid)
    print(f"  first pass (writes, commits and pushes {specs} status files) over after "
          f"{time.perf_counter() - t0:.1f} s: VmRSS {first['VmRSS']:.0f} MB, VmHWM {first['VmHWM']:.0f} MB "
          f"(load {load()})")
    # Steady passes, one at a time: a write of a file under specs/ that is no spec wakes one
    # (the watcher's), and it finds nothing to do.
    done = passes(port)
    keep = clone / "specs" / "runs" / ".keep"
    for i in range(n):
        keep.write_text(f"{i}\n")
        wait_for(lambda: passes(port) >= done + i + 1, timeout=120, interval=0.1)
    got = passes(port) - done
    steady = mem(p.pid)
    print(f"  after {got} more pass(es): VmRSS {steady['VmRSS']:.0f} MB, VmHWM {steady['VmHWM']:.0f} MB "
          f"(load {load()})")
    p.kill()
    p.wait(timeout=30)
    return {"first": first, "steady": steady, "steady_passes": got}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--specs", type=int, default=10_000)
    ap.add_argument("--passes", type=int, default=5, help="steady passes before the second figure")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="daemon-memory-"))
    b = Bench(tmp)
    try:
        modules = tmp / "modules.txt"
        module_list(b, modules)
        b.cleanup()
        rss, hwm = floor(modules)
        print(f"floor: an interpreter with the daemon's {len(modules.read_text().split())} modules imported: "
              f"VmRSS {rss:.0f} MB, VmHWM {hwm:.0f} MB (load {load()})")
        rounds = []
        for r in range(args.rounds):
            print(f"round {r + 1}:")
            rounds.append(one_round(b, args.specs, args.passes))
            b.cleanup()
        worst = max(max(x["first"]["VmRSS"], x["steady"]["VmRSS"]) for x in rounds)
        print(f"daemon VmRSS with {args.specs} specs: at most {worst:.0f} MB (target <= 120 MB); floor {rss:.0f} MB")
        if args.json:
            print(json.dumps({"floor": {"VmRSS": rss, "VmHWM": hwm}, "rounds": rounds}))
        return 0
    finally:
        b.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
