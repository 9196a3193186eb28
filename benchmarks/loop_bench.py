"""Benchmark: the planner and a no-change pass at 10,000 runs.

1. Plan computation for N runs with desired, observed and previous state already in memory
   (half running, a quarter succeeded, a quarter failed and waiting for backoff). Target ≤ 0.5 s.
2. A reconcile pass over a repository of N specs where nothing changed (every run Succeeded and
   collected), in a long-lived process that has done one pass before, as the daemon does.
   Target ≤ 1 s. This is what caching parsed specs and status files by content buys.

    python benchmarks/loop_bench.py [--runs 10000] [--repeat 5]
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reconciler.core import config as configs  # noqa: E402
from reconciler.status import store as statuses  # noqa: E402
from reconciler.core.runstatus import Handle  # noqa: E402
from reconciler.status.summarize import record  # noqa: E402
from reconciler.core.runstatus import SpecRef  # noqa: E402
from reconciler.engine.loop import Reconciler  # noqa: E402
from reconciler.core.observed import ObservedMachine, ObservedRun, ObservedWorld  # noqa: E402
from reconciler.planner.make import make_plan  # noqa: E402
from reconciler.spec.load import DesiredState, RunEntry, run_digest  # noqa: E402
from reconciler.spec.models.run import Run  # noqa: E402
from reconciler.spec.models.template import ExecutionTemplate  # noqa: E402

TEMPLATE = {"apiVersion": "reconciler/v1", "kind": "ExecutionTemplate", "id": "local-host",
            "placement": {"kind": "local"}, "launch_mode": {"kind": "host_process"}}
RUN_YAML = """apiVersion: reconciler/v1
kind: Run
metadata:
  name: {name}
spec:
  template: local-host
  task:
    type: command
    argv: ["python", "train.py", "--seed", "{i}"]
  restartPolicy:
    maxRetries: 2
    backoffSeconds: 600
"""


def bench_plan(n: int, repeat: int) -> list[float]:
    desired = DesiredState()
    desired.templates["local-host"] = ExecutionTemplate.model_validate(TEMPLATE)
    world = ObservedWorld(at=1000.0)
    local = world.machines.setdefault("local", ObservedMachine("local"))
    previous = {}
    for i in range(n):
        name = f"run-{i:05d}"
        run = Run.model_validate({"apiVersion": "reconciler/v1", "kind": "Run", "metadata": {"name": name},
                                  "spec": {"template": "local-host",
                                           "task": {"type": "command", "argv": ["python", "t.py", str(i)]},
                                           "restartPolicy": {"maxRetries": 2, "backoffSeconds": 600}}})
        entry = RunEntry(run, f"specs/runs/{name}.yaml", run_digest(run))
        desired.runs[name] = entry
        ident = f"{name}-g1-a1"
        kind = i % 4
        state = {0: "running", 1: "running", 2: "succeeded", 3: "failed"}[kind]
        local.runs[ident] = ObservedRun(ident, "local", state, exit_code=None if kind < 2 else (0 if kind == 2 else 1),
                                        finished_at=900.0 if kind >= 2 else None, collected=kind >= 2,
                                        spec_digest=entry.digest)  # built for this spec: adopted, not replaced
        previous[name] = statuses.RunStatus(
            name=name, phase={0: "Running", 1: "Running", 2: "Succeeded", 3: "Pending"}[kind], generation=1,
            attempt=1, spec=SpecRef(digest=entry.digest),
            handle=Handle(machine="local", identity=ident))
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        plan = make_plan(desired, world, previous, 1000.0)
        times.append(time.perf_counter() - t0)
    assert len(plan.changes) == n
    assert not any(c.action in ("launch", "relaunch") for c in plan.changes), "the fixture should launch nothing"
    return times


def bench_pass(n: int, repeat: int) -> tuple[float, list[float]]:
    tmp = Path(tempfile.mkdtemp(prefix="loop-bench-"))
    try:
        (tmp / "execution_templates").mkdir()
        (tmp / "execution_templates" / "local-host.yaml").write_text(
            "apiVersion: reconciler/v1\nkind: ExecutionTemplate\nid: local-host\n"
            "placement: {kind: local}\nlaunch_mode: {kind: host_process}\n")
        runs = tmp / "specs" / "runs"
        runs.mkdir(parents=True)
        status_dir = tmp / "status"
        status_dir.mkdir()
        for i in range(n):
            name = f"run-{i:05d}"
            text = RUN_YAML.format(name=name, i=i)
            (runs / f"{name}.yaml").write_text(text)
        cfg = configs.load(str(tmp), flags={"workspace_root": str(tmp / "ws"), "namespace": "bench",
                                            "commit": False, "local_gpus": 0})
        # Previous status: every run Succeeded, as a first pass would have left it.
        from reconciler.spec.load import load_tree

        desired = load_tree(tmp)
        for name, entry in desired.runs.items():
            st = statuses.RunStatus(name=name, phase="Succeeded", generation=1, attempt=1, exit_code=0,
                                    spec=SpecRef(digest=entry.digest, path=entry.rel),
                                    handle=Handle(machine="local", identity=f"{name}-g1-a1"))
            record(st, "Succeeded", "done", 1000.0)
            statuses.write_if_changed(status_dir, st)
        subprocess.run(["git", "init", "-q", str(tmp)], check=True)
        # Committed, as the daemon's clone is (the pass keys some of its caches by the commit).
        subprocess.run(["git", "-C", str(tmp), "add", "-A", "specs", "execution_templates"], check=True)
        subprocess.run(["git", "-C", str(tmp), "-c", "user.name=b", "-c", "user.email=b@x", "commit", "-q", "-m",
                        "specs"], check=True)
        rec = Reconciler(cfg)
        t0 = time.perf_counter()
        first = rec.run_pass()
        cold = time.perf_counter() - t0
        del first  # it brings the status files up to date (conditions) once
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            res = rec.run_pass()
            times.append(time.perf_counter() - t0)
            assert not res.written and all(c.action == "none" for c in res.plan.changes)
        return cold, times
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    plan_times = bench_plan(args.runs, args.repeat)
    print(f"plan: {args.runs} runs, observed state in memory: median {statistics.median(plan_times):.3f} s "
          f"(min {min(plan_times):.3f}, max {max(plan_times):.3f}; target <= 0.5 s)")
    cold, pass_times = bench_pass(args.runs, args.repeat)
    print(f"pass: {args.runs} unchanged specs: first pass {cold:.2f} s (parses everything), then median "
          f"{statistics.median(pass_times):.3f} s (min {min(pass_times):.3f}, max {max(pass_times):.3f}; target <= 1 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
