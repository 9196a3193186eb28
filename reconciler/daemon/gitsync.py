"""The daemon's side of git: find the remote, fetch and fast-forward, push with retries.

Apart from the loop because it is the one part that talks to the remote, with its own failure
accounting (the fetch and push tracks /healthz reads) and its own test seam.

Git is the only durable state. Before a pass the tracked branch is fetched and fast-forwarded; the
daemon's own unpushed status commits are rebased onto it (never a merge commit). After a pass the
status commit is pushed, with bounded retries: a rejected push fetches, rebases and tries again.

Seam for the crash-safety tests: ``_before_push`` does nothing here; tests/faults.py replaces it to
hold a push while the test moves the remote.
"""

from __future__ import annotations

import logging
import time

from reconciler.core.errors import UsageError
from reconciler.gitops import repo as gitops
from .logs import event


def _before_push() -> None:
    """Does nothing: a seam for the crash-safety tests (tests/faults.py replaces it with a wait),
    before each push of status commits."""


class GitSync:
    """The remote of a ``Daemon``: it reads ``cfg``, ``metrics`` and ``rec`` and sets ``remote`` and
    ``pending_rebase_pass`` (a push that had to rebase asks for another pass)."""

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
