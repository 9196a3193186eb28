"""systemd's readiness and watchdog protocol (``sd_notify(3)``), without a dependency.

The protocol is one datagram per message on the unix socket named by ``$NOTIFY_SOCKET`` (a path,
or ``@name`` for the abstract namespace): newline-separated ``KEY=VALUE`` lines such as
``READY=1``, ``WATCHDOG=1``, ``STATUS=...``, ``STOPPING=1``, ``EXTEND_TIMEOUT_USEC=...``.
Outside systemd (no ``$NOTIFY_SOCKET``) every call is a no-op, so the daemon runs the same way
by hand, in tests and under any other supervisor.

With ``WatchdogSec=`` in the unit, systemd sets ``$WATCHDOG_USEC`` (and ``$WATCHDOG_PID``) and
kills the service (then ``Restart=`` starts it again) when no ``WATCHDOG=1`` arrived within
that time. ``Watchdog`` sends them from a thread of its own, every half of it, for as long as
``alive()`` says the daemon's loop is turning: a process that is wedged sends nothing (the
thread cannot run), and neither does one whose loop has been stuck in a step for longer than
the daemon allows (see ``STUCK_AFTER`` in service.py).

The variables are removed from the environment when read, as ``sd_notify(unset_environment=1)``
does: the processes the daemon starts (git, ssh, the runs on this machine) must not inherit a
socket that speaks for the daemon.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Callable, MutableMapping

log = logging.getLogger("reconciler.sdnotify")

VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


class Notifier:
    """Sends messages to the service manager; does nothing when there is none."""

    def __init__(self, address: str | None, watchdog_usec: int | None = None):
        self.address = address or None
        self.watchdog_usec = watchdog_usec if address and watchdog_usec and watchdog_usec > 0 else None
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._warned = False
        self.ready_sent = False

    @classmethod
    def from_environ(cls, environ: MutableMapping[str, str] | None = None, unset: bool = True) -> "Notifier":
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET") or None
        usec: int | None = None
        raw_usec, raw_pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
        # WATCHDOG_PID names the process the watchdog is for; a child that inherited it is not.
        if raw_usec.isdigit() and (not raw_pid or (raw_pid.isdigit() and int(raw_pid) == os.getpid())):
            usec = int(raw_usec)
        if unset:
            for k in VARIABLES:
                env.pop(k, None)
        return cls(address, usec)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    @property
    def watchdog_period(self) -> float | None:
        """Seconds between two WATCHDOG=1: half the timeout, as sd_watchdog_enabled(3) advises."""
        return self.watchdog_usec / 2e6 if self.watchdog_usec else None

    def _target(self) -> str | bytes:
        assert self.address is not None
        if self.address.startswith("@"):  # abstract namespace: a leading NUL instead of the '@'
            return b"\0" + self.address[1:].encode()
        return self.address

    def notify(self, *lines: str) -> bool:
        """Send one message made of ``lines``; True when it was sent. Never raises."""
        if self.address is None or not lines:
            return False
        data = "\n".join(lines).encode()
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.sendto(data, self._target())
                return True
            except OSError as e:
                if not self._warned:  # once: a manager that went away is not worth a line per ping
                    self._warned = True
                    log.warning("sd_notify: cannot reach the service manager",
                                extra={"fields": {"socket": self.address, "error": str(e)}})
                return False

    def ready(self, status: str | None = None) -> bool:
        self.ready_sent = True
        return self.notify("READY=1", *(["STATUS=" + " ".join(status.split("\n"))] if status else []))

    def status(self, text: str) -> bool:
        return self.notify("STATUS=" + " ".join(text.split("\n")))  # one line: a message is KEY=VALUE lines

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def extend_timeout(self, seconds: float) -> bool:
        return self.notify(f"EXTEND_TIMEOUT_USEC={int(seconds * 1e6)}")

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


class Watchdog:
    """A thread that keeps the service manager's watchdog fed while ``alive()`` is true.

    Before ``READY=1`` it sends ``EXTEND_TIMEOUT_USEC`` instead: a first pass over a large fleet
    may take longer than ``TimeoutStartSec=``, and is allowed to as long as it is alive."""

    def __init__(self, notifier: Notifier, alive: Callable[[], bool]):
        self.notifier = notifier
        self.alive = alive
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sent = 0

    def start(self) -> None:
        period = self.notifier.watchdog_period
        if period is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, args=(period,), name="reconciler-watchdog", daemon=True)
        self._thread.start()

    def _run(self, period: float) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            if self.alive():
                if self.notifier.ready_sent:
                    self.notifier.watchdog()
                else:
                    self.notifier.extend_timeout(4 * period)
                self.sent += 1
            self._stop.wait(max(0.0, period - (time.monotonic() - t0)))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
