"""The daemon: ``reconcile [--repo DIR]`` without ``--once``. Watch, resync, pull and push.

One thread runs passes, so passes never overlap; every other thread (the file watcher, the HTTP
server, signal handlers) only records *why* a pass is wanted and wakes the loop. The loop wakes for:

- a local change under ``specs/`` or ``execution_templates/`` (watchfiles, debounced): a pass;
- the poll timer (``poll_interval``) or a signed webhook (``POST /hooks/git``): a fetch, and a pass
  when the remote branch moved;
- the resync timer (``resync_interval``): a pass, to follow running work;
- the soonest ``retry_after`` the last plan asked for (a backoff ending): a pass.

Git is the only durable state. Before a pass the tracked branch is fetched and fast-forwarded; the
daemon's own unpushed status commits are rebased onto it (never a merge commit). After a pass the
status commit is pushed, with bounded retries: a rejected push fetches, rebases and tries again.
A crash at any moment loses nothing that matters: a transition whose commit never reached the
remote is derived again by the next pass, on this checkout or on a fresh clone elsewhere, from
what the machines report (the plan adopts a running instance it has no status for).

Signals: SIGTERM and SIGINT finish the current pass, push, and exit 0 (a second one exits at
once, which is as safe as a crash); SIGHUP re-reads the configuration file.

Health: a daemon whose process is up can still be useless (the remote unreachable, a push that
keeps failing, passes that keep raising). ``/healthz`` therefore answers from the record of the
last fetches, pushes and passes (``Metrics.tracks``): 503, naming what fails, once one of them
failed ``health_max_failures`` times in a row or the last good pass is older than
``health_max_pass_age``; 200 again as soon as they succeed. A single failure is not an outage
(a fetch that times out once is retried at the next poll), hence the threshold.

Logging: one handler on the root logger, so the records of libraries (paramiko, git, warnings)
come out in the same format as ours: with ``log_format: json`` every line on stderr is one JSON
object, which is what a log shipper that parses the journal needs. In text format, when stderr is
the journal (``$JOURNAL_STREAM`` names stderr's device and inode, as systemd sets it), each line
starts with its syslog priority, ``<3>`` to ``<7>``: journald strips it and files the line under
that priority, so ``journalctl -p warning`` works.

systemd (``Type=notify``, sdnotify.py): ``READY=1`` once the first pass is over (the HTTP endpoint
is up by then), ``STATUS=`` when the health verdict changes, ``STOPPING=1`` on the way out, and,
with ``WatchdogSec=``, ``WATCHDOG=1`` from a thread of its own while the loop is alive: it turns
at least every ``STUCK_AFTER / 2`` seconds when idle, and a pass or fetch it is inside may last
up to ``STUCK_AFTER`` (every remote operation has a deadline well under that).

Seams for the crash-safety tests: ``_after_commit`` (a pass made its local status commit, not
pushed yet) and ``_before_push`` do nothing here; tests/faults.py replaces them to kill the
daemon at that point or hold its push while the test moves the remote.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from reconciler.core import config as configs
from reconciler.gitops import repo as gitops
from . import sdnotify
from reconciler.status import store as statuses
from reconciler.core.runstatus import PHASES
from reconciler.core.actions import Action
from reconciler.core.errors import ReconcilerError, UsageError
from .metrics import KINDS, Metrics

log = logging.getLogger("reconciler.daemon")

WATCHED = ("specs", "execution_templates")
MIN_WAKE = 0.2  # never spin: the shortest sleep between two passes asked for by retry_after
# The loop counts as stuck (and the systemd watchdog is left to fire) when one step of it, a pass
# with its push or a fetch, has lasted this long: each SSH command has a deadline (collecting
# artifacts at most 10 minutes), each git command 2 minutes.
STUCK_AFTER = 3600.0


def _after_commit() -> None:
    """Does nothing: a seam for the crash-safety tests (tests/faults.py replaces it with a kill),
    between a pass's local status commit and its push."""


def _before_push() -> None:
    """Does nothing: a seam for the crash-safety tests (tests/faults.py replaces it with a wait),
    before each push of status commits."""


