"""Which runs a plan decides: every run with a spec, an invalid spec or a status.

Asked once per plan over every run of the repository (10,000 in a large queue), where building
and sorting three sets of names cost twice what sorting the names of the specs alone does.
"""

from __future__ import annotations


def run_names(runs: dict, invalid: dict, previous: dict, settled: frozenset[str]) -> list[str]:
    """Every run with a spec, an invalid spec or a status, less the ``settled`` ones, by name.
    The keys of ``runs`` are names already, each once: with nothing else to add or take out they
    are sorted as they are."""
    if not (invalid or previous or settled):
        return sorted(runs)
    return sorted((set(runs) | set(invalid) | set(previous)) - settled)
