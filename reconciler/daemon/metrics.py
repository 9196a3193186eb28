"""The daemon's metrics, exposed through prometheus-client.

The client writes the exposition format (and OpenMetrics when the scraper asks for it in
``Accept``), and adds what every Prometheus target is expected to have: ``process_*`` (CPU, memory,
open file descriptors, start time) and ``python_info``/``python_gc_*``. Each daemon has its own
registry, so metrics never leak between two instances in one process (tests).

Two kinds of series:

- events, counted by the client's own ``Counter`` and ``Histogram``: passes, fetches, pushes,
  webhooks, actions and their errors, push retries, rebase resets, the pass duration;
- state the daemon keeps anyway, read at scrape time by a collector under one lock, so a scrape
  sees one consistent moment: the fetch/push/pass records (``Track``) that ``/healthz`` is computed
  from (an alert on the metrics and the health check therefore agree), runs by phase, and each
  machine's reachability as the last pass observed it.

Every series with a known label set exists from the start at zero (``reconciler_webhooks_total
{result="ignored"} 0`` before the first webhook), so ``rate()`` and ``increase()`` see the first
event, and an alert on absence is not needed. Names and labels are those the daemon has always
exported; ``reconciler_machine_reachable{machine}`` and ``reconciler_build_info{version}`` are new.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from prometheus_client import (CollectorRegistry, Counter, GCCollector, Histogram, PlatformCollector,
                               ProcessCollector, disable_created_metrics)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder

from reconciler.core.actions import Action
from reconciler.planner.render import SYMBOL
from reconciler.core.runstatus import PHASES

# The *_created series the client adds to counters and histograms by default are the process start
# time again, once per series: noise for this daemon (process_start_time_seconds says it once).
disable_created_metrics()

PASS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

# What the daemon does over and over that can fail without stopping it: each has a health check.
KINDS = ("fetch", "push", "pass")
ACTIONS = tuple(a for a in SYMBOL if a != Action.NONE)  # the plan's actions, each counted from zero
RESULTS = ("ok", "error")
WEBHOOK_RESULTS = ("accepted", "refused", "ignored")


def build_version() -> str:
    """The installed distribution's version, else the package's own (a source checkout)."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("gpu-reconciler")
        except PackageNotFoundError:
            pass
    except ImportError:  # pragma: no cover - Python < 3.8
        pass
    from reconciler import __version__

    return __version__


@dataclass
class Track:
    """One kind's recent record. Timestamps are Unix seconds; 0 means never."""

    consecutive_failures: int = 0
    failures: int = 0
    successes: int = 0
    last_success: float = 0.0
    last_failure: float = 0.0
    last_error: str = ""

    def record(self, ok: bool, at: float, error: str = "") -> None:
        if ok:
            self.successes += 1
            self.consecutive_failures = 0
            self.last_success = at
        else:
            self.failures += 1
            self.consecutive_failures += 1
            self.last_failure = at
            self.last_error = error[:500]

    def as_dict(self) -> dict:
        return dict(consecutive_failures=self.consecutive_failures, failures=self.failures,
                    successes=self.successes, last_success=self.last_success, last_failure=self.last_failure,
                    last_error=self.last_error)


