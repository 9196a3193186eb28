"""``reconcile artifacts NAME``: what a run has put in its Storage, read from the bucket itself.

The status file says where a run's outputs are; the bucket says what is there. So the listing is
taken from the bucket (rclone on the reconciler host, with the Storage's credentials from this
host's environment), never from the status alone: a checkpoint whose manifest was changed or
removed since the run recorded it shows as such. The bucket is written by machines, which are
untrusted: every name in the listing must be made of plain components (anything else is counted
as skipped and never fetched), every size is a bounded integer, a checkpoint manifest is read
with a size bound and parsed at the trust boundary.

``--get PATH`` fetches one object or folder under the run's base (``<bucket>/<prefix>/<repo id>/
<run>/g<generation>``), only under it: PATH is refused when absolute, with ``..`` or anything
but plain components. Only the objects of the listing are fetched (an object that appears since
is not), into a fresh folder beside the destination that is checked (plain files and folders
only) and then renamed into place; an existing destination is never overwritten.

A run without a Storage keeps its outputs on the reconciler host (``.reconciler/checkpoints/`` for
rentals' checkpoints, the collected bundle's ``artifacts/``): the command lists those and says so.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from difflib import get_close_matches
from pathlib import Path
from typing import Any

from reconciler.core.boundary import BadReply, bounded_int, clean_text, loads
from reconciler.core.relpaths import plain_path_problem
from reconciler.core.errors import PermanentError, ReconcilerError, TemporaryError, UsageError
from reconciler.status import store as statuses

from .common import _cfg, no_such_run, status_names

MAX_PARTS = 32
CHECKPOINT = re.compile(r"checkpoint-([0-9]{1,12})")
SHA256 = re.compile(r"[0-9a-f]{64}")
MANIFEST_FILES = 100_000
SKIPPED_SHOWN = 5


def path_problem(rel: Any) -> str | None:
    """Why ``rel`` is not a plain path under a run's base (relative, no '.' or '..', printable
    plain names), or None."""
    return plain_path_problem(rel, 4096, MAX_PARTS, "plain names (letters, digits and ._+=@-)")


@dataclass
class Outputs:
    """Where one run's outputs are: its Storage, the base folder (without the remote) and the
    status's record of them."""

    storage: Any
    base: str
    recorded: dict = field(default_factory=dict)

    @property
    def uri(self) -> str:
        from reconciler.artifacts.storage import status_uri

        return status_uri(self.storage, self.base)

    def recorded_checkpoints(self) -> dict[str, dict]:
        listed = self.recorded.get("checkpoints")
        return {c["name"]: c for c in listed if isinstance(c, dict) and isinstance(c.get("name"), str)} \
            if isinstance(listed, list) else {}


def secrets(name: str) -> str | None:
    """A Storage's credentials are resolved where the engine resolves run secrets: this host's
    environment."""
    return os.environ.get(name)


def outputs_of(cfg, name: str) -> tuple[Any, Outputs | None]:
    """The run's status and its Outputs (None: the run has no Storage). A status that names a
    Storage this repository does not define, or a URI outside it, is an error."""
    from reconciler.artifacts.checkpoint_sums import recorded_outputs
    from reconciler.artifacts.storage import run_base
    from reconciler.spec.load import load_tree

    st = statuses.load_one(cfg.repo / "status", name)
    if st is None:
        raise no_such_run(name, status_names(cfg))
    rec = recorded_outputs(st)
    if not isinstance(rec, dict) or not rec.get("storage"):
        return st, None
    storages = load_tree(cfg.repo).storages
    storage = storages.get(rec["storage"])
    if storage is None:
        raise PermanentError(f"run {name}: its outputs are in Storage {clean_text(rec['storage'], 80)!r}, "
                             f"which is not defined (or not valid) in this repository")
    # The base is computed, as the engine computes it, not taken from the status file (anyone who
    # can push may edit one): a URI that is not this run's own folder is refused.
    out = Outputs(storage, run_base(storage, cfg.repo_namespace, name, st.generation), rec)
    if rec.get("uri") != out.uri:
        raise PermanentError(f"run {name}: status outputs.uri {clean_text(rec.get('uri'), 200)!r} is not its folder "
                             f"{out.uri}")
    return st, out


def _size(entry: dict) -> int:
    return bounded_int(entry.get("size"), 0, 2 ** 62) or 0


def _place(rel: str) -> tuple[str, str | None]:
    """What an object is: ("checkpoint", name), ("manifest", name), ("attempt", "aN") or ("other", None)."""
    parts = rel.split("/")
    if parts[0] == "checkpoints" and len(parts) >= 2:
        if len(parts) == 2 and parts[1].endswith(".json") and CHECKPOINT.fullmatch(parts[1][:-5]):
            return "manifest", parts[1][:-5]
        if len(parts) >= 3 and CHECKPOINT.fullmatch(parts[1]):
            return "checkpoint", parts[1]
    if len(parts) >= 2 and re.fullmatch(r"a[0-9]{1,6}", parts[0]):
        return "attempt", parts[0]
    return "other", None


