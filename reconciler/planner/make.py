"""The planner's entry point: desired state + observed state + previous status → a Plan. Pure.

Nothing here touches a network, a process or git (a test enforces it), so a plan can be computed
from fixtures, printed, stored, and compared. Each change carries an action, the phase the run
reaches if the change applies, a machine-readable reason code and a human reason.

The rules, per run:
- a new spec launches generation 1, attempt 1; a changed spec digest bumps the generation and
  replaces whatever still runs of the old one;
- a removed spec, or ``desiredState: Stopped``, terminates every live instance (status kept,
  phase Terminated);
- a failure with retries left relaunches as attempt + 1 once the backoff has passed; without
  retries left the run is Failed; a success is collected and never relaunched;
- an instance found running that the status does not know (a crash between launch and commit) is
  adopted, never launched again, but only if it was built from the desired spec (its bundle's spec
  digest): identities never collide across spec contents, so a spec whose generation number is
  already used on a machine by another content gets the next unused generation, and the other
  instance is fenced; an instance that is not the current identity is fenced;
- a workspace staged but never started is finished launching (the current identity) or removed
  (any other); a finished instance that is no run's current one (a fenced leftover) is collected
  and cleaned;
- a launch that needs a secret the reconciler host does not have waits, Pending, spending no
  attempt and staging nothing;
- a machine that does not answer is not dead: its runs wait, and only after the grace period are
  they declared lost and relaunched elsewhere; the old instance is fenced when it comes back;
- an invalid spec marks its run Invalid with the validation message and touches nothing else: what
  its last valid generation started keeps running, and a fix back to the same content continues it.

Each run goes by what it is to do: an invalid spec (stop.py), a stop or a preemption (stop.py), or
a run to keep running (lifecycle.py, which places launches through placement.py and rentals.py);
then what no run's change covers (housekeeping.py, the rental sweep) and the gangs' nodes (gangs.py).
"""

from __future__ import annotations

import gc
import threading

from reconciler.core.observed import ObservedWorld
from reconciler.core.plan import Plan, PlanSettings
from reconciler.core.runstatus import TERMINAL, RunStatus
from reconciler.spec.load import DesiredState

from .book import PlanBook
from .capacity import _slots
from .fence import fence_other_attempts, hold_for_unreachable
from .gangs import expand_gangs
from .housekeeping import _accounted, _fences, _leftovers, _saves
from .launch import new_run
from .lifecycle import _running
from .order import run_names
from .quota import Quotas, placement_order
from .rentals import sweep
from .stop import _invalid, _preempted, _stop


_gc_lock = threading.Lock()
_gc_state = {"plans": 0, "was_enabled": False}  # plans being computed now, in any thread


def _pause_collector() -> None:
    """The cyclic garbage collector held off while a plan is computed. A plan allocates tens of
    thousands of small objects (changes, their lists) that outlive it, and that alone sets off
    full collections, each walking the whole heap (every spec model of the desired state): more
    CPU than the plan's own work. What the plan frees is freed by reference counting; cycles, if
    any, wait for the next collection after it. Counted, so that plans computed at once in
    threads leave the collector as the first found it (``_resume_collector``)."""
    with _gc_lock:
        if _gc_state["plans"] == 0:
            _gc_state["was_enabled"] = gc.isenabled()
            gc.disable()
        _gc_state["plans"] += 1


def _resume_collector() -> None:
    # Plain calls rather than a context manager: a generator's exit allocates (its StopIteration),
    # and the first allocation after the collector is back starts the young collection of all
    # the plan allocated. That collection comes at the caller's next allocation instead (in a
    # pass, after it: the engine holds the collector off for the whole pass, engine/collector.py).
    with _gc_lock:
        _gc_state["plans"] -= 1
        if _gc_state["plans"] == 0 and _gc_state["was_enabled"]:
            gc.enable()


