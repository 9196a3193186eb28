"""The two YAML paths (libyaml fast, ruamel located) must agree on what a file means, and both must
refuse hostile input quickly and with a location."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from reconciler.core import yamlsafe
from reconciler.core.yamlsafe import YamlProblem, decode, fast_load, located_load

REPO = Path(__file__).resolve().parents[2]


def both(text: str):
    return fast_load(text), located_load(text).data


# (YAML text of a value, what the core schema of YAML 1.2 makes of it)
SCALARS = [
    ("1e-4", 1e-4),
    ("1.0e-4", 1e-4),
    ("1E3", 1000.0),
    ("-2.5", -2.5),
    (".5", 0.5),
    ("1.", 1.0),
    ("+12", 12),
    ("-0", 0),
    ("0o17", 15),
    ("0x1F", 31),
    ("017", 17),  # YAML 1.1 octal; 1.2 decimal
    (".inf", math.inf),
    ("-.inf", -math.inf),
    ("true", True),
    ("False", False),
    ("TRUE", True),
    ("yes", "yes"),
    ("no", "no"),
    ("on", "on"),
    ("off", "off"),
    ("y", "y"),
    ("n", "n"),
    ("~", None),
    ("null", None),
    ("", None),
    ("2024-01-01", "2024-01-01"),
    ("2024-01-01T10:00:00Z", "2024-01-01T10:00:00Z"),
    ("2001-12-14 21:59:43.10 -5", "2001-12-14 21:59:43.10 -5"),
    ("12:30:00", "12:30:00"),  # YAML 1.1 sexagesimal
    ("1_000", "1_000"),
    ("0b101", "0b101"),
    ("=", "="),
    ("'12'", "12"),
    ('"true"', "true"),
    ("!!str 12", "12"),
    ("!!int '12'", 12),
    ("!!float 1", 1.0),
    ("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B"),
]


@pytest.mark.parametrize("text,value", SCALARS, ids=[s for s, _ in SCALARS])
def test_core_schema_scalars_agree(text: str, value) -> None:
    fast, located = both(f"a: {text}\n")
    assert fast == located == {"a": value}
    assert type(fast["a"]) is type(value) is type(located["a"])


def test_yaml_11_directive_does_not_revive_11_booleans() -> None:
    fast, located = both("%YAML 1.1\n---\na: yes\nb: 0b1\n")
    assert fast == located == {"a": "yes", "b": "0b1"}


def test_nan_agrees() -> None:
    fast, located = both("a: .nan\n")
    assert math.isnan(fast["a"]) and math.isnan(located["a"])


@pytest.mark.parametrize("path", sorted((REPO / "specs").rglob("*.yaml")) + sorted((REPO / "execution_templates").glob("*.yaml")),
                         ids=lambda p: str(p.relative_to(REPO)))
def test_repository_examples_agree(path: Path) -> None:
    text = decode(path.read_bytes())
    fast, located = both(text)
    assert fast == located


def test_nested_structures_agree() -> None:
    text = "a:\n  - {b: 1, c: [x, 'y', 2.0]}\n  - - nested\n    - 1e-4\nd: {}\ne: []\n"
    fast, located = both(text)
    assert fast == located == {"a": [{"b": 1, "c": ["x", "y", 2.0]}, ["nested", 1e-4]], "d": {}, "e": []}


def test_shared_aliases_agree() -> None:
    fast, located = both("base: &b {x: 1}\nother: *b\n")
    assert fast == located == {"base": {"x": 1}, "other": {"x": 1}}


# ---------------------------------------------------------------- refusals


def _laughs(levels: int = 9) -> str:
    text = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    prev = "a"
    for c in "bcdefghijklmnop"[: levels - 1]:
        text += f"{c}: &{c} [" + ",".join(["*" + prev] * 9) + "]\n"
        prev = c
    return text


@pytest.mark.parametrize("loader", [fast_load, located_load], ids=["fast", "located"])
def test_billion_laughs_fails_fast(loader) -> None:
    start = time.perf_counter()
    with pytest.raises(YamlProblem):
        loader(_laughs())
    assert time.perf_counter() - start < 0.5


def test_billion_laughs_is_located() -> None:
    with pytest.raises(YamlProblem, match="alias expansion exceeds") as e:
        located_load(_laughs())
    assert (e.value.line, e.value.col) == (1, 1)


def test_modest_aliases_are_fine() -> None:
    assert located_load(_laughs(3)).data == fast_load(_laughs(3))


@pytest.mark.parametrize("loader", [fast_load, located_load], ids=["fast", "located"])
def test_recursive_alias_refused(loader) -> None:
    with pytest.raises(YamlProblem):
        loader("a: &a [1, *a]\n")


def test_recursive_alias_located() -> None:
    with pytest.raises(YamlProblem, match="refers to its own anchor") as e:
        located_load("x: 1\na: &a [1, *a]\n")
    assert (e.value.line, e.value.col) == (2, 11)


@pytest.mark.parametrize("depth,ok", [(64, True), (65, False)])
def test_depth_limit_is_the_same_on_both_paths(depth: int, ok: bool) -> None:
    text = "[" * depth + "1" + "]" * depth
    for loader in (fast_load, located_load):
        if ok:
            loader(text)
        else:
            with pytest.raises(YamlProblem):
                loader(text)


def test_deep_nesting_fails_fast_with_a_location() -> None:
    text = "a: " + "[" * 50_000 + "]" * 50_000 + "\n"
    start = time.perf_counter()
    with pytest.raises(YamlProblem, match="nesting deeper than 64") as e:
        located_load(text)
    assert time.perf_counter() - start < 1.0
    # the top-level mapping is the first of the 65 collections; the 64th "[" is the last straw
    assert (e.value.line, e.value.col) == (1, 4 + 63)


@pytest.mark.parametrize(
    "text,match,line,col",
    [
        ("a: 1\na: 2\n", "duplicate key 'a'", 2, 1),
        ("a: !!python/object:os.system x\n", "tag !!python/object:os.system is not allowed", 1, 4),
        ("a:\n  - !foo x\n", "tag !foo is not allowed", 2, 5),
        ("a: !!binary aGk=\n", "not allowed", 1, 4),
        ("a: !!set {x}\n", "not allowed", 1, 4),
        ("a: !!timestamp 2024-01-01\n", "not allowed", 1, 4),
        ("b: &x {c: 1}\nd:\n  <<: *x\n", "merge keys", 3, 3),
        ("1: one\n", "keys must be strings", 1, 1),
        ("a: [1, 2\n", "invalid YAML", 1, 4),
        ("a:\n\tb: 1\n", "tabs", 2, 1),
        ("a: 1\n---\nb: 2\n", "one document per file", 2, 1),
        ("", "empty file", 1, 1),
        ("# only a comment\n", "empty file", 1, 1),
        ("a: *nope\n", "undefined alias", 1, 4),
    ],
)
def test_refusals_are_located(text: str, match: str, line: int, col: int) -> None:
    with pytest.raises(YamlProblem, match=match) as e:
        located_load(text)
    assert (e.value.line, e.value.col) == (line, col)


@pytest.mark.parametrize(
    "text",
    ["a: 1\na: 2\n", "a: !!python/object:os.system x\n", "a: !foo x\n", "b: &x {c: 1}\nd:\n  <<: *x\n",
     "'<<': 1\n", "1: one\n", "a: [1, 2\n", "a: !!binary aGk=\n", ""],
)
def test_fast_path_refuses_what_the_located_path_refuses(text: str) -> None:
    """Anything unusual goes to the located path: the fast path never accepts it silently."""
    with pytest.raises(Exception):
        fast_load(text)


def test_located_positions() -> None:
    doc = located_load("a:\n  b:\n    - x\n    - {c: 1}\n")
    assert doc.locate(("a",)) == (1, 1)
    assert doc.locate(("a", "b")) == (2, 3)
    assert doc.locate(("a", "b", 1)) == (4, 7)
    assert doc.locate(("a", "b", 1, "c")) == (4, 8)
    # A path that leaves the document points at the deepest part that exists.
    assert doc.locate(("a", "missing")) == (1, 1)
    assert doc.locate(("a", "b", 7)) == (2, 3)


# ---------------------------------------------------------------- bytes


def test_decode_tolerates_a_bom() -> None:
    assert decode(b"\xef\xbb\xbfa: 1\n") == "a: 1\n"


def test_decode_locates_bad_utf8() -> None:
    with pytest.raises(YamlProblem, match="not valid UTF-8 \\(byte 0xe9\\)") as e:
        decode(b"a: 1\nb: caf\xe9\n")
    assert (e.value.line, e.value.col) == (2, 7)


def test_decode_locates_nul() -> None:
    with pytest.raises(YamlProblem, match="NUL") as e:
        decode(b"a: 1\nbb: x\x00y\n")
    assert (e.value.line, e.value.col) == (2, 6)


def test_decode_size_limit() -> None:
    decode(b"#" * yamlsafe.MAX_BYTES)
    with pytest.raises(YamlProblem, match="limit"):
        decode(b"#" * (yamlsafe.MAX_BYTES + 1))


def test_utf16_is_refused() -> None:
    with pytest.raises(YamlProblem, match="UTF-8"):
        decode("a: 1\n".encode("utf-16"))
