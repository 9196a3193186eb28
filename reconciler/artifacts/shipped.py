"""The runtime files a bundle ships (``scripts/``), read once per process.

Every bundle holds the launch wrapper, the GPU sampler and the log stamper from
``reconciler/runtime/``; the precheck ships with a task whose entrypoint runs it (``helpers`` of
its rendering), the storage sync with a run that has a Storage (``scripts/storage.json``). A file
a run never uses is a file created on the way from an edit to its process, and sent over SSH: on
a file system whose creations are slow (docs/benchmarks.md, "File creation"), each one counts.
Reading them from the package for each bundle was a good part of a bundle's build on a loaded
small VM, where a burst of fifty runs builds fifty bundles; their bytes are read once per process
(an upgrade of the package restarts the reconciler).

Each bundle gets its own copy of each file, never a hard link to a shared one: on this machine
the workspace is the bundle, and a job may write to its own ``scripts/`` (a mode does not stop
the file's owner); a write through a shared link would change every other run's copy, so that one
hostile job could reach the others' launch wrappers.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

RUNTIME_DIR = Path(__file__).resolve().parent.parent / "runtime"
ALWAYS = ("launch.sh", "gpu_sampler.py", "log_stamp.py")
PRECHECK = ("precheck.py", "precheck_gpus.py")  # a task's entrypoint runs it (tasks/swift.py)
# Uploads to the run's Storage, machine to bucket (run by launch.sh when scripts/storage.json is there).
STORAGE = ("storage_sync.py", "storage_fetch.py", "storage_common.py")
SHIPPED_SCRIPTS = ALWAYS + PRECHECK + STORAGE
MODE = 0o755


@functools.lru_cache(maxsize=1)
def contents() -> tuple[tuple[str, bytes], ...]:
    """The shipped files' bytes, read once per process."""
    return tuple((name, (RUNTIME_DIR / name).read_bytes()) for name in SHIPPED_SCRIPTS)


def needed(helpers: tuple[str, ...] = (), storage: bool = False) -> frozenset[str]:
    """The shipped files a run uses: the ones every bundle has, the ``helpers`` its task's
    entrypoint calls, and the storage sync when it has a Storage."""
    unknown = set(helpers) - set(SHIPPED_SCRIPTS)
    if unknown:
        raise ValueError(f"not a shipped runtime file: {sorted(unknown)}")
    return frozenset(ALWAYS + tuple(helpers) + (STORAGE if storage else ()))


def place(scripts: Path, names: frozenset[str], skip: set[str] = frozenset()) -> None:
    """The shipped files of ``names`` into ``scripts`` (a bundle being built), but ``skip``: each a
    file of its own."""
    for name, data in contents():
        if name not in names or name in skip:
            continue
        fd = os.open(scripts / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, MODE)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(scripts / name, MODE)
