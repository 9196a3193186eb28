"""Files from a machine, written into a folder on the reconciler host without ever following a link.

Everything a machine sends back (``runtime/``, ``artifacts/``, a checkpoint) was written by the job
on it, and a machine is untrusted: its ``tar`` may be the job's own program (a ``tar`` earlier on
its PATH) answering with any byte stream at all. This module is the one place such a stream, or
such a folder on this host (a local workspace is written by a job too), becomes files here.

Why not ``tarfile``'s extraction with the ``data`` filter: the filter decides on
``os.path.realpath``, which gives up on paths longer than PATH_MAX and returns the rest
unresolved. A chain of symbolic links under long folder names then passes the filter and points
outside the destination, and a later member writes through it (CVE-2025-4517, fixed only in
CPython 3.11.13, 3.12.11 and 3.13.4). The reconciler must be safe on whatever Python it runs, so
``tarfile`` is used here only to read headers; the files are written by this module, which:

- accepts regular files and folders only, named by relative paths of plain components (no
  absolute path, no ``..``, ``.`` or empty component, no control character, at most
  ``MAX_NAME`` bytes and ``MAX_DEPTH`` components). Symbolic links, hard links, devices, FIFOs
  and sockets are never created: they are skipped and listed with the reason;
- opens every folder with ``O_DIRECTORY | O_NOFOLLOW`` relative to its parent's descriptor, and
  creates every file with ``O_CREAT | O_EXCL | O_NOFOLLOW`` under a temporary name in that folder,
  renamed over the final name (a rename replaces a link, it never follows one). So not even a
  link already in the destination (left by an older reconciler) can be followed;
- stops taking files at a byte and a file-count limit per transfer and says so (``truncated``):
  the files that fit are kept, so a transfer that is too large still ends.

The result lists what was written and what was skipped and why, for the run's status.
"""

from __future__ import annotations

import os
import stat
import tarfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

DEFAULT_MAX_BYTES = 20 << 30  # a few checkpoints of a mid-sized model, while object storage is not there
DEFAULT_MAX_FILES = 100_000
MAX_NAME = 1024  # bytes of a member's whole path (PATH_MAX is 4096: room for the destination)
MAX_COMPONENT = 255  # bytes of one component (NAME_MAX)
MAX_DEPTH = 64
MAX_LISTED = 50  # skipped entries listed by name; beyond that they are only counted
CHUNK = 1 << 20
# Per member, a stream holds a 512-byte header, padding up to 511 bytes and perhaps a long-name
# header: the most a whole stream within the limits can take, for bounding the spool.
HEADER_ALLOWANCE = 2048
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

# keep(parts) -> None to take the entry, a reason to skip and list it, "" to skip it silently.
Keep = Callable[[tuple[str, ...]], "str | None"]


@dataclass(frozen=True)
class Limits:
    max_bytes: int = DEFAULT_MAX_BYTES
    max_files: int = DEFAULT_MAX_FILES

    def spool_bytes(self) -> int:
        """The most a tar stream within these limits can be (plus slack for the end marker)."""
        return self.max_bytes + HEADER_ALLOWANCE * (self.max_files + 1) + (1 << 20)


@dataclass
class Result:
    files: int = 0
    dirs: int = 0
    bytes: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (name, why), the first MAX_LISTED
    skipped_total: int = 0
    truncated: bool = False  # a limit was reached: files beyond it were not taken
    complete: bool = False  # the stream ended with its end-of-archive marker
    error: str = ""  # why the stream could not be read to its end ("" when it could)

    def skip(self, name: str, why: str) -> None:
        self.skipped_total += 1
        if len(self.skipped) < MAX_LISTED:
            self.skipped.append((printable(name), why))

    def note(self) -> str:
        """One line for a status message: what was left out, or "" when nothing was."""
        parts = []
        if self.skipped_total:
            listed = ", ".join(f"{_short(n)} ({_short(why)})" for n, why in self.skipped[:5])
            more = f" and {self.skipped_total - 5} more" if self.skipped_total > 5 else ""
            parts.append(f"skipped {self.skipped_total} entr{'y' if self.skipped_total == 1 else 'ies'}: {listed}{more}")
        if self.truncated:
            parts.append("stopped at the collection limit (collect_max_bytes / collect_max_files)")
        if self.error:
            parts.append(self.error)
        return "; ".join(parts)

    def as_dict(self) -> dict:
        return {"files": self.files, "dirs": self.dirs, "bytes": self.bytes, "truncated": self.truncated,
                "skipped_total": self.skipped_total,
                "skipped": [{"path": n, "reason": why} for n, why in self.skipped]}


