#!/usr/bin/env python3
"""GPU sampler: a tiny side process that records GPU use next to a training run, as JSON lines.

Why: a run's logging.jsonl says what the trainer thought (loss, steps); it does not say whether the GPUs
were busy, how much memory each process held, or whether a card ran hot or throttled. This script asks
NVML (``nvidia-ml-py``, module ``pynvml``) once per interval and appends one JSON object per line to
``--out``. It needs only the standard library and pynvml, so it runs with whatever python the execution
plane has, and it costs next to nothing: between samples it sleeps in ``select()``.

    python gpu_sampler.py --out PATH [--interval 1.0] [--watch-pid PID]

Every line has ``ts`` (unix time, float) and ``event``:

* ``start``: ``pid``, ``hostname``, ``interval``, ``watch_pid``.
* ``inventory``: ``driver_version``, ``cuda_driver_version``, ``nvml_version`` and ``devices``, each with
  ``index``, ``name``, ``uuid``, ``memory_total_mib``.
* ``sample`` (every interval): ``devices``, each with ``index``, ``util_gpu_pct``, ``util_mem_pct``,
  ``mem_used_mib``, ``mem_total_mib``, ``temp_c``, ``power_w`` and ``processes`` (``pid``,
  ``used_mib``) from ``nvmlDeviceGetComputeRunningProcesses``. A field the device does not support is
  ``null``; a device that fails as a whole gets an ``error`` string instead of failing the sampler.
* ``stop``: ``reason`` (``signal SIGTERM``, ``watched pid N exited``, ...), ``samples``, ``cpu_s`` (the
  sampler's own CPU time, to keep an eye on its cost).

Without NVML (a host without the NVIDIA driver, where ``nvmlInit`` raises
``NVMLError_LibraryNotFound``, or without pynvml at all) it writes exactly one line,
``{"event": "nvml_unavailable", "reason": "NVML Shared Library Not Found", ...}``, and exits 0: a CPU
run is not an error, and a sampler that keeps failing would only add noise.

Lifetime: it stops on SIGTERM/SIGINT/SIGHUP (writing ``stop``), and with ``--watch-pid`` it also stops by
itself once that process is gone (exited, or a zombie nobody reaped yet, or its pid reused by another
process), so a sampler started beside a job never outlives it. The output is opened in append mode and
flushed after every line, so a reader can tail it and a relaunch adds to the same file.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import sys
import time

MIB = 1 << 20


def _s(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def _err(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Writer:
    def __init__(self, path: str):
        path = os.path.abspath(path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._f = open(path, "a", encoding="utf-8")

    def emit(self, event: str, **fields) -> None:
        record = {"ts": round(time.time(), 3), "event": event}
        record.update(fields)
        self._f.write(json.dumps(record, separators=(",", ":"), default=str) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


# --------------------------------------------------------------------------- watched process


def _proc_start_time(pid: int):
    """Field 22 of /proc/PID/stat (start time in clock ticks), to notice a reused pid; None off Linux."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain spaces: split after the last ')'.
    rest = stat[stat.rfind(")") + 2:].split()
    return rest[0], rest[19]  # state, starttime


class Watched:
    def __init__(self, pid: int):
        self.pid = pid
        st = _proc_start_time(pid)
        self.start_time = st[1] if st else None

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # exists, owned by someone else
        st = _proc_start_time(self.pid)
        if st is None:
            return not os.path.isdir("/proc") or os.path.exists(f"/proc/{self.pid}")
        state, start_time = st
        if state in ("Z", "X"):
            return False
        return self.start_time is None or start_time == self.start_time


# --------------------------------------------------------------------------- NVML


def _maybe(fn, *args):
    try:
        return fn(*args)
    except Exception:
        return None


