"""Moves a run's checkpoints and outputs from its machine straight to object storage.

A 70B checkpoint is 140 GB: it must never pass through the reconciler host. So the machine itself
uploads, with rclone, to the run's Storage (docs/storage.md, "On the machine"), and tells the
control plane what it did in ``runtime/uploads.json``, a small file the probe can read.

    python3 scripts/storage_sync.py fetch   before the job: resume from the newest complete checkpoint
    python3 scripts/storage_sync.py watch   beside the job: upload checkpoints and artifacts

Both read ``scripts/storage.json`` (no secrets) and the remote's configuration as
``RCLONE_CONFIG_STORE_*`` lines on stdin (the launch wrapper passes runtime/storage.env, which it
deleted). A checkpoint is complete in the bucket only once its manifest object is there (uploaded
last, deleted first); everything read from the bucket or from the job's files is bounded and
validated, since neither is trusted. Standard library only: it runs with the machine's python3.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time

try:
    from . import storage_fetch
    from .storage_common import (CKPT, MAX_ENV, MAX_PATH, Failure, Rclone, _now, _one_line, _sha256, _walk_files,
                                 load_config, new_state, parse_env, refuse, write_uploads)
except ImportError:  # run as a program: scripts/ is on sys.path
    import storage_fetch
    from storage_common import (CKPT, MAX_ENV, MAX_PATH, Failure, Rclone, _now, _one_line, _sha256, _walk_files,
                                load_config, new_state, parse_env, refuse, write_uploads)


def local_checkpoints(ws):
    """Complete checkpoints under artifacts/output (the probe's rule: trainer_state.json is
    written last), one level of run folders deep: {step: (name, path)}."""
    base = os.path.join(ws, "artifacts", "output")
    found = {}
    for folder in [base] + sorted(e.path for e in _scan(base) if e.is_dir(follow_symlinks=False)):
        for e in _scan(folder):
            m = CKPT.match(e.name)
            if m and e.is_dir(follow_symlinks=False) and os.path.isfile(os.path.join(e.path, "trainer_state.json")):
                found[int(m.group(1))] = (e.name, e.path)
    return found


def _scan(path):
    try:
        return list(os.scandir(path))
    except OSError:
        return []


def _resumed_from(ws):
    """What ``fetch`` recorded in this workspace (our own file, still read as untrusted)."""
    try:
        with open(os.path.join(ws, "runtime", "uploads.json"), "rb") as fh:
            old = json.loads(fh.read(1 << 20).decode("utf-8"))
        rf = old.get("resumed_from")
        if isinstance(rf, dict) and isinstance(rf.get("name"), str) and CKPT.match(rf["name"]):
            return {k: str(rf.get(k, ""))[:MAX_PATH] for k in ("name", "uri", "manifest_sha256")}
    except (OSError, ValueError, RecursionError, AttributeError):
        pass
    return None


# ------------------------------------------------------------------ watch

def upload_checkpoint(rc, cfg, name, path):
    """The folder, then its manifest object: a checkpoint is complete in the bucket only once its
    manifest is there. Files are hashed while rclone uploads them (each file read once more by
    us, in parallel with the upload, instead of before it)."""
    files = _walk_files(path)
    hashes = {}

    def hash_all():
        for rel in files:
            try:
                hashes[rel] = _sha256(os.path.join(path, rel))
            except OSError as e:
                hashes[rel] = e

    t = threading.Thread(target=hash_all, daemon=True)
    t.start()
    try:
        rc.run(["copy", "--checksum", "--skip-links", "--no-traverse"] + rc.bw
               + [path, rc.uri(f"checkpoints/{name}")])
    finally:
        t.join()
    entries = []
    for rel in files:
        h = hashes.get(rel)
        if not isinstance(h, tuple):
            raise Failure(f"{name}/{rel} could not be read: {getattr(h, 'strerror', h)}")
        entries.append({"path": rel, "size": h[1], "sha256": h[0]})
    step = int(CKPT.match(name).group(1))
    doc = {"schema_version": 1, "checkpoint": name, "step": step, "files": entries,
           "uploaded_at": _now(), "attempt": cfg["attempt"]}
    data = json.dumps(doc, sort_keys=True).encode()
    rc.run(["rcat", rc.uri(f"checkpoints/{name}.json")], stdin=data)
    return {"name": name, "uri": rc.uri(f"checkpoints/{name}"), "manifest_sha256": hashlib.sha256(data).hexdigest(),
            "bytes": sum(e["size"] for e in entries), "files": len(entries), "uploaded_at": doc["uploaded_at"]}


def prune(rc, keep, busy=()):
    """Keep the newest ``keep`` complete checkpoints. Manifest first, then the folder: a
    checkpoint half deleted is a folder without manifest, which is never taken for one. Folders
    without manifest older than the newest complete one are uploads cut short: removed too."""
    complete, folders = rc.catalog()
    steps = sorted(complete, reverse=True)
    for step in steps[keep:]:
        rc.run(["deletefile", rc.uri(f"checkpoints/{complete[step]}.json")], timeout=300)
        rc.run(["purge", rc.uri(f"checkpoints/{complete[step]}")], timeout=3600)
    kept = {complete[s] for s in steps[:keep]}
    gone = set(complete.values()) - kept
    for name in folders:
        if name not in kept | gone | set(busy) and steps and int(CKPT.match(name).group(1)) < steps[0]:
            rc.run(["purge", rc.uri(f"checkpoints/{name}")], timeout=3600)
    return kept


def sync_artifacts(rc, ws, cfg, state, final):
    """Everything in artifacts/ but checkpoint folders, and the wrapper's log and result, to
    a<attempt>/. ``copy`` never deletes: what an earlier round uploaded stays."""
    dest = f"a{cfg['attempt']}"
    # While the job runs its logs grow under the copy, so the size and hash rclone checks after
    # an upload differ from the file's by then: not a failure, the next round copies it again.
    # The final round, after the job, checks both.
    growing = [] if final else ["--ignore-checksum", "--ignore-size"]
    rc.run(["copy", "--skip-links", "--exclude", "checkpoint-*/**"] + growing + rc.bw
           + [os.path.join(ws, "artifacts"), rc.uri(dest)])
    rc.run(["copy", "--skip-links", "--include", "/runtime.log", "--include", "/result.json"] + growing
           + [os.path.join(ws, "runtime"), rc.uri(f"{dest}/runtime")])
    state["artifacts"].update(uploaded_at=_now(), final=bool(final))


def one_round(rc, ws, cfg, state, final=False):
    """Upload the newest complete checkpoints not yet uploaded (older ones would only be pruned),
    prune, sync artifacts. A failure is recorded and the next round tries again."""
    keep = cfg["keep_checkpoints"]
    done = {c["name"] for c in state["checkpoints"]}
    errors = []
    try:
        local = local_checkpoints(ws)
        for step in sorted(local)[-keep:]:
            name, path = local[step]
            if name not in done:
                entry = upload_checkpoint(rc, cfg, name, path)
                state["checkpoints"] = [c for c in state["checkpoints"] if c["name"] != name] + [entry]
                done.add(name)
                write_uploads(ws, state)
        if state["checkpoints"]:
            kept = prune(rc, keep)
            state["checkpoints"] = [c for c in state["checkpoints"] if c["name"] in kept]
    except Failure as e:
        errors.append(str(e))
    try:
        sync_artifacts(rc, ws, cfg, state, final)
    except Failure as e:
        errors.append(str(e))
    state["error"] = _one_line("; ".join(errors)) if errors else None
    write_uploads(ws, state)


def _final_seconds():
    text = os.environ.get("RECONCILER_STORAGE_FINAL_SECONDS", "")
    return int(text) if text.isdigit() and 0 < len(text) <= 6 else 1800


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def watch(ws, cfg, rc, wrapper=None):
    """Rounds every interval_s until runtime/result.json appears, then a last, bounded round.
    ``wrapper``: the launch wrapper's pid; gone without a result, there is nothing to finish."""
    try:
        os.nice(10)  # the job comes first: uploading may wait, training should not
    except OSError:
        pass
    result = os.path.join(ws, "runtime", "result.json")
    state = new_state(rc, cfg, _resumed_from(ws))
    write_uploads(ws, state)
    while True:
        started = time.monotonic()
        if os.path.exists(result):
            break
        one_round(rc, ws, cfg, state)
        while time.monotonic() - started < cfg["interval_s"] and not os.path.exists(result):
            if wrapper and not _alive(wrapper) and not os.path.exists(result):
                return 1
            time.sleep(0.2)
    rc.deadline = time.monotonic() + _final_seconds()
    one_round(rc, ws, cfg, state, final=True)
    return 0 if state["error"] is None else 1


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 1 or argv[0] not in ("fetch", "watch"):
        print("usage: storage_sync.py fetch|watch [WORKSPACE [WRAPPER_PID]]  (remote configuration on stdin)",
              file=sys.stderr)
        return 2
    ws = os.path.abspath(argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    store_env = parse_env(sys.stdin.buffer.read(MAX_ENV + 1))
    try:
        cfg = load_config(ws)
    except (OSError, ValueError, UnicodeDecodeError, Failure) as e:
        if argv[0] == "fetch":
            return refuse(ws, 2, f"scripts/storage.json: {e}")
        print(f"storage_sync: nothing is uploaded: scripts/storage.json: {e}", file=sys.stderr)
        return 2
    rc = Rclone(ws, cfg, store_env)
    if argv[0] == "watch":
        pid = argv[2] if len(argv) > 2 else ""
        return watch(ws, cfg, rc, int(pid) if pid.isdigit() and len(pid) <= 9 else None)
    return storage_fetch.fetch(ws, cfg, rc)


if __name__ == "__main__":
    sys.exit(main())