# ---------------------------------------------------------------- logging


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
    GitPython, ``warnings.warn`` through ``py.warnings``) are formatted like ours instead of being
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


def release_memory() -> None:
    """Return freed heap to the OS after a pass (glibc keeps it otherwise: RSS would stay at the peak
    of the largest pass, such as the first one over a large tree)."""
    import gc

    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


# ---------------------------------------------------------------- the daemon


class Daemon:
    def __init__(self, cfg: configs.Config, config_path: str | None = None, flags: dict | None = None):
        from reconciler.engine.loop import Reconciler

        # First: takes NOTIFY_SOCKET and WATCHDOG_* out of the environment before any child is started.
        self.notify = sdnotify.Notifier.from_environ()
        self._beat = time.monotonic()  # the loop's last turn, for the watchdog
        self._sd_status: str | None = None
        self.cfg = cfg
        self.config_path = config_path
        self.flags = dict(flags or {})
        self.rec = Reconciler(cfg, keep_connections=True)  # SSH connections kept from pass to pass
        self.metrics = Metrics()
        self.wake = threading.Event()
        self._flags_lock = threading.Lock()
        self._want_fetch = False
        self._want_pass: set[str] = set()
        self._stopping = False
        self._reload = False
        self._signals = 0
        self._stop_watch = threading.Event()
        self.remote: gitops.Remote | None = None
        self.server = None
        self.dashboard = None  # the read-only live page (dashboard_listen), when configured
        self.in_pass = False
        self.pending_rebase_pass = False
        self._failing: tuple[str, ...] | None = None  # what failed at the last look (None: still starting)

    # -------- requests from other threads (and signal handlers)

    def request(self, fetch: bool = False, why: str | None = None) -> None:
        with self._flags_lock:
            if fetch:
                self._want_fetch = True
            if why:
                self._want_pass.add(why)
        self.wake.set()

    def _take(self) -> tuple[bool, set[str]]:
        with self._flags_lock:
            fetch, why = self._want_fetch, self._want_pass
            self._want_fetch, self._want_pass = False, set()
        return fetch, why

    def _on_signal(self, signum: int, frame) -> None:  # noqa: ARG002
        if signum == signal.SIGHUP:
            self._reload = True
            self.wake.set()
            return
        self._signals += 1
        if self._signals > 1:
            event(logging.WARNING, "second signal: exiting now; the next start derives status again",
                  signal=signal.Signals(signum).name)
            os._exit(1)
        self._stopping = True
        self._stop_watch.set()
        self.wake.set()

    # -------- git

    def _setup_remote(self) -> None:
        cfg = self.cfg
        url = gitops.run_git(cfg.repo, "config", "--get", f"remote.{cfg.remote}.url", check=False).stdout.strip()
        if not url:
            event(logging.WARNING, "no git remote: running without fetch or push", remote=cfg.remote)
            self.remote = None
            return
        branch = cfg.branch or gitops.current_branch(cfg.repo)
        if not branch:
            raise UsageError(f"{cfg.repo}: HEAD is detached; check out a branch or set 'branch' in the configuration")
        self.remote = gitops.Remote(cfg.repo, cfg.remote, branch, gitops.Author(cfg.author_name, cfg.author_email))

    def fetch_and_integrate(self) -> bool:
        """Fetch the tracked branch and bring HEAD up to it. Return whether HEAD moved."""
        if self.remote is None:
            return False
        t0 = time.perf_counter()
        try:
            upstream = self.remote.fetch()
        except gitops.GitError as e:
            self.metrics.outcome("fetch", False, time.time(), str(e))
            event(logging.WARNING, "fetch failed; reconciling the local checkout", error=str(e),
                  failures=self.metrics.tracks["fetch"].consecutive_failures)
            return False
        if upstream is None:
            self.metrics.outcome("fetch", True, time.time())
            return False
        try:
            res = self.remote.integrate()
        except gitops.GitError as e:
            # Fetched, but the checkout still shows the old state: as bad as a failed fetch.
            self.metrics.outcome("fetch", False, time.time(), f"could not update the checkout from the remote: {e}")
            event(logging.ERROR, "could not update the checkout from the remote", error=str(e),
                  failures=self.metrics.tracks["fetch"].consecutive_failures)
            return False
        self.metrics.outcome("fetch", True, time.time())
        if res.action == "reset":
            self.metrics.inc("rebase_resets")
            event(logging.WARNING, "rebasing status commits onto the remote failed: took the remote's status/; "
                  "the next pass derives status again from what it observes", error=res.error)
        if res.moved:
            event(logging.INFO, "updated from remote", action=res.action, head=(res.head_after or "")[:12],
                  upstream=(res.upstream or "")[:12], seconds=round(time.perf_counter() - t0, 3))
        return res.moved

    def push(self) -> bool:
        """Push unpushed status commits; on rejection fetch, rebase and retry (bounded, with backoff)."""
        if self.remote is None or not self.cfg.push:
            return True
        retries = max(0, self.cfg.push_retries)
        for attempt in range(retries + 1):
            if self.remote.ahead() == 0:
                return True
            _before_push()
            try:
                self.remote.push()
                self.metrics.outcome("push", True, time.time())
                event(logging.INFO, "pushed status", head=(gitops.head(self.rec.repo) or "")[:12],
                      branch=self.remote.branch, retries=attempt)
                return True
            except gitops.PushRejected as e:
                if attempt >= retries:
                    self.metrics.outcome("push", False, time.time(), f"rejected after {attempt} retries: {e}")
                    event(logging.ERROR, "push rejected; giving up until the next pass", error=str(e),
                          retries=attempt, failures=self.metrics.tracks["push"].consecutive_failures)
                    return False
                self.metrics.inc("push_retries")
                delay = min(0.1 * 2 ** attempt, 5.0)
                event(logging.INFO, "push rejected: the remote moved; rebasing and retrying", retry=attempt + 1,
                      delay=delay)
                time.sleep(delay)
                if self.fetch_and_integrate():
                    # New commits from the remote may change desired state: look again soon.
                    self.pending_rebase_pass = True
            except gitops.GitError as e:
                self.metrics.outcome("push", False, time.time(), str(e))
                event(logging.ERROR, "push failed; will retry after the next pass", error=str(e),
                      failures=self.metrics.tracks["push"].consecutive_failures)
                return False
        return False

    # -------- one cycle

    def run_pass(self, why: str) -> float | None:
        """One pass and its push; return the plan's retry_after (None: nothing to wake up for)."""
        t0 = time.time()
        self.in_pass = True
        try:
            result = self.rec.run_pass()
        except Exception as e:  # noqa: BLE001 - a failed pass is logged and retried, never fatal
            duration = time.time() - t0
            self.metrics.observe_pass(False, duration, time.time(), str(e))
            log.error("pass failed", exc_info=True, extra={"fields": {"why": why, "error": f"{type(e).__name__}: {e}",
                                                                      "duration": round(duration, 3)}})
            return None
        finally:
            self.in_pass = False
        if result.commit:
            _after_commit()
        self._account_plan(result)
        errors = [o for o in result.outcomes if not o.ok]
        summary = {a: n for a, n in result.plan.summary().items() if a != Action.NONE}
        fields = dict(why=why, duration=round(result.duration, 3), plan=summary, transitions=result.transitions,
                      written=len(result.written), commit=(result.commit or "")[:12] or None,
                      retry_after=result.retry_after)
        if errors:
            fields["errors"] = [f"{o.name}: {o.action}: {o.error}" for o in errors][:20]
        level = logging.INFO if (result.transitions or result.commit or errors or summary) else logging.DEBUG
        event(level, "pass", **fields)
        for d in result.desired.diagnostics[:20]:
            event(logging.DEBUG, "invalid spec", diagnostic=d.text())
        retry_after = result.retry_after
        del result  # the pass's desired, observed and plan are garbage now: give the memory back
        self._account_runs()
        release_memory()
        self.push()
        return retry_after

    def _account_plan(self, result) -> None:
        m = self.metrics
        m.observe_pass(True, result.duration, time.time())
        m.set_machines({name: obs.reachable for name, obs in result.world.machines.items()})
        for c in result.plan.changes:
            if c.action != Action.NONE:
                m.count("actions", c.action)
        for o in result.outcomes:
            if not o.ok:
                m.count("action_errors", o.action)

    def _account_runs(self) -> None:
        m = self.metrics
        phases = self.rec.phase_counts  # kept by the pass: settled runs are not re-read for a count
        m.set_runs({p: phases.get(p, 0) for p in PHASES})

    # -------- health

    def max_pass_age(self) -> float:
        """How old the last good pass may be; by default three resyncs, and never under a minute."""
        return self.cfg.health_max_pass_age or max(60.0, 3 * self.cfg.resync_interval)

    def health(self) -> tuple[bool, dict]:
        """The verdict of /healthz and its reasons (see the module docstring). Runs on the HTTP thread."""
        snap = self.metrics.snapshot()
        now = time.time()
        cfg = self.cfg
        limit = max(1, cfg.health_max_failures)
        stale_after = self.max_pass_age() + snap["last_duration"]  # a long pass is not a stale one
        remote = self.remote
        # Without a remote nothing is fetched or pushed; with push: false nothing is pushed.
        enabled = {"fetch": remote is not None, "push": remote is not None and cfg.push, "pass": True}
        checks: dict[str, dict] = {}
        problems: list[str] = []
        for kind in KINDS:
            t = snap["tracks"][kind]
            bad = enabled[kind] and t["consecutive_failures"] >= limit
            if bad:
                problems.append(f"{kind}: failed {t['consecutive_failures']} time(s) in a row "
                                f"(health_max_failures {limit}): {t['last_error']}")
            checks[kind] = {"ok": not bad, "enabled": enabled[kind],
                            "consecutive_failures": t["consecutive_failures"], "failures": t["failures"],
                            "last_success_at": t["last_success"] or None, "last_failure_at": t["last_failure"] or None,
                            "last_error": t["last_error"] or None}
        age = now - snap["last_good_pass"] if snap["last_good_pass"] else None
        if age is None:
            problems.append("pass: no pass has succeeded yet")
        elif age > stale_after:
            problems.append(f"pass: the last good pass ended {age:.0f}s ago (more than {stale_after:.0f}s)")
        checks["pass"].update(ok=checks["pass"]["ok"] and age is not None and age <= stale_after,
                              last_success_age_seconds=round(age, 3) if age is not None else None,
                              max_age_seconds=stale_after)
        failing = [k for k in KINDS if not checks[k]["ok"]]
        ok = not failing
        return ok, {"ok": ok, "failing": failing, "problems": problems, "checks": checks,
                    "health_max_failures": limit, "last_pass_at": snap["last_pass"] or None,
                    "last_good_pass_at": snap["last_good_pass"] or None,
                    "last_good_pass_age_seconds": round(age, 3) if age is not None else None,
                    "stale_after_seconds": stale_after, "last_error": snap["last_error"] or None,
                    "passes": snap["passes"], "in_pass": self.in_pass, "pid": os.getpid()}

    def _note_health(self) -> None:
        """Log when the verdict or what fails changes, so the journal says when an outage began,
        what it grew to, and when it ended."""
        ok, data = self.health()
        failing = tuple(data["failing"])
        status = "healthy" if ok else "unhealthy: " + "; ".join(data["problems"])[:400]
        if status != self._sd_status and self.notify.ready_sent:
            self._sd_status = status
            self.notify.status(status)
        if self._failing is None:
            if ok:  # not "unhealthy" while starting: that is what a first pass is for
                self._failing = ()
            return
        if failing != self._failing:
            was_ok, self._failing = not self._failing, failing
            if ok:
                event(logging.INFO, "healthy again")
            else:
                event(logging.WARNING, "unhealthy" if was_ok else "still unhealthy", failing=data["failing"],
                      problems=data["problems"])

    # -------- threads

    def _start_http(self) -> None:
        if not self.cfg.listen:
            return
        from . import httpd

        def on_push(info: dict) -> None:
            ref = info.get("ref") or ""
            tracked = f"refs/heads/{self.remote.branch}" if self.remote is not None else None
            if ref and tracked and ref != tracked:  # a push to another branch changes nothing here
                self.metrics.count("webhooks", "ignored")
                event(logging.INFO, "webhook: push to another branch; nothing to fetch", ref=ref)
                return
            self.metrics.count("webhooks", "accepted")
            event(logging.INFO, "webhook: fetching now", **{k: v for k, v in info.items() if v})
            self.request(fetch=True)

        def on_refused(why: str) -> None:
            self.metrics.count("webhooks", "refused")
            event(logging.WARNING, "webhook refused", reason=why)

        ep = httpd.Endpoints(self.health, lambda accept: self.metrics.render(accept, healthy=self.health()[0]),
                             on_push, lambda: self.cfg.webhook_secret, on_refused)
        try:
            self.server = httpd.make_server(self.cfg.listen, ep)
        except (OSError, ValueError) as e:
            raise UsageError(f"cannot listen on {self.cfg.listen}: {e}") from None
        httpd.serve_in_thread(self.server)
        host, port = self.server.server_address[:2]
        event(logging.INFO, "listening", address=f"{host}:{port}", webhook=bool(self.cfg.webhook_secret))

    def _start_dashboard(self) -> None:
        if not self.cfg.dashboard_listen:
            return
        from . import dashboard, httpd

        try:
            self.dashboard = dashboard.make_server(self.cfg.dashboard_listen,
                                                   dashboard.Views(self.cfg.repo, self.cfg.state_dir,
                                                                   [self.cfg.local_root]))
        except (OSError, ValueError) as e:
            raise UsageError(f"cannot listen on {self.cfg.dashboard_listen}: {e}") from None
        httpd.serve_in_thread(self.dashboard)
        host, port = self.dashboard.server_address[:2]
        event(logging.INFO, "dashboard listening", address=f"{host}:{port}")

    def _watch(self) -> None:
        from watchfiles import watch

        root = str(self.cfg.repo)
        prefixes = tuple(os.path.join(root, d) + os.sep for d in WATCHED)

        def wanted(change, path: str) -> bool:  # noqa: ARG001
            return path.startswith(prefixes) or path in (os.path.join(root, d) for d in WATCHED)

        try:
            for changes in watch(root, watch_filter=wanted, stop_event=self._stop_watch,
                                 debounce=max(1, int(self.cfg.debounce * 1000)), step=20, rust_timeout=1000,
                                 yield_on_timeout=False, raise_interrupt=False):
                rels = sorted({os.path.relpath(p, root) for _, p in changes})
                event(logging.DEBUG, "local change", paths=rels[:10], count=len(rels))
                self.request(why="local change")
        except Exception as e:  # noqa: BLE001 - without a watcher the timers still converge
            event(logging.ERROR, "file watcher stopped; relying on resync", error=str(e))

    # -------- reload

    def reload(self) -> None:
        try:
            cfg = configs.load(str(self.cfg.repo), self.config_path, self.flags)
        except UsageError as e:
            event(logging.ERROR, "SIGHUP: configuration not reloaded", error=str(e))
            return
        if cfg.listen != self.cfg.listen:
            event(logging.WARNING, "SIGHUP: 'listen' changed; it takes effect on restart", listen=self.cfg.listen)
            cfg = cfg.model_copy(update={"listen": self.cfg.listen})
        self.cfg = cfg
        self.rec.cfg = cfg
        self.rec._gpus = None
        setup_logging(cfg.log_format)
        try:
            self._setup_remote()
        except UsageError as e:
            event(logging.ERROR, "SIGHUP: remote not changed", error=str(e))
        event(logging.INFO, "configuration reloaded", config=cfg.redacted())

    # -------- the loop

    def run(self) -> int:
        from .lock import RepoLock

        lock = RepoLock(self.cfg.state_dir)
        lock.acquire()  # LockHeld (a UsageError) → exit 2 with the holder's pid
        old = {}
        watchdog = sdnotify.Watchdog(self.notify, lambda: time.monotonic() - self._beat < STUCK_AFTER)
        try:
            for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                old[s] = signal.signal(s, self._on_signal)
            self._setup_remote()
            self._start_http()
            self._start_dashboard()
            watcher = threading.Thread(target=self._watch, name="reconciler-watch", daemon=True)
            watcher.start()
            event(logging.INFO, "daemon started", repo=str(self.cfg.repo), pid=os.getpid(),
                  branch=self.remote.branch if self.remote else None, poll_interval=self.cfg.poll_interval,
                  resync_interval=self.cfg.resync_interval, workspaces=self.cfg.local_root)
            watchdog.start()
            self._loop()
            self.notify.stopping()
            self.push()  # whatever the last pass committed
            event(logging.INFO, "daemon stopped", pid=os.getpid())
            return 0
        finally:
            watchdog.stop()
            self._stop_watch.set()
            self.rec.close()
            for server in (self.server, self.dashboard):
                if server is not None:
                    server.shutdown()
                    server.server_close()
            for s, h in old.items():
                signal.signal(s, h)
            lock.release()

    def _loop(self) -> None:
        mono = time.monotonic
        next_poll = mono()  # the first cycle fetches
        next_resync = mono()
        next_retry = float("inf")
        failures = 0
        while not self._stopping:
            self._beat = mono()
            if self._reload:
                self._reload = False
                self.reload()
            now = mono()
            fetch, why = self._take()
            if now >= next_poll:
                fetch = True
            if fetch:
                next_poll = now + self.cfg.poll_interval
                if self.fetch_and_integrate():
                    why.add("remote change")
                if self.remote is not None and self.cfg.push and self.remote.ahead():
                    self.push()  # left over from an earlier failure
                self._note_health()
            if self.pending_rebase_pass:
                self.pending_rebase_pass = False
                why.add("remote change")
            if now >= next_resync:
                why.add("resync")
            if now >= next_retry:
                why.add("retry_after")
            if why and not self._stopping:
                retry_after = self.run_pass(",".join(sorted(why)))
                if not self.notify.ready_sent:  # the first pass is over, good or not: the daemon serves
                    self.notify.ready("first pass done")
                good = self.metrics.last_pass == self.metrics.last_good_pass
                failures = 0 if good else failures + 1
                after = mono()
                next_resync = after + self.cfg.resync_interval
                if not good:  # a failed pass is retried sooner than a resync, with backoff
                    next_retry = after + min(self.cfg.resync_interval, 2.0 ** min(failures, 6))
                elif retry_after is not None:
                    next_retry = after + max(MIN_WAKE, retry_after)
                else:
                    next_retry = float("inf")
                self._note_health()
                continue  # requests that arrived during the pass are served at once
            if self._stopping:
                break
            timeout = min(next_poll, next_resync, next_retry, mono() + STUCK_AFTER / 2) - mono()
            if timeout > 0:
                self.wake.wait(timeout)
            self.wake.clear()