def _short(text: str, most: int = 80) -> str:
    return text if len(text) <= most else text[:50] + "…" + text[-(most - 51):]


class Refused(Exception):
    """One entry cannot be written where it should go (the reason is the message)."""


def printable(name: str) -> str:
    """A name as it may appear in a message: control characters escaped, length bounded."""
    text = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in name)
    return text if len(text) <= 200 else text[:120] + "…" + text[-40:]


def plain_parts(name: str) -> tuple[str, ...] | str:
    """The components of a relative path made of plain components, or why it is not one."""
    if not name:
        return "an empty name"
    try:
        encoded = name.encode("utf-8", "surrogateescape")  # as the file system will see it
    except UnicodeError:
        return "a name that is not a file name"
    if len(encoded) > MAX_NAME:
        return f"a name longer than {MAX_NAME} bytes"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        return "a control character in its name"
    if name.startswith("/"):
        return "an absolute name"
    parts = name.split("/")
    if len(parts) > 1 and parts[-1] == "":  # a folder written as "name/"
        parts.pop()
    if any(p in ("", ".", "..") for p in parts):
        return "an empty, '.' or '..' component in its name"
    if len(parts) > MAX_DEPTH:
        return f"more than {MAX_DEPTH} nested folders"
    if any(len(p.encode("utf-8", "surrogateescape")) > MAX_COMPONENT for p in parts):
        return f"a component longer than {MAX_COMPONENT} bytes"
    return tuple(parts)


def _kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return f"a symbolic link to {printable(member.linkname)}"
    if member.islnk():
        return f"a hard link to {printable(member.linkname)}"
    if member.isfifo():
        return "a FIFO"
    if member.ischr() or member.isblk():
        return "a device"
    return f"an entry of type {member.type!r}"


def _stat_kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file or folder"


class _Tree:
    """The destination folder, written only through descriptors of folders opened without
    following links. The folders of the last path used stay open (a stream lists a folder's
    files together), so a deep tree costs a few descriptors, not one per folder."""

    def __init__(self, dest: Path):
        self.root = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.chain: list[tuple[str, int]] = []

    def close(self) -> None:
        for _, fd in self.chain:
            os.close(fd)
        self.chain = []
        os.close(self.root)

    def folder(self, parts: tuple[str, ...]) -> int:
        """The descriptor of dest/parts, made when missing; Refused when something else is there."""
        same = 0
        while same < len(self.chain) and same < len(parts) and self.chain[same][0] == parts[same]:
            same += 1
        for _, fd in self.chain[same:]:
            os.close(fd)
        del self.chain[same:]
        fd = self.chain[-1][1] if self.chain else self.root
        for comp in parts[same:]:
            fd = self._sub(fd, comp)
            self.chain.append((comp, fd))
        return fd

    @staticmethod
    def _sub(parent: int, comp: str) -> int:
        try:
            os.mkdir(comp, 0o755, dir_fd=parent)
        except FileExistsError:
            pass
        try:
            return os.open(comp, _OPEN_DIR, dir_fd=parent)
        except OSError:
            pass
        try:
            st = os.stat(comp, dir_fd=parent, follow_symlinks=False)
        except OSError as e:
            raise Refused(f"cannot open folder {comp}: {e.strerror}") from None
        if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
            raise Refused(f"a file is where folder {printable(comp)} should be")
        # A link, FIFO or device left here earlier (by an older reconciler): removed, never followed.
        os.unlink(comp, dir_fd=parent)
        os.mkdir(comp, 0o755, dir_fd=parent)
        return os.open(comp, _OPEN_DIR, dir_fd=parent)

    def write(self, parts: tuple[str, ...], src, size: int, mode: int, mtime: float | None, exact: bool = True,
              at: tuple[int, int] | None = None) -> int:
        """Write one file of ``size`` bytes from ``src`` (at most ``size`` and to its end when not
        ``exact``: a file on this host that shrank meanwhile); returns its byte count. ``at``
        (a file descriptor and an offset) copies from that file instead, inside the kernel."""
        dfd = self.folder(parts[:-1])
        tmp = f".rc-part-{uuid.uuid4().hex[:16]}"
        fd = os.open(tmp, _CREATE, 0o600, dir_fd=dfd)
        done = 0
        try:
            try:
                if at is not None:
                    done = _copy_range(at[0], at[1], fd, size)
                while done < size and at is None:
                    chunk = src.read(min(CHUNK, size - done))
                    if not chunk:
                        break
                    _write_all(fd, chunk)
                    done += len(chunk)
                if exact and done < size:
                    raise EOFError("the stream ended inside a file")
                os.fchmod(fd, 0o755 if mode & 0o100 else 0o644)  # never setuid, setgid or world-writable
                if mtime is not None and 0 <= mtime < 1 << 33:
                    os.utime(fd, (mtime, mtime))
            finally:
                os.close(fd)
            try:
                os.rename(tmp, parts[-1], src_dir_fd=dfd, dst_dir_fd=dfd)
            except OSError as e:
                raise Refused(f"cannot be written ({e.strerror}: a folder is in the way?)") from None
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
        return done


