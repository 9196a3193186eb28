"""Only committed spec content is launched.

A run's status names the commit of its spec: that is how anyone finds what ran. A pass in a
working copy (``reconcile --once`` by hand, a cron job in a checkout someone edits) would
otherwise launch an edit no commit holds, and record the last commit of the file, whose content
differs from what ran. So a run whose spec file has uncommitted changes (modified, added, or not
tracked at all) and whose content is new to its status is held: none of its changes is applied,
the instance that runs keeps running, and the plan says why. ``allow_dirty`` (``--allow-dirty``)
launches it instead and records ``spec.dirty: true`` with the content's digest and no commit.

One ``git status`` per pass, limited to ``specs/``: the repository's own answer, with git's index
and its stat cache, rather than a second opinion computed here.
"""

from __future__ import annotations

from pathlib import Path

from reconciler.core.actions import Action
from reconciler.core.plan import Change, Plan
from reconciler.gitops.repo import run_git

CODE = "UncommittedSpec"


def uncommitted_specs(repo: Path) -> set[str]:
    """Paths under specs/ (relative to the repository) that differ from HEAD or are untracked."""
    p = run_git(repo, "-c", "core.quotePath=false", "status", "--porcelain=v1", "-z", "--untracked-files=all",
                "--", "specs", check=False)
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
