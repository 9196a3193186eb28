"""Benchmark: `reconcile validate` over generated valid specs.

Generates N Run specs of about 20 lines (default 10,000) plus one template in a scratch
repository, runs the real command line several times, and prints specs per second (median).
Target: at least 2,000 specs/s on a 2-core machine.

    python benchmarks/validate_bench.py [--specs 10000] [--runs 5]
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

from specgen import TEMPLATE, run_spec

def run_text(name: str, i: int) -> str:
    return run_spec(name, i, f'["python", "train.py", "--lr", "0.001", "--seed", "{i}"]', {"WANDB_MODE": "offline"},
                    middle="  overrides:\n    resources:\n      gpu_count: 1\n", tail="  secrets: [HF_TOKEN]\n")


def make_repo(root: Path, n: int) -> None:
    (root / "execution_templates").mkdir(parents=True)
    (root / "execution_templates" / "local-host.yaml").write_text(TEMPLATE)
    for i in range(n):
        d = root / "specs" / "runs" / f"team{i % 20}"
        d.mkdir(parents=True, exist_ok=True)
        name = f"run-{i:05d}"
        (d / f"{name}.yaml").write_text(run_text(name, i))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--specs", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="validate-bench-"))
    try:
        make_repo(tmp, args.specs)
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "reconciler", "validate", "--repo", str(tmp)],
                                  capture_output=True, text=True)
            times.append(time.perf_counter() - t0)
            if proc.returncode != 0:
                print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
                return 1
        med = statistics.median(times)
        print(f"specs: {args.specs}  runs: {args.runs}")
        print(f"wall time per run (s): median {med:.2f}  min {min(times):.2f}  max {max(times):.2f}")
        print(f"validate throughput: {args.specs / med:,.0f} specs/s (median; target >= 2,000)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
