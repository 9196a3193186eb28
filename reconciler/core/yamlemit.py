"""A block-style YAML writer for status files, byte for byte what PyYAML writes, several times faster.

A first pass that adopts thousands of runs writes thousands of status files, and PyYAML's
representer (Python, even in front of libyaml's emitter) spent most of that pass: about 100
node objects per file. Status files only hold mappings, lists, strings, numbers and booleans, in
block style with the loss curve's points as flow lists; for those, the text is simple to write
directly. What decides the text of a string (plain, 'single-quoted' or "double-quoted") is PyYAML's
own analysis and resolver, asked once per distinct string and remembered, so the output cannot
drift from what ``yaml.dump`` gives. Anything unusual (a string with a line break or a control
character, text beyond the basic plane, a very long string, a type not listed above) makes
``dump`` return None, and the caller uses PyYAML. ``tests/core/test_yamlemit.py`` compares both on the statuses the tests produce and on
strings chosen to hit every rule.
"""

from __future__ import annotations

import functools
import io
import math
import re

import yaml
from yaml.emitter import Emitter
from yaml.nodes import ScalarNode
from yaml.resolver import Resolver

STR_TAG = "tag:yaml.org,2002:str"
# Printable text (ASCII, and the printable Unicode of the basic plane: arrows and ellipses are
# common in messages), no line break of any kind (NEL, the Unicode line and paragraph separators),
# no byte order mark, short enough that no writer would fold it.
_SIMPLE = re.compile("^[\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd]{0,1000}$")
_resolver = Resolver()
_emitter = Emitter(io.StringIO(), allow_unicode=True)


class Unusual(Exception):
    """A value this writer leaves to PyYAML."""


class Flow(list):
    """A list written on one line: ``[1, 2.5]`` (numbers only)."""


# Strings PyYAML's analysis always finds fit for a plain block scalar: no space, no indicator at
# the start, no ':' at the end (a ':' inside is plain when a non-space follows it). Only the
# resolver then decides (1.5, true, 0x1F and 2026-11-24 are not strings to it): most of a status's
# strings (identities, paths, digests) take this road, without the analysis.
_PLAIN_SHAPE = re.compile(r"^[A-Za-z0-9_/.](?:[A-Za-z0-9_/.+:-]*[A-Za-z0-9_/.+-])?$")
# Words with single spaces between them and none of ':' or '#' (the only characters that make a
# space matter to the analysis): messages such as "found x-g1-a1 running on m1; adopting it",
# one of a kind per run, so the cache does not spare their analysis. Within _SIMPLE's length.
_PLAIN_WORDS = re.compile(r"^[A-Za-z0-9_/.(][A-Za-z0-9_/.+;=(),'-]*(?: [A-Za-z0-9_/.+;=(),'-]+)+$")


@functools.lru_cache(maxsize=65536)
def _style(s: str) -> str:
    """The scalar as PyYAML writes it as a block mapping's value or a block sequence's item."""
    if ((_PLAIN_SHAPE.match(s) or (len(s) <= 1000 and _PLAIN_WORDS.match(s)))
            and not s.startswith("...")  # a document end marker: PyYAML quotes it
            and _resolver.resolve(ScalarNode, s, (True, False)) == STR_TAG):
        return s
    return _analysed(s)


def _analysed(s: str) -> str:
    if not _SIMPLE.match(s):
        raise Unusual(s)
    implicit = _resolver.resolve(ScalarNode, s, (True, False)) == STR_TAG
    a = _emitter.analyze_scalar(s)
    if implicit and a.allow_block_plain and not a.multiline:
        return s
    if a.allow_single_quoted:
        return "'" + s.replace("'", "''") + "'"
    raise Unusual(s)


def _scalar(v) -> str:
    if v is True:
        return "true"
    if v is False:
        return "false"
    if v is None:
        return "null"
    if isinstance(v, str):
        return _style(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return ".nan"
        if math.isinf(v):
            return ".inf" if v > 0 else "-.inf"
        text = repr(v).lower()
        return text.replace("e", ".0e", 1) if "." not in text and "e" in text else text
    raise Unusual(type(v).__name__)


_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@functools.lru_cache(maxsize=4096)
def _key(k: str) -> str:
    """A mapping key: a plain word (status files have no other kind)."""
    if not _KEY.match(k) or _style(k) != k:
        raise Unusual(k)
    return k


def _flow(items: list) -> str:
    for v in items:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise Unusual("a flow list holds numbers only")
    return "[" + ", ".join(_scalar(v) for v in items) + "]"


def _value(v, indent: int, out: list[str], head: str) -> None:
    """``head`` (``key:`` or ``-``, already indented) followed by the value."""
    if isinstance(v, Flow):
        out.append(f"{head} {_flow(v)}\n")
    elif isinstance(v, dict):
        if not v:
            out.append(f"{head} {{}}\n")
        elif head.endswith("-"):
            _mapping(v, indent + 2, out, first=head + " ")
        else:
            out.append(head + "\n")
            _mapping(v, indent + 2, out)
    elif isinstance(v, list):
        if not v:
            out.append(f"{head} []\n")
        elif head.endswith("-"):
            raise Unusual("a list in a list")
        else:
            out.append(head + "\n")
            _sequence(v, indent, out)  # PyYAML does not indent a mapping's sequence
    else:
        out.append(f"{head} {_scalar(v)}\n")


def _mapping(d: dict, indent: int, out: list[str], first: str | None = None) -> None:
    pad = " " * indent
    lead = first if first is not None else pad
    for k, v in d.items():
        if type(k) is not str:
            raise Unusual(k)
        t = type(v)
        if t is str:  # the common cases first, without a call per value
            out.append(f"{lead}{_key(k)}: {_style(v)}\n")
        elif t is int:
            out.append(f"{lead}{_key(k)}: {v}\n")
        else:
            _value(v, indent, out, f"{lead}{_key(k)}:")
        lead = pad


def _sequence(items: list, indent: int, out: list[str]) -> None:
    pad = " " * indent
    for v in items:
        _value(v, indent, out, f"{pad}-")


def dump(data: dict) -> str | None:
    """``yaml.dump(data, sort_keys=False, default_flow_style=False, width=4096, allow_unicode=True)``
    with ``Flow`` lists in flow style; None when the data holds something this writer leaves to PyYAML."""
    out: list[str] = []
    try:
        _mapping(data, 0, out)
    except Unusual:
        return None
    return "".join(out)


# PyYAML's writer for the same data: libyaml's emitter when PyYAML has it.
_FlowDumper = type("_FlowDumper", (getattr(yaml, "CSafeDumper", yaml.SafeDumper),), {})
_FlowDumper.add_representer(Flow, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))


def pyyaml_dump(data: dict) -> str:
    """The same text by PyYAML."""
    return yaml.dump(data, Dumper=_FlowDumper, sort_keys=False, default_flow_style=False, width=4096,
                     allow_unicode=True)
