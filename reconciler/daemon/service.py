"""The daemon: ``reconcile [--repo DIR]`` without ``--once``. Watch, resync, pull and push.

One thread runs passes, so passes never overlap; every other thread (the file watcher, the HTTP
server, signal handlers) only records *why* a pass is wanted and wakes the loop. The loop wakes for:

- a local change under ``specs/`` or ``execution_templates/`` (watch.py: one file at once, a burst
  once it is over): a pass, before anything else, so that the fetch a poll has made due follows
  the launch instead of delaying it;
- the poll timer (``poll_interval``) or a signed webhook (``POST /hooks/git``): a fetch, and a pass
  when the remote branch moved;
- the resync timer (``resync_interval``): a pass, to follow running work;
- the soonest ``retry_after`` the last plan asked for (a backoff ending): a pass.

Git is the only durable state (gitsync.py fetches, rebases and pushes around each pass).
A crash at any moment loses nothing that matters: a transition whose commit never reached the
remote is derived again by the next pass, on this checkout or on a fresh clone elsewhere, from
what the machines report (the plan adopts a running instance it has no status for).

Signals: SIGTERM and SIGINT finish the current pass, push, and exit 0 (a second one exits at
once, which is as safe as a crash); SIGHUP re-reads the configuration file.

Health (health.py): ``/healthz`` answers from the record of the last fetches, pushes and passes.
Logging (logs.py): one handler on the root logger, text or JSON.

systemd (``Type=notify``, sdnotify.py): ``READY=1`` once the first pass is over (the HTTP endpoint
is up by then), ``STATUS=`` when the health verdict changes, ``STOPPING=1`` on the way out, and,
with ``WatchdogSec=``, ``WATCHDOG=1`` from a thread of its own while the loop is alive: it turns
at least every ``STUCK_AFTER / 2`` seconds when idle, and a pass or fetch it is inside may last
up to ``STUCK_AFTER`` (every remote operation has a deadline well under that).

Seam for the crash-safety tests: ``_after_commit`` (a pass made its local status commit, not
pushed yet) does nothing here; tests/faults.py replaces it to kill the daemon at that point.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time
from pathlib import Path

from reconciler.core import config as configs
from reconciler.gitops import repo as gitops
from . import sdnotify
from reconciler.core.runstatus import PHASES
from reconciler.core.actions import Action
from reconciler.core.errors import ReconcilerError, UsageError
from .gitsync import GitSync
from .health import Health
from .logs import event, log, setup_logging
from .metrics import Metrics
from .watch import GIT_WINDOW, Batches

MIN_WAKE = 0.2  # never spin: the shortest sleep between two passes asked for by retry_after
# The loop counts as stuck (and the systemd watchdog is left to fire) when one step of it, a pass
# with its push or a fetch, has lasted this long: each SSH command has a deadline (collecting
# artifacts at most 10 minutes), each git command 2 minutes.
STUCK_AFTER = 3600.0


def _after_commit() -> None:
    """Does nothing: a seam for the crash-safety tests (tests/faults.py replaces it with a kill),
    between a pass's local status commit and its push."""


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


class Daemon(GitSync, Health):
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
        self._asked_at: float | None = None  # when the oldest pass request not yet served came
        self._busy = True  # the loop is fetching, in a pass or pushing (not waiting)
        self._idle_since = 0.0
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
                if self._asked_at is None:
                    self._asked_at = time.monotonic()
        self.wake.set()

    def _take(self) -> tuple[bool, set[str], float | None]:
        """What was asked for since the last look, and when the oldest pass request came."""
        with self._flags_lock:
            fetch, why, asked = self._want_fetch, self._want_pass, self._asked_at
            self._want_fetch, self._want_pass, self._asked_at = False, set(), None
        return fetch, why, asked

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

    # -------- one cycle

    def run_pass(self, why: str, asked: float | None = None) -> float | None:
        """One pass and its push; return the plan's retry_after (None: nothing to wake up for).
        ``asked``: when the request it serves came (time.monotonic), logged as ``waited``."""
        waited = None if asked is None else round(time.monotonic() - asked, 4)
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
        fields = dict(why=why, waited=waited, duration=round(result.duration, 3), plan=summary,
                      transitions=result.transitions,
                      written=len(result.written), commit=(result.commit or "")[:12] or None,
                      retry_after=result.retry_after)
        if errors:
            fields["errors"] = [f"{o.name}: {o.action}: {o.error}" for o in errors][:20]
        level = logging.INFO if (result.transitions or result.commit or errors or summary) else logging.DEBUG
        event(level, "pass", **fields)
        for d in result.desired.diagnostics[:20]:
            event(logging.DEBUG, "invalid spec", diagnostic=d.text())
        retry_after = result.retry_after
        # The pass's desired, observed and plan are garbage now, and so is what the log line held
        # of them (a first pass's transitions: one line per run): give the memory back, and after a
        # large pass read its records back into fresh arenas now (engine/rehome.py), not a resync
        # later.
        del result, fields, summary, errors
        self._account_runs()
        from reconciler.engine.rehome import rehome_if_due

        rehome_if_due(self.rec)
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

    def _using_git(self) -> bool:
        """Whether the loop is busy (a pass runs ``git status`` and commits, a fetch rebases, a push
        fetches) or was until just now: git's index written then is the daemon's own."""
        return self._busy or time.monotonic() - self._idle_since < GIT_WINDOW

    def _watch(self) -> None:
        root = str(self.cfg.repo)
        try:
            for paths in Batches(root, self.cfg.debounce, self._using_git).changes(self._stop_watch):
                self.request(why="local change")  # first: the log line below is not on the way
                rels = sorted(os.path.relpath(p, root) for p in paths)
                event(logging.DEBUG, "local change", paths=rels[:10], count=len(rels))
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
        deferred = False  # the last fetch due was put off for a local change
        while not self._stopping:
            self._beat = mono()
            if self._reload:
                self._reload = False
                self.reload()
            now = mono()
            fetch, why, asked = self._take()
            if now >= next_poll:
                fetch = True
            if fetch and "local change" in why and not deferred:
                # A local edit first: its launch needs nothing from the remote, and the fetch (a
                # network round trip) follows right after the pass (never later: edits that keep
                # coming do not put it off twice), with a pass of its own if the remote moved.
                self.request(fetch=True)
                deferred = True
            elif fetch:
                deferred = False
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
                retry_after = self.run_pass(",".join(sorted(why)), asked)
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
                self._busy, self._idle_since = False, mono()
                self.wake.wait(timeout)
                self._busy = True
            self.wake.clear()


def main(args: argparse.Namespace) -> int:
    flags = {k: getattr(args, k, None) for k in ("log_format", "poll_interval", "resync_interval", "listen")}
    if getattr(args, "no_commit", False):
        flags["commit"] = False
    if getattr(args, "allow_dirty", False):
        flags["allow_dirty"] = True
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
