"""Provenance: what a run was made of and what it made, written as ``artifacts/manifest.json`` at collection.

The manifest has two halves:

- ``reproducibility``: everything that should be the same when the same spec runs again: the spec
  (digest and spec commit), a snapshot of the execution template and the image, the task and its
  resolved configuration (the rendered ms-swift config), the plain runtime environment, the code
  pin (repository, commit and a digest of the staged tree), the content hash of every staged input,
  and the versions the execution plane's python really imported (from the precheck: python, torch,
  CUDA, ms-swift and its fork check, transformers, peft, trl, ...). ``reproducibility_digest``
  hashes it. Two runs of the same spec on the same kind of environment have identical
  reproducibility fields, and so the same digest; a difference names what changed.
- ``run``: what is particular to this instance: identity, machine and host, the GPUs (inventory from
  ``nvml-audit.jsonl``, or why NVML was unavailable), timestamps, the result, the checkpoint it
  resumed from, the precheck's verdict, the last training step, the repository's HEAD at launch, and
  every artifact with its size and sha256.

The **spec commit** has one meaning everywhere (here, ``status.spec.commit``, the docs): the last
commit that changed the run's spec file, as of the launch. Not HEAD: the reconciler commits status
after every pass, so HEAD moves without anything the run is made of changing. HEAD at launch is
kept as ``run.repo_head``, for information only; ``--diff`` ignores it, and everything else those
status commits change (the bundle digest, which hashes job.json and so HEAD).

It is built on the control plane from files only (``job.json``, ``scripts/``, ``runtime/``,
``artifacts/``): no import of torch or swift. ``reconcile provenance NAME`` prints it; ``--diff
OTHER`` lists the reproducibility fields that differ (and exits 1 if any do), then, for
information, how the two instances differ.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from . import bundle as bundles
from reconciler.core.boundary import MAX_STEP, MAX_TIME, BadReply, clean_progress, clean_text, finite, loads
from .safetar import read_plain
from reconciler.core.identity import parse
from reconciler.core.runstatus import iso
from reconciler.status.store import load_one

# /2: spec.commit is only ever the spec commit (never HEAD); inputs by content hash; image, config
# and runtime_env added to the reproducibility half.
SCHEMA = "reconciler.artifacts.provenance/2"
ENV_PACKAGES = ("torch", "ms-swift", "transformers", "peft", "trl", "accelerate", "nvidia-ml-py")
# What an input is, for reproducibility: its place and its content. Size and file count follow from it.
INPUT_KEYS = ("path", "kind", "sha256")
# Keys of the rendered ms-swift config that name this attempt, not what it trains: a resumed attempt
# points at its predecessor's checkpoint (recorded as run.resumed_from).
CONFIG_INSTANCE_KEYS = ("resume_from_checkpoint",)
# Plain environment variables set per machine or per placement, not by the spec: the GPUs assigned
# (run.gpus_assigned) and the path of the machine's python (environment.python has its version).
ENV_INSTANCE_KEYS = ("CUDA_VISIBLE_DEVICES", "RECONCILER_PYTHON")
# run.* fields --diff never reports: HEAD at launch, and the bundle digest (job.json records HEAD),
# both moved by the reconciler's own status commits, which change nothing the run is made of.
DIFF_IGNORED = ("run.repo_head", "run.bundle_digest")


# What a job can write into the files read here is any JSON, or none: each file is decoded by the
# trust boundary's parser (bounded sizes, counts and nesting), must hold the expected top-level
# type, and its text and numbers are made plain (no control character or lone surrogate, finite
# numbers only) before they reach the manifest, its digest or a status. A file that fails leaves
# its fields out and says why under ``run.unreadable``; nothing here raises on a file's content.
JSON_LIMIT = 16 << 20
TEXT_LIMIT = 1000
NEST_LIMIT = 16


def plain(value: Any, depth: int = 0) -> Any:
    """Decoded JSON from a job, as the manifest may hold it: text cleaned and bounded, numbers
    finite (else None), nesting cut at NEST_LIMIT."""
    if isinstance(value, str):
        return clean_text(value, TEXT_LIMIT)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if -MAX_STEP <= value <= MAX_STEP else None
    if isinstance(value, float):
        return finite(value)
    if depth >= NEST_LIMIT:
        return None
    if isinstance(value, dict):
        return {clean_text(k, 200): plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v, depth + 1) for v in value]
    return None


def _obj(value: Any) -> dict:
    """``value`` when it is a mapping, else an empty one (a job's JSON has any shape)."""
    return value if isinstance(value, dict) else {}


def read_json(path: Path, kind: type = dict, limit: int = JSON_LIMIT) -> tuple[Any, str | None]:
    """A JSON file the job could write: (its plain value, None), or (None, why) when it is absent,
    not a regular file, too large, not JSON or not a ``kind`` at its top."""
    # runtime/ and artifacts/ were written by the job (a local run's are read in its workspace):
    # a regular file only, never through a link, never a FIFO that would block the pass.
    data = read_plain(path, limit)
    if data is None:
        return None, "absent, not a regular file, or over the size limit"
    try:
        value = loads(data, limit)
    except BadReply as e:
        return None, clean_text(str(e), 200)
    if not isinstance(value, kind):
        return None, f"not a JSON {'object' if kind is dict else kind.__name__}"
    return plain(value), None


def _load_json(path: Path) -> Any:
    return read_json(path)[0]


def _iso(ts: Any) -> str | None:
    f = finite(ts, MAX_TIME)
    return None if f is None else iso(f)


def _read_ts(path: Path) -> float | None:
    data = read_plain(path, 4096)
    try:
        return finite(float(data.decode().strip()), MAX_TIME) if data is not None else None
    except (ValueError, UnicodeDecodeError):
        return None


def canonical_digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _spec_commit(job: dict) -> str | None:
    return job.get("spec_commit") if "repo_head" in job else job.get("spec_source_commit")


# ---------------------------------------------------------------- sections


def environment(precheck: dict | None) -> dict | None:
    """The versions the training python imported, from runtime-precheck.json (paths and hosts left out)."""
    if not isinstance(precheck, dict):
        return None
    py = _obj(precheck.get("python"))
    packages = _obj(precheck.get("packages"))
    torch = _obj(precheck.get("torch"))
    swift = _obj(precheck.get("swift"))
    checks = precheck.get("checks") if isinstance(precheck.get("checks"), list) else []
    env: dict[str, Any] = {
        "python": {"version": py.get("version"), "implementation": py.get("implementation")},
        "packages": {k: _obj(packages.get(k)).get("version") for k in ENV_PACKAGES},
        "torch": {"version": torch.get("version"), "cuda_version": torch.get("cuda_version"),
                  "cudnn_version": torch.get("cudnn_version")} if torch.get("present") else None,
        "swift": {"version": swift.get("version")} if swift.get("present") else None,
        "checks": [{"name": c.get("name"), "ok": c.get("ok"),
                    **({"fork": _obj(c.get("fork")).get("name"), "tree_sha256": c.get("tree_sha256")}
                       if c.get("name") == "swift_fork" else {}),
                    **({"expected": c.get("expected")} if c.get("name") == "swift_version" else {})}
                   for c in checks if isinstance(c, dict)],
    }
    return env


def gpu_inventory(audit: Path) -> dict:
    """The GPUs as the sampler saw them: its inventory line, or why NVML was unavailable."""
    out: dict[str, Any] = {"source": "artifacts/nvml-audit.jsonl"}
    data = read_plain(audit, 256 << 20)
    if data is not None:
        lines = data.decode("utf-8", errors="replace").splitlines()
    else:
        return {"source": None, "available": False, "reason": "no nvml-audit.jsonl (no sampler ran)"}
    samples = 0
    for line in lines:
        try:
            rec = plain(loads(line))
        except BadReply:
            continue
        ev = rec.get("event") if isinstance(rec, dict) else None
        if ev == "nvml_unavailable" and "available" not in out:
            out.update(available=False, reason=rec.get("reason"))
        elif ev == "inventory" and not out.get("available"):
            out.update(available=True, driver_version=rec.get("driver_version"),
                       cuda_driver_version=rec.get("cuda_driver_version"),
                       devices=[{k: d.get(k) for k in ("index", "name", "uuid", "memory_total_mib")}
                                for d in (rec.get("devices") if isinstance(rec.get("devices"), list) else [])
                                if isinstance(d, dict)])
        elif ev == "sample":
            samples += 1
    out.setdefault("available", False)
    out["samples"] = samples
    return out


def resolved_config(root: Path) -> dict | None:
    """The task's configuration as rendered into the bundle (ms-swift's YAML config), without the
    keys that only name this attempt; None for tasks that render none (``command``: its argv is
    the task itself)."""
    from reconciler.tasks.swift import CONFIG_PATH

    from reconciler.core.yamlsafe import fast_load

    # In a local run's workspace the job can rewrite this file: a bounded read, never through a
    # link, and the loader that bounds alias expansion (no "billion laughs").
    data = read_plain(root / CONFIG_PATH, 1 << 20)
    if data is None:
        return None
    try:
        cfg = fast_load(data.decode("utf-8"))
    except Exception:  # noqa: BLE001 - any YAML, alias or decoding problem: unreadable
        return {"unreadable": CONFIG_PATH}
    if not isinstance(cfg, dict):
        return {"unreadable": CONFIG_PATH}
    return plain({k: v for k, v in cfg.items() if k not in CONFIG_INSTANCE_KEYS})


def runtime_env(root: Path) -> dict | None:
    """The plain environment the job starts with (``scripts/env.sh``: no secrets there, ever),
    without the variables set per machine or placement."""
    import shlex

    try:
        lines = (root / "scripts" / "env.sh").read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError):  # ValueError: not UTF-8
        return None
    env: dict[str, str] = {}
    for line in lines:
        if not line.startswith("export ") or "=" not in line:
            continue
        key, _, value = line[len("export "):].partition("=")
        if key in ENV_INSTANCE_KEYS:
            continue
        try:
            parts = shlex.split(value)
        except ValueError:
            parts = [value]
        env[key] = parts[0] if len(parts) == 1 else " ".join(parts)
    return env


