"""Progress alone is committed at most once per ``status_progress_interval``; transitions at once.

A real run on this machine reports training steps the way ms-swift does (``logging.jsonl``), and
an hour of passes at the daemon's default resync (one every 30 s) is driven with the pass's clock
moved forward, so the hour takes seconds. Its git history is then counted.
"""

from __future__ import annotations

import json

import git

from reconciler.status import store as statuses
from tests.repo_helpers import make_repo, pass_until, reconciler as make_reconciler, run_spec, wait_for

JOB = ["sh", "-c", "mkdir -p artifacts/output; while [ ! -e stop ]; do sleep 0.05; done"]


def _steps(ws, step: int) -> None:
    with open(ws / "artifacts" / "output" / "logging.jsonl", "a") as fh:
        fh.write(json.dumps({"loss": 2.0 - step / 1000, "global_step/max_steps": f"{step}/1000",
                             "learning_rate": 1e-4}) + "\n")


def test_an_hour_of_progress_makes_at_most_six_progress_commits(tmp_path):
    repo = make_repo(tmp_path / "repo", {"train": run_spec("train", JOB)})
    rec = make_reconciler(repo, tmp_path / "ws")
    st = pass_until(rec, "train", "Running")
    ws = tmp_path / "ws" / "test" / st.handle.identity
    wait_for(lambda: (ws / "artifacts" / "output").is_dir(), what="the job's output folder")
    commits = lambda: len(list(git.Repo(repo).iter_commits()))  # noqa: E731
    before = commits()
    start = rec_time = __import__("time").time()
    for k in range(1, 121):  # 120 passes, 30 s apart: one hour
        _steps(ws, k * 5)
        rec_time = start + 30 * k
        rec.run_pass(now=rec_time)
    progress_commits = commits() - before
    assert 1 <= progress_commits <= 6, progress_commits
    _steps(ws, 601)
    rec.run_pass(now=rec_time + 1)  # progress alone, just after a write: it waits for git
    assert "step: 601" not in (repo / "status" / "train.yaml").read_text()
    live = statuses.load_with_live(repo / "status", repo / ".reconciler")["train"]
    assert live.progress["step"] == 601  # the live page's copy is current
    rec_time += 1
    (ws / "stop").write_text("")
    wait_for(lambda: (ws / "runtime" / "result.json").is_file(), what="the job's result")
    rec.run_pass(now=rec_time + 30)
    head = git.Repo(repo).head.commit
    assert "Running → Succeeded" in head.message  # a transition commits in the pass that sees it
    assert "step: 601" in (repo / "status" / "train.yaml").read_text()  # with the latest progress


def test_interval_zero_commits_progress_every_pass(tmp_path):
    repo = make_repo(tmp_path / "repo", {"train": run_spec("train", JOB)})
    rec = make_reconciler(repo, tmp_path / "ws", status_progress_interval=0)
    st = pass_until(rec, "train", "Running")
    ws = tmp_path / "ws" / "test" / st.handle.identity
    wait_for(lambda: (ws / "artifacts" / "output").is_dir(), what="the job's output folder")
    before = len(list(git.Repo(repo).iter_commits()))
    for k in range(1, 4):
        _steps(ws, k)
        rec.run_pass()
    assert len(list(git.Repo(repo).iter_commits())) - before == 3
    (ws / "stop").write_text("")


def test_every_logged_step_reaches_the_curve_not_one_per_pass(tmp_path):
    repo = make_repo(tmp_path / "repo", {"train": run_spec("train", JOB)})
    rec = make_reconciler(repo, tmp_path / "ws", status_progress_interval=0)
    st = pass_until(rec, "train", "Running")
    ws = tmp_path / "ws" / "test" / st.handle.identity
    wait_for(lambda: (ws / "artifacts" / "output").is_dir(), what="the job's output folder")
    for step in range(1, 11):  # ten steps logged between two passes
        _steps(ws, step)
    rec.run_pass()
    curve = statuses.load_all(repo / "status")["train"].loss_curve
    assert [p[0] for p in curve] == list(range(1, 11))
    (ws / "stop").write_text("")
