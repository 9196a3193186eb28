"""The runs a plan decides are those the set formula gives, whichever way they are worked out."""

from __future__ import annotations

import random

import pytest

from reconciler.planner.order import run_names


@pytest.mark.parametrize("seed", range(30))
def test_the_runs_of_a_plan_are_those_the_set_formula_gives(seed) -> None:
    rng = random.Random(seed)
    pick = lambda k: {f"r{rng.randrange(40)}": object() for _ in range(rng.randint(0, k))}  # noqa: E731
    runs, invalid, previous = pick(30), pick(4) if seed % 3 else {}, pick(10) if seed % 2 else {}
    settled = frozenset(rng.sample(sorted(runs), min(len(runs), 3))) if seed % 5 == 0 else frozenset()
    want = sorted((set(runs) | set(invalid) | set(previous)) - settled)
    assert run_names(runs, invalid, previous, settled) == want
