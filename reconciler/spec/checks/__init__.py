"""Checks a schema cannot express: they look across files, at the repository, or for leaked secrets.

Each check returns located diagnostics for the file at fault, so a pull request that breaks a
reference (a run naming a template that was renamed) is pointed at the line that now dangles.
``cross_checks`` runs the concerns in a fixed order (each in a module of its own): names and ids,
templates, runs (and what they stage, rent and pass to ms-swift), secret grants, Storages, fleets, and the
Slurm logins that need both templates and fleets.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from reconciler.core.diagnostics import Diagnostic
from .fleets import check_machines
from .names import check_names, providers_of, template_lookup, the_policy
from .runs import check_runs
from .secrets import _check_secret_grants
from .storage import check_storage, storages_of
from .templates import _check_slurm_logins, _check_template


def cross_checks(root: Path, files: list, locator, given: set[str] | None = None) -> dict[str, list[Diagnostic]]:
    """Every check beyond one file's schema, by repository-relative path.

    The checks read each file's parsed mapping (``SpecFile.data``), not its validated object, so that
    a file the schema refused still gets them: one ``validate`` shows a misspelt key and the template
    that does not exist, not the one and then, once fixed, the other. A value the schema refuses
    (wrong type, bad pattern) is left alone here; its schema error says what is wrong with it.

    ``given``: the files named on the command line. A name or id defined twice is reported against a
    given file rather than against the tree's copy, which would be filtered out of what is shown.
    """
    out: dict[str, list[Diagnostic]] = defaultdict(list)

    def add(f, loc: tuple, message: str) -> None:
        out[f.rel].append(locator.diag(f, loc, message))

    given = given or set()
    checked = [f for f in files if f.data is not None]
    template_files = [f for f in checked if f.kind == "ExecutionTemplate"]
    lookup = template_lookup(template_files, given, add)
    for f in template_files:
        _check_template(f, add)
    by_name = check_names(checked, given, add)
    # A template with a cross-file error (id != file name, id defined twice) is as invalid as one
    # that failed its schema: the runs that use it must not pass.
    invalid_templates = {f.rel for f in template_files if f.diags or out.get(f.rel)}
    policy = the_policy(checked, add)
    check_runs(root, checked, lookup, add, invalid_templates, providers_of(by_name), policy)
    _check_secret_grants(checked, policy, add)
    check_storage(checked, storages_of(by_name), policy, add)
    machines = check_machines(checked, given, add)
    _check_slurm_logins(template_files, machines, add)
    return out