def last_step(root: Path) -> dict | None:
    from reconciler.runtime.probe import _progress  # the probe's own reading of logging.jsonl

    # The probe's reading, here on the control plane: its numbers as the boundary takes them.
    return clean_progress(_progress(str(root)))


def build(root: Path, collected_at: float | None = None) -> dict:
    """The provenance manifest of a collected bundle folder (``job.json``, ``runtime/``, ``artifacts/``)."""
    root = Path(root)
    unreadable: dict[str, str] = {}

    def load(rel: str, required: bool = True) -> dict | None:
        value, why = read_json(root / rel)
        if why is not None and (required or (root / rel).exists() or (root / rel).is_symlink()):
            unreadable[rel] = why
        return value

    job = _obj(_obj(load("job.json")).get("payload"))
    precheck = load("artifacts/runtime-precheck.json", required=False)
    result = _obj(load("runtime/result.json", required=False))
    identity = job.get("identity") if isinstance(job.get("identity"), str) else None
    ident = parse(identity or root.name)
    inputs = job.get("inputs") if isinstance(job.get("inputs"), list) else []
    repro = {
        # The spec commit: the last commit that changed the spec file, as of the launch. Bundles
        # that record "repo_head" hold it as "spec_commit"; older ones as "spec_source_commit",
        # their "spec_commit" being HEAD at launch (run.repo_head below), never used here: a bundle
        # without the spec commit says so with None rather than pass HEAD off.
        "spec": {"digest": job.get("spec_digest"), "commit": _spec_commit(job)},
        "template": job.get("template"),
        "image": job.get("image"),
        "task": job.get("task"),
        "config": resolved_config(root),
        "runtime_env": runtime_env(root),
        "code": job.get("code"),
        "inputs": [{k: i.get(k) for k in INPUT_KEYS if k in i} for i in inputs if isinstance(i, dict)],
        "environment": environment(precheck),
    }
    started = _read_ts(root / "runtime" / "started_at")
    launched = _read_ts(root / "runtime" / "launched_at")
    plat = _obj(_obj(precheck).get("platform"))
    run = {
        "identity": identity or root.name,
        "name": job.get("name"),
        "generation": ident.generation if ident else None,
        "attempt": ident.attempt if ident else None,
        # HEAD at launch: information only, moves with status commits.
        "repo_head": job.get("repo_head") if "repo_head" in job else job.get("spec_commit"),
        "machine": job.get("machine"),
        "backend": job.get("backend"),
        "hostname": plat.get("hostname"),
        "platform": plat.get("platform"),
        "python_executable": _obj(_obj(precheck).get("python")).get("executable"),
        "gpus_assigned": job.get("gpus") if isinstance(job.get("gpus"), list) else [],
        "gpu_inventory": gpu_inventory(root / "artifacts" / "nvml-audit.jsonl"),
        "timestamps": {"launched_at": _iso(launched), "started_at": _iso(started),
                       "finished_at": (result.get("finished_at") if isinstance(result.get("finished_at"), str)
                                       else None) or _iso(result.get("finished_ts")),
                       "collected_at": _iso(collected_at if collected_at is not None else time.time())},
        "result": {"state": result.get("state"), "exit_code": result.get("exit_code")},
        "resumed_from": job.get("resume_from"),
        "precheck": ({"ok": precheck.get("ok"), "reason": precheck.get("reason"),
                      "duration_s": precheck.get("duration_s")} if isinstance(precheck, dict) else None),
        "last_step": last_step(root),
        "bundle_digest": bundles.digest(root) if (root / "job.json").is_file() else None,
        "artifacts": bundles.manifest(root)["artifacts"],
    }
    if unreadable:
        run["unreadable"] = unreadable  # the files whose fields are left out, and why
    _outputs(root, job, repro, run, load)
    return {"schema": SCHEMA, "reproducibility_digest": canonical_digest(repro), "reproducibility": repro,
            "run": run}


