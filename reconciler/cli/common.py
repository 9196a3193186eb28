"""What the commands share: the configuration their arguments name, and one answer for a run NAME
that is not there (exit 2 and the nearest name, from every command alike)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler.core.errors import UsageError

if TYPE_CHECKING:
    from reconciler.core import config as configs


def _cfg(args: argparse.Namespace, **flags) -> configs.Config:
    from reconciler.core import config as configs  # its model's library: imported by the commands that validate

    repo = Path(getattr(args, "repo", None) or ".")
    if not repo.is_dir():
        raise UsageError(f"{repo}: no such directory")
    return configs.load(str(repo), getattr(args, "config", None), flags)


def status_names(cfg: configs.Config) -> list[str]:
    """The runs that have a status file, for the nearest name to one that is not there."""
    try:
        return sorted(p.stem for p in (cfg.repo / "status").glob("*.yaml") if not p.name.startswith("."))
    except OSError:
        return []


def no_such_run(name: str, known) -> UsageError:
    """The one error of every command given a run NAME that is not there: a usage error (exit 2),
    like an unknown command, since it is a name the user typed; the nearest name when one is close."""
    from difflib import get_close_matches

    close = get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return UsageError(f"no run {name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
