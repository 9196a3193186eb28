"""Benchmark: the real reconciler over 10,000 live runs on 1,000 machines.

The machines are SIMULATED: an in-process transport answers the probe as a real machine would
(every workspace of the run identities it holds, running, with its pid, start time and the spec
digest its bundle was built for) and costs no SSH. Everything else is real: the repository (a
real git repository with N run specs and a Fleet of M machines), spec loading and caching, the
planner, status files and the status commit. The simulated machines already run every run (an
earlier reconciler launched them and its status files were lost), so:

1. the first pass adopts all of them (N status files written and committed): target ≤ 5 s;
2. the steady passes after it change nothing: target ≤ 1.5 s wall and ≤ 1 s CPU each, RSS ≤ 300 MB.

The per-machine SSH cost is measured apart, against real sshd servers (benchmarks/observe_bench.py
and ``--ssh``), and docs/benchmarks.md projects 1,000 real machines from both.

    python benchmarks/scale_bench.py [--runs 10000] [--machines 1000] [--passes 3]
"""

from __future__ import annotations

import argparse
import gc
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10000)
    ap.add_argument("--machines", type=int, default=1000)
    ap.add_argument("--passes", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rc-scale-"))
    try:
        repo = tmp / "repo"
        build_repo(repo, args.runs, args.machines)
        desired = load_tree(repo)
        fleet: dict[str, dict[str, dict]] = {f"m{i:04d}": {} for i in range(args.machines)}
        now = time.time()
        for i, (name, entry) in enumerate(sorted(desired.runs.items())):
            m = f"m{i % args.machines:04d}"
            fleet[m][make(name, 1, 1)] = {"state": "running", "pid": 10000 + i, "started_at": now - 60,
                                          "spec_digest": entry.digest, "collected": False}
        del desired
        cfg = configs.load(str(repo), flags={"push": False, "namespace": "scale", "parallel_machines": 16,
                                             "workspace_root": str(tmp / "ws")})
        rec = Reconciler(cfg, keep_connections=True)
        rec.transport_factory = lambda info: SimulatedMachine(info, fleet[info.name])
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        first = rec.run_pass()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        adopted = sum(1 for c in first.plan.changes if c.action == "adopt")
        print(f"first pass: adopted {adopted} live runs on {args.machines} simulated machines, {len(first.written)} "
              f"status files, commit {'yes' if first.commit else 'no'}: {wall:.2f}s wall, {cpu:.2f}s CPU")
        walls, cpus = [], []
        for _ in range(args.passes):
            t0, c0 = time.perf_counter(), time.process_time()
            result = rec.run_pass()
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
            assert not result.written and result.commit is None, "a steady pass changed something"
        print(f"steady pass ({args.passes}): median {statistics.median(walls):.2f}s wall, "
              f"{statistics.median(cpus):.2f}s CPU; RSS {rss_mb():.0f} MB")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
