"""Bundles: a run's frozen, self-describing contract, built on the control plane.

A bundle holds everything a machine needs to run one identity and nothing that depends on the
machine: ``job.json`` (the envelope), ``inputs/`` (staged repository files), ``scripts/`` (the
rendered entrypoint, the launch wrapper, the GPU sampler and the precheck). Its digest is a hash of
those files' paths, modes and contents, so the same spec at the same commit gives the same digest.
``runtime/`` and ``artifacts/`` belong to the execution plane and are left out of the digest and of
the staging archive.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from . import codepin, shipped
from reconciler.core.boundary import BadReply, loads
from reconciler.core.errors import PermanentError
from .safetar import read_plain
from reconciler.spec.checks.inputs import input_problem, not_user_content
from reconciler.spec.resolve import Effective
from reconciler.tasks import RenderContext, env_lines, render

SCHEMA_VERSION = "v1"
CONTENT_DIRS = ("inputs", "scripts")


@dataclass
class BundleRequest:
    """What the planner decided about one launch, plus where the repository is."""

    repo_root: Path
    identity: str
    run: object  # spec.models.Run
    spec_digest: str
    repo_head: str | None  # HEAD at launch: information only (the reconciler's status commits move it)
    template: object  # spec.models.ExecutionTemplate
    effective: Effective
    machine: str
    gpus: list[int] = field(default_factory=list)
    python: str | None = None
    resume_from: str | None = None
    spec_commit: str | None = None  # the last commit that changed the spec file, as of the launch
    gang: dict | None = None  # {rank, of, machines}: this bundle is one node of a run on several machines
    storage: dict | None = None  # scripts/storage.json (artifacts/storage.py): outputs go to a Storage
    storage_name: str | None = None


@dataclass
class Bundle:
    path: Path

    @property
    def digest(self) -> str:
        """Computed on demand: it reads every staged file, and a launch does not need it."""
        return digest(self.path)


def built_digest(dest: Path) -> str | None:
    """The spec digest a bundle folder was built for (its job.json), or None when unreadable."""
    # A workspace's job.json can have been rewritten by its job: a bounded read of a regular file
    # (never a link or a FIFO), decoded by the boundary's parser, a digest only when it is text.
    data = read_plain(dest / "job.json", 16 << 20)
    try:
        job = loads(data) if data is not None else None
    except BadReply:
        return None
    payload = job.get("payload") if isinstance(job, dict) else None
    digest = payload.get("spec_digest") if isinstance(payload, dict) else None
    return digest if isinstance(digest, str) and 0 < len(digest) <= 200 and digest.isprintable() else None


def data_parallel_env(gpus: int, nodes: int = 1) -> dict[str, str]:
    """torchrun's settings for one process per GPU, which ms-swift reads (it starts torchrun only
    when NPROC_PER_NODE is set: without it, a 4-GPU run trains on one GPU) and a ``command`` task
    may pass on. On one machine MASTER_PORT is chosen free at launch (launch.sh), so two runs on
    one machine never share a rendezvous port. Across ``nodes`` machines NODE_RANK, MASTER_ADDR and
    MASTER_PORT are set per node when the nodes are known (at launch: runtime/launch.env, or
    launch.sh from Slurm's allocation). A run's own runtime_env wins."""
    if nodes > 1:
        return {"NPROC_PER_NODE": str(max(gpus, 1)), "NNODES": str(nodes)}
    if gpus <= 1:
        return {}
    return {"NPROC_PER_NODE": str(gpus), "NNODES": "1", "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1"}


def build(req: BundleRequest, dest: Path) -> Bundle:
    """Build into ``dest`` (atomically). An existing bundle for the identity is reused only when it
    was built for the same spec (an identity never names two spec contents). One built for another
    spec is rebuilt; if it has already run (its runtime/ holds files: a record whose status was
    lost), it is first moved aside as ``.<identity>.superseded-<digest>`` rather than destroyed."""
    if (dest / "job.json").is_file():
        old = built_digest(dest)
        if old == req.spec_digest:
            return Bundle(dest)
        if (dest / "runtime").is_dir() and any((dest / "runtime").iterdir()):
            aside = dest.with_name(f".{dest.name}.superseded-{(old or 'unknown').removeprefix('sha256:')[:12]}")
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(dest, aside)
    tmp = dest.with_name(f".{dest.name}.building")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "scripts").mkdir(parents=True)
    (tmp / "inputs").mkdir()
    (tmp / "artifacts").mkdir()
    run = req.run
    inputs = [_stage_input(req.repo_root, item, tmp / "inputs") for item in run.spec.inputs]
    code = None
    if run.spec.code is not None:
        try:
            code = codepin.stage(run.spec.code, tmp / "inputs" / run.spec.code.path)
        except Exception:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    rendered = render(run.spec.task, RenderContext(identity=req.identity, python=req.python,
                                                    resume_from=req.resume_from, gpus=req.gpus, bundle=tmp))
    _write(tmp / "scripts" / "entrypoint.sh", rendered.entrypoint.encode(), 0o755)
    own = {rel.rsplit("/", 1)[-1] for rel in rendered.files if rel.startswith("scripts/") and rel.count("/") == 1}
    shipped.place(tmp / "scripts", shipped.needed(rendered.helpers, storage=req.storage is not None), skip=own)
    for rel, content in sorted(rendered.files.items()):
        _write(tmp / rel, content, 0o644)
    res = req.effective.resources
    env = data_parallel_env(len(req.gpus) or res.gpu_count, res.nodes)
    if res.nodes > 1 and req.effective.placement == "slurm":
        # One bundle for every node: the wrapper on the first node starts a copy per node (srun).
        # (Nodes on fleet machines have a bundle each and learn their rank at launch.)
        env["RECONCILER_NODES"] = str(res.nodes)
    env.update(req.effective.runtime_env)
    env.update(rendered.env)
    # Under Slurm the job's GPUs are the scheduler's to choose: it sets CUDA_VISIBLE_DEVICES itself.
    if (req.gpus or res.gpu_count) and req.effective.placement != "slurm":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in req.gpus)
    if req.python:
        env["RECONCILER_PYTHON"] = req.python
    _write(tmp / "scripts" / "env.sh", ("# Plain environment for the job; secrets are never written here.\n"
                                        + env_lines(env)).encode(), 0o644)
    payload = {
        "identity": req.identity,
        "name": run.metadata.name,
        "labels": dict(run.metadata.labels),
        "spec_digest": req.spec_digest,
        "spec_commit": req.spec_commit,
        "repo_head": req.repo_head,
        "template": req.template.model_dump(mode="json"),
        "backend": req.effective.backend,
        "machine": req.machine,
        "resources": req.effective.resources.model_dump(mode="json"),
        "gpus": list(req.gpus),
        "image": req.effective.image if req.effective.launch_mode == "docker" else None,
        "task": run.spec.task.model_dump(mode="json"),
        "entrypoint": "scripts/entrypoint.sh",
        "inputs": inputs,
        "code": code,
        "env_names": sorted(env),
        "secret_names": sorted(run.spec.secrets),
        "resume_from": req.resume_from,
    }
    if req.gang:
        payload["gang"] = dict(req.gang)
    _storage(req, tmp, payload)
    _write(tmp / "job.json", (json.dumps({"schema_version": SCHEMA_VERSION, "payload": payload},
                                         indent=2, sort_keys=True) + "\n").encode(), 0o644)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():  # a half-built or foreign folder without job.json
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    return Bundle(dest)


def _storage(req: BundleRequest, tmp: Path, payload: dict) -> None:
    """A run with a Storage: where its outputs go, no secret (the machine's sync reads
    scripts/storage.json; provenance reads the payload's name and folder)."""
    if req.storage is None:
        return
    _write(tmp / "scripts" / "storage.json", (json.dumps(req.storage, indent=2, sort_keys=True) + "\n").encode(), 0o644)
    payload["storage"] = {"name": req.storage_name, "base": req.storage["base"]}


def _write(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.chmod(path, mode)


def _stage_input(repo: Path, item: str, inputs_dir: Path) -> dict:
    """Copy a repository file or folder under inputs/<same relative path>; return its record.

    A symbolic link is copied as what it points to only when that is user content of the
    repository: never outside it, never its root, .git/, .reconciler/ or status/ (a committed
    link must not ship the reconciler's state or its host's files to a machine), never a folder
    that holds the link (a loop). Anything else refuses the launch with the link's name."""
    problem = input_problem(repo, item)  # validation says the same; checked again at the launch
    if problem:
        raise PermanentError(problem)
    real_root = Path(repo).resolve()
    dst = inputs_dir / item
    dst.parent.mkdir(parents=True, exist_ok=True)
    _copy_input(real_root, real_root / item, dst, item, ())
    if dst.is_dir():
        sha, files, size = codepin.tree_digest(dst)
        return {"path": item, "kind": "dir", "files": files, "size": size, "sha256": sha}
    data = dst.read_bytes()
    return {"path": item, "kind": "file", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _copy_input(real_root: Path, src: Path, dst: Path, item: str, holding: tuple[Path, ...]) -> None:
    """Copy ``src`` (following links, within the rules of ``_stage_input``) to ``dst``."""
    where = src.relative_to(real_root) if src.is_relative_to(real_root) else src
    try:
        real = src.resolve(strict=True)
    except (OSError, RuntimeError):
        raise PermanentError(f"input '{item}': {where} is a broken or looping symlink") from None
    if not real.is_relative_to(real_root):
        raise PermanentError(f"input '{item}': {where} is a symlink that leaves the repository")
    into = not_user_content(real_root, real)
    if into:
        raise PermanentError(f"input '{item}': {where} is a symlink to {into}, which is not user content")
    mode = real.stat().st_mode
    if stat.S_ISDIR(mode):
        if real in holding:
            raise PermanentError(f"input '{item}': {where} is a symlink to a folder that holds it (a loop)")
        dst.mkdir(exist_ok=True)
        for name in sorted(os.listdir(real)):
            _copy_input(real_root, real / name, dst / name, item, holding + (real,))
    elif stat.S_ISREG(mode):
        shutil.copy2(real, dst)
    else:
        raise PermanentError(f"input '{item}': {where} is not a regular file or folder")


def _content_files(root: Path) -> list[Path]:
    out = [root / "job.json"] if (root / "job.json").exists() else []
    real_root = Path(root).resolve()
    for d in CONTENT_DIRS:
        out.extend(sorted(p for p in (root / d).rglob("*") if p.is_file() and _within(real_root, p)))
    return out


def _within(real_root: Path, p: Path) -> bool:
    """A file of the bundle, or a link to one. A link out of it (in a pinned repository's checkout,
    say) is never read: its target would be shipped to the machine."""
    return not p.is_symlink() or p.resolve().is_relative_to(real_root)


def digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in _content_files(root):
        rel = p.relative_to(root).as_posix()
        mode = "x" if os.access(p, os.X_OK) else "-"
        h.update(f"{rel}\0{mode}\0".encode() + hashlib.sha256(p.read_bytes()).digest())
    return "sha256:" + h.hexdigest()


def archive(root: Path) -> bytes:
    """A deterministic tar.gz of the bundle's content, without runtime/ and artifacts/."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6, format=tarfile.PAX_FORMAT) as tar:
        for p in _content_files(root):
            info = tarfile.TarInfo(p.relative_to(root).as_posix())
            data = p.read_bytes()
            info.size = len(data)
            info.mode = 0o755 if os.access(p, os.X_OK) else 0o644
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def manifest(root: Path) -> dict:
    """Every artifact with its size and hash (artifacts/manifest.json itself excluded)."""
    arts = root / "artifacts"
    items = []
    if arts.is_dir():
        for p in sorted(arts.rglob("*")):
            if p.is_file() and not p.is_symlink() and p.name != "manifest.json":
                h = hashlib.sha256()
                with open(p, "rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        h.update(chunk)
                items.append({"path": p.relative_to(root).as_posix(), "size": p.stat().st_size,
                              "sha256": h.hexdigest()})
    return {"artifacts": items}
