"""The arguments of ``reconcile artifacts`` and ``reconcile reproduce``, apart from their code.

Building the parser must stay cheap (every TAB of shell completion builds it), so this module
imports nothing; the commands' modules, which read specs, statuses and buckets, are imported only
when one of them runs.
"""

from __future__ import annotations

import argparse


def build(p: argparse.ArgumentParser, name: str, run_names, add_globals) -> None:
    """The command's arguments, then its global options (``add_globals``: main's)."""
    if name == "artifacts":
        p.add_argument("name", metavar="NAME", help="a run").completer = run_names
        p.add_argument("--get", metavar="PATH", help="fetch this object or folder of the run's base (relative, as "
                       "listed)")
        p.add_argument("--to", metavar="DIR", help="with --get: the folder to put it in (default: here)")
    else:
        p.add_argument("name", metavar="NAME", help="a run that has been collected").completer = run_names
        p.add_argument("--checkpoint", metavar="N", help="start from the run's checkpoint-N in its Storage")
        p.add_argument("--as", dest="as_name", metavar="NEW", help="the new run's name (default: NAME-repro)")
        p.add_argument("--out", metavar="FILE", help="where to write it (default: specs/runs/NEW.yaml)")
    add_globals(p, name)


def dispatch(name: str, args: argparse.Namespace) -> int:
    if name == "artifacts":
        from .artifacts import cmd_artifacts

        return cmd_artifacts(args)
    from .reproduce import cmd_reproduce

    return cmd_reproduce(args)
