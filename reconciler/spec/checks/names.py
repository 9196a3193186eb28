"""Names and ids across files: each equals its file's name and is defined once, a run's template
reference finds a file, and a repository has one Policy."""

from __future__ import annotations

from typing import Any

from ..models.common import is_dns_label
from .raw import _at


def template_lookup(template_files: list, given: set[str], add) -> dict[str, Any]:
    """Reports template ids that differ from their file's name or are defined twice; returns what a
    run's spec.template finds: an id, else a file stem."""
    lookup: dict[str, Any] = {}  # what a run's spec.template finds: an id, else a file stem
    by_id: dict[str, Any] = {}

    def tid(f) -> str | None:
        value = f.data.get("id")
        return value if is_dns_label(value) else None

    def misnamed(f) -> bool:
        return tid(f) not in (None, f.path.stem)

    # When an id is defined twice, the misnamed copy is at fault, and a run naming the id finds the
    # file named after it; but a file given on the command line is reported before the tree's copy.
    for f in sorted(template_files, key=lambda f: (f.rel in given, misnamed(f))):
        t = tid(f)
        if t is None:
            continue
        if misnamed(f):
            add(f, ("id",), f"id '{t}' must equal the file name '{f.path.stem}'")
        if t in by_id:
            add(f, ("id",), f"template id '{t}' is also defined in {by_id[t].rel}")
        by_id.setdefault(t, f)
    for f in sorted(template_files, key=misnamed):
        if tid(f) is not None:
            lookup.setdefault(tid(f), f)
    for f in template_files:
        lookup.setdefault(f.path.stem, f)  # a run naming the file still finds it (and sees it is invalid)
    return lookup


def check_names(checked: list, given: set[str], add) -> dict[tuple[str, str], Any]:
    """Reports names that differ from their file's name or are defined twice; returns the file that
    defines each (kind, name)."""
    by_name: dict[tuple[str, str], Any] = {}
    for f in sorted((f for f in checked if f.kind in ("Run", "Fleet", "Provider", "Policy", "Storage")), key=lambda f: f.rel in given):
        name = _at(f.data, "metadata", "name")
        if not is_dns_label(name):
            continue
        if f.path.stem != name:
            add(f, ("metadata", "name"), f"name '{name}' must equal the file name '{f.path.stem}'")
        other = by_name.get((f.kind, name))
        if other is not None:
            add(f, ("metadata", "name"), f"{f.kind} '{name}' is also defined in {other.rel}")
        else:
            by_name[(f.kind, name)] = f
    return by_name


def providers_of(by_name: dict[tuple[str, str], Any]) -> dict[str, Any]:
    """The Provider files by name."""
    return {name: f for (kind, name), f in by_name.items() if kind == "Provider"}


def the_policy(checked: list, add):
    """The repository's Policy file (the first by path), or None; any other is reported."""
    policies = sorted((f for f in checked if f.kind == "Policy"), key=lambda f: f.rel)
    for extra in policies[1:]:
        add(extra, ("kind",), f"a repository has one Policy; {policies[0].rel} is it")
    return policies[0] if policies else None
