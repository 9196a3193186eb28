#!/usr/bin/env python3
"""Regenerate reconciler/tasks/swift_args.json: the argument names of `swift sft` and `swift rlhf`.

Run it with the execution plane's python, the one that has ms-swift (the reconciler never imports
swift, so the list it checks ``args`` keys against is kept in the repository):

    /opt/reconciler-swift-venv/bin/python scripts/swift_args.py            # print the list
    /opt/reconciler-swift-venv/bin/python scripts/swift_args.py --write    # and write it

The names are those ms-swift's HfArgumentParser builds options from: the ``init`` fields of the
argument dataclasses. Its spelling variants (``--lora-rank``, ``--no_<flag>``, abbreviations) are
left out on purpose: a config key is written once, in its canonical name, so that the reconciler's
own keys (``output_dir``, ``add_version``, ``resume_from_checkpoint``) cannot be set in disguise.
The test ``tests/tasks/test_swift_args.py`` (marked ``swift``) fails when the committed file and
the installed ms-swift disagree.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from pathlib import Path

TARGET = Path(__file__).resolve().parent.parent / "reconciler" / "tasks" / "swift_args.json"


def argument_classes() -> dict[str, type]:
    try:  # ms-swift 4
        from swift.arguments import RLHFArguments, SftArguments
    except ImportError:  # ms-swift 3 kept them in swift.llm
        from swift.llm import RLHFArguments, SftArguments
    return {"sft": SftArguments, "rlhf": RLHFArguments}


def generate() -> str:
    with contextlib.redirect_stdout(sys.stderr):  # whatever importing ms-swift prints is not the list
        import swift

        classes = argument_classes()
    doc: dict = {"ms_swift": swift.__version__,
                 "source": "scripts/swift_args.py: the init fields of ms-swift's SftArguments and RLHFArguments"}
    for command, cls in classes.items():
        doc[command] = sorted(f.name for f in dataclasses.fields(cls) if f.init)
    return json.dumps(doc, indent=1) + "\n"


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