def main(args: argparse.Namespace) -> int:
    flags = {k: getattr(args, k, None) for k in ("log_format", "poll_interval", "resync_interval", "listen")}
    if getattr(args, "no_commit", False):
        flags["commit"] = False
    repo = Path(getattr(args, "repo", None) or ".")
    if not repo.is_dir():
        raise UsageError(f"{repo}: no such directory")
    cfg = configs.load(str(repo), getattr(args, "config", None), flags)
    if not (cfg.repo / "specs").is_dir() and not (cfg.repo / "execution_templates").is_dir() \
            and not (cfg.repo / ".git").exists():
        raise UsageError(f"{cfg.repo}: not a repository with specs/ or execution_templates/ (use --repo DIR)")
    setup_logging(cfg.log_format)
    try:
        return Daemon(cfg, getattr(args, "config", None), {k: v for k, v in flags.items() if v is not None}).run()
    except ReconcilerError as e:
        if cfg.log_format != "json":
            raise  # the command line prints it as "reconcile: ...", as for every command
        # JSON logs: even the reason the daemon cannot start (the lock is held, the port is taken)
        # is one JSON line, like everything else this process writes to stderr.
        event(logging.ERROR, "daemon not started", error=str(e))
        return 2 if isinstance(e, UsageError) else 1
