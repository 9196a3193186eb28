"""Machine names every layer agrees on: this machine, and a Slurm cluster by its login host."""

from __future__ import annotations

LOCAL = "local"
SLURM_PREFIX = "slurm:"


def slurm_machine(settings) -> str:
    """The machine name of a Slurm cluster: its login host, where its commands run and its shared
    workspace root is read."""
    return SLURM_PREFIX + settings.login
