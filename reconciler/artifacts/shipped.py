"""The runtime files every bundle ships (``scripts/``), read once per process.

Every bundle holds the same eight files from ``reconciler/runtime/`` (the launch wrapper, the GPU
sampler, the precheck, ...). Reading them from the package for each bundle was a good part of a
bundle's build on a loaded small VM, where a burst of fifty runs builds fifty bundles; their bytes
are read once per process (an upgrade of the package restarts the reconciler).

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
SHIPPED_SCRIPTS = ("launch.sh", "gpu_sampler.py", "precheck.py", "precheck_gpus.py", "log_stamp.py",
                   # uploads to the run's Storage, machine to bucket (used when scripts/storage.json is there)
                   "storage_sync.py", "storage_fetch.py", "storage_common.py")
MODE = 0o755


@functools.lru_cache(maxsize=1)
def contents() -> tuple[tuple[str, bytes], ...]:
    """The shipped files' bytes, read once per process."""
    return tuple((name, (RUNTIME_DIR / name).read_bytes()) for name in SHIPPED_SCRIPTS)


def place(scripts: Path, skip: set[str] = frozenset()) -> None:
    """The shipped files into ``scripts`` (a bundle being built), but ``skip``: each a file of its own."""
    for name, data in contents():
        if name in skip:
            continue
        fd = os.open(scripts / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, MODE)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(scripts / name, MODE)