def _copy_range(src_fd: int, offset: int, dst_fd: int, size: int) -> int:
    """``size`` bytes of ``src_fd`` from ``offset`` into ``dst_fd``, without passing them through
    this process: copy_file_range(2) (a reflink or an in-kernel copy on one file system), else
    sendfile(2), else reads. A checkpoint's shards are tens of GB: copying them through Python's
    buffers costs a core and more than halves the throughput. Returns the bytes copied (fewer
    when the source ends first)."""
    done = 0
    use_range = hasattr(os, "copy_file_range")
    while done < size:
        want = min(size - done, 1 << 30)
        n = 0
        if use_range:
            try:
                n = os.copy_file_range(src_fd, dst_fd, want, offset + done)
            except OSError:  # EXDEV before Linux 5.3, EINVAL on some file systems: another way
                use_range = False
                continue
        else:
            try:
                n = os.sendfile(dst_fd, src_fd, offset + done, want)
            except OSError:
                data = os.pread(src_fd, min(want, CHUNK), offset + done)
                if data:
                    _write_all(dst_fd, data)
                n = len(data)
        if n == 0:
            break
        done += n
    return done


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _take(res: Result, limits: Limits, name: str, size: int) -> bool:
    """Whether one more entry of ``size`` bytes fits the limits (else it is skipped, listed)."""
    if res.files + res.dirs >= limits.max_files:
        res.truncated = True
        res.skip(name, f"over the limit of {limits.max_files} files")
        return False
    if res.bytes + size > limits.max_bytes:
        res.truncated = True
        res.skip(name, f"over the limit of {limits.max_bytes} bytes")
        return False
    return True


def unpack(stream, dest: Path, *, keep: Keep | None = None, limits: Limits = Limits()) -> Result:
    """Unpack the plain (uncompressed) tar ``stream`` into the existing folder ``dest``."""
    res = Result()
    # A spool on disk (what collection reads) is a real, seekable file: tarfile then seeks over
    # each file's data instead of reading it, and the data is copied by the kernel from the spool
    # (``at``). Any other stream is read as a stream. Either way tarfile only reads headers, and
    # never decompresses ("r:" / "r|": no compression, so no decompression bomb).
    fileno = _fileno(stream)
    tree = _Tree(Path(dest))
    try:
        try:
            tar = tarfile.open(fileobj=stream, mode="r:" if fileno is not None else "r|")
        except Exception as e:  # noqa: BLE001 - whatever the header parser chokes on, the stream is bad
            res.error = f"the machine sent no readable archive ({printable(str(e))})"
            return res
        with tar:
            while True:
                try:
                    member = tar.next()
                except Exception as e:  # noqa: BLE001 - as above: a damaged stream, never a failed pass
                    res.error = f"the archive is damaged or cut short ({printable(str(e))})"
                    break
                tar.members.clear()  # stream mode keeps every header otherwise: memory bounded by entries
                if member is None:
                    res.complete = _ended(stream, tar.offset)
                    break
                parts = plain_parts(member.name)
                if isinstance(parts, str):
                    res.skip(member.name, parts)
                    continue
                if not (member.isreg() or member.isdir()):
                    res.skip(member.name, _kind(member))
                    continue
                why = keep(parts) if keep is not None else None
                if why is not None:
                    if why:
                        res.skip(member.name, why)
                    continue
                if not _take(res, limits, member.name, member.size if member.isreg() else 0):
                    continue
                try:
                    if member.isdir():
                        tree.folder(parts)
                        res.dirs += 1
                        continue
                    if fileno is not None and not member.issparse():  # a sparse member's data is not one range
                        res.bytes += tree.write(parts, None, member.size, member.mode, member.mtime,
                                                at=(fileno, member.offset_data))
                    else:
                        res.bytes += tree.write(parts, tar.extractfile(member), member.size, member.mode,
                                                member.mtime)
                    res.files += 1
                except Refused as e:
                    res.skip(member.name, str(e))
                except (tarfile.TarError, EOFError) as e:
                    res.error = f"the archive is cut short inside {printable(member.name)} ({e})"
                    break
    finally:
        tree.close()
    return res


