"""The JSON Schema of ms-swift's typed task fields: exactly what ``reconcile validate`` accepts.

ms-swift reads its arguments as command-line words (``spec/models/swift_values.py``): ``max_steps:
"10"`` is as good as ``max_steps: 10``, a one-item list is its item, ``"None"`` is a choice where
None is one, and a word starting with ``-`` is another option unless it is a negative number.
The typed fields' schemas say the same, so an editor flags what validate refuses and nothing else
(tests/spec/test_schema_typed.py holds the two to the same verdicts). The one value JSON Schema
cannot tell apart: ``10.0`` for an integer (JSON has one number type; validate reads the word
"10.0" and refuses it, as ms-swift's int() would).
"""

from __future__ import annotations

import copy

REF = "#/$defs/"

# What ``swift_values.value_problem`` accepts, word by word: a word starting with '-' is another
# option to argparse unless it is a negative number (``_NEGATIVE_NUMBER``) or holds a space;
# Python's int() and float() read the rest (surrounding whitespace, '_' between digits, inf, nan).
_WS = "[ \\t\\n\\r\\f\\v]*"
_DIGITS = "[0-9](?:_?[0-9])*"
_NOT_OPTION = "^(?:$|[^-]|-$|-[0-9]+$|-[0-9]*\\.[0-9]+$|[\\s\\S]* )"
INT_WORD = f"(?={_NOT_OPTION})^{_WS}[+-]?{_DIGITS}{_WS}$"
_FLOAT = (f"(?:(?:{_DIGITS}(?:\\.(?:{_DIGITS})?)?|\\.{_DIGITS})(?:[eE][+-]?{_DIGITS})?"
          "|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?|[nN][aA][nN])")
FLOAT_WORD = f"(?={_NOT_OPTION})^{_WS}[+-]?{_FLOAT}{_WS}$"
# A float that str() writes with a negative exponent (-1e-05) reads as an option.
_ARGV_NUMBER = {"type": "number", "not": {"exclusiveMinimum": -1e-4, "exclusiveMaximum": 0}}


def _value_string(string: dict) -> dict:
    return {**string, "type": "string", "pattern": _NOT_OPTION,
            "patternErrorMessage": "ms-swift's parser reads a word starting with '-' as another option"}


def _word(kind: str, choices: list | None, string: dict, item: bool) -> dict:
    """One value as ms-swift reads the word ``str(value)`` makes of it; ``item``: an item of a
    list (where str() writes null as None, and a list or a map as Python does, never with '-')."""
    if kind == "choice":
        return {"enum": [str(c) for c in choices] + ([None] if item and None in choices else [])}
    if kind == "int":
        return {"$ref": REF + "SwiftInt"}
    if kind == "float":
        return {"$ref": REF + "SwiftFloat"}
    if string:
        return {"anyOf": [_value_string(string), copy.deepcopy(_ARGV_NUMBER), {"type": "boolean"}]}
    return {"$ref": REF + ("SwiftStrItem" if item else "SwiftStr")}


def _word_defs(defs: dict) -> None:
    number = copy.deepcopy(_ARGV_NUMBER)
    defs["SwiftInt"] = {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": INT_WORD,
                                                        "patternErrorMessage": "not an integer (ms-swift reads it "
                                                                               "with int())"}],
                        "description": "An integer, or a string int() reads (ms-swift parses its arguments from words)."}
    defs["SwiftFloat"] = {"anyOf": [number, {"type": "string", "pattern": FLOAT_WORD,
                                                   "patternErrorMessage": "not a number (ms-swift reads it with "
                                                                          "float())"}],
                          "description": "A number, or a string float() reads (ms-swift parses its arguments from "
                                         "words)."}
    defs["SwiftStr"] = {"anyOf": [_value_string({}), number, {"type": "boolean"}],
                        "description": "A word ms-swift takes as this argument's value (one starting with '-' "
                                       "reads as another option unless it is a negative number or holds a space)."}
    defs["SwiftStrItem"] = {"anyOf": [{"$ref": REF + "SwiftStr"}, {"type": ["null", "array", "object"]}],
                            "description": "A list item: written as Python's str() of it."}


def _typed_field(prop: dict, spec: dict, optional: bool) -> None:
    """``prop`` (pydantic's, for a typed field) made to accept what ``swift_values.typed_value``
    accepts: a word of the argument's type, or a list of such words (one for a single value),
    and null where the field is optional (as a choice: where None is one)."""
    string = {k: prop[k] for k in ("minLength",) if k in prop}
    keep = {k: prop[k] for k in ("title", "description", "default", "examples") if k in prop}
    kind, choices = spec.get("type", "str"), spec.get("choices")
    word = _word(kind, choices, string, item=False)
    if "anyOf" in word:  # an editor's hover shows the branch a value matched: it says what the field is
        for branch in word["anyOf"]:
            branch.update({k: keep[k] for k in ("title", "description") if k in keep})
    items = {"type": "array", "items": _word(kind, choices, {}, item=True)}
    if spec.get("nargs") != "+":
        items.update(minItems=1, maxItems=1)
    branches = [word, items]
    if kind == "str":  # a map is passed as its JSON text: a word too
        branches.append({"type": "object", "minProperties": 1})
    if optional:
        branches.append({"type": "null"})
    prop.clear()
    prop.update(keep, anyOf=branches)


# checks.swift_args._check_data: no dataset (absent, null or []) needs a cached_dataset that is set.
NEEDS_DATA = {
    "if": {"not": {"required": ["args"], "properties": {"args": {
        "required": ["cached_dataset"], "properties": {"cached_dataset": {"not": {"enum": [None, False, 0, "", [], {}]}}}}}}},
    "then": {"required": ["dataset"], "properties": {"dataset": {"not": {"enum": [None, []]}}},
             "errorMessage": "no training data: set dataset or args.cached_dataset (ms-swift refuses a run with "
                             "neither)"},
}


def typed_fields(defs: dict, task: dict, command: str, model) -> None:
    from reconciler.tasks.swift import swift_argument_specs

    _word_defs(defs)
    specs = swift_argument_specs(command)
    for name, field in model.model_fields.items():
        spec = specs.get(name)
        if spec is None or name == "type" or spec.get("type") not in ("int", "float", "str", "choice"):
            continue
        optional = not field.is_required() and field.default is None or None in (spec.get("choices") or ())
        _typed_field(task["properties"][name], spec, optional)
