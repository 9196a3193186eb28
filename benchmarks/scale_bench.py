"""Benchmark: the real reconciler over 10,000 live runs on 1,000 machines.

The machines are SIMULATED: an in-process transport answers the probe as a real machine would
(every workspace of the run identities it holds, running, with its pid, start time and the spec
digest its bundle was built for) and costs no SSH. Everything else is real: the repository (a
real git repository with N run specs and a Fleet of M machines), spec loading and caching, the
planner, status files and the status commit. The simulated machines already run every run (an
earlier reconciler launched them and its status files were lost), so:

1. the first pass adopts all of them (N status files written and committed), measured against
   its floor: parsing the same specs (``load_tree``, no cache), writing the same status files
   (their bytes, kept from a pass) with plain writes, and ``git add status`` + ``git commit``.
   Pass and floor alternate ``--repeat`` times, each on a fresh repository, the order swapped
   every round; CPU is this process's plus its children's (git), with the load average;
   target: the pass within 1.5x its floor;
2. the steady passes after it change nothing: target ≤ 0.6 s CPU each, RSS ≤ 300 MB.

The per-machine SSH cost is measured apart, against real sshd servers (benchmarks/observe_bench.py
and ``--ssh``), and docs/benchmarks.md projects 1,000 real machines from both.

    python benchmarks/scale_bench.py [--runs 10000] [--machines 1000] [--passes 3] [--repeat 5]
    python benchmarks/scale_bench.py --steady-only [--profile FILE]

``--steady-only`` makes one first pass (not measured against the floor) and then the steady
passes; ``--profile FILE`` writes cProfile's statistics of the steady passes to FILE (pstats, in
CPU seconds); with ``--parallel 1`` every probe is parsed on the profiled thread.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reconciler.core import config as configs  # noqa: E402
from reconciler.core.identity import make  # noqa: E402
from reconciler.engine.loop import Reconciler  # noqa: E402
from reconciler.spec.load import load_tree  # noqa: E402

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICqRT6LKgEqdobuvittBCu1add1q6i1ofysL9m5i7d6G"


class SimulatedMachine:
    """A simulation of one machine: answers ``probe`` with its workspaces (no SSH, no process)."""

    def __init__(self, info, runs: dict[str, dict]):
        self.machine = info
        self.round_trips = 0
        self.runs = runs

    def workspace(self, identity: str) -> str:
        return f"/sim/{self.machine.name}/{identity}"

    def agent(self, args: dict) -> dict:
        self.round_trips += 1
        if args.get("op") != "probe":
            return {"error": f"simulated machine: {args.get('op')} is not simulated"}
        return {"now": time.time(), "root": f"/sim/{self.machine.name}", "runs": {
            ident: dict(r, workspace=self.workspace(ident)) for ident, r in self.runs.items()}}

    def close(self) -> None:
        pass


def build_repo(root: Path, runs: int, machines: int) -> None:
    (root / "specs" / "runs").mkdir(parents=True)
    (root / "specs" / "fleets").mkdir(parents=True)
    (root / "execution_templates").mkdir()
    (root / ".gitignore").write_text(".reconciler/\n")
    (root / "execution_templates" / "ssh-host.yaml").write_text(
        "apiVersion: reconciler/v1\nkind: ExecutionTemplate\nid: ssh-host\nplacement: {kind: ssh}\n"
        "launch_mode: {kind: host_process}\n")
    lines = ["apiVersion: reconciler/v1", "kind: Fleet", "metadata: {name: dc}", "spec:", "  machines:"]
    for i in range(machines):
        lines.append(f"    - {{name: m{i:04d}, ssh: {{host: sim-{i}, user: u, host_key: '{KEY}'}}, max_tasks: 16}}")
    (root / "specs" / "fleets" / "dc.yaml").write_text("\n".join(lines) + "\n")
    for i in range(runs):
        (root / "specs" / "runs" / f"run-{i:05d}.yaml").write_text(
            f"apiVersion: reconciler/v1\nkind: Run\nmetadata: {{name: run-{i:05d}}}\nspec:\n  template: ssh-host\n"
            f"  task: {{type: command, argv: [python, train.py, '{i}']}}\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"],
                 ["-c", "user.name=b", "-c", "user.email=b@x", "commit", "-q", "-m", "specs"]):
        subprocess.run(["git", "-C", str(root), *args], check=True)


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu() -> float:
    """CPU seconds of this process (all its threads) and of the children it waited for (git)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def adopting(tmp: Path, runs: int, machines: int, parallel: int = 16) -> tuple[Reconciler, Path]:
    """A fresh repository and a reconciler whose simulated machines run every run."""
    repo = tmp / "repo"
    build_repo(repo, runs, machines)
    desired = load_tree(repo)
    fleet: dict[str, dict[str, dict]] = {f"m{i:04d}": {} for i in range(machines)}
    now = time.time()
    for i, (name, entry) in enumerate(sorted(desired.runs.items())):
        m = f"m{i % machines:04d}"
        fleet[m][make(name, 1, 1)] = {"state": "running", "pid": 10000 + i, "started_at": now - 60,
                                      "spec_digest": entry.digest, "collected": False}
    cfg = configs.load(str(repo), flags={"push": False, "namespace": "scale", "parallel_machines": parallel,
                                         "workspace_root": str(tmp / "ws")})
    rec = Reconciler(cfg, keep_connections=True)
    rec.transport_factory = lambda info: SimulatedMachine(info, fleet[info.name])
    return rec, repo