def _step(name: str) -> int:
    return int(name.split("-", 1)[1])


def read_manifest(out: Outputs, name: str, listed: dict[str, int]) -> dict:
    """A checkpoint's manifest, read from the bucket now: {sha256, step, uploaded_at, problems}.
    ``listed`` (path → size) is the base's listing the manifest's files are checked against."""
    from reconciler.artifacts.storage import read_object

    info: dict[str, Any] = {"sha256": None, "step": None, "uploaded_at": None, "problems": []}
    rel = f"checkpoints/{name}.json"
    if rel not in listed:
        info["problems"].append(f"no manifest {rel} (an upload not finished, or removed)")
        return info
    data = read_object(out.storage, secrets, f"{out.base}/{rel}")
    info["sha256"] = hashlib.sha256(data).hexdigest()
    try:
        doc = loads(data, 4 << 20)
    except BadReply as e:
        info["problems"].append(f"{rel}: {e}")
        return info
    if not isinstance(doc, dict) or doc.get("checkpoint") != name:
        info["problems"].append(f"{rel}: not the manifest of {name}")
        return info
    info["step"] = bounded_int(doc.get("step"), 0, 10 ** 15)
    info["uploaded_at"] = _when(doc.get("uploaded_at"))
    info["problems"] += manifest_file_problems(doc.get("files"), name, listed)
    return info


def _when(value: Any) -> str | None:
    """A manifest's time: unix seconds (as the machine writes it) or ISO text, shown as ISO."""
    from reconciler.core.boundary import MAX_TIME, finite
    from reconciler.core.runstatus import iso

    seconds = finite(value, MAX_TIME)
    if seconds is not None and seconds >= 0:
        return iso(seconds)
    return clean_text(value, 40) or None


def manifest_file_problems(files: Any, name: str, listed: dict[str, int]) -> list[str]:
    """Each file a checkpoint manifest lists must be in the bucket with the size it says."""
    if not isinstance(files, list) or len(files) > MANIFEST_FILES:
        return ["its file list is not a list of at most %d entries" % MANIFEST_FILES]
    problems = []
    for f in files:
        path = f.get("path") if isinstance(f, dict) else None
        size = bounded_int(f.get("size"), 0, 2 ** 62) if isinstance(f, dict) else None
        sha = f.get("sha256") if isinstance(f, dict) else None
        if path_problem(path) or size is None or not isinstance(sha, str) or not SHA256.fullmatch(sha):
            problems.append(f"a file entry is malformed: {clean_text(repr(f), 120)}")
        elif listed.get(f"checkpoints/{name}/{path}") != size:
            problems.append(f"{path}: listed with {size} bytes, but the bucket has "
                            + ("no such object" if f"checkpoints/{name}/{path}" not in listed
                               else f"{listed[f'checkpoints/{name}/{path}']} bytes"))
        if len(problems) >= 5:
            break
    return problems


def listing(out: Outputs) -> tuple[dict[str, int], list[str]]:
    """The base's objects (plain relative path → size) and the names skipped as not plain."""
    from reconciler.artifacts.storage import list_objects

    good: dict[str, int] = {}
    skipped: list[str] = []
    for e in list_objects(out.storage, secrets, out.base):
        if e.get("is_dir"):
            continue
        rel = e["path"]
        if path_problem(rel) is None:
            good[rel] = _size(e)
        else:
            skipped.append(clean_text(rel, 200) or "?")
    return good, skipped


def inventory(out: Outputs) -> dict:
    """The run's outputs as the bucket has them, as the command's JSON."""
    objects, skipped = listing(out)
    ckpts: dict[str, dict] = {}
    attempts: dict[str, dict] = {}
    other = []
    for rel, size in sorted(objects.items()):
        kind, key = _place(rel)
        if kind in ("checkpoint", "manifest"):
            c = ckpts.setdefault(key, {"name": key, "files": 0, "bytes": 0})
            if kind == "checkpoint":
                c["files"] += 1
                c["bytes"] += size
        elif kind == "attempt":
            a = attempts.setdefault(key, {"attempt": int(key[1:]), "files": 0, "bytes": 0, "objects": []})
            a["files"] += 1
            a["bytes"] += size
            a["objects"].append({"path": rel, "size": size})
        else:
            other.append({"path": rel, "size": size})
    recorded = out.recorded_checkpoints()
    for name, c in ckpts.items():
        m = read_manifest(out, name, objects)
        rec = recorded.get(name, {}).get("manifest_sha256")
        if rec and m["sha256"] and rec != m["sha256"]:
            m["problems"].insert(0, f"its manifest's sha256 is {m['sha256']}, the run recorded {rec}: changed "
                                    "in the bucket since it was uploaded")
        c.update(step=m["step"], uploaded_at=m["uploaded_at"], manifest_sha256=m["sha256"],
                 recorded_sha256=rec if isinstance(rec, str) else None, problems=m["problems"],
                 uri=f"{out.uri}/checkpoints/{name}")
    return {"source": "storage", "storage": out.storage.metadata.name, "uri": out.uri,
            "checkpoints": sorted(ckpts.values(), key=lambda c: _step(c["name"]), reverse=True),
            "attempts": sorted(attempts.values(), key=lambda a: a["attempt"]),
            "other": other, "skipped": skipped, "error": clean_text(out.recorded.get("error"), 300) or None}


