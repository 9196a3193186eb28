"""Preemption: room on an owned machine made by stopping runs of lower priority, when the Policy
allows it and it is enough.
"""

from __future__ import annotations

from reconciler.core.actions import Action
from reconciler.core.identity import parse
from reconciler.core.plan import Change, Kill

from .quota import priority_of


def _preempt(name, entry, desired, candidates, res, ident, stale, base, book) -> Change | None:
    """Make room on one owned machine by stopping runs of lower priority, if the Policy allows it
    and it is enough: fewest victims first, then the lowest victim priority, then the machine's
    name. The victims are recorded in the book (their own change becomes a stop, back to Pending);
    this run waits for them and is placed on a later pass, before them (its priority is higher)."""
    policy = desired.policy
    if policy is None or not policy.spec.preemption.enabled:
        return None
    mine, mine_class = priority_of(desired, entry)
    rule = policy.spec.preemption
    world, now = book.world, book.now
    best = None
    for slot in candidates:
        obs = world.machines.get(slot.name)
        if obs is None or not slot.reachable or slot.max_tasks == 0 or slot.draining is not None:
            continue
        victims = []
        for r in obs.runs.values():
            p = parse(r.identity)
            if not r.alive or p is None or p.name in book.preempted or p.name == name:
                continue
            value, _ = priority_of(desired, desired.runs.get(p.name))
            if value >= mine or (r.started_at is not None and now - r.started_at < rule.minRuntimeSeconds):
                continue
            victims.append((value, -(r.started_at or 0.0), p.name, r))
        victims.sort(key=lambda v: v[:3])
        free = slot.free_count(res.gpu_type)
        tasks = slot.tasks
        chosen = []
        wanted = {i for i, t in slot.gpu_types.items() if res.gpu_type is None or t.lower() == res.gpu_type.lower()}
        for v in victims:
            if free >= res.gpu_count and (slot.max_tasks is None or tasks < slot.max_tasks):
                break
            chosen.append(v)
            free += len(set(v[3].gpus) & wanted)
            tasks -= 1
        if not (free >= res.gpu_count and (slot.max_tasks is None or tasks < slot.max_tasks)) or not chosen:
            continue
        key = (len(chosen), max(v[0] for v in chosen), slot.name)
        if best is None or key < best[0]:
            best = (key, slot, chosen)
    if best is None:
        return None
    _, slot, chosen = best
    names = []
    for value, _, victim, r in chosen:
        book.preempted[victim] = (Kill(slot.name, r.identity, r.workspace, rule.graceSeconds),
                                  f"preempted by {name} ({mine_class or mine}) to make room on {slot.name}; "
                                  "it runs again when there is room, resuming from its last checkpoint")
        names.append(r.identity)
    return Change(name, Action.WAIT, "Preempting",
                  f"stopping {', '.join(names)} (lower priority) on {slot.name} to make "
                  "room; placed there once they have stopped", "Pending", identity=ident, kill=stale,
                  retry_after=max(1.0, rule.graceSeconds / 4), machine=None,
                  considered=[f"{slot.name}: room after preempting {', '.join(names)}"], **base)
