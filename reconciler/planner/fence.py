"""No two attempts of a run alive at once: every change of a run stops what is left of every
attempt it does not keep running (an earlier one, or its own that has ended) before anything else.

A run's lifecycle decides from its current attempt's state; an attempt's state says how its
wrapper's own child ended, not that everything it started did (a worker in a session of its own
outlives the wrapper's group). The probe counts, per identity, the processes that still carry it
(``ObservedRun.live``), and this pass adds a stop of every such process to the run's own change:
apply carries out a change's stops first, in order, and starts nothing when a stop reports a
survivor, so a launch (or relaunch) runs only once the machine confirmed, in the same pass, that
nothing of an earlier attempt lives there; otherwise the change fails and the next pass observes
and stops again before it launches.

What cannot be observed cannot be stopped: a machine that does not answer is waited for (the
unreachable grace of the run's lifecycle) and fenced when it comes back (housekeeping.py). A
rented machine its provider reports terminated, or no longer lists, cannot come back, so nothing
waits for it (``evaporated``).
"""

from __future__ import annotations

from operator import attrgetter

from reconciler.core.actions import Action
from reconciler.core.identity import parse
from reconciler.core.names import LOCAL
from reconciler.core.observed import ObservedRun, ObservedWorld
from reconciler.core.plan import Change, Kill, Plan
from reconciler.core.runstatus import TERMINAL, RunStatus, iso

from .capacity import _candidates

STARTS = (Action.LAUNCH, Action.RELAUNCH, Action.PROVISION)
_NAME = attrgetter("name")


def fence_other_attempts(plan: Plan, world: ObservedWorld, protected: set[str]) -> None:
    """Add to each run's own change a stop of every live process of its attempts other than the
    one it keeps running. ``protected``: runs whose spec is invalid (nothing of theirs is touched).
    A run with no instance in sight has nothing to stop: its change is passed over."""
    observed = world.names()
    if observed.isdisjoint(map(_NAME, plan.changes)):  # in C: most changes are of runs with nothing in sight
        return
    for c in plan.changes:
        if c.phase is None or c.name in protected or c.name not in observed:
            continue
        extra = _to_stop(c, world.instances(c.name))
        if extra:
            c.kill = c.kill + extra
            if c.action == Action.NONE:  # shown, and recorded, as the stop it now is
                c.action, c.code = Action.TERMINATE, "Fenced"
                c.reason = f"stopping what is left of {', '.join(k.identity for k in extra)}"


def hold_for_unreachable(plan: Plan, world: ObservedWorld, previous: dict[str, RunStatus], now: float,
                         grace: float) -> None:
    """A run's next attempt does not start while a machine that holds its current attempt (as its
    status records it, every node of it) does not answer: that attempt may still run there, and
    nothing can stop it. The start waits until the machine answers (the attempt is then stopped
    first, as any other) or until the unreachable grace has passed (it is declared lost, and fenced
    when its machine is back). A lost machine's own run waits this way already (lifecycle); this
    holds every other start: a changed spec, a restart after a stop, a relaunch elsewhere."""
    if all(m.reachable for m in world.machines.values()):
        return  # nothing is held for a machine that answers: the changes need not be read
    for c in plan.changes:
        prev = previous.get(c.name)
        if c.phase is None or c.action not in STARTS or prev is None or prev.handle is None:
            continue
        if prev.phase in TERMINAL or prev.handle.identity in (None, c.identity):
            continue  # an attempt seen ended stays ended; a start of the same identity waits already
        for where in _machines_of(prev.handle):
            m = world.machines.get(where)
            if m is None or m.reachable or evaporated(world, where):
                continue
            until = (m.unreachable_since or now) + grace
            if now < until:
                _hold(c, prev, where, m.error, until, now)
                break


def _machines_of(handle) -> list[str]:
    nodes = [n.get("machine") for n in handle.nodes or [] if isinstance(n, dict)]
    return [m for m in [handle.machine, *nodes] if m]


