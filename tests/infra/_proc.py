"""Small process helpers shared by the sshd and dockerd test servers.

Both servers fork children that outlive a plain ``Popen.terminate()`` of the parent (sshd's
per-connection processes, dockerd's containerd).  To end exactly what we started, and nothing that
merely has the same name, we walk the process tree by parent pid from ``/proc`` and signal those pids.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from typing import Callable, Iterable


def descendants(pid: int) -> list[int]:
    """Return the pids of all live descendants of ``pid`` (children first, breadth-first)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # The command name may contain spaces and parentheses: the ppid follows the last ')'.
        fields = stat[stat.rindex(b")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    queue = [pid]
    while queue:
        for child in children.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def process_name(pid: int) -> str:
    """Return the short command name of ``pid`` ("" when it is gone)."""
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (None when it is gone).

    Together with the pid it identifies a process across pid reuse.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 :].split()[0] != b"Z"


def signal_pids(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def end_pids(pids: Iterable[int], timeout: float = 5.0) -> None:
    """SIGTERM ``pids``, then SIGKILL whatever is still alive after ``timeout`` seconds."""
    pids = list(pids)
    signal_pids(pids, signal.SIGTERM)
    if not wait_until(lambda: not any(alive(p) for p in pids), timeout, raise_on_timeout=False):
        signal_pids([p for p in pids if alive(p)], signal.SIGKILL)
        wait_until(lambda: not any(alive(p) for p in pids), 2.0, raise_on_timeout=False)


def wait_until(
    condition: Callable[[], bool],
    timeout: float,
    interval: float = 0.02,
    what: str = "condition",
    raise_on_timeout: bool = True,
) -> bool:
    """Poll ``condition`` until it is true or ``timeout`` seconds pass (backing off to 0.2 s)."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            if raise_on_timeout:
                raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {what}")
            return False
        time.sleep(interval)
        interval = min(interval * 1.5, 0.2)


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True if a TCP connection to ``host:port`` succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
