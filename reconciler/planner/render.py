"""A plan shown to people: its text (one line per change, its reason under it) and its JSON.

Kept apart from computing a plan: the command line, the pull request comment and the metrics read
the symbols and the text without the placement rules.
"""

from __future__ import annotations

import json

from reconciler.core.actions import Action
from reconciler.core.plan import Plan

SYMBOL = {Action.LAUNCH: "+", Action.RELAUNCH: "~", Action.TERMINATE: "-", Action.COLLECT: ">",
          Action.MARK_INVALID: "!", Action.WAIT: ".", Action.ADOPT: "=", Action.NONE: " ", Action.PROVISION: "^",
          Action.RELEASE: "x", Action.SAVE: "s"}


def text(plan: Plan, verbose: bool = False) -> str:
    """The plan as a person reads it; ``verbose``: the runs without a change too."""
    shown = [c for c in plan.changes if verbose or c.action != Action.NONE]
    warnings = "".join(f"\nWarning: {w}" for w in plan.warnings)
    if not shown:
        return "No changes. The machines match the repository." + warnings
    width = max(len(c.name) for c in shown)
    lines = [f"Reconcile plan: {len(shown)} change(s)", ""]
    for c in shown:
        where = c.identity or ""
        if c.machine and c.action in (Action.LAUNCH, Action.RELAUNCH, Action.ADOPT, Action.COLLECT, Action.SAVE):
            where += f" on {', '.join(n.machine for n in c.nodes) if c.nodes else c.machine}"
        notes = [where] if where else []
        if c.kill:
            notes.append("(stop " + ", ".join(k.identity for k in c.kill) + ")")
        if c.collect_first:
            notes.append(f"(collect {c.collect_first.identity})")
        if c.rental and c.action == Action.PROVISION:
            notes.append(f"renting {c.rental['provider']}/{c.rental['offer']} at {c.rental['price_per_hour']:g}/h")
        elif c.rental and c.action == Action.RELEASE:
            notes.append(f"give back {c.machine}")
        if c.retry_after is not None and c.action != Action.PROVISION:
            notes.append(f"(retry in {c.retry_after:.0f}s)")
        where = " ".join(notes)
        lines.append(f"  {SYMBOL[c.action]} {c.action:<12} {c.name:<{width}}  {where}")
        lines.append(f"      {' ' * 12} {'':<{width}}  {c.code}: {c.reason}")
    counts = plan.summary()
    lines += ["", "Plan: " + ", ".join(f"{n} {a}" for a, n in sorted(counts.items()) if a != Action.NONE) + "."]
    n, price = plan.new_rentals()
    if n:
        lines.append(f"New rentals: {n}, estimated {price:g} per hour.")
    return "\n".join(lines) + warnings


def _short(digest: str | None) -> str:
    return (digest or "none").removeprefix("sha256:")[:8]


def dumps(plan: Plan) -> str:
    return json.dumps(plan.to_json(), indent=2, sort_keys=True)