def _outputs(root: Path, job: dict, repro: dict, run: dict, load) -> None:
    """A run with a Storage: its outputs' URIs and checksums (and the checkpoint it was pinned to,
    part of what it is made of)."""
    if "storage" not in job:
        return
    from . import storage

    run["outputs"] = storage.provenance_outputs(job, load("scripts/storage.json", required=False),
                                                load("runtime/uploads.json", required=False))
    if run["outputs"] and run["outputs"]["pinned"]:
        repro["start_from"] = run["outputs"]["pinned"]


def summary(manifest: dict) -> dict:
    """The few fields that go into status.provenance (the full manifest stays with the artifacts)."""
    repro, run = manifest.get("reproducibility") or {}, manifest.get("run") or {}
    env = repro.get("environment") or {}
    code = repro.get("code") or {}
    inv = run.get("gpu_inventory") or {}
    out = {
        "manifest": "artifacts/manifest.json",
        "reproducibility_digest": manifest.get("reproducibility_digest"),
        "spec_commit": (repro.get("spec") or {}).get("commit"),
        "code": f"{code.get('repo')}@{code.get('commit')}" if code else None,
        "inputs": len(repro.get("inputs") or []),
        "swift": ((env.get("swift") or {}).get("version")) if env else None,
        "torch": ((env.get("torch") or {}).get("version")) if env else None,
        "gpus": (", ".join(d.get("name") or "?" for d in inv.get("devices") or []) if inv.get("available")
                 else f"none ({inv.get('reason')})"),
        "artifacts": len(run.get("artifacts") or []),
    }
    return {k: v for k, v in out.items() if v is not None}


