"""The precheck's GPU part: the driver and GPUs as NVML reports them, and the check that the GPUs
a run was given on a machine are visible to its login.

A separate file of ``scripts/`` (``precheck.py`` imports it from its own folder, where the bundle
ships both). Standard library only: NVML's module is imported when present, never required.
"""

from __future__ import annotations

import os
import socket


def error_text(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _s(value):
    """NVML returns bytes in old pynvml releases and str in new ones."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def collect_nvml() -> dict:
    info = {"available": False}
    try:
        import pynvml
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        info["error"] = "pynvml not importable: " + error_text(exc)
        return info
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound on a host without the driver
        info["error"] = str(exc) or type(exc).__name__
        return info
    try:
        info["available"] = True
        info["driver_version"] = _s(pynvml.nvmlSystemGetDriverVersion())
        try:
            cuda = pynvml.nvmlSystemGetCudaDriverVersion()
            info["cuda_driver_version"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        except Exception:
            info["cuda_driver_version"] = None
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            dev = {"index": i}
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                dev["name"] = _s(pynvml.nvmlDeviceGetName(h))
                dev["uuid"] = _s(pynvml.nvmlDeviceGetUUID(h))
                dev["memory_total_mib"] = int(pynvml.nvmlDeviceGetMemoryInfo(h).total) // (1 << 20)
            except Exception as exc:
                dev["error"] = error_text(exc)
            devices.append(dev)
        info["devices"] = devices
    except Exception as exc:
        info["error"] = error_text(exc)
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return info


def login() -> str:
    try:
        import pwd
        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return str(os.getuid())


def check_gpus(expected: int, torch_info: dict, nvml: dict) -> dict:
    """The run was given ``expected`` GPUs on this machine: they must be visible to this login.
    A failure is the machine's (its driver, its devices), never the spec's: another machine may
    take the run (``scope: machine``)."""
    check = {"name": "gpus", "ok": False, "expected": expected, "scope": "machine"}
    if torch_info.get("present") and torch_info.get("cuda_available"):
        visible, source = int(torch_info.get("device_count") or 0), "torch"
    elif nvml.get("available"):
        visible, source = len(nvml.get("devices") or []), "NVML"
    else:
        visible, source = 0, None
    check["visible"] = visible
    who = f"login {login()} on {socket.gethostname()}"
    if visible >= expected:
        check["ok"] = True
    elif source is None and not nvml.get("available") and "not importable" not in str(nvml.get("error")):
        check["kind"] = "no-cuda-driver"
        check["reason"] = (f"no CUDA driver for {who} ({nvml.get('error')}); the run was given {expected} GPU(s)")
    else:
        check["kind"] = "no-gpu"
        seen = f"{visible} GPU(s) visible" + (f" to {source}" if source else "")
        devices = os.environ.get("CUDA_VISIBLE_DEVICES")
        check["reason"] = (f"{seen} for {who}, the run was given {expected}"
                           + (f" (CUDA_VISIBLE_DEVICES={devices})" if devices is not None else "")
                           + (f": {torch_info.get('cuda_error')}" if torch_info.get("cuda_error") else ""))
    return check