# ---------------------------------------------------------------- --get


def fetch(out: Outputs, rel: str, to: Path) -> dict:
    """Fetch the object or folder ``rel`` of the run's base into ``to``/<its last name>."""
    from reconciler.artifacts.storage import fetch_objects

    rel = rel.rstrip("/") or rel  # a folder may be named with its trailing '/'
    why = path_problem(rel)
    if why:
        raise UsageError(f"--get {rel!r}: {why}; give a path under the run's base {out.uri}")
    objects, skipped = listing(out)
    chosen = {p: s for p, s in objects.items() if p == rel or p.startswith(rel + "/")}
    bad = [s for s in skipped if s == rel or s.startswith(rel + "/")]
    if bad:
        raise PermanentError(f"--get {rel}: the bucket holds names that are not plain under it "
                             f"({bad[0]!r}...): refusing to fetch")
    if not chosen:
        close = get_close_matches(rel, sorted({*objects, *_folders(objects)}), n=1, cutoff=0.6)
        raise UsageError(f"no object or folder {rel!r} under {out.uri}"
                         + (f" (did you mean {close[0]!r}?)" if close else ""))
    parent, _, last = rel.rpartition("/")
    dest = to / last
    if dest.exists() or dest.is_symlink():
        raise UsageError(f"{dest}: already exists; not overwriting it")
    to.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".reconcile-get-", dir=to))
    try:
        src = f"{out.base}/{parent}" if parent else out.base
        strip = len(parent) + 1 if parent else 0
        fetch_objects(out.storage, secrets, src, [p[strip:] for p in sorted(chosen)], str(tmp),
                      sum(chosen.values()))
        _check_tree(tmp, {p[strip:]: s for p, s in chosen.items()})
        _place_new(tmp / last, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"path": rel, "to": str(dest), "files": len(chosen), "bytes": sum(chosen.values())}


def _place_new(src: Path, dest: Path) -> None:
    """Move ``src`` to ``dest``, which must not exist: never over a file or folder that appeared
    since the check (a file is linked, which fails on an existing name; a folder's name is first
    claimed with mkdir, which fails likewise, and the empty folder then replaced)."""
    try:
        if src.is_dir():
            dest.mkdir()
            os.rename(src, dest)
        else:
            os.link(src, dest)
    except FileExistsError:
        raise UsageError(f"{dest}: already exists; not overwriting it") from None


def _folders(objects: dict[str, int]) -> set[str]:
    return {p.rsplit("/", i)[0] for p in objects for i in range(1, p.count("/") + 1)}


def _check_tree(root: Path, wanted: dict[str, int]) -> None:
    """What rclone wrote: exactly the objects asked for, as plain files of the listed sizes."""
    found: dict[str, int] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            st = p.lstat()
            if p.is_symlink() or not (p.is_dir() or p.is_file()):
                raise TemporaryError(f"the fetch left something that is not a plain file or folder: {n!r}")
            if p.is_file():
                found[str(p.relative_to(root))] = st.st_size
    if found != wanted:
        missing = sorted(set(wanted) - set(found))
        differ = sorted(k for k in set(wanted) & set(found) if wanted[k] != found[k])
        raise TemporaryError("the fetch did not bring what the listing holds"
                             + (f"; missing {missing[0]}" if missing else "")
                             + (f"; {differ[0]} changed size" if differ else ""))


# ---------------------------------------------------------------- a run without a Storage


def _tree(root: Path) -> tuple[int, int]:
    """Files and bytes under ``root``, links neither followed nor counted."""
    files = size = 0
    for dirpath, _dirs, filenames in os.walk(root, followlinks=False):
        for n in filenames:
            st = (Path(dirpath) / n).lstat()
            if not (Path(dirpath) / n).is_symlink():
                files, size = files + 1, size + st.st_size
    return files, size


