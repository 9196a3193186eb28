"""Resuming a run from object storage: the ``fetch`` half of storage_sync.py.

Before the job starts, the newest complete checkpoint of the run's generation (or the one the
control plane pinned) is downloaded into ``inputs/.reconciler/resume/checkpoint-N``, where the
task already resumes from, and verified file by file against its manifest. The bucket is not
trusted: names, paths, sizes and counts are validated before anything is written. Standard
library only, shipped beside storage_sync.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time

try:
    from .storage_common import (BASE, CKPT, MAX_FILES, MAX_MANIFEST, MAX_PATH, MAX_SIZE, REMOTE, RESUME_DIR, SHA, Failure,
                                 _is_int, _one_line, _sha256, _walk_files, new_state, refuse, write_uploads)
except ImportError:  # run as a program: scripts/ is on sys.path
    from storage_common import (BASE, CKPT, MAX_FILES, MAX_MANIFEST, MAX_PATH, MAX_SIZE, REMOTE, RESUME_DIR, SHA, Failure,
                                _is_int, _one_line, _sha256, _walk_files, new_state, refuse, write_uploads)


def _safe_rel(p):
    if not isinstance(p, str) or not 0 < len(p) <= MAX_PATH or p.startswith("/") or "\\" in p:
        return False
    parts = p.split("/")
    return all(x not in ("", ".", "..") and "\0" not in x and "\n" not in x and len(x) <= 255 for x in parts)


def parse_manifest(data, name):
    """A manifest object from the bucket, validated whole, or Failure."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        raise Failure(f"{name}: the manifest is not JSON") from None
    files = doc.get("files") if isinstance(doc, dict) else None
    if not (isinstance(doc, dict) and doc.get("schema_version") == 1 and doc.get("checkpoint") == name
            and _is_int(doc.get("step")) and doc["step"] == int(CKPT.match(name).group(1))
            and isinstance(files, list) and len(files) <= MAX_FILES):
        raise Failure(f"{name}: the manifest does not describe {name}")
    seen = set()
    for f in files:
        ok = (isinstance(f, dict) and _safe_rel(f.get("path")) and _is_int(f.get("size"), 0, MAX_SIZE)
              and isinstance(f.get("sha256"), str) and SHA.match(f["sha256"]))
        if not ok or f["path"] in seen:
            raise Failure(f"{name}: the manifest lists a bad or repeated file")
        seen.add(f["path"])
    for p in seen:  # a file that is also another's folder could never be written
        if any(q.startswith(p + "/") for q in seen):
            raise Failure(f"{name}: the manifest lists {p[:100]} as a file and a folder")
    return doc


def verify(folder, doc):
    """Every file of the manifest, with its size and sha256, and nothing else."""
    want = {f["path"]: f for f in doc["files"]}
    have = set(_walk_files(folder))
    if have != set(want):
        raise Failure(f"{doc['checkpoint']}: {len(set(want) - have)} file(s) missing, {len(have - set(want))} extra")
    for rel, f in want.items():
        digest, size = _sha256(os.path.join(folder, rel), f["size"])
        if size != f["size"] or digest != f["sha256"]:
            raise Failure(f"{doc['checkpoint']}: {rel[:100]} does not match its manifest (size or sha256)")


def pinned_source(pin):
    """The folder of a pinned checkpoint: ``store:<path>/checkpoint-N``, possibly another run's
    (``reconcile reproduce``), as plain path components; Failure otherwise."""
    uri, name = pin.get("uri"), pin.get("checkpoint")
    path = uri[len(REMOTE) + 1:] if isinstance(uri, str) and uri.startswith(REMOTE + ":") else None
    if (path is None or not isinstance(name, str) or not CKPT.match(name) or not BASE.match(path)
            or ".." in path.split("/") or path.startswith("/") or path.rsplit("/", 1)[-1] != name):
        raise Failure("the pinned checkpoint's URI is not a checkpoint folder of the store")
    return uri


def take(rc, ws, name, expect_sha=None, src=None):
    """Download checkpoint ``name`` (from ``src``, a folder URI, or this run's own) into
    inputs/.reconciler/resume/ and verify it; Failure, with nothing left behind, when it is not
    exactly what its manifest says."""
    src = src or rc.uri(f"checkpoints/{name}")
    data = rc.run(["cat", src + ".json"], MAX_MANIFEST, timeout=300)
    digest = hashlib.sha256(data).hexdigest()
    if expect_sha is not None and digest != expect_sha:
        raise Failure(f"{name}: the manifest in the bucket is not the pinned one (sha256 {digest[:12]})")
    doc = parse_manifest(data, name)
    root = os.path.join(ws, RESUME_DIR)
    tmp = os.path.join(root, f".{name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        listing = "".join(f["path"] + "\n" for f in doc["files"]).encode()
        with tempfile.NamedTemporaryFile(dir=root, prefix=".files-") as lf:
            lf.write(listing)
            lf.flush()
            rc.run(["copy", "--checksum", "--files-from-raw", lf.name, "--no-traverse"] + rc.bw + [src, tmp])
        verify(tmp, doc)
    except Failure:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    dest = os.path.join(root, name)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    latest = os.path.join(root, "latest")
    if os.path.islink(latest) or os.path.exists(latest):
        os.remove(latest)
    os.symlink(name, latest)  # a stable name for a resume the control plane could not name
    return {"name": name, "uri": src, "manifest_sha256": digest}


def _listed(rc, tries=3):
    """The complete checkpoints in the bucket; a listing that fails is not an empty bucket."""
    for i in range(tries):
        try:
            return rc.manifests()
        except Failure as e:
            last = e
            time.sleep(min(2 ** i, 5))
    raise last


def fetch(ws, cfg, rc):
    """Resume from the pinned checkpoint, else the newest complete one that verifies; none in
    the bucket: start fresh. 0 to start the job; non-zero (result.json written) to refuse."""
    state = new_state(rc, cfg)
    pin = cfg.get("pinned")
    os.makedirs(os.path.join(ws, RESUME_DIR), exist_ok=True)
    if pin:
        try:
            state["resumed_from"] = take(rc, ws, pin["checkpoint"], pin["manifest_sha256"], pinned_source(pin))
        except Failure as e:
            state["error"] = str(e)
            write_uploads(ws, state)
            return refuse(ws, 3, f"refusing to start: pinned checkpoint {e}")
    elif cfg["resume"]:
        try:
            found = _listed(rc)
        except Failure as e:
            state["error"] = str(e)
            write_uploads(ws, state)
            return refuse(ws, 75, f"cannot list the checkpoints to resume from: {e}")
        for step in sorted(found, reverse=True):
            try:
                state["resumed_from"] = take(rc, ws, found[step])
                break
            except Failure as e:
                state["error"] = _one_line(f"skipped {found[step]}: {e}")
                print(f"storage_sync: {state['error']}", file=sys.stderr)
    write_uploads(ws, state)
    return 0
