"""Tests for reconciler/runtime/precheck.py, run as a real subprocess.

The project's own python may or may not have torch and ms-swift. To be independent of that, the script
runs with ``python -S`` (no site-packages: every third-party package is missing) and with small stand-in
packages put on PYTHONPATH where a test needs a ``swift`` (a "fork" and an "upstream" copy) or a
``pynvml``. The checks under test (import, version, tree digest, location) are the real ones.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PRECHECK = Path(__file__).resolve().parents[2] / "reconciler" / "runtime" / "precheck.py"


def run_precheck(tmp_path: Path, *args: str, pythonpath=None):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    log, js = tmp_path / "out" / "precheck.log", tmp_path / "out" / "precheck.json"
    proc = subprocess.run([sys.executable, "-S", str(PRECHECK), "--log", str(log), "--json", str(js), *args],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(js.read_text()) if js.exists() else None
    return proc, report, log


def make_swift(root: Path, version: str, body: str = "") -> Path:
    pkg = root / "swift"
    (pkg / "trainers").mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"from .version import __version__\n{body}")
    (pkg / "version.py").write_text(f"__version__ = {version!r}\n")
    (pkg / "trainers" / "__init__.py").write_text("# trainers\n")
    return pkg


@pytest.fixture
def fork(tmp_path):
    """A staged fork: tmp/fork/FORK_MANIFEST.json next to tmp/fork/src/swift."""
    base = tmp_path / "fork"
    pkg = make_swift(base / "src", "4.6.0", "FORK = 'acme'\n")
    manifest = base / "FORK_MANIFEST.json"
    proc = subprocess.run([sys.executable, str(PRECHECK), "--write-fork-manifest", str(pkg), "--name", "acme-swift",
                           "--commit", "0123abc", "--root", "src"], capture_output=True, text=True, check=True)
    manifest.write_text(proc.stdout)
    return base, pkg, manifest


def test_bare_interpreter_writes_both_files_and_lists_missing_packages(tmp_path):
    proc, report, log = run_precheck(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert report["schema"] == "reconciler.precheck/1"
    assert report["ok"] is True and report["reason"] is None
    assert report["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert report["platform"]["hostname"]
    assert report["torch"]["present"] is False and "torch" in report["torch"]["error"]
    assert report["swift"]["present"] is False and "swift" in report["swift"]["error"]
    assert {"torch", "ms-swift", "transformers", "peft", "trl"} <= set(report["missing"])
    assert report["nvml"]["available"] is False and report["nvml"]["error"]
    text = log.read_text()
    assert text.startswith("precheck OK")
    assert "torch: MISSING" in text and "swift: MISSING" in text


def test_swift_that_raises_on_import_is_recorded_not_raised(tmp_path):
    broken = tmp_path / "broken"
    make_swift(broken, "4.6.0", "raise RuntimeError('half-installed')\n")
    proc, report, _ = run_precheck(tmp_path, pythonpath=[broken])
    assert proc.returncode == 0, proc.stderr
    assert report["swift"] == {"present": False, "error": "RuntimeError: half-installed"}


def test_swift_version_and_path_are_recorded(tmp_path):
    site = tmp_path / "site"
    pkg = make_swift(site, "4.6.0")
    proc, report, _ = run_precheck(tmp_path, "--expect-swift-version", "4.6.0", pythonpath=[site])
    assert proc.returncode == 0, proc.stderr
    assert report["swift"]["version"] == "4.6.0"
    assert report["swift"]["file"] == str((pkg / "__init__.py").resolve())
    assert report["checks"] == [{"name": "swift_version", "ok": True, "expected": "4.6.0", "actual": "4.6.0"}]


def test_swift_version_mismatch_exits_3(tmp_path):
    site = tmp_path / "site"
    make_swift(site, "3.12.1")
    proc, report, log = run_precheck(tmp_path, "--expect-swift-version", "4.6.0", pythonpath=[site])
    assert proc.returncode == 3
    assert report["ok"] is False
    assert "swift version 3.12.1" in report["reason"] and "expected 4.6.0" in report["reason"]
    assert proc.stderr.strip().count("\n") == 0 and "4.6.0" in proc.stderr
    assert log.read_text().startswith("precheck FAILED")


def test_declared_fork_that_is_imported_passes(tmp_path, fork):
    base, pkg, manifest = fork
    proc, report, _ = run_precheck(tmp_path, "--expect-swift-fork", str(manifest), pythonpath=[base / "src"])
    assert proc.returncode == 0, proc.stderr
    (check,) = report["checks"]
    assert check["ok"] is True
    assert check["fork"]["name"] == "acme-swift" and check["fork"]["commit"] == "0123abc"
    assert check["tree_sha256"] == json.loads(manifest.read_text())["tree_sha256"]


def test_upstream_swift_instead_of_declared_fork_exits_3(tmp_path, fork):
    base, pkg, manifest = fork
    upstream = tmp_path / "upstream"
    make_swift(upstream, "4.6.0")  # same version string as the fork, different code
    proc, report, _ = run_precheck(tmp_path, "--expect-swift-fork", str(manifest), pythonpath=[upstream])
    assert proc.returncode == 3
    assert report["ok"] is False
    assert f"expects {pkg.resolve()}" in report["reason"]
    assert proc.stderr.startswith("precheck failed: swift imported from") and proc.stderr.count("\n") == 1


def test_fork_with_a_changed_file_fails_the_digest(tmp_path, fork):
    base, pkg, manifest = fork
    (pkg / "trainers" / "__init__.py").write_text("# trainers, patched after the manifest was written\n")
    (pkg / "extra.py").write_text("")
    proc, report, _ = run_precheck(tmp_path, "--expect-swift-fork", str(manifest), pythonpath=[base / "src"])
    assert proc.returncode == 3
    assert "is not fork 'acme-swift': tree_sha256" in report["reason"]
    assert "1 changed (trainers/__init__.py)" in report["reason"] and "1 extra (extra.py)" in report["reason"]


def test_declared_fork_without_swift_exits_3(tmp_path, fork):
    _, _, manifest = fork
    proc, report, _ = run_precheck(tmp_path, "--expect-swift-fork", str(manifest))
    assert proc.returncode == 3
    assert "swift does not import" in report["reason"]


def test_unreadable_manifest_exits_3(tmp_path):
    bad = tmp_path / "FORK_MANIFEST.json"
    bad.write_text("{not json")
    proc, report, _ = run_precheck(tmp_path, "--expect-swift-fork", str(bad))
    assert proc.returncode == 3
    assert report["reason"].startswith("cannot read fork manifest")


def test_nvml_driver_and_gpus_are_recorded(tmp_path):
    lib = tmp_path / "nvml"
    lib.mkdir()
    (lib / "pynvml.py").write_text(textwrap.dedent('''
        from types import SimpleNamespace
        def nvmlInit(): pass
        def nvmlShutdown(): pass
        def nvmlSystemGetDriverVersion(): return b"550.54.15"
        def nvmlSystemGetCudaDriverVersion(): return 12040
        def nvmlDeviceGetCount(): return 1
        def nvmlDeviceGetHandleByIndex(i): return i
        def nvmlDeviceGetName(h): return "NVIDIA H100 80GB HBM3"
        def nvmlDeviceGetUUID(h): return "GPU-0000"
        def nvmlDeviceGetMemoryInfo(h): return SimpleNamespace(total=80 * 1024 ** 3)
    '''))
    proc, report, log = run_precheck(tmp_path, pythonpath=[lib])
    assert proc.returncode == 0, proc.stderr
    assert report["nvml"] == {"available": True, "driver_version": "550.54.15", "cuda_driver_version": "12.4",
                              "devices": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-0000",
                                           "memory_total_mib": 81920}]}
    assert "gpu 0: NVIDIA H100 80GB HBM3" in log.read_text()


def test_real_nvml_on_this_host_is_recorded_without_failing(tmp_path):
    pytest.importorskip("pynvml", reason="pynvml not installed for this interpreter")
    proc = subprocess.run([sys.executable, str(PRECHECK), "--json", str(tmp_path / "p.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    nvml = json.loads((tmp_path / "p.json").read_text())["nvml"]
    assert nvml["available"] or nvml["error"]  # "NVML Shared Library Not Found" without a GPU driver
