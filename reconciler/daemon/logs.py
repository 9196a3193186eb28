"""Logging for the daemon and the command line: one stderr handler, text or JSON, journald priorities.

It is its own module because every other part of the daemon logs through ``event``, and the command
line sets up the same handler for its long-running commands; keeping it apart from the loop keeps the
format (which log shippers and ``journalctl -p`` depend on) in one place.

One handler on the root logger, so the records of libraries (paramiko, git, warnings)
come out in the same format as ours: with ``log_format: json`` every line on stderr is one JSON
object, which is what a log shipper that parses the journal needs. In text format, when stderr is
the journal (``$JOURNAL_STREAM`` names stderr's device and inode, as systemd sets it), each line
starts with its syslog priority, ``<3>`` to ``<7>``: journald strips it and files the line under
that priority, so ``journalctl -p warning`` works.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from datetime import datetime, timezone

log = logging.getLogger("reconciler.daemon")


# The keys every JSON line has (exc and stack when the record carries them). A structured field
# with one of these names is kept as "field_<name>": renaming it keeps both the envelope and the data.
ENVELOPE = ("ts", "level", "msg", "logger", "exc", "stack")
FIELD_PREFIX = "field_"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, msg, logger, then the record's structured fields.

    Records from any logger come here (the handler is on the root logger): a library's message is
    ``msg``, its logger's name ``logger``, and a traceback ``exc``, all inside the one object, so
    a multi-line message or traceback never breaks the one-object-per-line contract."""

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        data = {"ts": ts, "level": record.levelname.lower(), "msg": record.getMessage(), "logger": record.name}
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for k, v in fields.items():
                key = str(k)
                while key in data or key in ENVELOPE:  # never drop a field, never overwrite the envelope
                    key = FIELD_PREFIX + key
                data[key] = v
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            data["stack"] = self.formatStack(record.stack_info)
        return json.dumps(data, default=str, ensure_ascii=False)


# syslog priorities (sd-daemon(3)'s SD_ERR ... SD_DEBUG), for the "<N>" prefix journald understands.
PRIORITIES = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6))


def syslog_priority(levelno: int) -> int:
    return next((p for lv, p in PRIORITIES if levelno >= lv), 7)


def stderr_is_journal() -> bool:
    """Whether stderr is connected to journald: ``$JOURNAL_STREAM`` ("DEVICE:INODE", set by systemd
    for a service whose output goes to the journal) names the file stderr is. A process that
    inherited the variable but writes elsewhere (redirected, piped into another program) does not match."""
    dev, _, ino = os.environ.get("JOURNAL_STREAM", "").partition(":")
    try:
        st = os.fstat(sys.stderr.fileno())
        return dev.isdigit() and ino.isdigit() and (st.st_dev, st.st_ino) == (int(dev), int(ino))
    except (OSError, ValueError, AttributeError):
        return False


class TextFormatter(logging.Formatter):
    def __init__(self, journal: bool = False):
        super().__init__()
        self.journal = journal  # prefix every line with "<priority>" for journald

    def format(self, record: logging.LogRecord) -> str:
        line = self._format(record)
        if self.journal:  # every line of a traceback too: journald reads the stream line by line
            prefix = f"<{syslog_priority(record.levelno)}>"
            line = "\n".join(prefix + part for part in line.split("\n"))
        return line

    def _format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        # Our own lines need no logger name; a library's does (which one complained matters).
        who = "" if record.name == "reconciler" or record.name.startswith("reconciler.") else f"[{record.name}] "
        line = f"{ts} {record.levelname:<7} {who}{record.getMessage()}"
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for k, v in fields.items():
                if isinstance(v, (list, dict)):
                    v = json.dumps(v, default=str, ensure_ascii=False)
                line += f" {k}={v}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


_HANDLER: logging.Handler | None = None


def _writes_to_stderr(h: logging.Handler) -> bool:
    return type(h) is logging.StreamHandler and getattr(h, "stream", None) in (sys.stderr, sys.__stderr__)


def setup_logging(fmt: str) -> None:
    """Route every logger, ours and every library's, to one stderr handler with one format.

    The handler sits on the root logger, so a library's records (paramiko's transport errors,
    ``warnings.warn`` through ``py.warnings``) are formatted like ours instead of being
    printed raw by Python's last-resort handler. Libraries log at WARNING and above (their INFO
    is chatter such as paramiko's "Connected (version ...)"); ``reconciler.*`` at
    ``RECONCILER_LOG_LEVEL``. Other plain stderr handlers already installed are removed, so no
    line is printed twice. Uncaught exceptions, in the main thread or another, are logged too.
    Called again (SIGHUP), it only changes the format and the level.
    """
    global _HANDLER
    root = logging.getLogger()
    ours = logging.getLogger("reconciler")
    if _HANDLER is None:
        for lg in [root, *(x for x in root.manager.loggerDict.values() if isinstance(x, logging.Logger))]:
            for h in list(lg.handlers):
                if _writes_to_stderr(h):
                    lg.removeHandler(h)
        _HANDLER = logging.StreamHandler(sys.stderr)
        root.addHandler(_HANDLER)
        ours.propagate = True  # through the root's handler, once
        logging.captureWarnings(True)  # warnings.warn → the py.warnings logger → this handler
        sys.excepthook = _log_uncaught
        threading.excepthook = _log_uncaught_in_thread
    _HANDLER.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter(journal=stderr_is_journal()))
    level = getattr(logging, os.environ.get("RECONCILER_LOG_LEVEL", "INFO").upper(), logging.INFO)
    if not isinstance(level, int):
        level = logging.INFO
    ours.setLevel(level)
    root.setLevel(max(level, logging.WARNING))


def _log_uncaught(exc_type, exc, tb) -> None:
    if issubclass(exc_type, KeyboardInterrupt):
        sys.__excepthook__(exc_type, exc, tb)
        return
    log.critical("uncaught exception", exc_info=(exc_type, exc, tb))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if issubclass(args.exc_type, SystemExit):
        return
    log.error("uncaught exception in a thread", exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
              extra={"fields": {"thread": args.thread.name if args.thread is not None else None}})


def event(level: int, msg: str, /, **fields) -> None:
    """A structured log line. Any field name is allowed (``level``, ``msg`` and ``ts`` too: in JSON
    they are written as ``field_level`` and so on, beside the envelope's own keys)."""
    log.log(level, msg, extra={"fields": fields})

