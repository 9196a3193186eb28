"""systemd's notify protocol, spoken by the real daemon to a real socket: the test plays the service
manager. It binds a unix datagram socket, starts the daemon with ``NOTIFY_SOCKET`` (and
``WATCHDOG_USEC``, as ``WatchdogSec=`` makes systemd set it) pointing at it, and reads what arrives:
``READY=1`` once the first pass is over, then ``WATCHDOG=1`` at half the watchdog interval,
``STATUS=`` lines, and ``STOPPING=1`` on SIGTERM. No systemd is needed, and none is faked beyond
the socket it would own."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from reconciler.daemon import sdnotify

from .conftest import http, wait_for


class Manager:
    """The service manager's end: a bound datagram socket and every message received, with its time."""

    def __init__(self, address: str):
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(b"\0" + address[1:].encode() if address.startswith("@") else address)
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, list[str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except (socket.timeout, OSError):
                continue
            self.messages.append((time.monotonic(), data.decode().split("\n")))

    def lines(self) -> list[str]:
        return [line for _, m in list(self.messages) for line in m]

    def index(self, line: str) -> int | None:
        return next((i for i, (_, m) in enumerate(list(self.messages)) if line in m), None)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def manager(tmp_path: Path):
    m = Manager(str(tmp_path / "notify.sock"))
    yield m
    m.close()


def test_ready_after_the_first_pass_then_watchdog_pings(world, manager):
    world.add_spec("hello")  # the first pass launches it
    d = world.start(world.clone("daemon"), NOTIFY_SOCKET=manager.address, WATCHDOG_USEC="1000000")

    def ready_seen():
        return manager.index("READY=1") is not None

    wait_for(ready_seen, timeout=30, what="READY=1")
    # READY=1 comes after the first pass: the run it launched exists, and the HTTP endpoint answers.
    assert world.workspaces() == ["hello-g1-a1"]
    assert http("GET", d.url + "/healthz")[0] == 200
    ready = manager.index("READY=1")
    assert all("WATCHDOG=1" not in m for _, m in manager.messages[:ready]), "pings before READY=1"

    # WATCHDOG_USEC=1 s: a ping every 0.5 s.
    wait_for(lambda: manager.lines().count("WATCHDOG=1") >= 4, timeout=10, what="four WATCHDOG=1")
    pings = [t for t, m in manager.messages if "WATCHDOG=1" in m]
    gaps = [b - a for a, b in zip(pings, pings[1:])]
    assert 0.3 < sorted(gaps)[len(gaps) // 2] < 0.8, gaps  # every half interval
    assert "STATUS=healthy" in manager.lines()

    # What the daemon starts must not inherit the socket that speaks for it.
    pid = world.pid_of("hello-g1-a1")
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert not [v for v in env if v.split(b"=")[0] in (b"NOTIFY_SOCKET", b"WATCHDOG_USEC", b"WATCHDOG_PID")]

    d.proc.terminate()
    assert d.proc.wait(timeout=30) == 0
    assert "STOPPING=1" in manager.lines()
    assert d.logged("daemon stopped")


def test_abstract_socket_and_no_watchdog_without_watchdog_usec(world):
    m = Manager(f"@reconciler-test-{uuid.uuid4().hex}")  # the abstract namespace, as systemd uses too
    try:
        d = world.start(world.clone("daemon"), listen=False, NOTIFY_SOCKET=m.address)
        wait_for(lambda: m.index("READY=1") is not None, timeout=30, what="READY=1 on an abstract socket")
        time.sleep(1.0)
        assert "WATCHDOG=1" not in m.lines()
        d.proc.terminate()
        assert d.proc.wait(timeout=30) == 0
    finally:
        m.close()


def test_without_notify_socket_nothing_is_sent_and_nothing_breaks(world):
    d = world.start(world.clone("daemon"), listen=False, WATCHDOG_USEC="1000000")
    wait_for(lambda: d.logged("daemon started"), timeout=20, what="the daemon")
    d.proc.terminate()
    assert d.proc.wait(timeout=30) == 0


# ---------------------------------------------------------------- the module on its own


def test_from_environ_reads_and_removes_the_variables(manager):
    env = {"NOTIFY_SOCKET": manager.address, "WATCHDOG_USEC": "3000000", "WATCHDOG_PID": str(os.getpid()),
           "OTHER": "1"}
    n = sdnotify.Notifier.from_environ(env)
    assert env == {"OTHER": "1"}
    assert n.enabled and n.watchdog_period == 1.5
    assert n.ready("first pass done\nsecond line") and n.watchdog() and n.stopping()
    wait_for(lambda: len(manager.messages) == 3, timeout=5, what="three messages")
    assert [m for _, m in manager.messages] == [["READY=1", "STATUS=first pass done second line"], ["WATCHDOG=1"],
                                                ["STOPPING=1"]]
    n.close()


def test_watchdog_pid_of_another_process_means_no_watchdog(manager):
    n = sdnotify.Notifier.from_environ({"NOTIFY_SOCKET": manager.address, "WATCHDOG_USEC": "1000000",
                                        "WATCHDOG_PID": str(os.getpid() + 1)})
    assert n.enabled and n.watchdog_period is None


def test_no_manager_is_a_no_op_and_a_gone_one_never_raises(tmp_path):
    assert sdnotify.Notifier.from_environ({}).notify("READY=1") is False
    gone = sdnotify.Notifier(str(tmp_path / "nobody-listens.sock"), 1_000_000)
    assert gone.watchdog() is False and gone.ready() is False


def test_watchdog_thread_pings_only_while_alive(manager):
    n = sdnotify.Notifier(manager.address, 200_000)  # 0.2 s: a ping every 0.1 s
    alive = threading.Event()
    alive.set()
    w = sdnotify.Watchdog(n, alive.is_set)
    w.start()
    try:
        wait_for(lambda: any(line.startswith("EXTEND_TIMEOUT_USEC=") for line in manager.lines()), timeout=5,
                 what="EXTEND_TIMEOUT_USEC before READY=1")
        assert "WATCHDOG=1" not in manager.lines()
        n.ready()
        wait_for(lambda: manager.lines().count("WATCHDOG=1") >= 3, timeout=5, what="pings after READY=1")
        alive.clear()  # the loop is stuck: the pings stop, and systemd would kill the service
        time.sleep(0.3)
        before = manager.lines().count("WATCHDOG=1")
        time.sleep(0.5)
        assert manager.lines().count("WATCHDOG=1") == before
        alive.set()
        wait_for(lambda: manager.lines().count("WATCHDOG=1") > before, timeout=5, what="pings again")
    finally:
        w.stop()
        n.close()
