#!/usr/bin/env python3
"""CPU cost of the GPU sampler's loop: CPU seconds per sampled (wall) second, from /proc.

On a machine without a GPU the real sampler writes one ``nvml_unavailable`` line and exits at once,
so this measures the loop against a stand-in ``pynvml`` (8 GPUs, one process each): the code under
test is the real ``reconciler/runtime/gpu_sampler.py``; only the NVML library below it is replaced.
A stand-in call returns at once where a real NVML query takes a few microseconds to ~1 ms (driver
ioctl), so on a GPU host the figure is higher by roughly (queries per sample x their latency); the
number measured here is the sampler's own Python overhead (JSON encoding, the file write, the
watch-pid check, select()).

    python benchmarks/sampler_overhead.py [--seconds 60] [--interval 1.0] [--gpus 8]

Method: start the sampler with ``--watch-pid`` of this process, let it run for ``--seconds`` wall
seconds, read its ``utime + stime`` from ``/proc/PID/stat`` just before stopping it (so interpreter
start-up is included: the figure is an upper bound), and report ``cpu / wall`` as a percentage of
one core. The start-up cost alone is reported too (a run that exits at once).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SAMPLER = Path(__file__).resolve().parents[1] / "reconciler" / "runtime" / "gpu_sampler.py"

FAKE = '''
from types import SimpleNamespace
NVML_TEMPERATURE_GPU = 0
N = {gpus}
class NVMLError(Exception): pass
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlSystemGetDriverVersion(): return "550.54.15"
def nvmlSystemGetCudaDriverVersion(): return 12040
def nvmlSystemGetNVMLVersion(): return "12.550.54.15"
def nvmlDeviceGetCount(): return N
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetName(h): return "Fake H100 80GB HBM3"
def nvmlDeviceGetUUID(h): return "GPU-fake-%d" % h
def nvmlDeviceGetMemoryInfo(h): return SimpleNamespace(total=80 * 1024 ** 3, used=(h + 1) * 1024 ** 3, free=0)
def nvmlDeviceGetUtilizationRates(h): return SimpleNamespace(gpu=97, memory=40)
def nvmlDeviceGetTemperature(h, sensor): return 60 + h
def nvmlDeviceGetPowerUsage(h): return 312345
def nvmlDeviceGetComputeRunningProcesses(h): return [SimpleNamespace(pid=4242 + h, usedGpuMemory=512 * 1024 ** 2)]
'''


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(rest[11]) + int(rest[12])) / ticks  # utime, stime


def run(seconds: float, interval: float, gpus: int, tmp: Path) -> dict:
    out = tmp / f"audit-{seconds}.jsonl"
    env = dict(os.environ, PYTHONPATH=str(tmp))
    proc = subprocess.Popen([sys.executable, str(SAMPLER), "--out", str(out), "--interval", str(interval),
                             "--watch-pid", str(os.getpid())], env=env)
    t0 = time.monotonic()
    time.sleep(seconds)
    cpu = cpu_seconds(proc.pid)
    wall = time.monotonic() - t0
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)
    events = [json.loads(line) for line in out.read_text().splitlines()]
    samples = sum(1 for e in events if e["event"] == "sample")
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 3), "samples": samples,
            "cpu_pct_of_one_core": round(100 * cpu / wall, 3), "bytes": out.stat().st_size}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--gpus", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "pynvml.py").write_text(FAKE.format(gpus=args.gpus))
        startup = run(0.5, args.interval, args.gpus, tmp)
        steady = run(args.seconds, args.interval, args.gpus, tmp)
    per_sample_ms = 1000 * (steady["cpu_s"] - startup["cpu_s"]) / max(1, steady["samples"] - startup["samples"])
    print(json.dumps({"python": sys.version.split()[0], "interval_s": args.interval, "gpus": args.gpus,
                      "startup": startup, "steady": steady,
                      "loop_cpu_ms_per_sample": round(per_sample_ms, 3)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
