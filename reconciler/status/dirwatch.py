"""Whether anything in status/ can have changed since the last look, without a stat per file.

A daemon's pass that changes nothing would otherwise stat every status file, those of settled
runs included (one system call and a key each: at 10,000 runs about a quarter of the pass). The
folder's own stat does not tell: writing into an existing file changes neither the folder's
mtime nor its size. So the folder is watched with inotify(7): the kernel queues an event for every
change made through the folder (write, truncate, chmod/touch, create, delete, rename in or out),
and a pass that finds the queue empty knows the files are as its last full scan found them.

Exact only where the kernel sees every change, so the watch is trusted only when:

- it was in place before the full scan whose listing is reused began (events are read first,
  then the folder scanned: a change during the scan shows up next time);
- the folder is the same one (device and inode, checked every time: a folder renamed away,
  replaced, or mounted over is scanned again), and the watch is intact (no queue overflow, no
  removal of the watch, the folder not deleted or moved);
- the file system is a local one (its statfs(2) magic number, from the kernel's
  include/uapi/linux/magic.h and OpenZFS for ZFS): a change made on another host of a network
  file system raises no event here;
- every status file is a plain file with one link (the caller checks during the scan): a change
  through a symbolic link's target, or through another hard link, is reported to that other folder.

What it still cannot see, and nothing here does: writes through a shared writable memory map
(no editor or git writes status files so). Anything it cannot set up (no inotify: another
system, the per-user instance limit reached) means a full scan every pass, as before.
"""

from __future__ import annotations

import os
import weakref

from reconciler.core.inotify import LOCAL_FS, MASK, drain, fs_type, libc as _libc  # noqa: F401


def relevant(name: bytes) -> bool:
    """A name ``store.load_all`` reads (``*.yaml``, not hidden): other files in status/ (the
    ledger's README and curves, temporaries before their rename) change nothing it returns."""
    return name.endswith(b".yaml") and not name.startswith(b".")


class DirWatch:
    """An inotify watch on one folder; ``unchanged`` tells whether it saw nothing since last asked."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self._fd: int | None = None
        self._ident: tuple[int, int] | None = None  # the folder's (device, inode) when watched
        self._refused: tuple[int, int] | None = None  # a folder it cannot watch (not a local file system)
        self._close: weakref.finalize | None = None

    @property
    def armed(self) -> bool:
        return self._fd is not None

    def unchanged(self) -> bool:
        """True when the watch was in place since the last call and nothing relevant happened in
        the folder since. Otherwise False, with the watch (re)made where it can be: call this
        before scanning the folder, so that whatever changes during the scan shows next time."""
        if self._fd is None:
            self._arm()
            return False
        quiet, lost = self._drain()
        try:
            st = os.stat(self.path)
            same = (st.st_dev, st.st_ino) == self._ident
        except OSError:
            same = False
        if quiet and same and not lost:
            return True
        if lost or not same:
            self.close()
            self._arm()
        return False

    def _drain(self) -> tuple[bool, bool]:
        """Read every queued event: (none of them relevant, the watch lost)."""
        return drain(self._fd, lambda name, mask: relevant(name))

    def _arm(self) -> None:
        try:
            before = os.stat(self.path)
        except OSError:
            return
        ident = (before.st_dev, before.st_ino)
        if ident == self._refused:
            return
        if fs_type(self.path) not in LOCAL_FS:
            self._refused = ident
            return
        try:
            ctypes, libc = _libc()
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        except (OSError, AttributeError):
            self._refused = ident
            return
        if fd < 0:
            return  # the per-user instance limit, say: tried again next time
        if libc.inotify_add_watch(fd, os.fsencode(self.path), MASK) < 0:
            os.close(fd)
            return
        try:
            after = os.stat(self.path)
        except OSError:
            after = None
        if after is None or (after.st_dev, after.st_ino) != ident:  # replaced while being watched
            os.close(fd)
            return
        self._fd, self._ident = fd, ident
        self._close = weakref.finalize(self, os.close, fd)

    def close(self) -> None:
        if self._close is not None:
            self._close()
        self._fd, self._ident, self._close = None, None, None
