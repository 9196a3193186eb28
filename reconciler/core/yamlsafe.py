"""Reading YAML that strangers wrote, quickly when it is fine and precisely when it is not.

Specs arrive by pull request, so the loader treats them as hostile: a size limit, UTF-8 only, no
custom tags or objects, no duplicate keys, and a bound on alias expansion (a "billion laughs" file
fails in milliseconds instead of eating the machine).

Two parsers, one result. Parsing dominates validation time (libyaml reads valid specs several times
faster than ruamel.yaml), so every file is first read with libyaml. Only a file that fails anything
is read again with ruamel.yaml's round-trip loader, which keeps the line and column of every key
and item; the errors users see always come from that path. Both sides resolve scalars with the YAML
1.2 core schema (``1e-4`` is a float, ``yes`` and ``2024-01-01`` are strings), so the two never
disagree about what a file means.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq, TaggedScalar
from ruamel.yaml.error import MarkedYAMLError, YAMLError as RuamelError
from ruamel.yaml.resolver import VersionedResolver

MAX_BYTES = 1 << 20  # 1 MiB: a spec is tens of lines
MAX_NODES = 20_000  # values after alias expansion
MAX_DEPTH = 64


class YamlProblem(Exception):
    def __init__(self, message: str, line: int = 0, col: int = 0):
        super().__init__(message)
        self.message, self.line, self.col = message, line, col


# ---------------------------------------------------------------- the fast path (libyaml)

_CLoader = getattr(yaml, "CSafeLoader", None)


# The YAML 1.2 core schema, shared by both parsers so that they agree on every plain scalar. No
# timestamps, no binary or underscored ints, no merge keys ('<<'), whatever a %YAML directive says.
CORE_RESOLVERS: list[tuple[str, re.Pattern[str], list[str]]] = [
    ("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")),
    ("tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789")),
    (
        "tag:yaml.org,2002:float",
        re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
        list("-+0123456789."),
    ),
    ("tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""]),
]


def _core_schema_resolvers(cls: type) -> None:
    cls.yaml_implicit_resolvers = {}
    for tag, regexp, first in CORE_RESOLVERS:
        cls.add_implicit_resolver(tag, regexp, first)


if _CLoader is not None:

    class _FastLoader(_CLoader):  # type: ignore[misc, valid-type]
        """libyaml parser and composer with YAML 1.2 core-schema scalar resolution."""

    _core_schema_resolvers(_FastLoader)
else:  # pragma: no cover - PyYAML built without libyaml
    _FastLoader = None

_BOOL = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_SPECIAL_FLOATS = {".inf": "inf", ".Inf": "inf", ".INF": "inf", ".nan": "nan", ".NaN": "nan", ".NAN": "nan"}


def _to_int(v: str) -> int:
    if v.startswith("0o"):
        return int(v[2:], 8)
    if v.startswith("0x"):
        return int(v[2:], 16)
    return int(v)


def _to_float(v: str) -> float:
    sign = v[0] if v[:1] in "+-" and v[1:] in _SPECIAL_FLOATS else ""
    return float(sign + _SPECIAL_FLOATS.get(v[len(sign):], v[len(sign):]))


_SCALAR = {
    "tag:yaml.org,2002:str": str,
    "tag:yaml.org,2002:int": _to_int,
    "tag:yaml.org,2002:float": _to_float,
    "tag:yaml.org,2002:bool": _BOOL.__getitem__,
    "tag:yaml.org,2002:null": lambda v: None,
}
_MAP, _SEQ = "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"


def _construct(node: Any, memo: dict[int, Any], depth: int = 0) -> Any:
    """Node graph → plain data. Anything but core tags, a duplicate key or deep nesting raises (→ located path)."""
    key = id(node)
    if key in memo:  # an alias: shared, never copied (expansion is bounded separately)
        return memo[key]
    if isinstance(node, yaml.ScalarNode):
        return _SCALAR[node.tag](node.value)
    if depth >= MAX_DEPTH:  # at most MAX_DEPTH nested collections, as _prescan says
        raise YamlProblem("nesting too deep")
    if isinstance(node, yaml.MappingNode):
        if node.tag != _MAP:
            raise KeyError(node.tag)
        out: dict[str, Any] = {}
        memo[key] = out
        for k, v in node.value:
            if not isinstance(k, yaml.ScalarNode) or k.tag != "tag:yaml.org,2002:str" or k.value in out or k.value == "<<":
                raise KeyError("key")
            out[k.value] = _construct(v, memo, depth + 1)
        return out
    if node.tag != _SEQ:
        raise KeyError(node.tag)
    seq: list[Any] = []
    memo[key] = seq
    seq.extend(_construct(v, memo, depth + 1) for v in node.value)
    return seq


def fast_load(text: str) -> Any:
    """Parse with libyaml; raise on anything unusual so the caller falls back to ``located_load``."""
    if _FastLoader is None:
        raise YamlProblem("libyaml unavailable")
    loader = _FastLoader(text)
    try:
        node = loader.get_single_node()
    finally:
        loader.dispose()
    if node is None:
        raise YamlProblem("empty")
    data = _construct(node, {})
    if ("&" in text or "*" in text) and _expanded_size(data) > MAX_NODES:
        raise YamlProblem("alias expansion too large")
    return data


def _expanded_size(data: Any) -> int:
    """Number of values after expanding aliases, computed without expanding them."""
    memo: dict[int, int] = {}

    def size(v: Any, depth: int) -> int:
        if depth > MAX_DEPTH:
            return MAX_NODES + 1
        if isinstance(v, dict):
            items: Iterable[Any] = v.values()
        elif isinstance(v, list):
            items = v
        else:
            return 1
        key = id(v)
        if key in memo:
            return memo[key]
        memo[key] = MAX_NODES + 1  # a cycle counts as too large
        total = 1
        for item in items:
            total += size(item, depth + 1)
            if total > MAX_NODES:
                break
        memo[key] = total
        return total

    return size(data, 0)


# ---------------------------------------------------------------- the located path (ruamel.yaml)


class _CoreResolver(VersionedResolver):
    """ruamel.yaml's resolver restricted to ``CORE_RESOLVERS``, for every document version.

    ruamel.yaml's own 1.2 rules still resolve timestamps, ``0b101``, ``1_000`` and merge keys; the
    fast path does not, and the two paths must agree about what a file means.
    """

    @property
    def versioned_resolver(self) -> Any:
        if not self._version_implicit_resolver:
            for tag, regexp, first in CORE_RESOLVERS:
                self.add_version_implicit_resolver((1, 2), tag, regexp, first)
        return self._version_implicit_resolver[(1, 2)]


def _ruamel() -> YAML:
    y = YAML(typ="rt", pure=True)
    y.Resolver = _CoreResolver
    y.allow_duplicate_keys = False
    return y


@dataclass
class Located:
    """A document read with ruamel.yaml: plain data plus a way to find where a value was written."""

    data: Any
    raw: Any = field(repr=False)

    def locate(self, loc: Iterable[Any]) -> tuple[int, int]:
        """1-based (line, col) of the deepest part of ``loc`` that exists in the document."""
        node = self.raw
        line, col = 1, 1
        for part in loc:
            if isinstance(node, CommentedMap) and part in node:
                kl, kc, *_ = node.lc.data[part]
                line, col = kl + 1, kc + 1
                node = node[part]
            elif isinstance(node, CommentedSeq) and isinstance(part, int) and 0 <= part < len(node):
                il, ic = node.lc.data[part][:2]
                line, col = il + 1, ic + 1
                node = node[part]
            elif isinstance(part, str) and not (isinstance(node, CommentedMap) and part in node):
                # Parts pydantic adds that are not keys (a union's tag, "function-after"): skip.
                continue
            else:
                break
        if node is self.raw and line == 1 and col == 1 and isinstance(node, (CommentedMap, CommentedSeq)):
            line, col = node.lc.line + 1, node.lc.col + 1
        return line, col


def located_load(text: str) -> Located:
    """Parse with ruamel.yaml; raise ``YamlProblem`` with a location for every refusal."""
    _prescan(text)
    y = _ruamel()
    try:
        docs = list(y.load_all(text))
    except MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = e.problem or str(e).splitlines()[0]
        if "duplicate key" in str(e).lower() or "found duplicate key" in (problem or ""):
            key = re.search(r'duplicate key "?([^"\n]+?)"? with', str(e))
            problem = f"duplicate key {key.group(1)!r}" if key else "duplicate key"
        elif "'\\t'" in problem or "\t" in problem:
            problem += " (indent with spaces: YAML does not allow tabs there)"
        elif e.context and e.context_mark is not None:
            cm = e.context_mark
            problem += f" ({e.context} that starts at line {cm.line + 1}, column {cm.column + 1})"
            if "stream end" in problem or "end of stream" in problem:  # the end of the file is not where the mistake is
                mark = cm
        line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        raise YamlProblem(f"invalid YAML: {problem}", line, col) from None
    except RuamelError as e:
        raise YamlProblem(f"invalid YAML: {str(e).splitlines()[0]}") from None
    except RecursionError:
        raise YamlProblem("invalid YAML: nesting too deep") from None
    if not docs:
        raise YamlProblem("empty file: expected one YAML mapping", 1, 1)
    if len(docs) > 1:
        raise YamlProblem("expected one document per file, found several ('---' separators)", *_second_document(y, text))
    raw = docs[0]
    if _expanded_size(raw) > MAX_NODES:
        raise YamlProblem(
            f"alias expansion exceeds {MAX_NODES} values (a 'billion laughs' document?); anchors and aliases are limited",
            1, 1,
        )
    return Located(data=_plain(raw, (1, 1)), raw=raw)


def _prescan(text: str) -> None:
    """Refuse, with a location, what ruamel.yaml handles slowly or silently: deep nesting (ruamel
    takes seconds to hit the recursion limit) and an alias inside its own anchor (ruamel reads
    ``&a [*a]`` as ``[None]``). libyaml's event stream makes this cheap; a syntax error is left to
    ruamel.yaml, which reports it."""
    if _FastLoader is None:  # pragma: no cover
        return
    opened: list[str | None] = []
    try:
        for ev in yaml.parse(text, Loader=_FastLoader):
            if isinstance(ev, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                opened.append(ev.anchor)
                if len(opened) > MAX_DEPTH:
                    m = ev.start_mark
                    raise YamlProblem(f"nesting deeper than {MAX_DEPTH} levels", m.line + 1, m.column + 1)
            elif isinstance(ev, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                opened.pop()
            elif isinstance(ev, yaml.AliasEvent) and ev.anchor in opened:
                m = ev.start_mark
                raise YamlProblem(f"alias *{ev.anchor} refers to its own anchor (a recursive structure)", m.line + 1, m.column + 1)
    except yaml.YAMLError as e:
        # libyaml 0.2.5 with PyYAML >= 6.0.3 refuses more than 1000 nested flow levels while
        # scanning ahead, before the events reach the limit here: the events of the text up to
        # where it stopped say where the limit was crossed.
        mark = getattr(e, "problem_mark", None)
        if "nesting depth" in str(e) and mark is not None and 0 < mark.index < len(text):
            _prescan(text[:mark.index])
            raise YamlProblem(f"nesting deeper than {MAX_DEPTH} levels", mark.line + 1, mark.column + 1) from None
        return


def _second_document(y: YAML, text: str) -> tuple[int, int]:
    """Where the second document of a stream starts (its '---'), for a located refusal."""
    try:
        starts = [ev.start_mark for ev in y.parse(text) if type(ev).__name__ == "DocumentStartEvent"]
    except RuamelError:
        starts = []
    return (starts[1].line + 1, starts[1].column + 1) if len(starts) > 1 else (1, 1)


STANDARD_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "map", "seq")}


def _plain(v: Any, where: tuple[int, int]) -> Any:
    """ruamel's round-trip types → plain Python, refusing tags and types a spec never needs.

    ``where`` is the (line, col) of the key or item that holds ``v``: tagged scalars carry no
    position of their own.
    """
    tag = getattr(v, "tag", None)
    tag_value = getattr(tag, "value", tag) if tag is not None else None
    if tag_value and str(tag_value) not in STANDARD_TAGS:
        shown = str(tag_value).replace("tag:yaml.org,2002:", "!!")
        raise YamlProblem(f"tag {shown} is not allowed: specs hold plain strings, numbers, booleans, lists and maps", *where)
    if isinstance(v, TaggedScalar) and str(tag_value) == "tag:yaml.org,2002:str":
        return str(v.value)  # '!!str 12': what the fast path reads too
    if isinstance(v, CommentedMap):
        out = {}
        for k, item in v.items():
            pos = v.lc.data.get(k)
            at = (pos[0] + 1, pos[1] + 1) if pos else where
            if not isinstance(k, str):
                raise YamlProblem(f"keys must be strings, not {type(k).__name__} ({k!r})", *at)
            if k == "<<":
                raise YamlProblem("merge keys ('<<') are not allowed: write the keys out", *at)
            out[k] = _plain(item, (pos[2] + 1, pos[3] + 1) if pos else where)
        return out
    if isinstance(v, CommentedSeq):
        return [_plain(x, (v.lc.data[i][0] + 1, v.lc.data[i][1] + 1) if i in v.lc.data else where)
                for i, x in enumerate(v)]
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    if isinstance(v, str):
        return str(v)
    raise YamlProblem(f"a value of type {type(v).__name__} is not allowed: specs hold plain strings, numbers, "
                      "booleans, lists and maps", *where)


def decode(raw: bytes) -> str:
    """UTF-8 text or a located refusal; a BOM is tolerated."""
    if len(raw) > MAX_BYTES:
        raise YamlProblem(f"file is {len(raw)} bytes; the limit is {MAX_BYTES}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        before = raw[: e.start]
        line = before.count(b"\n") + 1
        col = e.start - (before.rfind(b"\n") + 1) + 1
        raise YamlProblem(f"not valid UTF-8 (byte 0x{raw[e.start]:02x}); save the file as UTF-8", line, col) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    if "\x00" in text:
        before = text[: text.index("\x00")]
        raise YamlProblem("contains a NUL character", before.count("\n") + 1, len(before) - before.rfind("\n"))
    return text
