"""Benchmark: a fresh ``reconcile --once`` and the daemon's no-change pass against their floors.

For each tree size (10,000 and 50,000 settled runs by default: ``benchmarks/specgen.py`` Run specs
with ``desiredState: Stopped``, committed; their status files written and committed by a real
``reconcile --once``, as the reconciler writes them), rounds alternate, each printing CPU and
wall time and the load average:

1. fresh process: the real ``reconcile --once`` (not ``--dry-run``: the whole pass, status
   commit check included) in a new process (over a settled tree: the quick pass of
   ``reconciler/engine/quickpass.py``), against the floor, a new process that reads and
   sha256s every spec file (interpreter start included, as in the command), and ``git status
   --porcelain -- specs`` as a second floor. CPU is the children's rusage (user + sys);
2. the daemon's no-change pass: a long-lived ``Reconciler`` in this process after two passes,
   against the in-process floors: read + sha256 of every spec file, and a stat of every spec file
   (the pass is stat-based). CPU is this process's ``time.process_time`` plus its children's
   rusage (the pass asks git whether the status files changed);
3. the resident memory of a daemon-like process (a ``Reconciler`` after three passes) at the
   first size, started with and without the pass cache.

    python benchmarks/entry_bench.py [--sizes 10000,50000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import specgen  # noqa: E402

PY = sys.executable
RECONCILE = [PY, "-m", "reconciler.cli.main"]
FLOOR = ("import hashlib, os, sys\n"
         "for top in ('specs', 'execution_templates'):\n"
         "    for d, _, names in os.walk(top):\n"
         "        for n in names:\n"
         "            with open(os.path.join(d, n), 'rb') as fh:\n"
         "                hashlib.sha256(fh.read()).hexdigest()\n")


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=bench", "-c", "user.email=b@example.invalid", *args],
                   check=True, capture_output=True)


def make_tree(tmp: Path, n: int) -> Path:
    repo = tmp / f"tree-{n}"
    runs = repo / "specs" / "runs"
    runs.mkdir(parents=True)
    (repo / "execution_templates").mkdir()
    (repo / "execution_templates" / "local-host.yaml").write_text(specgen.TEMPLATE)
    for i in range(n):
        name = f"run-{i:05d}"
        (runs / f"{name}.yaml").write_text(specgen.run_spec(name, i, '[sh, -c, "echo hi"]', {"STEP": f'"{i}"'},
                                                            middle="  desiredState: Stopped\n"))
    (repo / "reconciler.yaml").write_text(f"workspace_root: {tmp / 'ws'}\nnamespace: bench\nlocal_gpus: 0\n")
    (repo / ".gitignore").write_text(".reconciler/\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "specs")
    return repo


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_child(argv: list[str], cwd: Path) -> tuple[float, float]:
    """(CPU, wall) of one new process."""
    c0, t0 = children_cpu(), time.perf_counter()
    p = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, children_cpu() - c0
    if p.returncode != 0:
        raise SystemExit(f"{argv} failed ({p.returncode}): {p.stderr[-2000:]}")
    return cpu, wall


def rss_of(argv: list[str], cwd: Path) -> float:
    """Peak RSS (MB) of one run of ``argv``, as /usr/bin/time reports it. Not this process's
    children's rusage: a child forked from a large parent counts the parent's pages until it execs."""
    p = subprocess.run(["/usr/bin/time", "-f", "%M", *argv], cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{argv} failed ({p.returncode}): {p.stderr[-2000:]}")
    return int(p.stderr.strip().splitlines()[-1]) / 1024


def load() -> str:
    return "%.1f %.1f %.1f" % os.getloadavg()


def settle(repo: Path, without_cache: bool) -> None:
    """The reconciler's own first passes: status files written and committed, the pass cache built
    (a second pass once every spec file is older than the racy-clean window)."""
    t0 = time.perf_counter()
    cpu, wall = run_child([*RECONCILE, "--once"], repo)
    print(f"  first pass (writes and commits every status file): {cpu:.2f} s CPU, {wall:.2f} s wall")
    time.sleep(max(0.0, 2.5 - (time.perf_counter() - t0)))
    cache = repo / ".reconciler" / "pass-cache.json"
    for n in range(1, 6):  # git's index is refreshed once after a commit: a pass or two record it
        if quick(repo):
            print(f"  pass {n + 1} and later: quick (reconciler/engine/quickpass.py)")
            break
    else:
        print("  NOTE: no quick pass (an edited module of the reconciler changes the caches' code stamp)")
    print(f"  pass cache: {cache.stat().st_size / 1e6:.1f} MB")
    if not without_cache:
        return
    saved = cache.read_bytes()
    cache.unlink()
    cpu, wall = run_child([*RECONCILE, "--once"], repo)
    print(f"  fresh --once without the pass cache: {cpu:.2f} s CPU, {wall:.2f} s wall (load {load()})")
    cache.write_bytes(saved)


def quick(repo: Path) -> bool:
    """Whether a ``--once`` now is a quick pass: one that imports no pydantic."""
    p = subprocess.run([*RECONCILE[:1], "-X", "importtime", *RECONCILE[1:], "--once"], cwd=repo,
                       capture_output=True, text=True)
    return p.returncode == 0 and not any(line.split("|")[-1].strip() == "pydantic" for line in p.stderr.splitlines())


def fresh(repo: Path, rounds: int) -> None:
    rows: dict[str, list[tuple[float, float]]] = {"floor": [], "git": [], "once": []}
    for r in range(rounds):
        rows["floor"].append(run_child([PY, "-c", FLOOR], repo))
        rows["git"].append(run_child(["git", "status", "--porcelain", "--", "specs"], repo))
        rows["once"].append(run_child([*RECONCILE, "--once"], repo))
        f, g, o = rows["floor"][-1], rows["git"][-1], rows["once"][-1]
        print(f"  round {r + 1}: --once {o[0]:.3f} s CPU {o[1]:.3f} s wall | read+sha256 process {f[0]:.3f} / "
              f"{f[1]:.3f} | git status {g[0]:.3f} / {g[1]:.3f} | ratio {o[0] / f[0]:.2f}x | load {load()}")
    med = {k: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v)) for k, v in rows.items()}
    print(f"  median: --once {med['once'][0]:.3f} s CPU ({med['once'][1]:.3f} wall); floor {med['floor'][0]:.3f} s "
          f"CPU ({med['floor'][1]:.3f}); git status {med['git'][0]:.3f} ({med['git'][1]:.3f}); "
          f"--once / floor {med['once'][0] / med['floor'][0]:.2f}x (target <= 3x)")
    print(f"  peak RSS: --once {rss_of([*RECONCILE, '--once'], repo):.0f} MB, "
          f"read+sha256 process {rss_of([PY, '-c', FLOOR], repo):.0f} MB")


def read_sha(repo: Path) -> None:
    for top in ("specs", "execution_templates"):
        for d, _, names in os.walk(repo / top):
            for n in names:
                with open(os.path.join(d, n), "rb") as fh:
                    hashlib.sha256(fh.read()).hexdigest()


def stat_all(repo: Path) -> None:
    for top in ("specs", "execution_templates"):
        for d, _, names in os.walk(repo / top):
            for n in names:
                os.stat(os.path.join(d, n))


def timed(fn) -> tuple[float, float]:
    c0, k0, t0 = time.process_time(), children_cpu(), time.perf_counter()
    fn()
    return time.process_time() - c0 + children_cpu() - k0, time.perf_counter() - t0


def daemon_pass(repo: Path, rounds: int) -> None:
    from reconciler.core import config as configs
    from reconciler.engine.loop import Reconciler

    rec = Reconciler(configs.load(str(repo)))
    rec.run_pass()
    rec.run_pass()
    rows: dict[str, list[tuple[float, float]]] = {"pass": [], "sha": [], "stat": []}
    for r in range(rounds):
        rows["sha"].append(timed(lambda: read_sha(repo)))
        rows["stat"].append(timed(lambda: stat_all(repo)))
        res = []
        rows["pass"].append(timed(lambda: res.append(rec.run_pass())))
        assert not res[0].written and not res[0].commit
        p, s, st = rows["pass"][-1], rows["sha"][-1], rows["stat"][-1]
        print(f"  round {r + 1}: pass {p[0]:.3f} s CPU {p[1]:.3f} s wall | read+sha256 {s[0]:.3f} / {s[1]:.3f} | "
              f"stat {st[0]:.3f} / {st[1]:.3f} | ratio to read+sha256 {p[0] / s[0]:.2f}x | load {load()}")
    med = {k: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v)) for k, v in rows.items()}
    print(f"  median: pass {med['pass'][0]:.3f} s CPU ({med['pass'][1]:.3f} wall); read+sha256 {med['sha'][0]:.3f}; "
          f"stat {med['stat'][0]:.3f}; pass / read+sha256 {med['pass'][0] / med['sha'][0]:.2f}x (target <= 1.2x); "
          f"pass / stat {med['pass'][0] / med['stat'][0]:.1f}x; spec files opened by the last pass: "
          f"{rec.cache.opened} of {len(rec.cache)}")
    rec.close()


RSS = ("import sys; from reconciler.core import config as c; from reconciler.engine.loop import Reconciler\n"
       "r = Reconciler(c.load(sys.argv[1]), keep_connections=True)\n"
       "for _ in range(3): r.run_pass()\n"
       "f = dict(l.split(':', 1) for l in open('/proc/self/status') if l.startswith('Vm'))\n"
       "print(f['VmRSS'].strip(), f['VmHWM'].strip())\n")


def rss(repo: Path) -> None:
    cache = repo / ".reconciler" / "pass-cache.json"
    for label in ("with the pass cache", "without it (a cold start parses every file)"):
        if "without" in label:
            cache.unlink(missing_ok=True)
        out = subprocess.run([PY, "-c", RSS, str(repo)], cwd=ROOT, capture_output=True, text=True, check=True)
        now, peak = out.stdout.split(" kB ")[0], out.stdout.split()[-2]
        print(f"  daemon-like process after 3 passes, {label}: VmRSS {int(now) / 1024:.0f} MB "
              f"(peak {int(peak) / 1024:.0f} MB; target <= 120 MB)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,50000")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    # Bytecode compiled first, as an installed package has it (PYTHONDONTWRITEBYTECODE, or a file
    # edited since, would otherwise have every process compile those modules again).
    subprocess.run([PY, "-m", "compileall", "-q", str(ROOT / "reconciler")], check=False, capture_output=True)
    tmp = Path(tempfile.mkdtemp(prefix="entry-bench-"))
    try:
        for i, n in enumerate(int(s) for s in args.sizes.split(",")):
            print(f"{n} settled runs (load {load()})")
            repo = make_tree(tmp, n)
            settle(repo, without_cache=i == 0)
            print(" fresh process:")
            fresh(repo, args.rounds)
            print(" daemon no-change pass:")
            daemon_pass(repo, args.rounds)
            if i == 0:
                print(" memory:")
                rss(repo)
            shutil.rmtree(repo, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
