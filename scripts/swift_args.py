#!/usr/bin/env python3
"""Regenerate reconciler/tasks/swift_args.json: what `swift sft` and `swift rlhf` accept, argument by argument.

Run it with the execution plane's python, the one that has ms-swift (the reconciler never imports
swift, so what it checks ``args`` and the typed fields against is kept in the repository as data):

    /opt/reconciler-swift-venv/bin/python scripts/swift_args.py            # print it
    /opt/reconciler-swift-venv/bin/python scripts/swift_args.py --write    # and write it

The data is read from the parser ms-swift itself builds (``swift.utils.parse_args``: transformers'
HfArgumentParser over the argument dataclass, with ms-swift's own type-hint patch), not from the
dataclasses' source: each canonical option's conversion (``type``: int, float, str, bool, dict,
...), how many values it takes (``nargs``), and its ``choices`` (from field metadata or a
``Literal``). Besides what argparse checks, transformers' ``TrainingArguments.__post_init__``
converts the fields it annotates ``SomeEnum | str`` with the enum (``SchedulerType(value)``: an
unknown ``lr_scheduler_type`` is refused there, before any download); those are recorded as
``enum`` with the enum's values.

Spelling variants (``--lora-rank``, ``--no_<flag>``, abbreviations) are left out on purpose: a config
key is written once, in its canonical name, so the reconciler's own keys (``output_dir``,
``add_version``, ``resume_from_checkpoint``) cannot be set in disguise. Output is sorted and
stable, so the committed file changes only when ms-swift does; ``tests/tasks/test_swift_args.py``
(marked ``swift``) fails when the committed file and the installed ms-swift disagree.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import json
import sys
import typing
from pathlib import Path

TARGET = Path(__file__).resolve().parent.parent / "reconciler" / "tasks" / "swift_args.json"
FORMAT = 2  # 1: names only; 2: per argument its type, nargs and choices
# The converters HfArgumentParser installs, by name, as the reconciler's checker knows them.
TYPE_NAMES = {"int": "int", "float": "float", "str": "str", "string_to_bool": "bool", "dict": "dict",
              "Path": "str"}


def argument_classes() -> dict[str, type]:
    try:  # ms-swift 4
        from swift.arguments import RLHFArguments, SftArguments
    except ImportError:  # ms-swift 3 kept them in swift.llm
        from swift.llm import RLHFArguments, SftArguments
    return {"sft": SftArguments, "rlhf": RLHFArguments}


def build_parser(cls: type):
    """The parser ``swift sft|rlhf`` parses with (``swift.utils.utils.parse_args``)."""
    from transformers import HfArgumentParser
    try:
        from swift.utils.utils import _patch_get_type_hints
    except ImportError:  # an ms-swift without the patch builds the parser plainly
        _patch_get_type_hints = contextlib.nullcontext
    with _patch_get_type_hints():
        return HfArgumentParser([cls])


def _plain(value):
    """A choice as JSON can hold it (Enum members by value)."""
    return value.value if isinstance(value, enum.Enum) else value


def enum_fields(cls: type) -> dict[str, type]:
    """Fields some class in the MRO annotates ``Enum | str``: TrainingArguments.__post_init__ converts them."""
    out: dict[str, type] = {}
    for base in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(base):
            continue
        try:
            hints = typing.get_type_hints(base)
        except Exception:  # a base whose hints do not resolve declares nothing we can use
            continue
        for name in getattr(base, "__annotations__", {}):
            kinds = [a for a in typing.get_args(hints.get(name)) if isinstance(a, type) and issubclass(a, enum.Enum)]
            if kinds and str in typing.get_args(hints.get(name)):
                out[name] = kinds[0]
    return out


def describe(cls: type) -> dict[str, dict]:
    parser = build_parser(cls)
    enums = enum_fields(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    out: dict[str, dict] = {}
    for action in parser._actions:
        name = action.dest
        if name not in names or f"--{name}" not in action.option_strings:
            continue
        conv = getattr(action.type, "__name__", None)
        entry: dict = {"type": "choice" if conv == "<lambda>" else TYPE_NAMES.get(conv, "any")}
        if action.nargs is not None:
            entry["nargs"] = action.nargs
        if action.choices is not None:
            entry["choices"] = [_plain(c) for c in action.choices]
        if name in enums and action.choices is None:
            entry["enum"] = [m.value for m in enums[name]]
        out[name] = entry
    missing = names - set(out)
    if missing:  # every init field is an option; a miss means the parser changed shape
        raise SystemExit(f"no canonical option for {sorted(missing)}")
    return dict(sorted(out.items()))


def supported_tuners() -> list[str]:
    """The built-in tuners tuner_type's help lists (suggestions: ms-swift takes any name, plugins add theirs)."""
    try:
        from swift.arguments.base_args.base_args import get_supported_tuners
    except ImportError:
        return []
    return sorted(get_supported_tuners())


def generate() -> str:
    with contextlib.redirect_stdout(sys.stderr):  # whatever importing ms-swift prints is not the data
        import swift

        classes = argument_classes()
        doc: dict = {"ms_swift": swift.__version__, "format": FORMAT,
                     "source": "scripts/swift_args.py: the options HfArgumentParser builds from ms-swift's "
                               "SftArguments and RLHFArguments, and the Enum | str fields "
                               "TrainingArguments.__post_init__ converts"}
        for command, cls in classes.items():
            doc[command] = describe(cls)
        doc["tuner_types"] = supported_tuners()
    return json.dumps(doc, indent=1, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help=f"write {TARGET.relative_to(TARGET.parents[2])}")
    args = p.parse_args(argv)
    text = generate()
    if args.write:
        TARGET.write_text(text, encoding="utf-8")
        print(f"wrote {TARGET}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
