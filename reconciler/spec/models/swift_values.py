"""How ms-swift's parser reads one argument's value: the rules both the typed fields and ``args`` are held to.

A value is checked the way it reaches ms-swift: the rendered YAML is read back by ms-swift's
``parse_yaml_args`` (``swift/cli/main.py``), which turns ``key: value`` into ``--key`` plus
``str(v)`` for a scalar, one ``str(i)`` per item for a list and ``json.dumps(v)`` for a map; argparse
then takes the option's number of values, converts each with the option's type (Python's own
``int``, ``float``, ``dict``; transformers' ``string_to_bool``) and compares it with the choices.
The same builtins run here, so ``1.5`` for an int, ``five percent`` for a float or ``[]`` for a
single value are refused exactly when ms-swift would refuse them. Fields annotated ``Enum | str``
are converted by transformers' ``TrainingArguments.__post_init__`` (``SchedulerType(value)``):
their values are checked against the enum too. What each argument is (type, nargs, choices) is
``reconciler/tasks/swift_args.json``, read from the installed ms-swift by ``scripts/swift_args.py``.
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Any

# argparse's _negative_number_matcher (Lib/argparse.py): such a token is a value, not an option.
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
_BOOL_WORDS = {"yes": True, "true": True, "t": True, "y": True, "1": True,
               "no": False, "false": False, "f": False, "n": False, "0": False}


def argv_tokens(value: Any) -> list[str]:
    """The command-line words ``parse_yaml_args`` makes of a YAML value."""
    if isinstance(value, list):
        return [str(i) for i in value]
    if isinstance(value, dict):
        return [json.dumps(value, ensure_ascii=False)]
    return [str(value)]


def _is_value(token: str) -> bool:
    """Whether argparse reads ``token`` as a value rather than as another option (``_parse_optional``)."""
    if not token.startswith("-") or token == "-":
        return True
    return bool(_NEGATIVE_NUMBER.match(token)) or " " in token


def _string_to_bool(token: str) -> bool:
    # transformers.hf_argparser.string_to_bool, case-insensitive
    try:
        return _BOOL_WORDS[token.lower()]
    except KeyError:
        raise ValueError(token) from None


def _choice(choices: list):
    # transformers.hf_argparser.make_choice_type_function: the choice whose str() is the word, else the word
    by_text = {str(c): c for c in choices}
    return lambda token: by_text.get(token, token)


_CONVERTERS = {"int": int, "float": float, "str": str, "dict": dict, "bool": _string_to_bool}
_TYPE_WORDS = {"int": "an integer", "float": "a number (float)", "str": "a string", "dict": "a JSON object",
               "bool": "a boolean (true/false, yes/no, 1/0)"}


def _shown(choices: list) -> str:
    return ", ".join("null" if c is None else str(c) for c in choices)


def suggest(word: str, options) -> str:
    close = difflib.get_close_matches(word, [str(o) for o in options if o is not None], n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _count_problem(name: str, spec: dict, tokens: list[str]) -> str | None:
    nargs = spec.get("nargs")
    taken = 0
    while taken < len(tokens) and _is_value(tokens[taken]) and (nargs == "+" or taken < 1):
        taken += 1
    if taken < len(tokens):
        bad = tokens[taken]
        if not _is_value(bad):
            return (f"'{bad}' starts with '-', so ms-swift's parser reads it as another option "
                    "(quote-free values may not; write it without the leading '-')")
        return f"{name} takes one value, not a list of {len(tokens)}"
    if taken == 0 and nargs != "?":
        return f"{name} needs a value (an empty list gives it none)"
    return None


def value_problem(name: str, spec: dict, value: Any) -> tuple[str | None, list]:
    """Why ms-swift would refuse ``name: value`` (None if it accepts), and the values it would parse."""
    tokens = argv_tokens(value)
    problem = _count_problem(name, spec, tokens)
    if problem:
        return problem, []
    kind = spec.get("type", "any")
    convert = _choice(spec["choices"]) if kind == "choice" else _CONVERTERS.get(kind, lambda t: t)
    parsed = []
    for token in tokens:
        try:
            parsed.append(convert(token))
        except (ValueError, TypeError):
            return f"'{token}' is not {_TYPE_WORDS[kind]}: ms-swift reads {name} as {kind}", []
        choices = spec.get("choices")
        if choices is not None and parsed[-1] not in choices:
            return f"'{token}' is not one of {name}'s choices ({_shown(choices)}){suggest(token, choices)}", []
        enum = spec.get("enum")
        if enum is not None and token not in enum:
            return (f"'{token}' is not one of {name}'s values ({_shown(enum)}; transformers converts it to an "
                    f"enum){suggest(token, enum)}"), []
    return None, parsed


def typed_value(command: str, name: str, value: Any) -> Any:
    """A typed field's value as ms-swift parses it, or ValueError with the reason ms-swift would refuse it.

    Scalars come back converted (``"10"`` for an int becomes 10, as ms-swift reads it), lists as the
    list of parsed items, so the model's own types never refuse what ms-swift accepts.
    """
    from reconciler.tasks.swift import swift_argument_specs

    spec = swift_argument_specs(command).get(name)
    if spec is None or value is None or value == [] or value == {}:
        return value  # not rendered (swift.swift_config skips empty typed fields), so ms-swift never sees it
    problem, parsed = value_problem(name, spec, value)
    if problem:
        raise ValueError(problem)
    if spec.get("nargs") == "+":
        return parsed
    return parsed[0] if parsed else value
