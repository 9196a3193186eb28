"""What /healthz answers: the verdict from the record of the last fetches, pushes and passes.

Apart from the loop because it runs on the HTTP thread and only reads: the metrics, the
configuration and whether a remote is set.

A daemon whose process is up can still be useless (the remote unreachable, a push that
keeps failing, passes that keep raising). ``/healthz`` therefore answers from the record of the
last fetches, pushes and passes (``Metrics.tracks``): 503, naming what fails, once one of them
failed ``health_max_failures`` times in a row or the last good pass is older than
``health_max_pass_age``; 200 again as soon as they succeed. A single failure is not an outage
(a fetch that times out once is retried at the next poll), hence the threshold.
"""

from __future__ import annotations

import logging
import os
import time

from .logs import event
from .metrics import KINDS


class Health:
    """The health of a ``Daemon``: it reads ``cfg``, ``metrics``, ``remote``, ``in_pass`` and
    ``notify``, and keeps ``_failing`` and ``_sd_status`` (what was reported last)."""

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
