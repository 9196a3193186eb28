"""Reading a spec file's parsed mapping, which the schema may have refused: every value is checked
for its type before a check looks at it (a value of the wrong type is the schema's to report)."""

from __future__ import annotations

from typing import Any


def _at(data: Any, *path: str) -> Any:
    """The value at ``path`` in a parsed mapping, or None where a part is missing or not a mapping."""
    for part in path:
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data


def _dict(v: Any) -> dict:
    return v if isinstance(v, dict) else {}


def _list(v: Any) -> list:
    return v if isinstance(v, list) else []


def _text(v: Any) -> str | None:
    """A non-empty string, or None (a missing value, or one of another type: the schema reports that)."""
    return v if isinstance(v, str) and v else None


def _count(v: Any, default: int = 0) -> int | None:
    """A GPU count as the schema reads it: an int (not a bool), the default when absent, else None."""
    if v is None:
        return default
    return v if type(v) is int else None
