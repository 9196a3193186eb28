#!/usr/bin/env python3
"""Environment precheck, run by the execution plane's python right before a training run starts.

Why: when a run fails or behaves oddly, the first question is "what exactly did it run on?". The
control plane never imports torch or ms-swift, so it cannot answer that itself; this script runs with
the *training* interpreter on the *training* host and writes down what that interpreter really sees:

* the interpreter (path, version), platform and hostname;
* torch (version, CUDA and cuDNN versions, whether CUDA is usable, GPU names);
* ms-swift: its version and the resolved file it was imported from (which checkout or site-packages);
  transformers, peft and trl versions (read from package metadata, without importing them: importing
  trl and transformers costs seconds and is not needed to know their version);
* the NVIDIA driver and GPUs as NVML reports them (``nvidia-ml-py``, module ``pynvml``).

Anything missing (no torch, no swift, no NVML library on a CPU host) is *recorded*, never raised: the
script only imports the standard library at module level and wraps every optional import.

It can also verify that the swift being imported is the one the run spec declared:

* ``--expect-swift-version V``: ``swift.__version__`` must equal V.
* ``--expect-swift-fork MANIFEST_JSON``: the imported ``swift`` package must be the fork described by a
  fork manifest (format below).

On such a mismatch (or when the declared expectation cannot be checked at all, e.g. swift does not
import) both output files are written with ``"ok": false`` and a ``"reason"``, the reason is printed as
one line on stderr, and the exit code is 3. Otherwise the exit code is 0.

Fork manifest (``FORK_MANIFEST.json``, staged alongside the fork)
-----------------------------------------------------------------
A JSON object::

    {
      "format": 1,
      "name": "ms-swift-acme",                 # free text, recorded
      "version": "4.6.0",                       # optional: must equal swift.__version__
      "commit": "0123abcd...",                  # optional, recorded (the fork's git commit)
      "tree_sha256": "9f86d0...",               # required: digest of the swift package tree
      "root": "src",                            # optional: dir that must contain the imported swift/
      "files": {"__init__.py": "<sha256>", ...} # optional: per-file digests, only to explain a mismatch
    }

``tree_sha256`` is the identity check. A path or a version string alone is not enough: a fork usually
keeps upstream's version string and its ``swift/__init__.py``, and the same path can hold different
code after a re-install. The digest covers the *content* of every regular file under the imported
package directory (the folder holding ``swift/__init__.py``), skipping ``__pycache__`` folders and
``*.pyc``/``*.pyo`` files, so it is the same for an editable install of the fork's checkout and for
a regular ``pip install`` of it, and differs from upstream as soon as one file differs::

    h = sha256()
    for rel in sorted(relative POSIX paths of those files):
        h.update(rel + "\\0" + sha256(file bytes).hexdigest() + "\\n")   # UTF-8
    tree_sha256 = h.hexdigest()

(about 40 ms for ms-swift's ~550 files). ``root``, when given, is resolved against the manifest's
folder and the imported package must be ``<root>/swift``: it pins *where* the fork is imported from,
on top of *what* it is. Write a manifest for a fork with::

    python precheck.py --write-fork-manifest PATH/TO/fork/swift --name NAME --commit SHA > FORK_MANIFEST.json

Output
------
``--json PATH``: one JSON object (``"schema": "reconciler.precheck/1"``, ``ok``, ``reason``,
``python``, ``platform``, ``packages``, ``torch``, ``swift``, ``nvml``, ``checks``, ``missing``).
A refusal that is the machine's, not the spec's (``--expect-gpus N``: the GPUs the run was given
are not visible, or there is no CUDA driver) adds ``scope: "machine"``, ``kind`` (``no-gpu``,
``no-cuda-driver``), ``path`` (the interpreter), ``login`` and ``machine``: the control plane rules
this machine out for the run and tries another. The entrypoint's shell check before this script
writes the same fields for an interpreter that is missing, not executable or does not start.
``--log PATH``: the same facts as readable lines, for a human looking at the run's folder.
Both are written atomically (temporary file, then rename).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import socket
import sys
import time

# Shipped beside this script (scripts/), found through the script's own folder on sys.path.
from precheck_gpus import check_gpus, collect_nvml, error_text as _err, login

SCHEMA = "reconciler.precheck/1"
EXIT_OK = 0
EXIT_MISMATCH = 3

# Distributions whose versions are recorded. Keys are how the report names them.
PACKAGES = {
    "torch": ("torch", "torch"),
    "ms-swift": ("ms-swift", "swift"),
    "transformers": ("transformers", "transformers"),
    "peft": ("peft", "peft"),
    "trl": ("trl", "trl"),
    "accelerate": ("accelerate", "accelerate"),
    "nvidia-ml-py": ("nvidia-ml-py", "pynvml"),
}


def collect_python() -> dict:
    return {
        "executable": sys.executable,
        "realpath": os.path.realpath(sys.executable) if sys.executable else None,
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "prefix": sys.prefix,
        "virtualenv": sys.prefix != getattr(sys, "base_prefix", sys.prefix),
    }


def collect_platform() -> dict:
    return {
        "hostname": socket.gethostname(),
        "system": platform.system(),
        "release": platform.release(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }


def collect_packages() -> dict:
    """Version and location of each distribution, from metadata only (nothing is imported)."""
    import importlib.metadata as md
    import importlib.util

    out = {}
    for key, (dist, module) in PACKAGES.items():
        entry = {"present": False, "version": None, "module_path": None}
        try:
            entry["version"] = md.version(dist)
            entry["present"] = True
        except md.PackageNotFoundError:
            pass
        except Exception as exc:  # broken metadata must not stop the precheck
            entry["error"] = _err(exc)
        try:
            spec = importlib.util.find_spec(module)
            if spec is not None:
                entry["present"] = True
                origin = spec.origin or (list(spec.submodule_search_locations or []) or [None])[0]
                entry["module_path"] = os.path.realpath(origin) if origin else None
        except Exception as exc:
            entry.setdefault("error", _err(exc))
        out[key] = entry
    return out


def collect_swift() -> dict:
    """Import swift for real: the module that loads is the one training will use."""
    info = {"present": False}
    try:
        import swift  # noqa: F401  (lazy module: cheap, does not import torch)
    except BaseException as exc:  # ImportError, but also a broken install raising anything else
        if isinstance(exc, KeyboardInterrupt):
            raise
        info["error"] = _err(exc)
        return info
    file = getattr(swift, "__file__", None)
    info["present"] = True
    info["file"] = os.path.realpath(file) if file else None
    info["package_dir"] = os.path.dirname(info["file"]) if file else None
    try:
        info["version"] = swift.__version__
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        info["version"] = None
        info["version_error"] = _err(exc)
    return info


def collect_torch() -> dict:
    info = {"present": False}
    try:
        import torch
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        info["error"] = _err(exc)
        return info
    info["present"] = True
    info["version"] = getattr(torch, "__version__", None)
    info["file"] = os.path.realpath(torch.__file__) if getattr(torch, "__file__", None) else None
    info["cuda_version"] = getattr(getattr(torch, "version", None), "cuda", None)
    try:
        info["cudnn_version"] = torch.backends.cudnn.version()
    except Exception as exc:
        info["cudnn_version"] = None
        info["cudnn_error"] = _err(exc)
    try:
        info["cuda_available"] = bool(torch.cuda.is_available())
        info["device_count"] = torch.cuda.device_count() if info["cuda_available"] else 0
        info["devices"] = [torch.cuda.get_device_name(i) for i in range(info["device_count"])]
    except Exception as exc:
        info.setdefault("cuda_available", False)
        info.setdefault("device_count", 0)
        info.setdefault("devices", [])
        info["cuda_error"] = _err(exc)
    return info


def _tree_files(package_dir: str):
    for dirpath, dirnames, filenames in os.walk(package_dir):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in filenames:
            if name.endswith((".pyc", ".pyo")):
                continue
            path = os.path.join(dirpath, name)
            if os.path.isfile(path):
                yield os.path.relpath(path, package_dir).replace(os.sep, "/"), path


def file_digests(package_dir: str) -> dict:
    out = {}
    for rel, path in _tree_files(package_dir):
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        out[rel] = h.hexdigest()
    return out


def tree_sha256(files: dict) -> str:
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(f"{rel}\0{files[rel]}\n".encode("utf-8"))
    return h.hexdigest()


def _diff_summary(expected: dict, actual: dict, limit: int = 5) -> str:
    changed = sorted(k for k in expected if k in actual and expected[k] != actual[k])
    missing = sorted(k for k in expected if k not in actual)
    extra = sorted(k for k in actual if k not in expected)
    parts = []
    for label, items in (("changed", changed), ("missing", missing), ("extra", extra)):
        if items:
            shown = ", ".join(items[:limit]) + (", ..." if len(items) > limit else "")
            parts.append(f"{len(items)} {label} ({shown})")
    return "; ".join(parts) or "no per-file difference"


def check_fork(manifest_path: str, swift_info: dict) -> dict:
    check = {"name": "swift_fork", "ok": False, "manifest": os.path.abspath(manifest_path)}
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
        if not isinstance(manifest, dict):
            raise ValueError("not a JSON object")
    except Exception as exc:
        check["reason"] = f"cannot read fork manifest {manifest_path}: {_err(exc)}"
        return check
    check["fork"] = {k: manifest.get(k) for k in ("name", "version", "commit", "tree_sha256", "root")}
    expected_tree = manifest.get("tree_sha256")
    if not isinstance(expected_tree, str) or not expected_tree:
        check["reason"] = f"fork manifest {manifest_path} has no tree_sha256"
        return check
    if not swift_info.get("present"):
        check["reason"] = f"fork {manifest.get('name')!r} declared but swift does not import: {swift_info.get('error')}"
        return check
    pkg = swift_info["package_dir"]
    root = manifest.get("root")
    if root:
        base = os.path.dirname(os.path.abspath(manifest_path))
        want = os.path.realpath(os.path.join(base, root, "swift"))
        check["expected_package_dir"] = want
        if os.path.realpath(pkg) != want:
            check["reason"] = f"swift imported from {pkg}, fork {manifest.get('name')!r} expects {want}"
            return check
    want_version = manifest.get("version")
    if want_version and swift_info.get("version") != want_version:
        check["reason"] = (f"swift version {swift_info.get('version')} imported from {pkg}, "
                           f"fork {manifest.get('name')!r} declares {want_version}")
        return check
    try:
        files = file_digests(pkg)
    except Exception as exc:
        check["reason"] = f"cannot hash swift package at {pkg}: {_err(exc)}"
        return check
    actual_tree = tree_sha256(files)
    check["tree_sha256"] = actual_tree
    if actual_tree != expected_tree:
        detail = _diff_summary(manifest["files"], files) if isinstance(manifest.get("files"), dict) else ""
        check["reason"] = (f"swift imported from {pkg} is not fork {manifest.get('name')!r}: tree_sha256 "
                           f"{actual_tree[:12]} != {expected_tree[:12]}" + (f" [{detail}]" if detail else ""))
        return check
    check["ok"] = True
    return check


def check_version(expected: str, swift_info: dict) -> dict:
    check = {"name": "swift_version", "ok": False, "expected": expected, "actual": swift_info.get("version")}
    if not swift_info.get("present"):
        check["reason"] = f"swift {expected} expected but swift does not import: {swift_info.get('error')}"
    elif swift_info.get("version") != expected:
        check["reason"] = (f"swift version {swift_info.get('version')} imported from "
                           f"{swift_info.get('package_dir')}, expected {expected}")
    else:
        check["ok"] = True
    return check


def write_fork_manifest(package_dir: str, name: str, version, commit, root) -> dict:
    package_dir = os.path.realpath(package_dir)
    if not os.path.isfile(os.path.join(package_dir, "__init__.py")):
        raise SystemExit(f"{package_dir} is not a package folder (no __init__.py)")
    if version is None:
        ns: dict = {}
        vfile = os.path.join(package_dir, "version.py")
        if os.path.isfile(vfile):
            with open(vfile, encoding="utf-8") as f:
                exec(compile(f.read(), vfile, "exec"), ns)  # swift/version.py only assigns strings
        version = ns.get("__version__")
    files = file_digests(package_dir)
    manifest = {"format": 1, "name": name, "version": version, "commit": commit,
                "tree_sha256": tree_sha256(files)}
    if root:
        manifest["root"] = root
    manifest["files"] = files
    return manifest


def _atomic_write(path: str, text: str) -> None:
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def render_log(report: dict) -> str:
    def get(section):
        value = report.get(section)
        return value if isinstance(value, dict) else {}

    lines = ["precheck " + ("OK" if report["ok"] else "FAILED") + (f": {report['reason']}" if report["reason"] else "")]
    py, pl = get("python"), get("platform")
    lines.append(f"python: {py.get('executable')} ({py.get('realpath')}) {py.get('implementation')} "
                 f"{py.get('version')}")
    lines.append(f"host: {pl.get('hostname')} {pl.get('platform')} cpus={pl.get('cpu_count')}")
    t = get("torch")
    if t.get("present"):
        lines.append(f"torch: {t.get('version')} cuda={t.get('cuda_version')} cudnn={t.get('cudnn_version')} "
                     f"cuda_available={t.get('cuda_available')} devices={t.get('devices')}")
    else:
        lines.append(f"torch: MISSING ({t.get('error')})")
    s = get("swift")
    if s.get("present"):
        lines.append(f"swift: {s.get('version')} from {s.get('file')}")
    else:
        lines.append(f"swift: MISSING ({s.get('error')})")
    for key, p in get("packages").items():
        if isinstance(p, dict):
            lines.append(f"package {key}: {p.get('version') if p.get('present') else 'MISSING'}"
                         + (f" at {p['module_path']}" if p.get("module_path") else ""))
    n = get("nvml")
    if n.get("available"):
        lines.append(f"nvml: driver {n.get('driver_version')} cuda {n.get('cuda_driver_version')}")
        for d in n.get("devices", []):
            lines.append(f"  gpu {d.get('index')}: {d.get('name')} {d.get('uuid')} {d.get('memory_total_mib')} MiB")
    else:
        lines.append(f"nvml: unavailable ({n.get('error')})")
    for c in report["checks"]:
        lines.append(f"check {c['name']}: " + ("ok" if c["ok"] else "FAILED: " + c.get("reason", "")))
    if report["missing"]:
        lines.append("missing: " + ", ".join(report["missing"]))
    lines.append(f"took {report['duration_s']:.2f}s")
    return "\n".join(lines) + "\n"


def _guard(fn, *args):
    """A section that fails unexpectedly is recorded, the others still run."""
    try:
        return fn(*args)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        return {"present": False, "available": False, "error": "precheck internal error: " + _err(exc)}


def run(args) -> int:
    t0 = time.monotonic()
    # Python put this script's folder first on sys.path; training does not run from here, so nothing in
    # it may shadow the packages being checked (e.g. a staged run folder holding a "swift" directory).
    here = os.path.dirname(os.path.realpath(__file__))
    if sys.path and sys.path[0] and os.path.realpath(sys.path[0]) == here:
        del sys.path[0]
    report = {"schema": SCHEMA, "ok": True, "reason": None, "ts": time.time()}
    report["python"] = _guard(collect_python)
    report["platform"] = _guard(collect_platform)
    report["packages"] = _guard(collect_packages)
    # swift before torch: swift's __init__ may set device visibility variables that torch reads once.
    report["swift"] = _guard(collect_swift)
    report["torch"] = _guard(collect_torch)
    report["nvml"] = _guard(collect_nvml)

    checks = []
    if args.expect_swift_version:
        checks.append(check_version(args.expect_swift_version, report["swift"]))
    if args.expect_swift_fork:
        checks.append(check_fork(args.expect_swift_fork, report["swift"]))
    if args.expect_gpus:
        checks.append(check_gpus(args.expect_gpus, report["torch"], report["nvml"]))
    report["checks"] = checks
    pk = report["packages"] if isinstance(report["packages"], dict) else {}
    report["missing"] = sorted(k for k, v in pk.items() if isinstance(v, dict) and not v.get("present"))
    failed = [c for c in checks if not c["ok"]]
    if failed:
        report["ok"] = False
        report["reason"] = "; ".join(c["reason"] for c in failed)
        if all(c.get("scope") == "machine" for c in failed):
            # Nothing the spec can fix: the probe rules this machine out for the run (docs/machines.md).
            report.update(scope="machine", kind=failed[0].get("kind"), path=sys.executable, login=login(),
                          machine=socket.gethostname())
    report["duration_s"] = round(time.monotonic() - t0, 3)

    if args.json:
        _atomic_write(args.json, json.dumps(report, indent=2, sort_keys=False, default=str) + "\n")
    if args.log:
        _atomic_write(args.log, render_log(report))
    if not report["ok"]:
        print("precheck failed: " + report["reason"].replace("\n", " "), file=sys.stderr)
        return EXIT_MISMATCH
    return EXIT_OK


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description="Record the training environment and check the declared ms-swift (exit 3 on mismatch).",
        # @FILE reads more arguments from FILE, one per line: the bundle's scripts/precheck.args.
        fromfile_prefix_chars="@")
    parser.add_argument("--log", help="human-readable report")
    parser.add_argument("--json", help="machine-readable report")
    parser.add_argument("--expect-swift-fork", metavar="MANIFEST_JSON", help="fork manifest the swift import must match")
    parser.add_argument("--expect-swift-version", metavar="V", help="version swift.__version__ must equal")
    parser.add_argument("--expect-gpus", metavar="N", type=int, default=0,
                        help="GPUs the run was given here, which this login must see")
    parser.add_argument("--write-fork-manifest", metavar="SWIFT_PKG_DIR",
                        help="print a fork manifest for the swift package folder SWIFT_PKG_DIR and exit")
    parser.add_argument("--name", help="with --write-fork-manifest: the fork's name")
    parser.add_argument("--version", dest="fork_version", help="with --write-fork-manifest: default from version.py")
    parser.add_argument("--commit", help="with --write-fork-manifest: the fork's git commit")
    parser.add_argument("--root", help="with --write-fork-manifest: folder (relative to the manifest) holding swift/")
    args = parser.parse_args(argv)

    if args.write_fork_manifest:
        manifest = write_fork_manifest(args.write_fork_manifest, args.name or "ms-swift-fork",
                                       args.fork_version, args.commit, args.root)
        json.dump(manifest, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return EXIT_OK
    if not (args.log or args.json):
        parser.error("give --log and/or --json")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
