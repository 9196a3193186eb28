"""The status writer against PyYAML: the same bytes for every status the tests produce and for
strings chosen to hit each of PyYAML's rules (plain, single-quoted, left to PyYAML)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler import yamlemit
from reconciler.status import RunStatus, dump, load_all, ordered
from reconciler.yamlemit import Flow

TRICKY = ["", " ", "a", "True", "true", "yes", "No", "on", "null", "~", "Null", "0", "012", "0x1F", "1e3", "1.5",
          ".5", "-1", "+1", ".inf", "-.inf", ".nan", "2026-11-24", "2026-11-24T19:38:55Z", "12:30", "1:2:3",
          "a: b", "a:b", "sha256:abc", "a #b", "a#b", "#x", "- x", "-x", "-", "?", "? x", ":x", "x:", "@x", "`x",
          "!x", "&x", "*x", "|", ">", "%x", "'", "'q'", '"', 'say "hi"', "it's", "[x]", "{x}", "x, y", "x,y",
          "a ", " a", "a  b", "a\tb", "a\\b", "=", "<<", "local: chosen (owned; 0 other task(s))",
          "node-1 does not answer (node-1 (127.0.0.5:42755): connection refused)", "x" * 1001,
          "line\nbreak", "café", "\x07bell", "/tmp/ws/test/a-g1-a1", "rc-ns--a-g1-a1-x1", "1_000", "0o17",
          "1,000", "+.5", "=x", "y", "n", "Y", "off", "OFF", "NO", "...", "...x", "---", "--x", "a...", ".x", "_x",
          "x:y:", "x::y", "1:00", "60:00", "1.0e+3", "1e+3", "0.", "._", "1__0", "0b101", "x/y:z", "/:x"]


@pytest.mark.parametrize("s", TRICKY)
def test_every_string_rule_gives_pyyaml_s_text(s: str) -> None:
    data = {"message": s, "list": [s, {"reason": s, "inner": {"why": s}}], "empty": [], "none": {}}
    fast = yamlemit.dump(data)
    if fast is None:  # left to PyYAML: a line break, non-ASCII text, a long string
        assert "\n" in s or not s.isascii() or len(s) > 1000 or not s.isprintable()
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


def test_status_files_written_by_the_tests_read_back_the_same(tmp_path: Path) -> None:
    """Every status file lying in a fixture repository of this checkout (examples and test data)
    dumps to the same text both ways."""
    roots = [Path(__file__).resolve().parent / "data", Path(__file__).resolve().parents[1] / "examples"]
    seen = 0
    for root in roots:
        for d in {p.parent for p in root.rglob("status/*.yaml")}:
            for st in load_all(d).values():
                seen += _same(st)
    st = RunStatus.model_validate({
        "name": "r", "phase": "Running", "generation": 1, "attempt": 2, "message": "a: b",
        "handle": {"machine": "m1", "identity": "r-g1-a2", "gpus": [0, 1], "nodes": [
            {"rank": 0, "machine": "m1", "identity": "r-g1-a2-n0", "workspace": "/w/r-g1-a2-n0"}]},
        "cost": {"provider": "local", "price_per_hour": 0.1, "so_far": 1.25},
        "progress": {"step": 10, "loss": 0.5}, "loss_curve": [[1, 2.0], [10, 0.5]],
        "conditions": [{"type": "Ready", "status": "True", "reason": "Running", "message": "",
                        "last_transition": "2026-11-24T19:38:55Z"}],
        "history": [{"time": "2026-11-24T19:38:55Z", "phase": "Running", "generation": 1, "attempt": 2,
                     "reason": "lost: node-1 unreachable for 301s; retry 1/3"}]})
    seen += _same(st)
    assert seen >= 1


def _same(st: RunStatus) -> int:
    assert dump(st).split("\n", 1)[1] == yamlemit.pyyaml_dump(ordered(st))
    return 1
