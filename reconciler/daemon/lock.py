"""One writer per checkout: an exclusive ``flock`` on ``.reconciler/daemon.lock``, holding the pid.

The daemon holds it for its lifetime and ``reconcile --once`` for its pass, so a one-off pass
never interleaves its status writes and commit with a daemon's on the same checkout.

The kernel drops the lock when the process dies, kill -9 included, so a stale file never blocks a
restart; the pid inside is only there to name the holder in the refusal message.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from reconciler.core.errors import UsageError


class LockHeld(UsageError):
    """Another process holds the checkout's lock (exit code 2)."""

    def __init__(self, path: Path, pid: int | None):
        who = f"pid {pid}" if pid else "another process"
        super().__init__(f"another reconciler ({who}) is already running on this checkout; "
                         f"it holds {path}. Stop it first, or use another clone.")
        self.pid = pid


class RepoLock:
    def __init__(self, state_dir: Path):
        self.path = state_dir / "daemon.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:  # .reconciler/ unwritable, or a file in the way
            raise UsageError(f"cannot create {self.path}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                text = os.pread(fd, 64, 0).decode(errors="replace").strip()
            finally:
                os.close(fd)
            raise LockHeld(self.path, int(text) if text.isdigit() else None) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
            except OSError:
                pass
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> "RepoLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
