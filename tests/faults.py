"""Fault injection for the crash-safety tests: the reconciler's command line with faults at its seams.

    python -m tests.faults [--crash-after POINT] [--hold-push PATH] -- ARGS...

does what ``python -m reconciler ARGS...`` does, in a process where some of the product's seams
(plain functions that do nothing) have been replaced first:

- ``--crash-after stage``: die like kill -9 (exit 137, nothing flushed or cleaned up) between
  staging a run's bundle on its machine and starting it (``reconciler.engine.apply._after_stage``);
- ``--crash-after apply``: right after apply, runs launched, before any status is written
  (``reconciler.engine.loop._after_apply``);
- ``--crash-after commit``: the daemon, after a pass's local status commit, before its push
  (``reconciler.daemon.service._after_commit``);
- ``--hold-push PATH``: while PATH exists, every push waits; ``PATH.held`` appears once one waits,
  so a test can move the remote under an unpushed status commit (``reconciler.daemon.gitsync._before_push``).

The tests run the reconciler as a separate process, where a monkeypatch in the test's own process
cannot reach; and the product reads no switch for any of this, so nothing a production host sets
can trigger it. ``command`` builds the command line; run it with the repository root importable
(in ``PYTHONPATH`` or as the working directory), as ``env`` arranges.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Where each crash point is: (module, seam).
CRASH_POINTS = {"stage": ("reconciler.engine.apply", "_after_stage"), "apply": ("reconciler.engine.loop", "_after_apply"),
                "commit": ("reconciler.daemon.service", "_after_commit")}
HOLD_PUSH = ("reconciler.daemon.gitsync", "_before_push")


def command(*args: str, crash_after: str | None = None, hold_push: Path | str | None = None) -> list[str]:
    """The argv that runs ``reconcile ARGS...`` with these faults."""
    if crash_after is not None and crash_after not in CRASH_POINTS:
        raise ValueError(f"no crash point {crash_after!r}; known: {', '.join(CRASH_POINTS)}")
    opts = (["--crash-after", crash_after] if crash_after else []) + (["--hold-push", str(hold_push)] if hold_push
                                                                       else [])
    return [sys.executable, "-m", "tests.faults", *opts, "--", *args]


def env(base: dict[str, str]) -> dict[str, str]:
    """``base`` with this checkout first on ``PYTHONPATH``, so that ``-m tests.faults`` imports from
    any working directory."""
    return {**base, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), base.get("PYTHONPATH", "")) if p)}


def _die() -> None:
    os._exit(137)  # as kill -9 would end it: no exception handlers, no atexit, no flush


def _hold_while(path: str):
    def before_push() -> None:
        announced = False
        while os.path.exists(path):
            if not announced:
                Path(path + ".held").write_text(str(os.getpid()))
                announced = True
            time.sleep(0.02)

    return before_push


def _replace(where: tuple[str, str], fault) -> None:
    import importlib

    module = importlib.import_module(where[0])
    # A seam that was renamed or removed must fail the test, not leave it testing nothing.
    if not callable(getattr(module, where[1], None)):
        raise SystemExit(f"tests.faults: {where[0]} has no seam {where[1]}")
    setattr(module, where[1], fault)


def main(argv: list[str]) -> int:
    if "--" not in argv:
        raise SystemExit("usage: python -m tests.faults [--crash-after POINT] [--hold-push PATH] -- ARGS...")
    sep = argv.index("--")
    p = argparse.ArgumentParser(prog="python -m tests.faults")
    p.add_argument("--crash-after", choices=sorted(CRASH_POINTS))
    p.add_argument("--hold-push", metavar="PATH")
    opts = p.parse_args(argv[:sep])
    if opts.crash_after:
        _replace(CRASH_POINTS[opts.crash_after], _die)
    if opts.hold_push:
        _replace(HOLD_PUSH, _hold_while(opts.hold_push))
    from reconciler.cli import main as cli

    return cli.main(argv[sep + 1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
