"""Checkpoints copied off rented machines while their runs train.

A rental can vanish with everything on it. So while a run trains on one, each new complete
checkpoint (its ``trainer_state.json`` is written last) is copied to the reconciler host's bundle
store, ``.reconciler/checkpoints/<run>/g<generation>/checkpoint-N``: only the newest, only once,
under a bandwidth limit, into a temporary folder renamed into place when whole (a copy cut short
is never mistaken for a checkpoint). The newest copy is all a resume needs: older ones are removed.
When the run is relaunched on another machine, the newest copy of its generation is staged with
the bundle (``inputs/.reconciler/resume/checkpoint-N``) and training resumes from it.

A ``command`` run resumes the same way, by a contract of folders rather than of arguments: it
writes its checkpoints as ``artifacts/output/checkpoint-N/`` (``trainer_state.json``, or any file
of that name, written last: the Hugging Face Trainer's layout, which ms-swift also writes), and
a relaunch of the same generation finds the newest one in ``$RECONCILER_RESUME_DIR``
(in a container, where ``container_view`` places it). A run that writes none, or ignores the
variable, starts over as before.

This is the small-scale default. A run with a Storage (docs/storage.md) never comes here: its
machine uploads checkpoints to the bucket itself and a relaunch downloads them from there, so no
checkpoint byte crosses this host.

The machine says where its checkpoints are, and a machine is untrusted: a path it reports is
copied only if it looks like a checkpoint folder of the workspace (``checkpoint_problem``), the
copy holds plain files and folders only (``safetar``: no link is created or followed), and the
store is read the same way (a link left in it by an older reconciler is never taken for a
checkpoint, nor followed when a copy is staged).
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from pathlib import Path

from reconciler.artifacts import safetar
from reconciler.core.errors import TemporaryError
from reconciler.core.identity import make, parse
from reconciler.core.relpaths import plain_path_problem

# What the probe reports: a checkpoint folder under the job's artifacts (ms-swift writes
# artifacts/output/<version>/checkpoint-N), as plain components.
CHECKPOINT_NAME = re.compile(r"checkpoint-[0-9]{1,12}")
MAX_DEPTH = 8


def checkpoint_problem(rel: str) -> str | None:
    """Why ``rel`` is not a workspace-relative checkpoint folder that may be copied, or None."""
    why = plain_path_problem(rel, 512, MAX_DEPTH)
    if why is not None:
        return why
    parts = rel.split("/")
    if parts[0] != "artifacts" or len(parts) < 2:
        return "not under artifacts/"
    if not CHECKPOINT_NAME.fullmatch(parts[-1]):
        return "not a checkpoint-N folder"
    return None


def _stored(p: Path) -> bool:
    """A checkpoint folder of the store: a real folder, never a link (left by an older reconciler)."""
    return p.is_dir() and not p.is_symlink() and CHECKPOINT_NAME.fullmatch(p.name) is not None


def root(state_dir: Path) -> Path:
    return Path(state_dir) / "checkpoints"


def folder(state_dir: Path, name: str, generation: int) -> Path:
    return root(state_dir) / name / f"g{generation}"


def saved(state_dir: Path, names: set[str] | None = None) -> dict[tuple[str, int], set[str]]:
    """(run, generation) → the checkpoints copied so far (whole ones only)."""
    out: dict[tuple[str, int], set[str]] = {}
    base = root(state_dir)
    if not base.is_dir():
        return out
    for run_dir in base.iterdir():
        if names is not None and run_dir.name not in names:
            continue
        for gen_dir in run_dir.glob("g*"):
            if gen_dir.name[1:].isdigit():
                out[(run_dir.name, int(gen_dir.name[1:]))] = {p.name for p in gen_dir.glob("checkpoint-*")
                                                              if _stored(p)}
    return out


def latest(state_dir: Path, name: str, generation: int) -> Path | None:
    d = folder(state_dir, name, generation)
    found = [p for p in d.glob("checkpoint-*") if _stored(p)]
    return max(found, key=lambda p: int(p.name[11:])) if found else None


class Throttled:
    """A file wrapper that holds writes to ``rate`` bytes per second."""

    def __init__(self, f, rate: float):
        self.f, self.rate = f, rate
        self.t0, self.n = time.monotonic(), 0

    def write(self, data: bytes) -> None:
        self.f.write(data)
        self.n += len(data)
        ahead = self.n / self.rate - (time.monotonic() - self.t0)
        if ahead > 0:
            time.sleep(ahead)


def save(transport, identity: str, rel: str, state_dir: Path, name: str, generation: int,
         mb_per_s: float | None, limits: safetar.Limits = safetar.Limits()) -> Path:
    """Copy the workspace folder ``rel`` (a checkpoint) into the store; returns where it is."""
    why = checkpoint_problem(rel)
    if why is not None:
        raise TemporaryError(f"not copying checkpoint {safetar.printable(str(rel))!r} reported by the machine: {why}")
    dest = folder(state_dir, name, generation)
    dest.mkdir(parents=True, exist_ok=True)
    final = dest / rel.rsplit("/", 1)[-1]
    if final.is_symlink():  # never a checkpoint: removed (unlink does not follow it)
        final.unlink()
    if _stored(final):
        return final
    tmp = dest / f".partial-{uuid.uuid4().hex[:8]}"
    wrap = (lambda f: Throttled(f, mb_per_s * 1e6)) if mb_per_s else None
    try:
        tmp.mkdir()
        res = transport.fetch_folder(identity, rel, tmp, sink_wrapper=wrap, limits=limits)
        if res.truncated or res.error:
            # A checkpoint cut at the limit would be resumed from as if whole: not kept.
            raise TemporaryError(f"checkpoint {rel} of {identity} not copied: {res.note()}")
        got = tmp.joinpath(*rel.split("/"))
        if got.is_symlink() or not got.is_dir():
            raise TemporaryError(f"checkpoint {rel} of {identity} not copied: the machine sent no such folder")
        os.replace(got, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    step = int(final.name[11:]) if final.name[11:].isdigit() else None
    for old in dest.glob("checkpoint-*"):  # the newest copy is all a resume needs
        if old != final and step is not None and old.name[11:].isdigit() and int(old.name[11:]) < step:
            if old.is_symlink():
                old.unlink()
            else:
                shutil.rmtree(old, ignore_errors=True)
    return final


def stage(saved: Path, bundle: Path, limits: safetar.Limits = safetar.Limits()) -> safetar.Result:
    """Copy a stored checkpoint into a bundle as ``inputs/.reconciler/resume/<name>``, without
    following a link: one left in the store before copies were checked could point at any folder
    of this host, which would then be sent to the machine."""
    got = safetar.copy_tree(saved, Path(bundle), prefix=("inputs", ".reconciler", "resume", saved.name), limits=limits)
    if got.truncated:
        raise TemporaryError(f"the saved checkpoint {saved.name} is over the collection limit: not staged")
    return got


RESUME_ENV = "RECONCILER_RESUME_DIR"
DOCKER_BUNDLE = "/bundle"  # where a docker launch mounts the workspace (machines/launchers.py)


def previous_attempt(identity: str) -> str | None:
    """The attempt a relaunch resumes from: the one before it, of the same generation (a new
    generation is a changed spec, which starts over)."""
    p = parse(identity)
    return make(p.name, p.generation, p.attempt - 1) if p is not None and p.attempt > 1 else None


# Where a docker launch mounts, read-only, a previous attempt's checkpoint that lies in another
# workspace of the same machine: outside /bundle, so docker makes no mount point in the workspace.
CONTAINER_RESUME = "/reconciler-resume"


def container_view(resume: str | None, workspace: str) -> tuple[str | None, tuple[str, str] | None]:
    """The checkpoint folder ``resume`` (a path on the machine) as a container sees it, and the
    read-only mount (machine path, container path) it needs, if any. The workspace is ``/bundle``
    there, so a staged copy or a bucket's checkpoint (inside the workspace) needs none; a previous
    attempt's folder on the same machine is mounted at ``/reconciler-resume/<its name>``. A path
    ``docker run -v`` cannot carry (a ``:`` or ``,`` in it) is not resumed from: the run starts over."""
    if not resume:
        return None, None
    base = workspace.rstrip("/") + "/"
    if resume.startswith(base):
        return DOCKER_BUNDLE + "/" + resume[len(base):], None
    if any(ch in resume for ch in ":,\n") or not resume.startswith("/"):
        return None, None
    target = f"{CONTAINER_RESUME}/{resume.rstrip('/').rsplit('/', 1)[-1]}"
    return target, (resume, target)