def first_pass(tmp: Path, args) -> tuple[float, float, dict[str, bytes], Reconciler]:
    rec, repo = adopting(tmp, args.runs, args.machines, args.parallel)
    gc.collect()
    t0, c0 = time.perf_counter(), cpu()
    first = rec.run_pass()
    wall, used = time.perf_counter() - t0, cpu() - c0
    adopted = sum(1 for c in first.plan.changes if c.action == "adopt")
    assert adopted == args.runs and first.commit, "the first pass did not adopt every run and commit"
    texts = {p.name: p.read_bytes() for p in (repo / "status").iterdir() if p.is_file()}
    return wall, used, texts, rec


def floor(tmp: Path, args, texts: dict[str, bytes]) -> tuple[float, float]:
    """What the first pass cannot do without: parse the specs, write the status files, commit them."""
    repo = tmp / "repo"
    build_repo(repo, args.runs, args.machines)
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x", "GIT_COMMITTER_NAME": "b",
           "GIT_COMMITTER_EMAIL": "b@x"}
    gc.collect()
    t0, c0 = time.perf_counter(), cpu()
    desired = load_tree(repo)
    assert len(desired.runs) == args.runs
    (repo / "status").mkdir()
    for name, data in texts.items():
        with open(repo / "status" / name, "wb") as fh:
            fh.write(data)
    subprocess.run(["git", "-C", str(repo), "add", "status"], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", "status"], check=True, env=env)
    return time.perf_counter() - t0, cpu() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10000)
    ap.add_argument("--machines", type=int, default=1000)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5, help="first passes alternated with the floor")
    ap.add_argument("--parallel", type=int, default=16, help="parallel_machines (observing threads)")
    ap.add_argument("--steady-only", action="store_true", help="one first pass, then the steady passes")
    ap.add_argument("--profile", metavar="FILE", help="cProfile the steady passes into FILE")
    args = ap.parse_args()
    if args.steady_only:
        steady_only(args)
        return
    passes: list[tuple[float, float]] = []
    floors: list[tuple[float, float]] = []
    texts: dict[str, bytes] = {}
    for round_no in range(args.repeat):
        order = ("pass", "floor") if round_no % 2 == 0 else ("floor", "pass")
        for what in order:
            tmp = Path(tempfile.mkdtemp(prefix="rc-scale-"))
            try:
                if what == "pass":
                    wall, used, texts, rec = first_pass(tmp, args)
                    passes.append((wall, used))
                    if round_no == 0:  # before other rounds' garbage weighs on the process's RSS
                        steady(rec, args)
                    rec.close()
                    del rec
                else:
                    floors.append(floor(tmp, args, texts))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        load = " ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"round {round_no + 1}: first pass {passes[-1][0]:.2f}s wall, {passes[-1][1]:.2f}s CPU; "
              f"floor {floors[-1][0]:.2f}s wall, {floors[-1][1]:.2f}s CPU; load average {load}", flush=True)
    pw, pc = (statistics.median(x[i] for x in passes) for i in (0, 1))
    fw, fc = (statistics.median(x[i] for x in floors) for i in (0, 1))
    print(f"first pass: adopted {args.runs} live runs on {args.machines} simulated machines, median of "
          f"{args.repeat}: {pw:.2f}s wall, {pc:.2f}s CPU (own + children); floor {fw:.2f}s wall, {fc:.2f}s CPU: "
          f"{pw / fw:.2f}x wall, {pc / fc:.2f}x CPU")


def steady_only(args) -> None:
    """The steady passes alone: a first pass to reach them, without its floor (minutes saved)."""
    tmp = Path(tempfile.mkdtemp(prefix="rc-scale-"))
    try:
        wall, used, _, rec = first_pass(tmp, args)
        print(f"first pass: {wall:.2f}s wall, {used:.2f}s CPU (not compared with its floor)", flush=True)
        steady(rec, args)
        rec.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def steady(rec: Reconciler, args) -> None:
    """Passes that change nothing, after a first pass (in its repository, before it is removed)."""
    walls, cpus, owns = [], [], []
    profiler = None
    if getattr(args, "profile", None):
        import cProfile

        # CPU time, not the wall clock: on a shared box the wall clock counts the waits for a core.
        # Worker threads (observing) are not profiled: ``--parallel 1`` puts the probes on this thread.
        profiler = cProfile.Profile(time.process_time)
    for _ in range(args.passes):
        t0, c0, o0 = time.perf_counter(), cpu(), time.process_time()
        if profiler is not None:
            profiler.enable()
        result = rec.run_pass()
        if profiler is not None:
            profiler.disable()
        walls.append(time.perf_counter() - t0)
        cpus.append(cpu() - c0)
        owns.append(time.process_time() - o0)
        assert not result.written and result.commit is None, "a steady pass changed something"
    if profiler is not None:
        profiler.dump_stats(args.profile)
    print(f"steady pass ({args.passes}): median {statistics.median(walls):.2f}s wall, "
          f"{statistics.median(owns):.2f}s CPU ({statistics.median(cpus):.2f}s with git's); RSS {rss_mb():.0f} MB",
          flush=True)


if __name__ == "__main__":
    main()
