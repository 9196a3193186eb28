"""The daemon's metrics, written by hand in the Prometheus text exposition format (version 0.0.4).

Counters, gauges and one histogram, kept in memory under a lock: the HTTP thread reads them while
the loop thread writes them. No dependency: the format is a few lines of text per metric.

The three things that can keep failing while the process stays up, a fetch, a push and a pass,
are each tracked the same way (``Track``): consecutive failures, last success, last failure and
its error. ``/healthz`` is computed from them (daemon.py), and the same figures are exported, so
an alert on the metrics and the health check agree.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

PASS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    body = ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(labels.items()))
    return "{" + body + "}"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(float(v))


# What the daemon does over and over that can fail without stopping it: each has a health check.
KINDS = ("fetch", "push", "pass")
# The older per-kind result counters, kept as they were: reconciler_fetches_total{result} and so on.
_RESULT_TABLES = {"fetch": "fetches", "push": "pushes", "pass": "passes"}


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
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.passes: dict[str, int] = {"ok": 0, "error": 0}
        self.buckets = [0] * len(PASS_BUCKETS)
        self.duration_sum = 0.0
        self.duration_count = 0
        self.runs: dict[str, int] = {}
        self.actions: dict[str, int] = {}
        self.action_errors: dict[str, int] = {}
        self.push_retries = 0
        self.pushes: dict[str, int] = {"ok": 0, "error": 0}
        self.fetches: dict[str, int] = {"ok": 0, "error": 0}
        self.webhooks: dict[str, int] = {"accepted": 0, "refused": 0}
        self.rebase_resets = 0
        self.last_good_pass = 0.0
        self.last_pass = 0.0
        self.last_error = ""
        self.last_duration = 0.0
        self.tracks: dict[str, Track] = {k: Track() for k in KINDS}

    def outcome(self, kind: str, ok: bool, at: float, error: str = "") -> None:
        """A fetch or a push ended (passes go through observe_pass, which calls this too)."""
        with self._lock:
            self._outcome(kind, ok, at, error)

    def _outcome(self, kind: str, ok: bool, at: float, error: str) -> None:
        self.tracks[kind].record(ok, at, error)
        table = getattr(self, _RESULT_TABLES[kind])
        key = "ok" if ok else "error"
        table[key] = table.get(key, 0) + 1

    def observe_pass(self, ok: bool, duration: float, at: float, error: str = "") -> None:
        with self._lock:
            self._outcome("pass", ok, at, error)
            for i, b in enumerate(PASS_BUCKETS):
                if duration <= b:
                    self.buckets[i] += 1
            self.duration_sum += duration
            self.duration_count += 1
            self.last_pass = at
            self.last_duration = duration
            if ok:
                self.last_good_pass, self.last_error = at, ""
            else:
                self.last_error = error

    def set_runs(self, phases: dict[str, int]) -> None:
        with self._lock:
            self.runs = dict(phases)

    def count(self, table: str, key: str, n: int = 1) -> None:
        with self._lock:
            d = getattr(self, table)
            d[key] = d.get(key, 0) + n

    def inc(self, attr: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, attr, getattr(self, attr) + n)

    def snapshot(self) -> dict:
        with self._lock:
            return {"last_pass": self.last_pass, "last_good_pass": self.last_good_pass, "last_error": self.last_error,
                    "last_duration": self.last_duration, "passes": dict(self.passes),
                    "tracks": {k: t.as_dict() for k, t in self.tracks.items()}}

    def exposition(self, healthy: bool | None = None) -> str:
        """The text format. ``healthy``: the verdict of /healthz at this moment, exported as a gauge."""
        with self._lock:
            out: list[str] = []

            def metric(name: str, kind: str, help_: str, samples: list[tuple[dict[str, str], float]],
                       suffix_samples: list[tuple[str, dict[str, str], float]] | None = None) -> None:
                out.append(f"# HELP {name} {help_}")
                out.append(f"# TYPE {name} {kind}")
                for labels, v in samples:
                    out.append(f"{name}{_labels(labels)} {_num(v)}")
                for suffix, labels, v in suffix_samples or []:
                    out.append(f"{name}{suffix}{_labels(labels)} {_num(v)}")

            def table(name: str, help_: str, label: str, counts: dict[str, int]) -> None:
                metric(name, "counter", help_, [({label: k}, v) for k, v in sorted(counts.items())])

            table("reconciler_passes_total", "Reconcile passes, by result.", "result", self.passes)
            hist = [("_bucket", {"le": _num(b)}, n) for b, n in zip(PASS_BUCKETS, self.buckets)]
            hist.append(("_bucket", {"le": "+Inf"}, self.duration_count))
            hist.append(("_sum", {}, self.duration_sum))
            hist.append(("_count", {}, self.duration_count))
            metric("reconciler_pass_duration_seconds", "histogram", "Duration of reconcile passes.", [], hist)
            metric("reconciler_runs", "gauge", "Runs by phase, as of the last pass.",
                   [({"phase": k}, v) for k, v in sorted(self.runs.items())])
            table("reconciler_actions_total", "Plan actions applied, by action.", "action", self.actions)
            table("reconciler_action_errors_total", "Plan actions that failed, by action.", "action",
                  self.action_errors)
            metric("reconciler_push_retries_total", "counter", "Status pushes retried after the remote moved.",
                   [({}, self.push_retries)])
            table("reconciler_pushes_total", "Status pushes, by result.", "result", self.pushes)
            table("reconciler_fetches_total", "Fetches of the tracked branch, by result.", "result", self.fetches)
            table("reconciler_webhooks_total", "Webhook deliveries, by result.", "result", self.webhooks)
            metric("reconciler_rebase_resets_total", "counter",
                   "Failed rebases of status commits, resolved by taking the remote's status/.",
                   [({}, self.rebase_resets)])
            metric("reconciler_last_good_pass_timestamp_seconds", "gauge",
                   "Unix time at which the last successful pass ended (0: none yet).", [({}, self.last_good_pass)])
            kinds = [(k, self.tracks[k]) for k in KINDS]
            metric("reconciler_consecutive_failures", "gauge",
                   "Failures in a row of fetch, push and pass (0 once one succeeds); /healthz compares it "
                   "with health_max_failures.", [({"kind": k}, t.consecutive_failures) for k, t in kinds])
            metric("reconciler_failures_total", "counter", "Failed fetches, pushes and passes.",
                   [({"kind": k}, t.failures) for k, t in kinds])
            metric("reconciler_last_success_timestamp_seconds", "gauge",
                   "Unix time of the last successful fetch, push and pass (0: none yet).",
                   [({"kind": k}, t.last_success) for k, t in kinds])
            metric("reconciler_last_failure_timestamp_seconds", "gauge",
                   "Unix time of the last failed fetch, push and pass (0: none yet).",
                   [({"kind": k}, t.last_failure) for k, t in kinds])
            if healthy is not None:
                metric("reconciler_healthy", "gauge", "1 when /healthz answers 200, 0 when it answers 503.",
                       [({}, 1 if healthy else 0)])
            return "\n".join(out) + "\n"
