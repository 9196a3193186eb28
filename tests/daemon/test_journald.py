"""Text logs to the journal carry their syslog priority: when stderr is the stream systemd connected
to journald (``$JOURNAL_STREAM`` = its device and inode), each line starts with ``<N>``, which
journald strips and files as the line's priority. The test gives the real daemon what systemd
gives it, a unix stream socket as stderr and that socket's device:inode in ``$JOURNAL_STREAM``,
and reads the lines journald would read."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading

from reconciler.daemon.logs import TextFormatter, syslog_priority

from .conftest import ROOT, Daemon, git, wait_for


def start(world, clone, journal_stream: str | None):
    """The daemon with stderr on a socket, as under systemd; returns (process, a function → the lines so far)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    st = os.fstat(theirs.fileno())
    env = world.env(RECONCILER_LOG_FORMAT="text", RECONCILER_POLL_INTERVAL="300")
    env["JOURNAL_STREAM"] = journal_stream if journal_stream is not None else f"{st.st_dev}:{st.st_ino}"
    proc = subprocess.Popen([sys.executable, "-m", "reconciler", "--repo", str(clone)], cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=theirs.fileno())
    theirs.close()
    buf = bytearray()

    def read() -> None:
        while chunk := ours.recv(65536):
            buf.extend(chunk)

    threading.Thread(target=read, daemon=True).start()
    world.daemons.append(Daemon(proc, world.tmp / "no-log", None))  # killed at teardown like the others
    return proc, lambda: buf.decode(errors="replace").splitlines()


def test_text_lines_carry_their_priority_when_stderr_is_the_journal(world):
    clone = world.clone("daemon")
    git(clone, "remote", "remove", "origin")  # a warning at start: "no git remote"
    proc, lines = start(world, clone, None)
    wait_for(lambda: any("daemon started" in line for line in lines()), timeout=20, what="daemon started")
    proc.terminate()
    assert proc.wait(timeout=30) == 0
    got = lines()
    assert got and all(line[:3] in ("<2>", "<3>", "<4>", "<6>", "<7>") for line in got), got
    assert any(line.startswith("<4>") and "no git remote" in line for line in got), got
    assert any(line.startswith("<6>") and "daemon started" in line for line in got), got


def test_no_prefix_when_journal_stream_names_another_file(world):
    proc, lines = start(world, world.clone("daemon"), "1:2")  # inherited, but stderr is not that stream
    wait_for(lambda: any("daemon started" in line for line in lines()), timeout=20, what="daemon started")
    proc.terminate()
    assert proc.wait(timeout=30) == 0
    assert not [line for line in lines() if line.startswith("<")], lines()


def test_every_line_of_a_traceback_is_prefixed():
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        rec = logging.LogRecord("reconciler.daemon", logging.ERROR, __file__, 1, "pass failed", None, sys.exc_info())
    text = TextFormatter(journal=True).format(rec)
    assert len(text.splitlines()) > 3 and all(line.startswith("<3>") for line in text.splitlines()), text
    assert not TextFormatter().format(rec).startswith("<")
    assert [syslog_priority(lv) for lv in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR,
                                           logging.CRITICAL)] == [7, 6, 4, 3, 2]
