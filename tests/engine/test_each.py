"""observe.each: a function over items on a few threads, results in order, errors raised here."""

from __future__ import annotations

import threading

import pytest

from reconciler.engine.observe import each


def test_results_keep_the_items_order_and_items_run_at_once() -> None:
    both = threading.Barrier(2, timeout=10)  # the first two items meet: two threads ran them at once

    def square(x: int) -> int:
        if x < 2:
            both.wait()
        return x * x

    assert each(square, list(range(50)), 4) == [x * x for x in range(50)]


def test_an_exception_in_a_worker_reaches_the_caller() -> None:
    def boom(x: int) -> int:
        if x == 7:
            raise OSError("disk full")
        return x

    with pytest.raises(OSError, match="disk full"):
        each(boom, list(range(20)), 4)


def test_one_thread_or_one_item_runs_inline() -> None:
    main = threading.current_thread().name
    seen = []
    each(lambda x: seen.append(threading.current_thread().name), [1, 2, 3], 1)
    each(lambda x: seen.append(threading.current_thread().name), [1], 8)
    assert set(seen) == {main}
