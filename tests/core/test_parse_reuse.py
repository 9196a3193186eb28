"""Reusing the parse of identical run entries (core/parse_reuse.py) gives what parsing gives: types
told apart, heartbeats and live counts read afresh, refusals kept, copies handed out, and a bounded memory."""

from __future__ import annotations

import json

from reconciler.core import boundary
from reconciler.core.parse_reuse import ParseMemo

DIGEST = "sha256:" + "ab" * 32
ENTRY = {"state": "running", "pid": 12, "started_at": 1000.5, "spec_digest": DIGEST, "workspace": "/w/r-g1-a1",
         "heartbeat_age": 1.5, "progress": {"step": 3, "loss": 0.5}, "checkpoints": ["out/checkpoint-1"]}


def _reply(runs: dict) -> dict:
    # A new decoding each time, as a transport hands it over.
    return json.loads(json.dumps({"now": 1.0, "root": "/w", "runs": runs}))


def _both(memo: ParseMemo, runs: dict, source: str = "m1"):
    memo.rotate()
    return boundary.parse_probe(_reply(runs), memo, source), boundary.parse_probe(_reply(runs))


def test_an_identical_entry_is_reused_and_equals_a_fresh_parse():
    memo = ParseMemo()
    first, fresh = _both(memo, {"r-g1-a1": ENTRY})
    assert first.runs == fresh.runs and memo.misses == 1
    again, fresh = _both(memo, {"r-g1-a1": ENTRY})
    assert again.runs == fresh.runs and memo.hits == 1
    # Copies: what a pass annotates never reaches the next pass's report.
    again.runs["r-g1-a1"].machine = "elsewhere"
    again.runs["r-g1-a1"].checkpoints.append("x")
    again.runs["r-g1-a1"].progress["step"] = 99
    third, fresh = _both(memo, {"r-g1-a1": ENTRY})
    assert third.runs == fresh.runs and third.runs["r-g1-a1"].progress["step"] == 3


def test_values_equal_in_python_but_not_in_type_are_parsed_again():
    memo = ParseMemo()
    _both(memo, {"r-g1-a1": ENTRY})
    for pid in (12.0, True):  # 12 == 12.0, 1 == True: the boundary refuses both as a pid
        got, fresh = _both(memo, {"r-g1-a1": dict(ENTRY, pid=pid)})
        assert got.runs == fresh.runs
        assert got.runs["r-g1-a1"].state == "unknown", pid
    got, fresh = _both(memo, {"r-g1-a1": dict(ENTRY, started_at=-0.0)})
    assert got.runs == fresh.runs


def test_the_heartbeat_moves_without_a_new_parse_and_is_still_checked():
    memo = ParseMemo()
    _both(memo, {"r-g1-a1": ENTRY})
    for age, expected in ((7.25, 7.25), ("soon", None), (float("inf"), None), (True, None)):
        got, fresh = _both(memo, {"r-g1-a1": dict(ENTRY, heartbeat_age=age)})
        assert got.runs == fresh.runs
        assert got.runs["r-g1-a1"].heartbeat_age == expected
    assert memo.hits == 4 and memo.misses == 1
    # An invalid entry never reads its heartbeat, reused or not.
    bad = dict(ENTRY, state="exploded")
    for age in (1.0, 2.0):
        got, fresh = _both(memo, {"r-g1-a1": dict(bad, heartbeat_age=age)})
        assert got.runs == fresh.runs and got.runs["r-g1-a1"].heartbeat_age is None


def test_the_count_of_live_processes_moves_without_a_new_parse_and_is_still_checked():
    memo = ParseMemo()
    _both(memo, {"r-g1-a1": dict(ENTRY, live=2)})
    for live, expected in ((5, 5), (0, 0), ("many", 0), (-3, 0), (1 << 40, 0), (2.5, 0)):
        got, fresh = _both(memo, {"r-g1-a1": dict(ENTRY, live=live)})
        assert got.runs == fresh.runs and got.runs["r-g1-a1"].live == expected, live
        assert got.same_runs  # the whole reply was taken, the count read afresh
    assert memo.misses == 1
    # An ended instance whose processes linger is told from one whose processes are gone.
    ended = dict(ENTRY, state="succeeded", exit_code=0, finished_at=1001.0)
    _both(memo, {"r-g1-a1": dict(ended, live=0)})
    got, fresh = _both(memo, {"r-g1-a1": dict(ended, live=3)})
    assert got.runs == fresh.runs and got.runs["r-g1-a1"].lingering


def test_a_whole_reply_repeated_keeps_its_refusals():
    memo = ParseMemo()
    runs = {"r-g1-a1": ENTRY, "not an identity": ENTRY, "s-g2-a1": "not an object"}
    first, fresh = _both(memo, runs)
    assert first.runs == fresh.runs and first.rejected == fresh.rejected and len(first.rejected) == 1
    again, fresh = _both(memo, runs)
    assert again.runs == fresh.runs and again.rejected == fresh.rejected
    # The same runs from another machine are that machine's first reply (its entries are the same
    # values, so they may reuse the parse; the result is a parse of them either way).
    other, fresh = _both(memo, runs, source="m2")
    assert other.runs == fresh.runs and other.rejected == fresh.rejected


def test_memory_is_bounded_and_unused_entries_go():
    memo = ParseMemo(limit=2)
    runs = {f"r{i}-g1-a1": dict(ENTRY, workspace=f"/w/r{i}-g1-a1") for i in range(5)}
    got, fresh = _both(memo, runs)
    assert got.runs == fresh.runs
    assert len(memo._current) <= 2 and len(memo._replies) <= 2
    memo.rotate()
    memo.rotate()
    assert not memo._current and not memo._previous and not memo._replies_before


def test_one_identity_from_two_machines_keeps_each_machines_own_report():
    memo = ParseMemo()
    a = {"r-g1-a1": ENTRY}
    b = {"r-g1-a1": dict(ENTRY, state="failed", exit_code=3)}
    for _ in range(3):
        memo.rotate()
        got_a = boundary.parse_probe(_reply(a), memo, "m1")
        got_b = boundary.parse_probe(_reply(b), memo, "m2")
        assert got_a.runs == boundary.parse_probe(_reply(a)).runs
        assert got_b.runs == boundary.parse_probe(_reply(b)).runs
        assert got_a.runs["r-g1-a1"].state == "running" and got_b.runs["r-g1-a1"].state == "failed"
