"""The ledger: status/README.md and the loss curves, on values and on a real repository."""

from __future__ import annotations

import time

import git

from reconciler.status import ledger
from reconciler.core.runstatus import RunStatus, Transition
from tests.repo_helpers import make_repo, reconciler, run_spec, status_of


def status(name: str, phase: str, at: str, **kw) -> RunStatus:
    return RunStatus(name=name, phase=phase, generation=1, attempt=1,
                     history=[Transition(time=at, phase=phase, generation=1, attempt=1)], **kw)


def test_rows_are_grouped_by_phase_newest_first_and_escaped():
    rows = {s.name: ledger.row(s) for s in [
        status("old", "Succeeded", "2026-01-01T00:00:00Z", message="done"),
        status("new", "Succeeded", "2026-01-02T00:00:00Z", message="done too"),
        status("train", "Running", "2026-01-01T00:00:00Z", progress={"step": 30, "max_steps": 100, "loss": 0.5},
               loss_curve=[(10, 2.0), (20, 1.0), (30, 0.5)]),
        status("bad", "Failed", "2026-01-03T00:00:00Z", message="exit 1 | <script>alert(1)</script>\nnext"),
    ]}
    text = ledger.render(rows)
    assert text.index("## Running (1)") < text.index("## Failed (1)") < text.index("## Succeeded (2)")
    assert text.index("[new](new.yaml)") < text.index("[old](old.yaml)")
    assert "**1** Running · **1** Failed · **2** Succeeded" in text
    assert "| [train](train.yaml) | 1/1 | 30/100 | [█▃▁ 0.5](train.svg) |" in text
    bad = next(line for line in text.splitlines() if line.startswith("| [bad]"))
    assert "<script>" not in bad and "&lt;script&gt;" in bad and "exit 1 \\| " in bad and bad.count(" | ") == 6
    assert ledger.render(rows) == text  # a value of its rows only: no clock in it


def test_sparkline_is_bounded_and_keeps_the_last_value():
    values = [float(100 - i) for i in range(100)]
    spark = ledger.sparkline(values)
    assert len(spark) == ledger.SPARK_POINTS and spark[0] == "█" and spark[-1] == "▁"
    assert ledger.sparkline([1.0]) == ""


def test_svg_is_small_and_self_contained():
    curve = [(i, 3.0 / i) for i in range(1, 121)]
    text = ledger.svg("run-a", curve)
    assert text.startswith("<svg ") and "<polyline" in text and "<script" not in text and "href" not in text
    assert len(text.encode()) < 8000


PROGRESS = ("mkdir -p artifacts/output && for i in 1 2 3 4; do "
            "echo '{\"loss\": '$((5 - i))'.5, \"global_step/max_steps\": \"'$i'/4\"}' >> artifacts/output/logging.jsonl; "
            "sleep 0.3; done")


def test_ledger_rides_with_the_status_commit_and_stays_put(tmp_path, ws_root):
    repo_dir = make_repo(tmp_path / "repo", {"train": run_spec("train", ["sh", "-c", PROGRESS])})
    rec = reconciler(repo_dir, ws_root)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rec.run_pass()
        st = status_of(repo_dir, "train")
        if st is not None and st.phase == "Succeeded":
            break
        time.sleep(0.1)
    assert st.phase == "Succeeded" and st.loss_curve[-1] == (4, 1.5)
    repo = git.Repo(repo_dir)
    readme = repo.git.show("HEAD:status/README.md")
    assert "## Succeeded (1)" in readme and "| [train](train.yaml) | 1/1 | 4/4 |" in readme
    curve = repo.git.show("HEAD:status/train.svg")
    assert "<polyline" in curve and "step 4" in curve
    # Nothing changed: no file rewritten, no commit.
    before = {p.name: p.read_bytes() for p in (repo_dir / "status").iterdir()}
    head = repo.head.commit.hexsha
    assert rec.run_pass().commit is None and reconciler(repo_dir, ws_root).run_pass().commit is None
    assert {p.name: p.read_bytes() for p in (repo_dir / "status").iterdir()} == before
    assert repo.head.commit.hexsha == head


def test_ledger_can_be_turned_off(tmp_path, ws_root):
    repo_dir = make_repo(tmp_path / "repo", {"a": run_spec("a", ["true"])})
    reconciler(repo_dir, ws_root, ledger=False).run_pass()
    assert sorted(p.name for p in (repo_dir / "status").iterdir()) == ["a.yaml"]


def test_price_and_cost_columns_appear_only_when_a_run_rents():
    plain = {"a": ledger.row(status("a", "Running", "2026-01-01T00:00:00Z"))}
    assert "price" not in ledger.render(plain)
    rented = dict(plain, b=ledger.row(status("b", "Running", "2026-01-02T00:00:00Z",
                                             cost={"price_per_hour": 2.4, "so_far": 1.375})))
    text = ledger.render(rented)
    assert "| machine | price | cost | since |" in text and "| 2.40/h | 1.38 |" in text
    assert "| [a](a.yaml) | 1/1 |  |  |  |  |  |" in text  # the run that does not rent: empty cells


def test_a_removed_or_edited_readme_is_written_again(tmp_path, ws_root):
    repo_dir = make_repo(tmp_path / "repo", {"a": run_spec("a", ["true"])})
    rec = reconciler(repo_dir, ws_root)
    deadline = time.monotonic() + 20
    while rec.run_pass().commit is not None or status_of(repo_dir, "a").phase != "Succeeded":
        assert time.monotonic() < deadline, "a did not settle"
        time.sleep(0.1)
    readme = repo_dir / "status" / "README.md"
    want = readme.read_text()
    assert "## Succeeded (1)" in want
    readme.unlink()  # what a reset of status/ to a remote without it does
    rec.run_pass()
    assert readme.read_text() == want
    readme.write_text("edited by hand\n")
    rec.run_pass()
    assert readme.read_text() == want
