"""Tests for reconciler/runtime/gpu_sampler.py, run as a real subprocess.

This machine (and CI) has no GPU: the real pynvml raises NVMLError_LibraryNotFound, which must give one
``nvml_unavailable`` line and exit 0. The sampling loop itself is exercised against a stand-in ``pynvml``
module put first on PYTHONPATH (with ``python -S`` so no installed pynvml can shadow it): the code under
test is the real script, only the NVML library below it is replaced.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.repo_helpers import wait_for

SAMPLER = Path(__file__).resolve().parents[2] / "reconciler" / "runtime" / "gpu_sampler.py"

FAKE_PYNVML = textwrap.dedent('''
    """Stand-in for nvidia-ml-py: two GPUs, the second without power readings."""
    from types import SimpleNamespace

    NVML_TEMPERATURE_GPU = 0


    class NVMLError(Exception):
        pass


    class NVMLError_NotSupported(NVMLError):
        pass


    def nvmlInit():
        pass


    def nvmlShutdown():
        pass


    def nvmlSystemGetDriverVersion():
        return "550.54.15"


    def nvmlSystemGetCudaDriverVersion():
        return 12040


    def nvmlSystemGetNVMLVersion():
        return "12.550.54.15"


    def nvmlDeviceGetCount():
        return 2


    def nvmlDeviceGetHandleByIndex(i):
        return i


    def nvmlDeviceGetName(h):
        return b"Fake H100 80GB HBM3"  # old pynvml releases return bytes


    def nvmlDeviceGetUUID(h):
        return "GPU-fake-%d" % h


    def nvmlDeviceGetMemoryInfo(h):
        return SimpleNamespace(total=80 * 1024 ** 3, used=(h + 1) * 1024 ** 3, free=0)


    def nvmlDeviceGetUtilizationRates(h):
        return SimpleNamespace(gpu=97 - h, memory=40 + h)


    def nvmlDeviceGetTemperature(h, sensor):
        return 60 + h


    def nvmlDeviceGetPowerUsage(h):
        if h == 1:
            raise NVMLError_NotSupported("Not Supported")
        return 312345


    def nvmlDeviceGetComputeRunningProcesses(h):
        if h == 0:
            return [SimpleNamespace(pid=4242, usedGpuMemory=512 * 1024 ** 2)]
        return [SimpleNamespace(pid=4343, usedGpuMemory=None)]
''')


def read_events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def fake_nvml_env(tmp_path):
    lib = tmp_path / "fake_nvml"
    lib.mkdir()
    (lib / "pynvml.py").write_text(FAKE_PYNVML)
    return dict(os.environ, PYTHONPATH=str(lib))


def start_sampler(out: Path, env: dict, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-S", str(SAMPLER), "--out", str(out), *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_without_nvml_library_writes_one_event_and_exits_0(tmp_path):
    try:
        import pynvml
    except ImportError:
        pytest.skip("pynvml is not installed for this interpreter (covered by the next test)")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("NVML works on this host: there is a GPU driver")

    out = tmp_path / "gpu.jsonl"
    proc = subprocess.run([sys.executable, str(SAMPLER), "--out", str(out), "--interval", "0.1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    events = read_events(out)
    assert len(events) == 1, events
    (event,) = events
    assert event["event"] == "nvml_unavailable"
    assert event["reason"] == "NVML Shared Library Not Found"
    assert isinstance(event["ts"], float)


def test_without_pynvml_module_writes_one_event_and_exits_0(tmp_path):
    out = tmp_path / "gpu.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-S", str(SAMPLER), "--out", str(out)],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    events = read_events(out)
    assert [e["event"] for e in events] == ["nvml_unavailable"]
    assert "pynvml not importable" in events[0]["reason"]


def test_samples_devices_and_processes_then_stops_on_sigterm(tmp_path, fake_nvml_env):
    out = tmp_path / "gpu.jsonl"
    proc = start_sampler(out, fake_nvml_env, "--interval", "0.1")
    try:
        wait_for(lambda: sum(e["event"] == "sample" for e in read_events(out)) >= 3, timeout=30, what="3 samples")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    events = read_events(out)
    kinds = [e["event"] for e in events]
    assert kinds[:2] == ["start", "inventory"]
    assert kinds[-1] == "stop" and set(kinds[2:-1]) == {"sample"}
    for e in events:
        assert isinstance(e["ts"], float)

    inv = events[1]
    assert inv["driver_version"] == "550.54.15"
    assert inv["cuda_driver_version"] == "12.4"
    assert inv["devices"][0] == {"index": 0, "name": "Fake H100 80GB HBM3", "uuid": "GPU-fake-0",
                                 "memory_total_mib": 81920}

    sample = events[2]
    d0, d1 = sample["devices"]
    assert d0 == {"index": 0, "util_gpu_pct": 97, "util_mem_pct": 40, "mem_used_mib": 1024,
                  "mem_total_mib": 81920, "temp_c": 60, "power_w": 312.3,
                  "processes": [{"pid": 4242, "used_mib": 512}]}
    assert d1["power_w"] is None  # NVMLError_NotSupported is a missing field, not a failure
    assert d1["processes"] == [{"pid": 4343, "used_mib": None}]

    stop = events[-1]
    assert stop["reason"] == "signal SIGTERM"
    assert stop["samples"] == kinds.count("sample")
    assert stop["cpu_s"] < 5


def test_exits_by_itself_when_watched_pid_is_gone(tmp_path, fake_nvml_env):
    # The short-lived process is not reaped before the sampler must notice: a zombie counts as gone.
    short = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    out = tmp_path / "gpu.jsonl"
    proc = start_sampler(out, fake_nvml_env, "--interval", "0.1", "--watch-pid", str(short.pid))
    try:
        wait_for(lambda: proc.poll() is not None, timeout=30, what="the sampler to exit after its watched pid")
        assert proc.returncode == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        short.wait()

    events = read_events(out)
    assert events[0]["event"] == "start" and events[0]["watch_pid"] == short.pid
    assert events[-1]["event"] == "stop"
    assert events[-1]["reason"] == f"watched pid {short.pid} exited"
    assert any(e["event"] == "sample" for e in events)


def test_watch_pid_that_never_existed_stops_at_once(tmp_path, fake_nvml_env):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: the pid no longer exists
    out = tmp_path / "gpu.jsonl"
    proc = start_sampler(out, fake_nvml_env, "--interval", "5", "--watch-pid", str(gone.pid))
    assert proc.wait(timeout=30) == 0
    events = read_events(out)
    assert [e["event"] for e in events] == ["start", "inventory", "stop"]
    assert events[-1]["samples"] == 0
