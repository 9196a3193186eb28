"""A pass over a fleet at rest takes the last pass's plan, once it is proved to be what planning
again would give, and skips the status step the last pass proved had nothing to write.

A steady pass over 10,000 running runs on 1,000 machines spent most of its CPU deciding every run
again (the planner, ~0.3 s) and confirming every status again (~0.08 s), to reach the decisions
and the files of the pass before. The plan is a pure function of the desired state, the observed
world, the previous statuses, the clock, the plan settings, the settled runs, the secrets the
host lacks and the uncommitted spec files (planner/make.py, engine/loop.py's ``_plan``). The last
plan is taken again when:

- it reads nothing of the clock: each of its changes keeps the one running instance its run's
  status records (``planner/lifecycle.py``'s ``_found_running``), with no stall rule in the spec,
  nothing to stop, hold, clean up or retry; no rental, provider, storage, gang node or orphaned
  rental is in sight; every other instance observed is an ended, collected earlier attempt of one
  of those runs with no process left (an orphan or look-alike has an orphan grace, which reads
  the clock; a lingering process is stopped); every machine answered; and the status step found
  every status unchanged (``status/summarize.py``'s ``unchanged``) and wrote nothing;
- since then nothing it was computed from moved: the same spec records and the same objects of
  every other kind (the spec cache hands out the same record while a file's stat vouches for it),
  the same status objects (the status cache likewise), the same settled runs, missing secrets,
  uncommitted spec files, configuration and plan settings, the same machines, each having
  answered the very next observation with runs identical to its last reply (heartbeat ages and
  live process counts aside: such a plan reads neither; ``core/parse_reuse.py``) and the same
  notes (error, drain, foreign GPUs, refusals).

The record is taken at the end of a pass and dropped at the start of the next, so a pass that
fails half way leaves none (the machines' replies are compared with the observation just before).
A pass that took the plan and skipped the status step renews the record as it was: its inputs
were just proved to be the record's.
Anything else, and the pass plans and writes as always. The world is still observed and bound
afresh every pass: what the machines say is what the page and the next pass see.
"""

from __future__ import annotations

from dataclasses import dataclass

from reconciler.core.actions import Action
from reconciler.core.identity import split
from reconciler.core.plan import Plan

_NONE = Action.NONE  # an Enum member looked up on its class costs a call


@dataclass
class Record:
    """What the last pass's plan was computed from, by identity where the caches keep objects."""

    plan: Plan
    observation: int  # the parse memo's observation the plan's world came from
    cfg: object
    runs: dict
    kinds: tuple  # templates, fleets, policy, invalid providers: what else of the tree a plan reads
    previous: dict
    skipped: frozenset
    missing: dict
    dirty: frozenset
    settings: object
    machines: dict  # name → (error, draining, foreign GPUs, GPU error, refusals)
    first_seen: dict
    ended: list  # (machine, identity) of the kept runs' ended earlier attempts still in sight


def _kinds(desired) -> tuple:
    return dict(desired.templates), dict(desired.fleets), desired.policy, dict(desired.invalid_providers)


def _same_kinds(desired, kinds: tuple) -> bool:
    templates, fleets, policy, invalid_providers = kinds
    return (_same_objects(desired.templates, templates) and _same_objects(desired.fleets, fleets)
            and desired.policy is policy and desired.invalid_providers == invalid_providers)


def _same_objects(a: dict, b: dict) -> bool:
    """Whether two mappings hold the very same objects under the same keys."""
    if len(a) != len(b):
        return False
    get = b.get
    for k, v in a.items():
        if get(k) is not v:
            return False
    return True


def _notes(m) -> tuple:
    return m.error, m.draining, tuple(m.foreign_gpus), m.gpu_error, tuple(m.rejected)


def _out_of_scope(desired, world) -> bool:
    """What a plan that reads nothing of the clock never has in sight (see above): asked of the
    pass that records and of the pass that takes."""
    return bool(world.rentals or world.provider_errors or desired.providers or desired.storages or desired.invalid)