def vm_store(cfg, name: str, st) -> dict:
    """What the reconciler host keeps of a run without a Storage: rentals' checkpoint copies and
    the collected artifacts of its current attempt."""
    from reconciler.rentals.checkpoints import root as ckpt_root

    ckpts = []
    base = ckpt_root(cfg.state_dir) / name
    for gen in sorted(base.glob("g*")) if base.is_dir() and not base.is_symlink() else []:
        for c in sorted(gen.glob("checkpoint-*")):
            if c.is_dir() and not c.is_symlink() and CHECKPOINT.fullmatch(c.name):
                files, size = _tree(c)
                ckpts.append({"name": c.name, "generation": gen.name, "path": str(c), "files": files, "bytes": size})
    ckpts.sort(key=lambda c: _step(c["name"]), reverse=True)
    attempts = []
    ident = st.handle.identity if st.handle is not None else None
    for root in ([Path(cfg.local_root) / ident, cfg.state_dir / "bundles" / ident] if ident else []):
        art = root / "artifacts"
        if art.is_dir() and not art.is_symlink():
            files, size = _tree(art)
            attempts.append({"identity": ident, "path": str(art), "files": files, "bytes": size})
            break
    return {"source": "vm", "storage": None, "uri": None, "checkpoints": ckpts, "attempts": attempts,
            "other": [], "skipped": [], "error": None}


# ---------------------------------------------------------------- the command


def _redact(text: str, out: Outputs | None) -> str:
    """Whatever an error carries, never a credential's value."""
    if out is not None:
        for secret in out.storage.spec.credentials.values():
            value = secrets(secret)
            if value:
                text = text.replace(value, "***")
    return text


def cmd_artifacts(args: argparse.Namespace) -> int:
    cfg = _cfg(args)
    st, out = outputs_of(cfg, args.name)
    try:
        return _artifacts(args, cfg, st, out)
    except ReconcilerError as e:
        raise type(e)(_redact(str(e), out)) from None


def _artifacts(args: argparse.Namespace, cfg, st, out: Outputs | None) -> int:
    if out is None:
        if args.get:
            raise UsageError(f"run {args.name} has no Storage (spec.outputs.storage): its outputs are on the "
                             f"reconciler host; run 'reconcile artifacts {args.name}' for their paths")
        doc = vm_store(cfg, args.name, st)
    elif args.get:
        got = fetch(out, args.get, Path(args.to or "."))
        if args.json:
            print(json.dumps({"name": args.name, "uri": out.uri, "fetched": got}, indent=2, sort_keys=True))
        else:
            print(f"fetched {got['path']} ({got['files']} file(s), {got['bytes']} bytes) to {got['to']}")
        return 0
    else:
        doc = inventory(out)
    doc = {"name": args.name, **doc}
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(render(doc), end="")
    return 1 if any(c.get("problems") for c in doc["checkpoints"]) else 0


def render(doc: dict) -> str:
    lines = []
    if doc["source"] == "vm":
        lines.append(f"{doc['name']} has no Storage (spec.outputs.storage): its outputs are kept on the "
                     "reconciler host (the VM store)")
    else:
        lines.append(f"{doc['name']}: outputs in Storage {doc['storage']} at {doc['uri']}")
    rows = [("CHECKPOINT", "STEP", "FILES", "BYTES", "MANIFEST SHA256" if doc["source"] == "storage" else "PATH")]
    for c in doc["checkpoints"]:
        where = (c.get("manifest_sha256") or "-") if doc["source"] == "storage" else c["path"]
        step = c.get("step") if c.get("step") is not None else _step(c["name"])
        rows.append((c["name"], str(step), str(c["files"]), str(c["bytes"]), where))
    lines += _table(rows) if len(rows) > 1 else ["no checkpoints"]
    for c in doc["checkpoints"]:
        for p in c.get("problems") or ():
            lines.append(f"  {c['name']}: {p}")
    rows = [("ATTEMPT", "FILES", "BYTES", "WHERE")]
    for a in doc["attempts"]:
        label = f"a{a['attempt']}" if "attempt" in a else a["identity"]
        rows.append((label, str(a["files"]), str(a["bytes"]), f"{doc['uri']}/a{a['attempt']}" if doc["uri"]
                     else a["path"]))
    lines += _table(rows) if len(rows) > 1 else ["no artifacts"]
    if doc["other"]:
        lines.append(f"{len(doc['other'])} other object(s) under the base")
    if doc["error"]:
        lines.append(f"the machine's last upload error (status outputs.error): {doc['error']}")
    if doc["skipped"]:
        lines.append(f"{len(doc['skipped'])} object(s) with names that are not plain, skipped: "
                     + ", ".join(repr(s) for s in doc["skipped"][:SKIPPED_SHOWN]))
    return "\n".join(lines) + "\n"


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return [("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1]).rstrip() for r in rows]
