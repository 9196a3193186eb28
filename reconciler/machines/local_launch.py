"""A host process started on this machine in-process: the launch script's steps without a shell.

Why: on this machine the shell script of ``launchers._launch_host`` (``sh -c``, a ``grep`` for the
spec digest, ``mkdir``, ``date``, ``setsid``, a poll that sleeps 20 ms at a time for the pid, a
``cat``) was most of the time between an edited spec and its process. Here the same steps are
system calls of this process, the wrapper is started directly in a session of its own, and the
wait for its pid is a notification (inotify on ``runtime/`` for the rename that puts the pid file
in place, a pidfd for a wrapper that exits before writing it), not a poll.

The steps and their order are the script's, and so are the promises: a workspace that is gone or
built for another spec is refused, an identity already launched (``runtime/launched_at``) is
adopted, never started twice, and the launch returns once the wrapper has written its pid (or 2 s
passed), so that a stop in the same or the next pass finds its process group. Keep the two in step.

The wrapper is this process's child (there is no shell in between to exit and hand it to init):
its exit status is collected here (``reap``), so an ended job never lingers as a zombie.

The inotify instances are kept for the life of the process, a watch added and removed per launch:
closing an instance that has held a watch waits for the kernel's grace period (fsnotify's
``synchronize_srcu``), measured at 8 to 16 ms on this kind of VM, against 0.01 ms for a watch
added and removed on a kept one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import subprocess
import threading
import time

from reconciler.artifacts.safetar import read_plain
from reconciler.core import inotify, procenv
from reconciler.tasks import env_lines
from .base import WRONG_SPEC, LaunchResult, LaunchSpec
from .launchers import CLAIMED, LATE

PID_WAIT = 2.0  # seconds, as the script's 100 x 20 ms
JOB_JSON_MAX = 16 << 20  # the bound of every read of a workspace's job.json (artifacts/bundle.py)

log = logging.getLogger("reconciler")
_children: list[subprocess.Popen] = []
_children_lock = threading.Lock()


def reap() -> int:
    """Collect the exit status of every wrapper started here that has ended; how many still live."""
    with _children_lock:
        _children[:] = [p for p in _children if p.poll() is None]
        return len(_children)


def start_host(t, spec: LaunchSpec, not_after: float | None = None) -> tuple[int, str, LaunchResult | None]:
    """``launchers._launch_host``'s script on this machine: (its exit code, its error text, the
    result when it started or adopted the identity). The codes are the script's (97: no workspace;
    ``WRONG_SPEC``; the guard's ``CLAIMED`` and ``LATE``), so launchers.py reads both the same way."""
    began = time.monotonic()
    ws = spec.workspace
    if not os.path.isdir(ws):
        return 97, f"workspace {ws} is gone", None
    if spec.spec_digest and not _built_for(ws, spec.spec_digest):
        return WRONG_SPEC, "built for another spec", None
    rt = os.path.join(ws, "runtime")
    os.makedirs(rt, exist_ok=True)
    os.makedirs(os.path.join(ws, "artifacts"), exist_ok=True)
    if os.path.exists(os.path.join(rt, "launched_at")):
        return 0, "", LaunchResult(spec.identity, ws, adopted=True, pid=_pid(rt))
    if spec.env:
        _write(os.path.join(rt, "launch.env"), env_lines(spec.env))
    refused = _guard(spec, not_after)
    if refused is not None:
        return refused
    _write(os.path.join(rt, "launched_at"), f"{int(time.time())}\n")
    reap()
    env = procenv.base({"DOCKER_HOST": t.machine.docker_host} if t.machine.docker_host else None)
    env["PWD"] = ws  # as the script's ``cd`` exported it: the wrapper's environment names its workspace
    try:
        proc = subprocess.Popen(["sh", "scripts/launch.sh", spec.identity], cwd=ws, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    except OSError as e:
        return 1, f"cannot start the wrapper: {e}", None
    with _children_lock:
        _children.append(proc)
    wait_for_pid(rt, proc, PID_WAIT)
    pid = _pid(rt)
    # When each launch began and got its answer: the record that a pass's launches overlap.
    log.debug("wrapper started", extra={"fields": {"identity": spec.identity, "pid": pid, "began": began,
                                                   "answered": time.monotonic()}})
    return 0, "", LaunchResult(spec.identity, ws, adopted=False, pid=pid)


def _guard(spec: LaunchSpec, not_after: float | None) -> tuple[int, str, None] | None:
    """``launchers._guard``: the identity's claim for one spec digest (a file beside the workspace,
    made whole and hard-linked into place: a link never replaces a file, so the first launch wins),
    then the deadline. None when the launch may go on, else the script's exit code and message."""
    if spec.spec_digest:
        claim = os.path.join(os.path.dirname(spec.workspace.rstrip("/")), f".{spec.identity}.claim")
        if not os.path.exists(claim):
            tmp = f"{claim}.{os.getpid()}.{threading.get_ident()}"
            try:
                _write(tmp, spec.spec_digest + "\n")
                try:
                    os.link(tmp, claim)
                except FileExistsError:
                    pass
                except OSError:  # a file system without hard links
                    if not os.path.exists(claim):
                        os.replace(tmp, claim)
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        held = read_plain(claim, 200)
        if held is None or held.decode("utf-8", "replace").rstrip("\n") != spec.spec_digest:
            return CLAIMED, "claimed by a launch of another spec", None
    if not_after is not None:
        now = int(time.time())
        if now > int(not_after):
            return LATE, f"the machine's clock says {now}", None
    return None


def _built_for(ws: str, digest: str) -> bool:
    """``base.built_for_check``: job.json holds the exact line of ``digest`` (written with sorted
    keys and two-space indents). A bounded read of a regular file: the job may have rewritten it."""
    data = read_plain(os.path.join(ws, "job.json"), JOB_JSON_MAX)
    return data is not None and f'"spec_digest": "{digest}"'.encode() in data


def _pid(rt: str) -> int | None:
    data = read_plain(os.path.join(rt, "pid"), 64)
    text = data.decode("ascii", "replace").strip() if data else ""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 10 else None


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _has_pid(rt: str) -> bool:
    try:
        return os.stat(os.path.join(rt, "pid")).st_size > 0
    except OSError:
        return False


def wait_for_pid(rt: str, proc: subprocess.Popen, timeout: float) -> bool:
    """Until ``rt/pid`` is there and not empty, the wrapper ended, or ``timeout``: woken by the
    kernel (inotify for the rename into ``rt``, a pidfd for the wrapper's exit); polled every 2 ms
    where neither can be had. Whether the pid file is there."""
    deadline = time.monotonic() + timeout
    watch = _Watch.on(rt)
    ino = watch.fd if watch is not None else None
    pidfd = _pidfd(proc.pid)
    try:
        while True:
            if _has_pid(rt):
                return True
            if proc.poll() is not None:
                return _has_pid(rt)
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            fds = [fd for fd in (ino, pidfd) if fd is not None]
            if ino is None:
                time.sleep(min(left, 0.002))
                continue
            # Without a pidfd an early exit is noticed by proc.poll() at least every 50 ms.
            ready, _, _ = select.select(fds, [], [], left if pidfd is not None else min(left, 0.05))
            if ino in ready:
                inotify.drain(ino)
    finally:
        if watch is not None:
            watch.release()
        if pidfd is not None:
            os.close(pidfd)


_idle: list[int] = []  # kept inotify instances without a watch, ready for the next launch
_idle_lock = threading.Lock()


class _Watch:
    """A watch on one folder, on an inotify instance kept for the next launch (see the module's
    text for why instances are not closed)."""

    def __init__(self, fd: int, wd: int):
        self.fd, self.wd = fd, wd

    @classmethod
    def on(cls, folder: str) -> _Watch | None:
        """A watch of ``folder`` for files written or renamed into it (inotify(7)); None where the
        C library or the kernel offers none (out of instances, say)."""
        with _idle_lock:
            fd = _idle.pop() if _idle else None
        if fd is None:
            fd = inotify.instance()
            if fd is None:
                return None
        wd = inotify.libc()[1].inotify_add_watch(fd, os.fsencode(folder), inotify.IN_CLOSE_WRITE | inotify.IN_MOVED_TO)
        if wd < 0:
            with _idle_lock:
                _idle.append(fd)
            return None
        return cls(fd, wd)

    def release(self) -> None:
        """Remove the watch and keep the instance, its queue drained: what is read from it next is
        about the next launch's folder only (the removal's own IN_IGNORED event is drained too)."""
        inotify.libc()[1].inotify_rm_watch(self.fd, self.wd)
        inotify.drain(self.fd)
        with _idle_lock:
            _idle.append(self.fd)


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when ``pid`` exits (pidfd_open(2), Linux 5.3)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