def inventory(nvml, handles) -> dict:
    cuda = _maybe(nvml.nvmlSystemGetCudaDriverVersion)
    devices = []
    for i, h in enumerate(handles):
        mem = _maybe(nvml.nvmlDeviceGetMemoryInfo, h)
        devices.append({
            "index": i,
            "name": _s(_maybe(nvml.nvmlDeviceGetName, h)),
            "uuid": _s(_maybe(nvml.nvmlDeviceGetUUID, h)),
            "memory_total_mib": int(mem.total) // MIB if mem is not None else None,
        })
    return {
        "driver_version": _s(_maybe(nvml.nvmlSystemGetDriverVersion)),
        "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None,
        "nvml_version": _s(_maybe(nvml.nvmlSystemGetNVMLVersion)),
        "devices": devices,
    }


def sample_device(nvml, index: int, h) -> dict:
    dev = {"index": index}
    try:
        util = _maybe(nvml.nvmlDeviceGetUtilizationRates, h)
        mem = _maybe(nvml.nvmlDeviceGetMemoryInfo, h)
        power_mw = _maybe(nvml.nvmlDeviceGetPowerUsage, h)
        procs = _maybe(nvml.nvmlDeviceGetComputeRunningProcesses, h) or []
        dev.update({
            "util_gpu_pct": util.gpu if util is not None else None,
            "util_mem_pct": util.memory if util is not None else None,
            "mem_used_mib": int(mem.used) // MIB if mem is not None else None,
            "mem_total_mib": int(mem.total) // MIB if mem is not None else None,
            "temp_c": _maybe(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU),
            "power_w": round(power_mw / 1000.0, 1) if power_mw is not None else None,
            "processes": [
                {"pid": p.pid,
                 # None when the driver cannot tell (e.g. without permission, or under MIG)
                 "used_mib": int(p.usedGpuMemory) // MIB if getattr(p, "usedGpuMemory", None) is not None else None}
                for p in procs
            ],
        })
    except Exception as exc:
        dev["error"] = _err(exc)
    return dev


# --------------------------------------------------------------------------- main loop


class Stopper:
    """Signals set a reason and wake the select() through a pipe (signal.set_wakeup_fd)."""

    def __init__(self):
        self.reason = None
        self._r, w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, _frame):
        self.reason = f"signal {signal.Signals(signum).name}"

    def sleep(self, seconds: float) -> None:
        if seconds > 0 and self.reason is None:
            try:
                ready, _, _ = select.select([self._r], [], [], seconds)
            except InterruptedError:
                ready = []
            if ready:
                try:
                    os.read(self._r, 512)
                except BlockingIOError:
                    pass


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Sample NVIDIA GPUs into a JSON-lines file.")
    parser.add_argument("--out", required=True, help="JSON-lines file (appended to)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1.0)")
    parser.add_argument("--watch-pid", type=int, help="stop once this process is gone")
    args = parser.parse_args(argv)
    if args.interval <= 0:
        parser.error("--interval must be > 0")

    out = Writer(args.out)
    common = {"pid": os.getpid(), "hostname": socket.gethostname(), "watch_pid": args.watch_pid}
    try:
        import pynvml as nvml
    except Exception as exc:
        out.emit("nvml_unavailable", reason="pynvml not importable: " + _err(exc), **common)
        out.close()
        return 0
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
        out.emit("nvml_unavailable", reason=str(exc) or type(exc).__name__, error=type(exc).__name__, **common)
        out.close()
        return 0

    stopper = Stopper()
    watched = Watched(args.watch_pid) if args.watch_pid else None
    samples = 0
    failed = False
    try:
        out.emit("start", interval=args.interval, **common)
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        out.emit("inventory", **inventory(nvml, handles))
        next_at = time.monotonic()
        while stopper.reason is None:
            if watched is not None and not watched.alive():
                stopper.reason = f"watched pid {watched.pid} exited"
                break
            out.emit("sample", devices=[sample_device(nvml, i, h) for i, h in enumerate(handles)])
            samples += 1
            # Fixed cadence without drift; after a stall (suspended host) skip the missed slots.
            next_at += args.interval
            now = time.monotonic()
            if next_at < now:
                next_at = now + args.interval
            stopper.sleep(next_at - now)
    except Exception as exc:
        failed = True
        stopper.reason = stopper.reason or "error: " + _err(exc)
    finally:
        out.emit("stop", reason=stopper.reason or "unknown", samples=samples, cpu_s=round(time.process_time(), 3))
        out.close()
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
