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
needs it asks right after the specs are loaded, on a thread of its own (``prefetch``), so that git
runs beside the observation of the machines instead of after it; it is never asked before the
load, so its answer covers at least what the pass loaded.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from reconciler.core.actions import Action
from reconciler.core.plan import Change, Plan
from reconciler.gitops.repo import run_git

CODE = "UncommittedSpec"


def uncommitted_specs(repo: Path) -> set[str]:
    """Paths under specs/ (relative to the repository) that differ from HEAD or are untracked."""
    # --no-optional-locks (git 2.15+, git(1)): no index.lock taken and no refreshed index written
    # back, so a user's own git command in the checkout never finds the index locked by us.
    p = run_git(repo, "--no-optional-locks", "-c", "core.quotePath=false", "status", "--porcelain=v1", "-z",
                "--untracked-files=all", "--", "specs", check=False)
    if p.returncode != 0:
        return set()
    out: set[str] = set()
    entries = p.stdout.split("\0")
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
        self._early: tuple | None = None  # (arguments, thread, [key, answer]) of a prefetch

    def prefetch(self, repo, tree_changed: bool, ignores: list | None = None) -> None:
        """Start asking git now, on a thread, when ``specs`` with the same arguments would ask."""
        self._early = None
        key = _key(repo, ignores)
        if not (tree_changed or self.paths is None or key is None or key != self.key):
            return
        box: list = [key, None]

        def ask() -> None:
            box[1] = uncommitted_specs(Path(repo.working_tree_dir))

        t = threading.Thread(target=ask, name="git-status", daemon=True)
        t.start()
        self._early = ((repo, tree_changed, ignores), t, box)

    def specs(self, repo, tree_changed: bool, ignores: list | None = None) -> set[str]:
        """``uncommitted_specs``, or its last answer while nothing it depends on changed.
        ``ignores``: the stats of the ignore files inside the spec folders (the spec loader's)."""
        early, self._early = self._early, None
        # The same pass's prefetch: the loader makes a new ``ignores`` list every load.
        if early is not None and early[0][0] is repo and early[0][1] == tree_changed and early[0][2] is ignores:
            early[1].join()
            if early[2][1] is not None:  # (None: the thread failed; ask here, as without it)
                self.key, self.paths = early[2][0], early[2][1]
                self.asked += 1
                return self.paths
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