def _fileno(stream) -> int | None:
    """The descriptor of a stream that is a seekable regular file, else None."""
    try:
        fd = stream.fileno()
        return fd if stream.seekable() and stat.S_ISREG(os.fstat(fd).st_mode) else None
    except (OSError, ValueError, AttributeError):
        return None


def _ended(stream, offset: int) -> bool:
    """Whether a 512-byte zero block (tar's end marker) is at ``offset`` of a seekable stream."""
    try:
        if not stream.seekable():
            return False
        stream.seek(offset)
        return stream.read(512) == b"\0" * 512
    except (OSError, ValueError, AttributeError):
        return False


def copy_tree(src: Path, dest: Path, *, keep: Keep | None = None, limits: Limits = Limits(),
              prefix: tuple[str, ...] = (), result: Result | None = None) -> Result:
    """Copy the folder ``src`` (on this host, written by someone untrusted) into ``dest/prefix``
    under the same rules as ``unpack``: links, FIFOs, devices and sockets are skipped and listed,
    never followed or opened (a FIFO opened for reading would block the pass)."""
    res = result if result is not None else Result()
    try:
        top = os.open(src, _OPEN_DIR)
    except OSError as e:
        res.skip("/".join(prefix) or str(src), f"not a folder that can be opened ({e.strerror})")
        return res
    tree = _Tree(Path(dest))
    try:
        if prefix:
            tree.folder(prefix)
        _copy_dir(top, prefix, tree, keep, limits, res)
    except Refused as e:
        res.skip("/".join(prefix), str(e))
    finally:
        tree.close()
        os.close(top)
    return res


def _copy_dir(dfd: int, parts: tuple[str, ...], tree: _Tree, keep: Keep | None, limits: Limits, res: Result) -> None:
    with os.scandir(dfd) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        sub = parts + (entry.name,)
        name = "/".join(sub)
        checked = plain_parts(name)
        if isinstance(checked, str):
            res.skip(name, checked)
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue  # gone since the listing
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            why = _stat_kind(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                try:
                    why += f" to {printable(os.readlink(entry.name, dir_fd=dfd))}"
                except OSError:
                    pass
            res.skip(name, why)
            continue
        why = keep(sub) if keep is not None else None
        if why is not None:
            if why:
                res.skip(name, why)
            continue
        if not _take(res, limits, name, st.st_size if stat.S_ISREG(st.st_mode) else 0):
            continue
        try:
            if stat.S_ISDIR(st.st_mode):
                try:
                    child = os.open(entry.name, _OPEN_DIR, dir_fd=dfd)
                except OSError as e:  # replaced by a link since the listing: not followed
                    res.skip(name, f"cannot be opened as a folder ({e.strerror})")
                    continue
                try:
                    tree.folder(sub)
                    res.dirs += 1
                    _copy_dir(child, sub, tree, keep, limits, res)
                finally:
                    os.close(child)
                continue
            # O_NONBLOCK: a FIFO swapped in since the listing opens at once instead of blocking.
            try:
                fd = os.open(entry.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
            except OSError as e:
                res.skip(name, f"cannot be opened ({e.strerror})")
                continue
            with os.fdopen(fd, "rb") as fh:
                now = os.fstat(fd)
                if not stat.S_ISREG(now.st_mode):
                    res.skip(name, _stat_kind(now.st_mode))
                    continue
                budget = min(now.st_size, limits.max_bytes - res.bytes)
                res.bytes += tree.write(sub, fh, budget, now.st_mode, now.st_mtime, exact=False)
                res.files += 1
        except Refused as e:
            res.skip(name, str(e))



def read_plain(path: Path, limit: int) -> bytes | None:
    """The first ``limit`` bytes of ``path`` if it is a regular file (not a link, FIFO or device:
    opened without following a link and without blocking), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return fh.read(limit)
