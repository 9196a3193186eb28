#!/usr/bin/env python3
"""Parse every corpus invocation with ms-swift's own parser, in one process; print the verdicts as JSON.

    /opt/reconciler-swift-venv/bin/python tests/data/swift/oracle/parse_corpus.py [corpus.json]

What runs is what ``swift sft`` / ``swift rlhf`` run first (``SwiftPipeline._parse_args`` ->
``swift.utils.parse_args``): transformers' HfArgumentParser over ``SftArguments`` / ``RLHFArguments``
built under ms-swift's ``_patch_get_type_hints``, ``parse_known_args`` on the command line (names,
number of values, type conversion, choices), then ms-swift's refusal of leftover words
(``remaining_argv``). That is ``parse_args_into_dataclasses`` up to the point where it would call the
dataclass constructor; the constructor is not called, because ``__post_init__`` resolves the model
and datasets (hub downloads, files), which must not decide here. Two of its checks need nothing
from outside and are run as ms-swift runs them:

- the ``Enum | str`` fields of transformers' ``TrainingArguments`` are converted with their enum
  (``SchedulerType(value)`` in ``TrainingArguments.__post_init__``);
- ``SftArguments.__post_init__`` refuses a run with neither ``dataset`` nor ``cached_dataset``.

The parser's ``error`` (argparse prints and exits 2) is replaced by one that raises with the same
message, so one process parses the whole corpus. Output: ``{"ms_swift": version, "verdicts":
{id: {"ok": bool, "arg": refused argument or null, "reason": text}}}``.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "corpus.json"


class Refused(Exception):
    pass


def _raise(message: str):
    raise Refused(message)


def load():
    sys.path.insert(0, str(CORPUS.parents[4] / "scripts"))
    import swift
    import swift_args  # the same parser construction the argument data is read from

    classes = swift_args.argument_classes()
    parsers = {c: swift_args.build_parser(cls) for c, cls in classes.items()}
    for p in parsers.values():
        p.error = _raise
    enums = {c: swift_args.enum_fields(cls) for c, cls in classes.items()}
    return swift.__version__, parsers, enums


def verdict(parser, enums: dict, pairs: list) -> dict:
    argv = [w for name, words in pairs for w in [f"--{name}", *words]]
    try:
        namespace, remaining = parser.parse_known_args(args=argv)
    except Refused as e:
        m = re.search(r"argument (--[\w-]+)", str(e))
        return {"ok": False, "arg": m.group(1)[2:].replace("-", "_") if m else None, "reason": str(e)}
    if remaining:  # swift.pipelines.base.SwiftPipeline._parse_args: ValueError(f'remaining_argv: ...')
        first = remaining[0]
        arg = first[2:] if first.startswith("--") else next((n for n, ws in pairs if first in ws), None)
        return {"ok": False, "arg": arg, "reason": f"remaining_argv: {remaining}"}
    for name, kind in enums.items():
        value = getattr(namespace, name, None)
        if value is None:
            continue
        try:
            kind(value)
        except ValueError as e:
            return {"ok": False, "arg": name, "reason": f"TrainingArguments.__post_init__: {e}"}
    if not namespace.dataset and not namespace.cached_dataset:
        return {"ok": False, "arg": "dataset", "reason": "SftArguments.__post_init__: no dataset or cached_dataset"}
    return {"ok": True, "arg": None, "reason": ""}


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else CORPUS
    with contextlib.redirect_stdout(sys.stderr):
        version, parsers, enums = load()
        entries = json.loads(path.read_text(encoding="utf-8"))["entries"]
        out = {e["id"]: verdict(parsers[e["command"]], enums[e["command"]], e["pairs"]) for e in entries}
    json.dump({"ms_swift": version, "verdicts": out}, sys.stdout, indent=0, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
