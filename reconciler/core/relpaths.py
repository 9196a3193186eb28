"""One check for a relative path that came from outside (a machine's report, a manifest in a
bucket): relative, no empty, '.' or '..' component, and made only of plain printable names, so it
can be joined under a base folder without leaving it or confusing a terminal. The callers add
what is theirs (a checkpoint must lie under artifacts/, a listing may be deeper)."""

from __future__ import annotations

import re
from typing import Any

PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+=@-]{0,127}")


def plain_path_problem(rel: Any, max_len: int, max_parts: int, names: str = "plain names") -> str | None:
    """Why ``rel`` is not such a path (``names`` says what a plain name is, in the message), or None."""
    if not isinstance(rel, str) or not rel or len(rel) > max_len:
        return "not a path of a sensible length"
    if rel.startswith("/"):
        return "an absolute path"
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "an empty, '.' or '..' component"
    if len(parts) > max_parts or not all(PART.fullmatch(p) for p in parts):
        return f"not made of {names}"
    return None
