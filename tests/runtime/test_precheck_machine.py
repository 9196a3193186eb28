"""Machine-scoped precheck refusals: the interpreter check of a swift entrypoint and the GPU check
of precheck.py tell apart what is wrong with the machine, name the path and the login, and write
``scope: machine`` where the probe reads it.

The entrypoint and precheck.py run for real (subprocesses). Where NVML is needed, a stand-in
``pynvml`` module (a fake: no GPU driver on this machine) says what a machine without a driver or
with one GPU would say; the check that reads it is the real one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from reconciler.core.boundary import parse_run
from reconciler.runtime import probe
from reconciler.tasks.swift import entrypoint
from tests.runtime.test_precheck import run_precheck


def _run_entrypoint(tmp_path: Path, python: str) -> tuple[int, dict]:
    bundle = tmp_path / "bundle"
    (bundle / "scripts").mkdir(parents=True, exist_ok=True)
    ep = bundle / "scripts" / "entrypoint.sh"
    ep.write_text(entrypoint("sft"))
    env = {"PATH": os.environ["PATH"], "RECONCILER_BUNDLE": str(bundle), "RECONCILER_PYTHON": python}
    r = subprocess.run(["sh", str(ep)], capture_output=True, text=True, env=env, timeout=30)
    return r.returncode, json.loads((bundle / "artifacts" / "runtime-precheck.json").read_text())


def test_the_interpreter_check_names_what_is_wrong_the_path_and_the_login(tmp_path: Path) -> None:
    login = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    rc, rep = _run_entrypoint(tmp_path, str(tmp_path / "nowhere" / "python"))
    assert rc == 127 and rep["ok"] is False
    assert (rep["scope"], rep["kind"], rep["path"], rep["login"]) == (
        "machine", "python-missing", str(tmp_path / "nowhere" / "python"), login)
    assert str(tmp_path / "nowhere" / "python") in rep["reason"] and f"login {login}" in rep["reason"]
    plain = tmp_path / "plain"
    plain.write_text("not a program")
    plain.chmod(0o644)
    if os.geteuid() != 0:  # root may execute anything with an x bit, and reads anything
        rc, rep = _run_entrypoint(tmp_path, str(plain))
        assert (rc, rep["kind"]) == (127, "python-not-executable")
    # A virtualenv's interpreter link into a folder the login cannot reach: here, a folder that is
    # gone (the e2e test has a real 0700 home on an SSH machine).
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(tmp_path / "private" / "bin" / "python3")
    rc, rep = _run_entrypoint(tmp_path, str(venv / "python"))
    assert (rc, rep["kind"], rep["path"]) == (127, "venv-unreadable", str(venv / "python"))
    assert str(tmp_path / "private" / "bin" / "python3") in rep["reason"]
    (tmp_path / "broken").write_text("#!/bin/sh\necho 'cannot open shared object' >&2; exit 1\n")
    (tmp_path / "broken").chmod(0o755)
    rc, rep = _run_entrypoint(tmp_path, str(tmp_path / "broken"))
    assert (rc, rep["kind"]) == (127, "python-does-not-start") and "cannot open shared object" in rep["reason"]


def test_the_gpus_a_run_was_given_must_be_visible(tmp_path: Path) -> None:
    proc, report, _ = run_precheck(tmp_path, "--expect-gpus", "2")  # python -S: no torch, no pynvml
    assert proc.returncode == 3
    assert report["scope"] == "machine" and report["kind"] == "no-gpu", report
    assert report["path"] == sys.executable and report["login"] and report["machine"]
    assert "0 GPU(s) visible" in report["reason"] and "given 2" in report["reason"]
    proc, report, _ = run_precheck(tmp_path)  # a run given no GPUs: nothing to check
    assert proc.returncode == 0 and "scope" not in report


def _nvml(root: Path, body: str) -> Path:
    lib = root / "fake-nvml"
    lib.mkdir(exist_ok=True)
    (lib / "pynvml.py").write_text(textwrap.dedent(body))
    return lib


def test_no_driver_and_too_few_gpus_are_told_apart(tmp_path: Path) -> None:
    lib = _nvml(tmp_path, '''
        class NVMLError_LibraryNotFound(Exception): pass
        def nvmlInit(): raise NVMLError_LibraryNotFound("NVML Shared Library Not Found")
    ''')
    proc, report, _ = run_precheck(tmp_path, "--expect-gpus", "1", pythonpath=[lib])
    assert proc.returncode == 3 and report["kind"] == "no-cuda-driver", report
    assert "NVML Shared Library Not Found" in report["reason"]
    lib = _nvml(tmp_path, '''
        from types import SimpleNamespace
        def nvmlInit(): pass
        def nvmlShutdown(): pass
        def nvmlSystemGetDriverVersion(): return "550.54.15"
        def nvmlSystemGetCudaDriverVersion(): return 12040
        def nvmlDeviceGetCount(): return 1
        def nvmlDeviceGetHandleByIndex(i): return i
        def nvmlDeviceGetName(h): return "NVIDIA H100"
        def nvmlDeviceGetUUID(h): return "GPU-0"
        def nvmlDeviceGetMemoryInfo(h): return SimpleNamespace(total=80 * 1024 ** 3)
    ''')
    proc, report, _ = run_precheck(tmp_path, "--expect-gpus", "2", pythonpath=[lib])
    assert proc.returncode == 3 and report["kind"] == "no-gpu" and "1 GPU(s) visible to NVML" in report["reason"]
    proc, report, _ = run_precheck(tmp_path, "--expect-gpus", "1", pythonpath=[lib])
    assert proc.returncode == 0 and report["checks"][-1]["ok"] is True


def test_the_probe_reports_the_machines_refusal_and_the_boundary_keeps_it(tmp_path: Path) -> None:
    ws = tmp_path / "root" / "r-g1-a1"
    (ws / "runtime").mkdir(parents=True)
    (ws / "artifacts").mkdir()
    (ws / "runtime" / "result.json").write_text(json.dumps({"state": "failed", "exit_code": 127, "finished_ts": 5}))
    (ws / "artifacts" / "runtime-precheck.json").write_text(json.dumps(
        {"ok": False, "scope": "machine", "kind": "venv-unreadable", "reason": "python /v/bin/python links to ..."}))
    run = probe.probe(str(tmp_path / "root"), ["r"])["runs"]["r-g1-a1"]
    assert run["permanent"] is True and run["scope"] == "machine", run
    obs = parse_run("r-g1-a1", run)
    assert obs.permanent and obs.scope == "machine"
    # The spec's own refusal (a version mismatch) stays the spec's; a garbage scope is none.
    for scope in (None, "everywhere", ["machine"]):
        (ws / "artifacts" / "runtime-precheck.json").write_text(json.dumps({"ok": False, "reason": "x", "scope": scope}))
        run = probe.probe(str(tmp_path / "root"), ["r"])["runs"]["r-g1-a1"]
        assert run["permanent"] is True and parse_run("r-g1-a1", run).scope is None
    # A run that exits 127 on its own (a command not found) with no precheck report: not permanent.
    (ws / "artifacts" / "runtime-precheck.json").unlink()
    run = probe.probe(str(tmp_path / "root"), ["r"])["runs"]["r-g1-a1"]
    assert not run.get("permanent") and parse_run("r-g1-a1", run).scope is None
    # The scope a machine claims on a run that is not permanent is dropped at the boundary.
    assert parse_run("r-g1-a1", {"state": "failed", "scope": "machine"}).scope is None
    odd = parse_run("r-g1-a1", {"state": "failed", "permanent": True, "scope": {"x": "machine"}})
    assert (odd.state, odd.permanent, odd.scope) == ("failed", True, None)