def make_plan(desired: DesiredState, world: ObservedWorld, previous: dict[str, RunStatus], now: float,
              settings: PlanSettings | None = None, settled: frozenset[str] = frozenset(),
              missing_secrets: dict[str, list[str]] | None = None) -> Plan:
    """``settled``: runs the caller knows are finished and untouched since (their plan would be
    "none"); they are left out of the plan. A long-lived reconciler uses it to keep thousands of
    finished runs out of memory. ``missing_secrets``: per run, the secrets it names that the
    reconciler host does not have (the caller looks; the planner stays pure)."""
    _pause_collector()
    try:
        return _make_plan(desired, world, previous, now, settings, settled, missing_secrets)
    finally:
        _resume_collector()


def _make_plan(desired, world, previous, now, settings, settled, missing_secrets) -> Plan:
    settings = settings or PlanSettings()
    missing_secrets = missing_secrets or {}
    plan = Plan(at=now)
    book = PlanBook(desired, world, previous, now, settings.namespace, settings.bad_offers, settings.spend,
                    slots=_slots(desired, world, settings))
    book.quotas = Quotas.build(desired, world, previous) if desired.policy is not None else None
    names = run_names(desired.runs, desired.invalid, previous, settled)
    # An invalid spec protects everything its run has on the machines: nothing is fenced, collected
    # or cleaned until the spec is fixed (or removed).
    invalid = {n for n in desired.invalid if n not in desired.runs}
    # Runs already holding a slot keep it; launches are placed by priority (then first come, first
    # served, with a Policy; then by name), and the plan lists every run in name order.
    changes, runs, preempted = plan.changes, desired.runs, book.preempted  # read for every run
    # A new run (no status, nothing observed) while every machine answers gets the launch
    # lifecycle.new_run gives, without the general walk (launch.new_run: the bulk of a queue).
    book.read_runs(names)  # each spec read once, in name order
    stopped, fresh = book.stopped, book.fresh  # fresh: such new runs, found by read_runs
    for name in placement_order(desired, names, previous, book.quotas, book.reads, book.groups.groups):
        entry = fresh.get(name)
        if entry is not None and name not in preempted:
            changes.extend(new_run(name, entry, desired, book, missing_secrets.get(name, ())))
            continue
        prev = previous.get(name)
        if name in invalid:
            changes.append(_invalid(name, desired.invalid[name], prev, world))
            continue
        entry = runs.get(name)
        if entry is None or name in stopped:
            changes.append(_stop(name, entry, prev, world))
            continue
        if name in preempted:
            changes.append(_preempted(name, entry, prev, preempted[name]))
            continue
        changes.extend(_running(name, entry, prev, world, desired, settings, now,
                                missing_secrets.get(name, ()), book))
    position = dict(zip(names, range(len(names))))
    last = len(position)
    plan.changes.sort(key=lambda c: position.get(c.name, last))  # stable: a run's own order kept
    by_run = {c.name: c for c in plan.changes if c.phase is not None} if missing_secrets else {}
    for name, secrets in sorted(missing_secrets.items()):
        entry, change = desired.runs.get(name), by_run.get(name)
        # Only where a launch may still come: not for a stopped run, nor for one that has ended.
        if (secrets and entry is not None and entry.run.spec.desiredState != "Stopped"
                and change is not None and change.phase not in TERMINAL):
            plan.warnings.append(f"{name}: secret(s) {', '.join(secrets)} not set on the reconciler host; "
                                 "its launches wait until they are")
    hold_for_unreachable(plan, world, previous, now, settings.unreachable_grace)
    fence_other_attempts(plan, world, invalid)
    covered = _accounted(plan)
    known = set(names) | settled  # every run of a spec, an invalid spec or a status
    plan.changes.extend(_fences(world, invalid, covered, known, now, settings.orphan_grace, plan.warnings))
    # Fences add only live instances, which _leftovers passes over anyway: the same set serves both.
    plan.changes.extend(_leftovers(plan, world, invalid, known, covered))
    if world.rentals:
        plan.changes.extend(sweep(book, plan, plan.warnings))
        plan.changes.extend(_saves(plan, world))
    if world.has_nodes():  # else no change names a gang
        expand_gangs(plan, world)
    return plan