def write(root: Path, collected_at: float | None = None, collection: dict | None = None) -> dict:
    """Write artifacts/manifest.json; ``collection`` says what the collection left out (links,
    FIFOs, what was over the limits), when it left anything out."""
    manifest = build(root, collected_at)
    if collection:
        manifest["collection"] = collection
    path = Path(root) / "artifacts" / "manifest.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(".manifest.json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)
    return manifest


# ---------------------------------------------------------------- diff


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys → scalar values; lists of records with a 'path' (inputs, artifacts) are keyed by it."""
    out: dict[str, Any] = {}
    if isinstance(value, dict):
        if not value and prefix:
            out[prefix] = {}
        for k in sorted(value):
            out.update(flatten(value[k], f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(value, list):
        keyed = value and all(isinstance(v, dict) and ("path" in v or "name" in v) for v in value)
        if not value:
            out[prefix] = []
        for i, v in enumerate(value):
            key = (v.get("path") if "path" in v else v.get("name")) if keyed else i
            out.update(flatten(v, f"{prefix}[{key}]"))
    else:
        out[prefix] = value
    return out


def _comparable(manifest: dict, section: str) -> dict:
    """The part of a section --diff compares. Inputs are compared by content (a manifest written
    before schema /2 also records their size and file count, which add nothing to the hash)."""
    value = manifest.get(section) or {}
    if section == "reproducibility" and isinstance(value.get("inputs"), list):
        value = dict(value, inputs=[{k: i.get(k) for k in INPUT_KEYS if k in i} if isinstance(i, dict) else i
                                    for i in value["inputs"]])
    return value


def diff(a: dict, b: dict, section: str) -> list[tuple[str, Any, Any]]:
    fa, fb = flatten(_comparable(a, section), section), flatten(_comparable(b, section), section)
    missing = object()
    rows = []
    for key in sorted(set(fa) | set(fb)):
        if any(key == k or key.startswith(k + ".") or key.startswith(k + "[") for k in DIFF_IGNORED):
            continue
        va, vb = fa.get(key, missing), fb.get(key, missing)
        if va != vb:
            rows.append((key, None if va is missing else va, None if vb is missing else vb))
    return rows


def _short(v: Any) -> str:
    text = json.dumps(v, ensure_ascii=False, default=str) if not isinstance(v, str) else v
    return text if len(text) <= 80 else text[:77] + "..."


def diff_text(a: dict, b: dict, name_a: str, name_b: str) -> tuple[str, bool]:
    """Readable diff and whether the reproducibility halves differ."""
    lines = [f"--- {name_a}", f"+++ {name_b}"]
    if a.get("schema") != b.get("schema"):
        lines.append(f"note: {name_a} is {a.get('schema')}, {name_b} is {b.get('schema')}: "
                     "fields one of them does not record show as differing")
    repro = diff(a, b, "reproducibility")
    if repro:
        lines.append(f"reproducibility: {len(repro)} field(s) differ")
    else:
        lines.append(f"reproducibility: identical ({a.get('reproducibility_digest')})")
    for key, va, vb in repro:
        lines.append(f"  {key}: {_short(va)} -> {_short(vb)}")
    run = diff(a, b, "run")
    lines.append(f"run: {len(run)} field(s) differ" if run else "run: identical")
    for key, va, vb in run:
        lines.append(f"  {key}: {_short(va)} -> {_short(vb)}")
    return "\n".join(lines) + "\n", bool(repro)


# ---------------------------------------------------------------- command


def locate(cfg, name_or_identity: str) -> tuple[Path | None, str]:
    """The manifest of a run (its current attempt, from its status) or of an identity, on this host."""
    ident = name_or_identity
    if parse(name_or_identity) is None:
        st = load_one(cfg.repo / "status", name_or_identity)  # not every status file: just this run's
        if st is None or st.handle is None or not st.handle.identity:
            return None, f"no status with a launched instance for run {name_or_identity!r}"
        ident = st.handle.identity
    candidates = [Path(cfg.local_root) / ident, cfg.state_dir / "bundles" / ident]
    for c in candidates:
        if (c / "artifacts" / "manifest.json").is_file():
            return c / "artifacts" / "manifest.json", ident
    return None, (f"{ident} has no artifacts/manifest.json on this host (looked in "
                  + ", ".join(str(c) for c in candidates) + "); it is written when the run is collected")


def _read_manifest(cfg, name: str) -> tuple[dict | None, str]:
    path, ident = locate(cfg, name)
    if path is None:
        print(f"reconcile provenance: {ident}", file=sys.stderr)
        return None, ident
    manifest = _load_json(path)
    if not isinstance(manifest, dict):
        print(f"reconcile provenance: {path}: not a readable manifest (not JSON, or cut short)", file=sys.stderr)
        return None, ident
    return manifest, ident


def cmd_provenance(args, cfg) -> int:
    manifest, ident = _read_manifest(cfg, args.name)
    if manifest is None:
        return 1
    if not getattr(args, "diff", None):
        print(json.dumps(manifest, indent=2, sort_keys=True))
        return 0
    other, other_ident = _read_manifest(cfg, args.diff)
    if other is None:
        return 1
    from . import checkpoint_sums  # the checkpoints' manifest checksums, for information

    sums = [checkpoint_sums.sums(cfg.repo / "status", n) for n in (args.name, args.diff)]
    if getattr(args, "json", False):
        out = {section: [{"field": k, "a": va, "b": vb} for k, va, vb in diff(manifest, other, section)]
               for section in ("reproducibility", "run")}
        print(json.dumps({"a": ident, "b": other_ident, **out, "checkpoints": checkpoint_sums.diff(*sums)},
                         indent=2, sort_keys=True))
        return 1 if out["reproducibility"] else 0
    text, differs = diff_text(manifest, other, ident, other_ident)
    print(text + "".join(line + "\n" for line in checkpoint_sums.text(*sums)), end="")
    return 1 if differs else 0
