"""The few inotify(7) pieces that folder watches share (status/dirwatch.py, spec/treewatch.py,
machines/local_launch.py's wait for a pid file).

A watch is only as good as the kernel's view of the folder: a change made on another host of a
network file system raises no event here, so a watch is set up only on a local file system (its
statfs(2) magic number). Everything is asked through libc with ctypes; where that is not possible
(another system, no inotify) the callers fall back to looking at every file.
"""

from __future__ import annotations

import functools
import os
import struct

# <sys/inotify.h>
IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF = 0x400, 0x800
IN_UNMOUNT, IN_Q_OVERFLOW, IN_IGNORED = 0x2000, 0x4000, 0x8000
IN_ONLYDIR, IN_ISDIR = 0x01000000, 0x40000000
MASK = (IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF
        | IN_MOVE_SELF | IN_ONLYDIR)
LOST = IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT | IN_Q_OVERFLOW | IN_IGNORED  # the watch must be set up again
EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of NUL-padded name

# statfs(2) f_type of local file systems (include/uapi/linux/magic.h; ZFS_SUPER_MAGIC in OpenZFS).
LOCAL_FS = {0xEF53: "ext2/3/4", 0x58465342: "xfs", 0x9123683E: "btrfs", 0x01021994: "tmpfs",
            0x794C7630: "overlayfs", 0xF2F52010: "f2fs", 0x2FC12FC1: "zfs", 0xCA451A4E: "bcachefs",
            0x52654973: "reiserfs", 0x3153464A: "jfs"}


@functools.cache
def libc():
    """(ctypes, the C library), loaded once; OSError where there is none to load."""
    import ctypes

    return ctypes, ctypes.CDLL("libc.so.6", use_errno=True)


def instance() -> int | None:
    """A new inotify instance, non-blocking and closed on exec; None where the C library or the
    kernel offers none (the per-user instance limit, say)."""
    try:
        fd = libc()[1].inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, AttributeError):
        return None
    return fd if fd >= 0 else None


def drain(fd: int, relevant=None) -> tuple[bool, bool]:
    """Read every event queued on ``fd``: (none of them was relevant, the watch was lost: ``LOST``
    or the instance unreadable). ``relevant(name, mask)``; None: no event is (the queue is only
    emptied)."""
    quiet, lost = True, False
    while True:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return quiet, lost
        except OSError:
            return False, True
        if not data:
            return False, True
        for _, mask, name in events(data):
            if mask & LOST:
                lost = True
            if relevant is not None and (mask & LOST or relevant(name, mask)):
                quiet = False


def fs_type(path: str) -> int | None:
    """statfs(2)'s f_type of the file system holding ``path`` (the first field of struct statfs,
    a word on Linux), or None where it cannot be asked."""
    try:
        ctypes, lib = libc()
        buf = ctypes.create_string_buffer(512)  # larger than struct statfs on every Linux ABI
        if lib.statfs(os.fsencode(path), buf) != 0:
            return None
        return ctypes.c_ulong.from_buffer(buf).value & 0xFFFFFFFF
    except (OSError, AttributeError):
        return None


def events(data: bytes):
    """(watch descriptor, mask, name) of each event in what one read(2) of the instance returned."""
    at = 0
    while at + EVENT.size <= len(data):
        wd, mask, _, size = EVENT.unpack_from(data, at)
        yield wd, mask, data[at + EVENT.size:at + EVENT.size + size].rstrip(b"\0")
        at += EVENT.size + size