class Metrics:
    def __init__(self, version: str | None = None) -> None:
        self._lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        ProcessCollector(registry=reg)
        PlatformCollector(registry=reg)
        GCCollector(registry=reg)

        # Events.
        self._passes = Counter("reconciler_passes", "Reconcile passes, by result.", ["result"], registry=reg)
        self._pass_duration = Histogram("reconciler_pass_duration_seconds", "Duration of reconcile passes.",
                                        buckets=PASS_BUCKETS, registry=reg)
        self._tables = {
            "actions": Counter("reconciler_actions", "Plan actions applied, by action.", ["action"], registry=reg),
            "action_errors": Counter("reconciler_action_errors", "Plan actions that failed, by action.",
                                     ["action"], registry=reg),
            "pushes": Counter("reconciler_pushes", "Status pushes, by result.", ["result"], registry=reg),
            "fetches": Counter("reconciler_fetches", "Fetches of the tracked branch, by result.", ["result"],
                               registry=reg),
            "webhooks": Counter("reconciler_webhooks", "Webhook deliveries, by result.", ["result"], registry=reg),
        }
        self._counters = {
            "push_retries": Counter("reconciler_push_retries", "Status pushes retried after the remote moved.",
                                    registry=reg),
            "rebase_resets": Counter("reconciler_rebase_resets",
                                     "Failed rebases of status commits, resolved by taking the remote's status/.",
                                     registry=reg),
        }
        for r in RESULTS:  # every known label value from zero
            self._passes.labels(result=r)
            self._tables["pushes"].labels(result=r)
            self._tables["fetches"].labels(result=r)
        for r in WEBHOOK_RESULTS:
            self._tables["webhooks"].labels(result=r)
        for a in ACTIONS:
            self._tables["actions"].labels(action=a)
            self._tables["action_errors"].labels(action=a)
        self._build = GaugeMetricFamily("reconciler_build_info", "The running reconciler's version (always 1).",
                                        labels=["version"])
        self._build.add_metric([version or build_version()], 1)

        # State, read by _State.collect at scrape time.
        self.runs: dict[str, int] = {p: 0 for p in PHASES}
        self.machines: dict[str, bool] = {}
        self.last_good_pass = 0.0
        self.last_pass = 0.0
        self.last_error = ""
        self.last_duration = 0.0
        self.tracks: dict[str, Track] = {k: Track() for k in KINDS}
        self.healthy: bool | None = None
        reg.register(_State(self))

    # -------- recording (the loop thread, the HTTP thread for webhooks)

    def outcome(self, kind: str, ok: bool, at: float, error: str = "") -> None:
        """A fetch or a push ended (passes go through observe_pass, which records theirs too)."""
        with self._lock:
            self._outcome(kind, ok, at, error)

    def _outcome(self, kind: str, ok: bool, at: float, error: str) -> None:
        self.tracks[kind].record(ok, at, error)
        counter = self._passes if kind == "pass" else self._tables["fetches" if kind == "fetch" else "pushes"]
        counter.labels(result="ok" if ok else "error").inc()

    def observe_pass(self, ok: bool, duration: float, at: float, error: str = "") -> None:
        with self._lock:
            self._outcome("pass", ok, at, error)
            self._pass_duration.observe(duration)
            self.last_pass = at
            self.last_duration = duration
            if ok:
                self.last_good_pass, self.last_error = at, ""
            else:
                self.last_error = error

    def set_runs(self, phases: dict[str, int]) -> None:
        with self._lock:
            self.runs = {p: 0 for p in PHASES}
            self.runs.update(phases)

    def set_machines(self, reachable: dict[str, bool]) -> None:
        """Each machine the last pass observed, and whether it answered. Replaces the previous set:
        a machine no longer declared (nor running anything) drops out of the metric."""
        with self._lock:
            self.machines = dict(reachable)

    def count(self, table: str, key: str, n: int = 1) -> None:
        self._tables[table].labels(key).inc(n)

    def inc(self, attr: str, n: int = 1) -> None:
        self._counters[attr].inc(n)

    # -------- reading

    def snapshot(self) -> dict:
        with self._lock:
            t = self.tracks["pass"]
            return {"last_pass": self.last_pass, "last_good_pass": self.last_good_pass, "last_error": self.last_error,
                    "last_duration": self.last_duration, "passes": {"ok": t.successes, "error": t.failures},
                    "tracks": {k: tr.as_dict() for k, tr in self.tracks.items()}}

    def render(self, accept: str | None = None, healthy: bool | None = None) -> tuple[bytes, str]:
        """The exposition, in the format ``accept`` (an HTTP Accept header) prefers, and its content
        type: OpenMetrics when asked for, else the text format 0.0.4. ``healthy``: the verdict of
        /healthz at this moment, exported as ``reconciler_healthy``."""
        with self._lock:
            self.healthy = healthy
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type

    def exposition(self, healthy: bool | None = None) -> str:
        """The text format 0.0.4, as a string."""
        return self.render(None, healthy)[0].decode()


class _State:
    """A prometheus-client collector for the state the daemon keeps: read under the lock at scrape time."""

    def __init__(self, m: Metrics):
        self.m = m

    def describe(self):  # the families, so the registry can check names without collecting
        return list(self._families(describe=True))

    def collect(self):
        with self.m._lock:
            return list(self._families())

    def _families(self, describe: bool = False):
        m = self.m
        yield m._build
        runs = GaugeMetricFamily("reconciler_runs", "Runs by phase, as of the last pass.", labels=["phase"])
        reach = GaugeMetricFamily("reconciler_machine_reachable",
                                  "1 when the machine answered the last pass's observation, 0 when it did not.",
                                  labels=["machine"])
        last_good = GaugeMetricFamily("reconciler_last_good_pass_timestamp_seconds",
                                      "Unix time at which the last successful pass ended (0: none yet).")
        consecutive = GaugeMetricFamily("reconciler_consecutive_failures",
                                        "Failures in a row of fetch, push and pass (0 once one succeeds); /healthz "
                                        "compares it with health_max_failures.", labels=["kind"])
        failures = CounterMetricFamily("reconciler_failures", "Failed fetches, pushes and passes.", labels=["kind"])
        success_at = GaugeMetricFamily("reconciler_last_success_timestamp_seconds",
                                       "Unix time of the last successful fetch, push and pass (0: none yet).",
                                       labels=["kind"])
        failure_at = GaugeMetricFamily("reconciler_last_failure_timestamp_seconds",
                                       "Unix time of the last failed fetch, push and pass (0: none yet).",
                                       labels=["kind"])
        healthy = GaugeMetricFamily("reconciler_healthy", "1 when /healthz answers 200, 0 when it answers 503.")
        if not describe:
            for phase, n in sorted(m.runs.items()):
                runs.add_metric([phase], n)
            for name, ok in sorted(m.machines.items()):
                reach.add_metric([name], 1 if ok else 0)
            last_good.add_metric([], m.last_good_pass)
            for kind in KINDS:
                t = m.tracks[kind]
                consecutive.add_metric([kind], t.consecutive_failures)
                failures.add_metric([kind], t.failures)
                success_at.add_metric([kind], t.last_success)
                failure_at.add_metric([kind], t.last_failure)
        yield from (runs, reach, last_good, consecutive, failures, success_at, failure_at)
        if describe or m.healthy is not None:
            if not describe:
                healthy.add_metric([], 1 if m.healthy else 0)
            yield healthy
