"""The status writer against PyYAML: the same bytes for every status the tests produce and for
strings chosen to hit each of PyYAML's rules (plain, single-quoted, left to PyYAML)."""

from __future__ import annotations

import pytest
import yaml

from reconciler.core import yamlemit
from reconciler.core.runstatus import RunStatus
from reconciler.status.store import dump, ordered
from reconciler.core.yamlemit import Flow

TRICKY = ["", " ", "a", "True", "true", "yes", "No", "on", "null", "~", "Null", "0", "012", "0x1F", "1e3", "1.5",
          ".5", "-1", "+1", ".inf", "-.inf", ".nan", "2026-11-24", "2026-11-24T19:38:55Z", "12:30", "1:2:3",
          "a: b", "a:b", "sha256:abc", "a #b", "a#b", "#x", "- x", "-x", "-", "?", "? x", ":x", "x:", "@x", "`x",
          "!x", "&x", "*x", "|", ">", "%x", "'", "'q'", '"', 'say "hi"', "it's", "[x]", "{x}", "x, y", "x,y",
          "a ", " a", "a  b", "a\tb", "a\\b", "=", "<<", "local: chosen (owned; 0 other task(s))",
          "node-1 does not answer (node-1 (127.0.0.5:42755): connection refused)", "x" * 1001,
          "line\nbreak", "café", "\x07bell", "/tmp/ws/test/a-g1-a1", "rc-ns--a-g1-a1-x1", "1_000", "0o17",
          "1,000", "+.5", "=x", "y", "n", "Y", "off", "OFF", "NO", "...", "...x", "---", "--x", "a...", ".x", "_x",
          "x:y:", "x::y", "1:00", "60:00", "1.0e+3", "1e+3", "0.", "._", "1__0", "0b101", "x/y:z", "/:x",
          "→", "a → b", "spec changed (0ld → 2eb6beef): generation 1 → 2", "… and 3 more", "…", "- …", "日本語",
          "\xa0x", "x\xa0", "\xa0", "a: →", "→: a", "\u2028", "x\u2029y", "\x85", "\ufeffx", "😀", "ÿ", "\u00ad",
          # words with spaces, which the writer takes as plain without PyYAML's analysis
          "found a-g1-a1 running on m0003; adopting it", "a b", "1 2", "1 x", "true false", "null x", "x null",
          "(x) y", "x (y)", "x, y (z)", "x = y", "x +y", "it's done", "'q' x", "x 'q'", ".. x", "... x", "- x y",
          "x -", "x - y", "_ x", "/a /b", "1.5 2.5", "0x1F x", "2026-11-24 21:59:43", "2026-11-24 x", "x" * 500 + " y",
          "x " * 500 + "y", "x y ", " x y", "x  y z", "x ,y", "x,", "x, ", "= x", "(x", "x)", "a;b c", "~ x", "x ~"]


@pytest.mark.parametrize("s", TRICKY)
def test_every_string_rule_gives_pyyaml_s_text(s: str) -> None:
    data = {"message": s, "list": [s, {"reason": s, "inner": {"why": s}}], "empty": [], "none": {}}
    fast = yamlemit.dump(data)
    if fast is None:  # left to PyYAML: a line break, a control character, a long string, beyond the basic plane
        assert "\n" in s or len(s) > 1000 or not s.isprintable() or any(ord(c) > 0xFFFF or c in "\x85\u2028\u2029\ufeff"
                                                                        for c in s)
    else:
        assert fast == yamlemit.pyyaml_dump(data)


def test_numbers_booleans_and_flow_points() -> None:
    data = {"a": 1, "b": -2, "c": 0.1, "d": 1e-05, "e": 1e17, "f": float("inf"), "g": float("nan"), "h": True,
            "i": False, "curve": [Flow([1, 2.5]), Flow([2, 1e-07]), Flow([3, 0])],
            "nested": [{"k": [1, 2], "m": {"x": 1.0}}, "plain"]}
    assert yamlemit.dump(data) == yamlemit.pyyaml_dump(data)


def test_a_list_in_a_list_and_odd_keys_are_left_to_pyyaml() -> None:
    assert yamlemit.dump({"a": [[1, 2]]}) is None
    assert yamlemit.dump({"a b": 1}) is None
    assert yamlemit.dump({"a": Flow(["x"])}) is None


def test_the_statuses_of_every_plan_case_are_written_as_pyyaml_writes_them() -> None:
    """The statuses the planner's table of cases leads to (every action, code, condition and
    history line it produces), and one with every optional part, dump the same both ways."""
    from reconciler.planner.make import make_plan
    from reconciler.status.summarize import summarize
    from tests.planner.test_plan import CASES, build

    seen = 0
    for case_file in CASES:
        desired, world, previous, now, settings = build(yaml.safe_load(case_file.read_text()))
        for c in make_plan(desired, world, previous, now, settings).changes:
            if c.phase is None:
                continue
            obs = world.find(c.identity) if c.identity else None
            seen += _same(summarize(previous.get(c.name), c, None, obs, now, None))
    assert seen >= len(CASES)
    seen += _same(RunStatus.model_validate({
        "name": "r", "phase": "Running", "generation": 1, "attempt": 2, "message": "a: b",
        "handle": {"machine": "m1", "identity": "r-g1-a2", "gpus": [0, 1], "nodes": [
            {"rank": 0, "machine": "m1", "identity": "r-g1-a2-n0", "workspace": "/w/r-g1-a2-n0"}]},
        "cost": {"provider": "local", "price_per_hour": 0.1, "so_far": 1.25},
        "progress": {"step": 10, "loss": 0.5}, "loss_curve": [[1, 2.0], [10, 0.5]],
        "conditions": [{"type": "Ready", "status": "True", "reason": "Running", "message": "",
                        "last_transition": "2026-11-24T19:38:55Z"}],
        "history": [{"time": "2026-11-24T19:38:55Z", "phase": "Running", "generation": 1, "attempt": 2,
                     "reason": "lost: node-1 unreachable for 301s; retry 1/3"}]}))


def _same(st: RunStatus) -> int:
    fast = yamlemit.dump(ordered(st))
    assert fast is not None, "an ordinary status is written without PyYAML"
    assert fast == yamlemit.pyyaml_dump(ordered(st))
    assert dump(st).split("\n", 1)[1] == fast
    return 1
