"""``git status -- specs`` started right after the load on a thread the pass does not wait for
(engine/uncommitted.py): its answer is the one git gives for what the pass loaded, and a process
that no plan read is stopped and reaped, never left behind. Real git, real processes."""

from __future__ import annotations

import os
from pathlib import Path

import git

from reconciler.engine.uncommitted import Uncommitted, uncommitted_specs
from tests.repo_helpers import make_repo, run_spec


def _zombie_child(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False  # reaped: gone from /proc
    return fields[0] == "Z" and fields[1] == str(os.getpid())


def test_the_pass_never_waits_for_git_to_start(tmp_path, monkeypatch):
    """git's start (its fork and exec) is waited for by its own thread, not by the pass: a start
    made slow here still lets ``prefetch`` return at once, and the answer is git's."""
    import subprocess
    import threading

    from reconciler.engine import uncommitted

    repo = make_repo(tmp_path / "repo", {"a": run_spec("a", ["true"])})
    gitrepo = git.Repo(repo)
    (repo / "specs/runs/b.yaml").write_text(run_spec("b", ["true"]))
    gate = threading.Event()
    real = subprocess.Popen

    def slow_start(*a, **k):
        gate.wait(10)
        return real(*a, **k)

    monkeypatch.setattr(uncommitted.subprocess, "Popen", slow_start)
    u = Uncommitted()
    ignores: list = []
    u.prefetch(gitrepo, True, ignores)
    assert u._early[1].proc is None  # returned while git's start is still held back
    gate.set()
    assert u.specs(gitrepo, True, ignores) == {"specs/runs/b.yaml"} == uncommitted_specs(repo) and u.asked == 1


def test_a_prefetch_no_plan_read_is_stopped_and_reaped_by_the_next(tmp_path):
    repo = make_repo(tmp_path / "repo", {"a": run_spec("a", ["true"])})
    gitrepo = git.Repo(repo)
    u = Uncommitted()
    (repo / "specs/runs/b.yaml").write_text(run_spec("b", ["true"]))
    u.prefetch(gitrepo, True, [])
    first = u._early[1]
    # The pass failed before its plan; the next one loads again and asks again.
    (repo / "specs/runs/c.yaml").write_text(run_spec("c", ["true"]))
    ignores: list = []
    u.prefetch(gitrepo, True, ignores)
    # the unread one: ended and reaped before the next was started
    assert first.proc.returncode is not None and not _zombie_child(first.proc.pid)
    second = u._early[1]
    assert u.specs(gitrepo, True, ignores) == {"specs/runs/b.yaml", "specs/runs/c.yaml"} == uncommitted_specs(repo)
    assert second.proc.returncode is not None and not _zombie_child(second.proc.pid)


def test_an_answer_for_another_load_is_not_taken_and_git_is_asked_again(tmp_path):
    """A prefetch for one load's arguments answers only that load: git asked afresh for another
    (it must see at least what that load saw), and the unused process reaped."""
    repo = make_repo(tmp_path / "repo", {"a": run_spec("a", ["true"])})
    gitrepo = git.Repo(repo)
    u = Uncommitted()
    u.prefetch(gitrepo, True, [])
    stale = u._early[1]
    (repo / "specs/runs/late.yaml").write_text(run_spec("late", ["true"]))
    assert u.specs(gitrepo, True, []) == {"specs/runs/late.yaml"}  # (another list: another load)
    assert stale.proc.returncode is not None and u.asked == 1
