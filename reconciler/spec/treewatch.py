"""Whether any spec file can have changed since the last walk of the tree, without a stat per file.

A pass that reads nothing spends most of its spec time in the walk (``tree.py``): one stat per
file, because the stat decides whether the file is read. A folder's own mtime cannot replace it:
writing into an existing file (a shell's ``>``, an editor that saves over the file) moves only that
file's times, not its folder's. So, as ``status/dirwatch.py`` does for ``status/``, every folder
of the walk is watched with inotify(7), on one instance: the kernel queues an event for every change
made through a watched folder (write, truncate, chmod or touch, create, delete, rename in or out),
and a pass that finds no event about a spec file, a ``.gitignore`` or a folder reuses the last
walk's listing, stats included.

The listing is trusted only when:

- each folder's watch was added before that folder was listed (a change during the walk shows up
  at the next pass, which then walks again);
- no watch was lost (queue overflow, a folder removed, moved or unmounted) and each folder is still
  the one watched (device and inode, asked every pass: a folder replaced or mounted over is walked);
- every folder is on a local file system (``core/inotify.py``): a change made on another host of a
  network file system raises no event here;
- every spec file and ``.gitignore`` is a plain file with one link: a change through a symbolic
  link's target, or through another hard link, raises its event in another folder.

Writes through a shared writable memory map raise no event; no editor or git writes specs so.
Anything that cannot be set up means the full walk every pass, as before.
"""

from __future__ import annotations

import os
import weakref

from reconciler.core import inotify

# Files from which a tree is watched: below this the walk costs less than a millisecond or so.
WATCH_FROM = 1000


def relevant(name: bytes, mask: int) -> bool:
    """An event that can change what the walk returns: a spec file (not hidden), a .gitignore
    (its stat is part of the listing), or any folder (created, removed or renamed)."""
    if mask & (inotify.LOST | inotify.IN_ISDIR):
        return True
    return name == b".gitignore" or name.endswith((b".yaml", b".yml")) and not name.startswith(b".")


class TreeWatch:
    """The watches of one walk's folders, and that walk's listing while they vouch for it."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._close: weakref.finalize | None = None
        self._folders: dict[str, tuple[int, int]] = {}
        self._ok = False  # every folder of the walk under way got its watch
        self.listing: tuple[list, list] | None = None  # (files, .gitignore entries) of the last walk

    def reuse(self) -> tuple[list, list] | None:
        """The last walk's (files, .gitignore entries) when nothing relevant happened since; else
        None (the walk that follows watches its folders again: ``begin``)."""
        if self._fd is None or self.listing is None:
            return None
        quiet = self._drain() and all(_ident(p) == ident for p, ident in self._folders.items())
        if quiet:
            return self.listing
        self.listing = None
        return None

    def begin(self) -> TreeWatch:
        """A new walk starts: its folders watched as it reaches them (``add``). The instance is kept
        from walk to walk, its queue drained here (what comes after is about the walk that follows,
        and the next pass sees it): closing an instance that holds watches waits for the kernel's
        grace period, 8 to 16 ms on this kind of VM (machines/local_launch.py), on the way of every
        pass after an edit. Adding a watch a folder already has is allowed, and a watch on a folder
        that left the tree only raises events that cost a walk."""
        self.listing, self._folders = None, {}
        if self._fd is not None:
            self._drain()
            self._ok = True
            return self
        fd = inotify.instance()
        if fd is None:
            return self  # none to be had (the per-user instance limit, say): tried again next walk
        self._fd, self._ok = fd, True
        self._close = weakref.finalize(self, os.close, fd)
        return self

    def add(self, folder: str) -> None:
        """Watch ``folder`` before it is listed."""
        if not self._ok:
            return
        before = _ident(folder)
        if before is None or inotify.fs_type(folder) not in inotify.LOCAL_FS:
            self._ok = False
            return
        try:
            _, lib = inotify.libc()
            added = lib.inotify_add_watch(self._fd, os.fsencode(folder), inotify.MASK)
        except (OSError, AttributeError):
            added = -1
        if added < 0 or _ident(folder) != before:  # no watch (the watch limit), or replaced meanwhile
            self._ok = False
            return
        self._folders[folder] = before

    def finish(self, files: list, ignores: list, plain: bool) -> None:
        """The walk is done: its listing kept when every folder was watched from before its listing
        and every file is plain (see the module's docstring); else none is kept, and the next walk
        lists again."""
        if self._ok and plain and len(files) >= WATCH_FROM:
            self.listing = (files, [list(x) for x in ignores])
        else:
            self.listing = None  # the instance stays, for the next walk (``begin``)

    def _drain(self) -> bool:
        """Read every queued event: whether none of them was relevant (a lost watch is)."""
        return inotify.drain(self._fd, relevant)[0]

    def close(self) -> None:
        if self._close is not None:
            self._close()
        self._fd, self._close, self._ok, self.listing = None, None, False, None
        self._folders = {}


def _ident(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino
