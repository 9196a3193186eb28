"""engine/downtime.py: a silent machine's silence is dated from the first pass that found it, across
processes, so the hold of planner/fence.py ends after the grace."""

from __future__ import annotations

import json

from reconciler.core.observed import ObservedMachine, ObservedWorld
from reconciler.engine.downtime import FILE, mark


def world(**reachable: bool) -> ObservedWorld:
    w = ObservedWorld()
    for name, up in reachable.items():
        w.machines[name] = ObservedMachine(name, reachable=up)
    return w


def test_silence_is_dated_from_the_first_pass_that_found_it_even_in_a_new_process(tmp_path):
    w = world(a=False, b=True)
    mark(tmp_path, w, now=100.0)
    assert w.machines["a"].unreachable_since == 100.0
    later = world(a=False, b=True)
    mark(tmp_path, later, now=400.0)  # a new process: nothing in memory, the file remains
    assert later.machines["a"].unreachable_since == 100.0
    assert json.loads((tmp_path / FILE).read_text()) == {"a": 100.0}


def test_an_answer_clears_the_date(tmp_path):
    mark(tmp_path, world(a=False), now=100.0)
    mark(tmp_path, world(a=True), now=200.0)
    assert json.loads((tmp_path / FILE).read_text()) == {}
    again = world(a=False)
    mark(tmp_path, again, now=300.0)
    assert again.machines["a"].unreachable_since == 300.0


def test_a_status_that_dates_it_earlier_wins_and_a_broken_file_is_ignored(tmp_path):
    (tmp_path / FILE).write_text("{not json")
    w = world(a=False)
    w.machines["a"].unreachable_since = 50.0
    mark(tmp_path, w, now=100.0)
    assert w.machines["a"].unreachable_since == 50.0