def take(rec, desired, world, previous: dict, skipped: set, missing: dict, settings,
         now: float) -> tuple[Plan, frozenset] | None:
    """The last pass's plan, at ``now``, and the uncommitted spec files it was planned with (the
    caller compares them once ``git status`` has answered), when everything else it was computed
    from is as it was (see above); None otherwise. Always drops the record: one pass may use it,
    the next. The record taken is kept aside for ``renew``."""
    r, rec._steady, rec._taken = rec._steady, None, None
    if r is None or r.observation + 1 != rec.parse_memo.observations or r.cfg is not rec.cfg:
        return None
    if _out_of_scope(desired, world) or world.first_seen != r.first_seen:
        return None
    machines = world.machines
    if len(machines) != len(r.machines):
        return None
    for name, m in machines.items():
        notes = r.machines.get(name)
        if notes is None or not m.reachable or not m.same_runs or _notes(m) != notes:
            return None
    for m, ident in r.ended:
        seen = machines[m].runs.get(ident)
        if seen is None or seen.live:  # a process of an ended attempt is back: it is to be stopped
            return None
    if (not _same_objects(desired.runs, r.runs) or not _same_objects(previous, r.previous)
            or frozenset(skipped) != r.skipped or missing != r.missing or settings != r.settings
            or not _same_kinds(desired, r.kinds)):
        return None
    rec._taken = r
    return Plan(changes=list(r.plan.changes), at=now, warnings=list(r.plan.warnings)), r.dirty


def renew(rec) -> None:
    """After a pass that took the plan and skipped the status step: its inputs were proved to be
    the record's, so the record stands for this pass's observation too (checked again, it was
    most of the CPU a steady pass has left)."""
    r, rec._taken = rec._taken, None
    if r is not None:
        r.observation = rec.parse_memo.observations
        rec._steady = r


def keep(rec, result, previous: dict, skipped: set, all_unchanged: bool) -> None:
    """After the status step of a pass that wrote and did nothing: record what its plan came from,
    when the plan reads nothing of the clock (see above). ``all_unchanged``: the status step found
    every status unchanged. The plan's inputs of ``rec._plan`` are in ``rec._planned_with``."""
    desired, world, plan = result.desired, result.world, result.plan
    missing, settings = rec._planned_with
    if (not all_unchanged or result.outcomes or result.written or plan.orphans or rec.focus.focus is not None
            or _out_of_scope(desired, world)):
        return
    machines = world.machines
    if not all(m.reachable for m in machines.values()) or world.has_nodes():
        return
    runs, kept = desired.runs, {}
    for c in plan.changes:
        if (c.action is not _NONE or c.phase != "Running" or c.code != "Running" or c.kill or c.cleanup
                or c.nodes or c.stalled or c.retry_after is not None or c.identity is None):
            return
        entry, prev = runs.get(c.name), previous.get(c.name)
        if (entry is None or entry.run.spec.stall is not None or prev is None or prev.handle is None
                or prev.handle.identity != c.identity or prev.phase != "Running"):
            return
        kept[c.name] = c
    ended = _ended(machines, kept)
    if ended is None:
        return
    rec._steady = Record(plan, rec.parse_memo.observations, rec.cfg, dict(runs), _kinds(desired), dict(previous),
                         frozenset(skipped), missing, frozenset(rec._dirty), settings,
                         {n: _notes(m) for n, m in machines.items()}, dict(world.first_seen), ended)


def _ended(machines: dict, kept: dict) -> list[tuple[str, str]] | None:
    """The instances besides the kept ones: each an ended, collected earlier attempt of a kept run
    with no process left, as (machine, identity); None when another is in sight (an orphan, a
    look-alike, a node: what the planner decides about them can read the clock). Their processes
    are counted afresh every pass (``live``), so a pass that takes the plan looks at them again."""
    out = []
    for name, m in machines.items():
        for ident, r in m.runs.items():
            p, node = split(ident)
            c = kept.get(p.name) if p is not None else None
            if c is None or node is not None:
                return None
            if c.identity == ident and c.machine == name:
                continue
            if r.state in ("running", "staged", "unknown") or r.nodes or r.live or not r.collected:
                return None
            out.append((name, ident))
    return out