def _hold(c: Change, prev: RunStatus, where: str, error: str, until: float, now: float) -> None:
    """``c`` becomes a wait that records the run as it was: its current attempt, spec and phase."""
    c.reason = (f"{where}, which holds {prev.handle.identity}, does not answer ({error or 'no reply'}); "
                f"{c.identity} starts once it is stopped there, or at {iso(until)} when it is declared lost")
    c.action, c.code, c.phase = Action.WAIT, "MachineUnreachable", "Unknown"
    c.identity, c.machine, c.workspace, c.nodes, c.gpus = prev.handle.identity, where, None, [], []
    c.generation, c.attempt = prev.generation, prev.attempt
    c.spec_digest, c.spec_path = prev.spec.digest, prev.spec.path
    c.collect_first, c.resume_from, c.rental = None, None, None
    c.retry_after = min(until - now, 60.0)


def _to_stop(c: Change, instances: list[ObservedRun]) -> list[Kill]:
    """The live nodes (or one-machine instances) of ``c``'s run that ``c`` neither stops already
    nor keeps: it keeps its own identity while that still runs, unless it starts a new attempt."""
    have = {k.identity for k in c.kill}
    pairs = {(k.machine, k.identity) for k in c.kill}
    keep = None if c.action in STARTS else c.identity
    # The same identity on two machines (one launched unseen, then declared lost after the grace):
    # only the one on the change's machine is kept.
    twice = sum(r.identity == keep for r in instances) > 1 and c.machine is not None
    out = []
    for r in instances:
        if r.identity in have and not twice:
            continue
        for n in r.nodes or [r]:
            if not (n.alive or n.lingering) or (n.identity in have and not twice) or (n.machine, n.identity) in pairs:
                continue
            if r.identity == keep and n.state == "running" and not (twice and r.machine != c.machine):
                continue
            out.append(Kill(n.machine, n.identity, n.workspace))
    return out


def evaporated(world: ObservedWorld, machine: str) -> bool:
    """Whether ``machine`` is a rental its provider reports gone: terminated, or absent from an
    inventory that was read. Its instance cannot come back, so nothing needs to wait for it."""
    if "/" not in machine:
        return False
    provider = machine.split("/", 1)[0]
    if provider in world.provider_errors:
        return False
    r = world.rentals.get(machine)
    return r is None or r.state == "terminated"


def hold_unseen_launches(changes: list[Change], name: str, prev: RunStatus | None, world: ObservedWorld,
                         machines: list[str], now: float, grace: float) -> None:
    """A start of an identity that no machine in sight holds and the status does not record waits
    while one of ``machines`` (where the run may be placed) does not answer, within the unreachable
    grace: a pass killed between its launch and its status push may have started an attempt
    there that git never heard of. Numbering past it blind could give its identity to another
    spec's content, and starting elsewhere would run two attempts at once. Once the machine answers
    its instance is in sight (adopted, or numbered past and fenced); once the grace has passed it
    is declared lost like any other, and fenced when it is back."""
    recorded = prev.handle.identity if prev is not None and prev.handle is not None else None
    # A machine holding the recorded attempt is held for by hold_for_unreachable, which keeps that
    # attempt in the status.
    held = _machines_of(prev.handle) if recorded and prev.phase not in TERMINAL else []
    down = [(where, m, until) for where in machines if (m := world.machines.get(where)) is not None
            and not m.reachable and not evaporated(world, where)
            and now < (until := (m.unreachable_since or now) + grace)]
    if not down or any(where in held for where, _, _ in down):
        return
    where, m, until = down[0]
    for c in changes:
        if c.phase is None or c.action not in STARTS or c.identity in (None, recorded):
            continue
        if world.find(c.identity) is None:  # staged or found: its identity is in sight already
            _wait_unseen(c, name, prev, where, m.error, until, now)


