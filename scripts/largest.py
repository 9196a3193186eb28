#!/usr/bin/env python3
"""The largest modules and functions of the package, against the limits the layout keeps.

    python scripts/largest.py            # the ten largest of each, and every one over a limit
    python scripts/largest.py --check    # exit 1 when one is over its limit and not an exception

A module is its line count; a function runs from its ``def`` to its last line (decorators excluded,
nested functions counted in their parent too). tests/test_size.py runs ``--check``.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "reconciler"
MODULE_LIMIT = 500
FUNCTION_LIMIT = 80
# Exceptions, each with its reason. Keep this list short; it is read by tests/test_size.py.
EXCEPTIONS: dict[str, str] = {}


def modules() -> list[tuple[int, str]]:
    return sorted(((len(p.read_text().splitlines()), str(p.relative_to(PKG.parent))) for p in PKG.rglob("*.py")),
                  reverse=True)


def functions() -> list[tuple[int, str]]:
    out = []
    for p in PKG.rglob("*.py"):
        rel = str(p.relative_to(PKG.parent))
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((node.end_lineno - node.lineno + 1, f"{rel}:{node.lineno} {node.name}"))
    return sorted(out, reverse=True)


def over() -> list[str]:
    """Every module and function over its limit that is not an exception (``EXCEPTIONS`` names a
    module by its path, a function by ``path:name``)."""
    bad = [(name, f"{name}: {n} lines (limit {MODULE_LIMIT})") for n, name in modules() if n > MODULE_LIMIT]
    for n, where in functions():
        if n > FUNCTION_LIMIT:
            path_line, name = where.split(" ")
            bad.append((f"{path_line.split(':')[0]}:{name}", f"{where}: {n} lines (limit {FUNCTION_LIMIT})"))
    return [text for key, text in bad if key not in EXCEPTIONS]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when a module or function is over its limit")
    args = ap.parse_args(argv)
    if args.check:
        bad = over()
        print("\n".join(bad) if bad else "within the limits")
        return 1 if bad else 0
    for title, rows, limit in (("modules", modules(), MODULE_LIMIT), ("functions", functions(), FUNCTION_LIMIT)):
        print(f"largest {title} (limit {limit} lines):")
        for n, name in [r for r in rows if r[0] > limit] or rows[:10]:
            print(f"  {n:5d}  {name}")
        shown = [r for r in rows if r[0] > limit]
        if shown:
            print(f"  ... then {rows[len(shown)][0]} lines and less")
    return 0


if __name__ == "__main__":
    sys.exit(main())
