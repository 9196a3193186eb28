"""Only committed spec content is launched.

A run's status names the commit of its spec: that is how anyone finds what ran. A pass in a
working copy (``reconcile --once`` by hand, a cron job in a checkout someone edits) would
otherwise launch an edit no commit holds, and record the last commit of the file, whose content
differs from what ran. So a run whose spec file has uncommitted changes (modified, added, or not
tracked at all) and whose content is new to its status is held: none of its changes is applied,
the instance that runs keeps running, and the plan says why. ``allow_dirty`` (``--allow-dirty``)
launches it instead and records ``spec.dirty: true`` with the content's digest and no commit.

``git status``, limited to ``specs/``: the repository's own answer, with git's index and its stat
cache, rather than a second opinion computed here. It runs again only when its answer can have
moved: a spec file's content changed or one came or went (the spec cache says), or HEAD, the
index or an ignore file changed (their stats); otherwise the last answer stands. A pass that
needs it starts git right after the specs are loaded (``prefetch``), on a thread that the pass
never waits for until the plan needs the answer, so that git starts and runs beside the
observation of the machines instead of before or after it (``_Asking`` says how); it is never
asked before the load, so its answer covers at least what the pass loaded.
"""

from __future__ import annotations

import _thread
import os
import subprocess
import threading
from pathlib import Path

from reconciler.core.actions import Action
from reconciler.core.plan import Change, Plan
from reconciler.gitops.repo import git_env, run_git

CODE = "UncommittedSpec"
# --no-optional-locks (git 2.15+, git(1)): no index.lock taken and no refreshed index written
# back, so a user's own git command in the checkout never finds the index locked by us.
STATUS = ("--no-optional-locks", "-c", "core.quotePath=false", "status", "--porcelain=v1", "-z",
          "--untracked-files=all", "--", "specs")
TIMEOUT = 120.0  # seconds, as run_git's


def uncommitted_specs(repo: Path) -> set[str]:
    """Paths under specs/ (relative to the repository) that differ from HEAD or are untracked."""
    p = run_git(repo, *STATUS, check=False)
    return _paths(p.returncode, p.stdout)


class _Asking:
    """``git status`` for one pass, on a thread of its own that the pass does not wait for: the
    thread is started without the handshake of ``threading.Thread.start`` (on a loaded machine a
    wait for the new thread to be scheduled), and it, not the pass, waits while git's process
    starts (the fork and exec: 6 to 10 ms of waiting at a load of 7 to 12, measured with
    ``benchmarks/daemon_bench.py --phases``)."""

    def __init__(self, top: str, args: tuple) -> None:
        self.args = args
        self.proc: subprocess.Popen | None = None
        self.found: set[str] | None = None
        self._done = threading.Lock()
        self._done.acquire()  # released by the thread when it is done, answer or not
        _thread.start_new_thread(self._ask, (top,))

    def _ask(self, top: str) -> None:
        try:
            self.proc = subprocess.Popen(["git", "-C", top, *STATUS], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                         env=git_env())
            out, _ = self.proc.communicate(timeout=TIMEOUT)
            self.found = _paths(self.proc.returncode, out)
        except Exception:  # noqa: BLE001 - no answer here: the pass asks git itself
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
                self.proc.communicate()
        finally:
            self._done.release()

    def answer(self) -> set[str] | None:
        """Its answer, once git has given it (None: git could not be asked, or did not answer in
        time and was killed)."""
        with self._done:
            return self.found

    def drop(self) -> None:
        """Not needed after all (the pass ended before its plan): stopped and reaped before the
        next pass asks again."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.kill()
        self.answer()


def _paths(returncode: int, stdout: str) -> set[str]:
    if returncode != 0:
        return set()
    out: set[str] = set()
    entries = stdout.split("\0")
    i = 0
    while i < len(entries):
        e = entries[i]
        if len(e) > 3:
            out.add(e[3:])
            if e[0] in "RC":  # a rename or copy: the next entry is its source
                i += 1
        i += 1
    return out


class Uncommitted:
    """The last answer of ``uncommitted_specs`` and what it was given under."""

    def __init__(self, key: list | None = None, paths: set[str] | None = None) -> None:
        self.key, self.paths = key, paths
        self.asked = 0  # how many times git was asked (the tests count them)
        self._early: tuple | None = None  # (key, _Asking) of a prefetch

    def prefetch(self, repo, tree_changed: bool, ignores: list | None = None) -> None:
        """Start git now, when ``specs`` with the same arguments would ask it."""
        if self._early is not None:  # an earlier pass's, never read (that pass failed before its plan)
            self._early[1].drop()
        self._early = None
        key = _key(repo, ignores)
        if not (tree_changed or self.paths is None or key is None or key != self.key):
            return
        try:
            self._early = (key, _Asking(str(repo.working_tree_dir), (repo, tree_changed, ignores)))
        except RuntimeError:
            pass  # no thread could be started: asked again by ``specs``, as without a prefetch

    def specs(self, repo, tree_changed: bool, ignores: list | None = None) -> set[str]:
        """``uncommitted_specs``, or its last answer while nothing it depends on changed.
        ``ignores``: the stats of the ignore files inside the spec folders (the spec loader's)."""
        early, self._early = self._early, None
        if early is not None:
            asked = early[1]
            # The same pass's prefetch: the loader makes a new ``ignores`` list every load.
            if asked.args[0] is repo and asked.args[1] == tree_changed and asked.args[2] is ignores:
                found = asked.answer()
                if found is not None:  # (None: it failed; ask here, as without it)
                    self.key, self.paths = early[0], found
                    self.asked += 1
                    return self.paths
            else:
                asked.drop()
        key = _key(repo, ignores)
        if tree_changed or self.paths is None or key is None or key != self.key:
            self.paths = uncommitted_specs(Path(repo.working_tree_dir))
            self.key = key
            self.asked += 1
        return self.paths


def _key(repo, ignores: list | None) -> list | None:
    key = repo_key(repo)
    if key is not None:
        key.append(ignores)
    return key


def repo_key(repo) -> list | None:
    """HEAD and the stats of the index and the ignore files: git's answer for unchanged spec
    files can only move with these (a commit, ``git add``/``rm --cached``, a new ignore rule)."""
    from reconciler.gitops.repo import head

    git_dir, top = str(repo.git_dir), str(repo.working_tree_dir)
    key: list = [head(repo)]
    for p in (os.path.join(git_dir, "index"), os.path.join(git_dir, "info", "exclude"),
              os.path.join(top, ".gitignore"), os.path.join(top, "specs", ".gitignore")):
        try:
            st = os.stat(p)
            key.append([st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns])
        except FileNotFoundError:
            key.append(None)
        except OSError:
            return None
    return key


def hold_uncommitted(plan: Plan, desired, previous: dict, dirty: set[str]) -> None:
    """Replace every change of a run whose spec file is uncommitted and whose content is new to
    its status by one wait that says so (nothing launches, nothing running is stopped)."""
    if not dirty:
        return
    held: dict[str, Change] = {}
    for name, entry in desired.runs.items():
        if entry.rel not in dirty:
            continue
        prev = previous.get(name)
        if prev is not None and prev.spec.digest == entry.digest:
            continue  # the change is not to what it runs (a comment, or an edit undone)
        held[name] = Change(name, Action.WAIT, CODE,
                            f"{entry.rel} has uncommitted changes: commit them to launch this content "
                            "(or run with --allow-dirty)", None, spec_path=entry.rel)
    if held:
        plan.changes = [c for c in plan.changes if c.name not in held] + list(held.values())