def _wait_unseen(c: Change, name: str, prev: RunStatus | None, where: str, error: str, until: float,
                 now: float) -> None:
    """``c`` becomes a wait that leaves the status as it was (its generation, attempt and spec), so
    nothing of the start it holds back is recorded; an ended attempt it would have collected first
    is collected now."""
    # No countdown in the text: an unchanged wait leaves the status byte-identical.
    c.reason = (f"{where} does not answer ({error or 'no reply'}) and may hold a launch of {name} "
                f"that never reached git; {c.identity} starts once it answers, or at {iso(until)} "
                "when it is declared lost")
    c.action, c.code, c.phase = Action.WAIT, "MachineUnreachable", "Pending"
    c.machine, c.workspace, c.nodes, c.gpus, c.rental, c.resume_from = None, None, [], [], None, None
    if prev is not None and prev.generation > 0:
        c.generation, c.attempt = prev.generation, prev.attempt
        c.spec_digest, c.spec_path = prev.spec.digest, prev.spec.path
        c.identity = prev.handle.identity if prev.handle is not None and prev.handle.identity else c.identity
    if c.collect_first is not None:
        k = c.collect_first
        c.action, c.identity, c.machine, c.workspace = Action.COLLECT, k.identity, k.machine, k.workspace
    c.collect_first = None
    c.retry_after = min(until - now, 60.0)


def launch_machines(name: str, eff, slots: dict, cache: dict | None, slurm: str | None, rents: bool,
                    prev: RunStatus | None, world: ObservedWorld) -> list[str]:
    """The machines that could hold an attempt of ``name`` that the status does not record: where
    its placement may put it (its Slurm cluster, the owned machines its target names, the rentals
    named for it when it rents), and the machines its status names."""
    out: list[str] = []
    if slurm is not None:
        out.append(slurm)
    elif eff.placement == "ssh":
        out.extend(s.name for s in _candidates(slots, eff.placement, eff.target, cache))
    if rents:
        out.extend(m for m, r in world.rentals.items() if _run_of(r.identity) == name)
    if prev is not None and prev.handle is not None:
        out.extend(_machines_of(prev.handle))
    return [m for m in dict.fromkeys(out) if m != LOCAL]


def _run_of(identity: str) -> str | None:
    p = parse(identity)
    return p.name if p is not None else None



def hold_predecessor_launches(plan: Plan, world: ObservedWorld, previous: dict[str, RunStatus],
                              inflight: dict[str, tuple[str, str, float]], blanket_until: float | None,
                              now: float) -> None:
    """A start of an identity that no status records and no machine shows waits while a launch
    issued by an earlier reconciler may still land (engine/inflight.py): until the hold of the
    run's launch that got no answer (``inflight``: run → (machine, identity, until), the launch's
    deadline plus the clock margin), or, when the predecessor's launches cannot be known at all,
    until ``blanket_until``. Starting sooner could number past nothing there and give the landing
    launch's identity to another spec's content. A start of the identity the status records
    (adoption, a staged bundle) never waits for this, nor does a launch git knows of."""
    for c in plan.changes:
        if c.phase is None or c.action not in STARTS or c.identity is None:
            continue
        prev = previous.get(c.name)
        recorded = prev.handle.identity if prev is not None and prev.handle is not None else None
        if c.identity == recorded or world.find(c.identity) is not None:
            continue
        machine, identity, until = inflight.get(c.name, ("", "", 0.0))
        ident = c.identity
        if until > now and identity != recorded:
            _wait_unseen(c, c.name, prev, machine, "", until, now)
            c.reason = (f"a launch of {identity} on {machine} got no answer and may still land until "
                        f"{iso(until)}; {ident} starts after that")
        elif blanket_until is not None and now < blanket_until:
            _wait_unseen(c, c.name, prev, "", "", blanket_until, now)
            c.reason = (f"an earlier reconciler may have left a launch of {c.name} in flight (this checkout "
                        f"has no launch journal); {ident} starts at {iso(blanket_until)}, once any such "
                        "launch has landed or been refused")
        else:
            continue
        c.code = "LaunchInFlight"
