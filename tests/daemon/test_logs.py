"""With log_format json, every line the daemon writes to stderr is one JSON object, whoever logged
it: our loggers, paramiko (a real SSH transport against a port that does not speak SSH), a library
logger, ``warnings.warn``, an uncaught exception in a thread. Fields whose names clash with the
envelope (ts, level, msg, logger, exc) are kept as ``field_<name>``."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading

import pytest

from .conftest import ROOT, wait_for


@pytest.fixture
def not_ssh():
    """A TCP port that answers every connection with a line that is not an SSH banner, then hangs up."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                try:
                    conn.sendall(b"220 this is not ssh\r\n")
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        t.join(timeout=5)
        srv.close()


def parse_every_line(text: str) -> list[dict]:
    events = []
    for n, line in enumerate(text.splitlines(), 1):
        try:
            obj = json.loads(line)
        except ValueError:
            raise AssertionError(f"line {n} is not JSON: {line!r}\n--- all of it:\n{text}") from None
        assert isinstance(obj, dict) and {"ts", "level", "msg", "logger"} <= set(obj), line
        events.append(obj)
    return events


def test_daemon_json_logs_paramiko_errors_as_json_lines(world, not_ssh):
    world.add_unanswering_machine("box", not_ssh)
    d = world.start(world.clone("daemon"), RECONCILER_SSH_CONNECT_TIMEOUT="2")
    d.wait_ready()
    # paramiko's transport thread logs the failed handshake, traceback included, on its own logger.
    wait_for(lambda: any(e.get("logger", "").startswith("paramiko") for e in d.events()), timeout=30,
             what="paramiko's error in the log")
    d.proc.terminate()
    assert d.proc.wait(timeout=20) == 0
    events = parse_every_line(d.text())
    theirs = [e for e in events if e["logger"].startswith("paramiko")]
    assert theirs and all(e["level"] == "error" for e in theirs)
    assert any("Error reading SSH protocol banner" in e["msg"] for e in theirs)
    assert d.logged("daemon started") and d.logged("daemon stopped")


SCRIPT = r"""
import logging, socket, sys, threading, warnings
logging.basicConfig()  # a stray stderr handler installed before ours: must not print lines twice
from reconciler.daemon.logs import event, setup_logging
setup_logging("json")
setup_logging("json")  # SIGHUP calls it again: still one handler
warnings.simplefilter("always")

event(logging.WARNING, "clash", ts="user-ts", level="user-level", msg="user-msg", logger="user-logger",
      exc="user-exc", field_ts="user-field-ts", plain=1)
warnings.warn("a library's deprecation", DeprecationWarning)
logging.getLogger("urllib3.connectionpool").warning("Retrying (%d) after a broken connection", 2)
logging.getLogger("chatty.lib").info("chatter under WARNING is left out")
try:
    raise ValueError("boom\nsecond line")
except ValueError:
    logging.getLogger("some.lib").exception("failed with a traceback")
t = threading.Thread(target=lambda: 1 / 0, name="worker")
t.start()
t.join()

import paramiko
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
tr = paramiko.Transport(sock)
try:
    tr.start_client(timeout=5)
except paramiko.SSHException:
    pass
tr.close()
event(logging.INFO, "done")
"""


def test_setup_logging_json_covers_every_logger_and_keeps_clashing_fields(not_ssh, tmp_path):
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(not_ssh)], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
    assert p.stdout == ""
    events = parse_every_line(p.stderr)
    by_msg = {e["msg"]: e for e in events}

    clash = by_msg["clash"]
    assert clash["level"] == "warning" and clash["logger"] == "reconciler.daemon" and clash["ts"] != "user-ts"
    assert (clash["field_ts"], clash["field_level"], clash["field_msg"], clash["field_logger"], clash["field_exc"]) \
        == ("user-ts", "user-level", "user-msg", "user-logger", "user-exc")
    assert clash["field_field_ts"] == "user-field-ts" and clash["plain"] == 1

    loggers = {e["logger"] for e in events}
    assert {"py.warnings", "urllib3.connectionpool", "some.lib", "reconciler.daemon"} <= loggers
    assert any("paramiko" in x for x in loggers), loggers
    assert "chatter under WARNING is left out" not in by_msg
    assert "a library's deprecation" in next(e["msg"] for e in events if e["logger"] == "py.warnings")
    assert "boom\nsecond line" in by_msg["failed with a traceback"]["exc"]
    crash = by_msg["uncaught exception in a thread"]
    assert crash["thread"] == "worker" and "ZeroDivisionError" in crash["exc"]
    assert [e["msg"] for e in events].count("done") == 1 and [e["msg"] for e in events].count("clash") == 1
