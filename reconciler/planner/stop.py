"""A run that is not to run: its spec removed, ``desiredState: Stopped``, its spec invalid, or
preempted by a run of higher priority. What it still has on the machines is stopped or collected.
"""

from __future__ import annotations

from reconciler.core.actions import Action
from reconciler.core.identity import parse
from reconciler.core.observed import ObservedRun, ObservedWorld
from reconciler.core.plan import Change, Kill
from reconciler.core.runstatus import TERMINAL, RunStatus
from reconciler.spec.load import RunEntry

from .fence import evaporated


def _preempted(name: str, entry: RunEntry, prev: RunStatus | None, victim: tuple) -> Change:
    kill, why = victim
    p = parse(kill.identity)
    return Change(name, Action.TERMINATE, "Preempted", why, "Pending", p.generation, p.attempt, identity=kill.identity,
                  machine=kill.machine, kill=[kill], spec_digest=entry.digest, spec_path=entry.rel)


def _invalid(name: str, message: str, prev: RunStatus | None, world: ObservedWorld) -> Change:
    gen = prev.generation if prev else 0
    att = prev.attempt if prev else 0
    alive = [r.identity for r in world.instances(name) if r.alive]
    if alive:
        message += f" (the last valid spec keeps running as {', '.join(alive)}; nothing is changed until the spec is fixed)"
    ident = prev.handle.identity if prev is not None and prev.handle is not None else None
    if prev and prev.phase == "Invalid" and prev.message == message:
        return Change(name, Action.NONE, "SpecInvalid", "still invalid", "Invalid", gen, att, identity=ident)
    return Change(name, Action.MARK_INVALID, "SpecInvalid", message, "Invalid", gen, att, identity=ident)


def _stop(name: str, entry: RunEntry | None, prev: RunStatus | None, world: ObservedWorld) -> Change:
    why = "spec removed" if entry is None else "desiredState: Stopped"
    code = "SpecRemoved" if entry is None else "Stopped"
    gen = prev.generation if prev else (1 if entry else 0)
    att = prev.attempt if prev else 0
    digest = entry.digest if entry else None
    path = entry.rel if entry else None
    alive = [r for r in world.instances(name) if r.alive or any(n.alive for n in r.nodes)]
    if alive:
        kills = [Kill(r.machine, r.identity, r.workspace) for r in alive]
        return Change(name, Action.TERMINATE, code, f"{why}: stopping {', '.join(r.identity for r in alive)}",
                      "Terminated", gen, att, kill=kills, spec_digest=digest, spec_path=path)
    ended = _ended_uncollected(name, prev, world)
    if prev is not None and prev.phase in TERMINAL:
        if ended is not None:  # stopped, but its collection failed: once more
            return Change(name, Action.COLLECT, code, f"{why}; collecting {ended.identity}", prev.phase, gen, att,
                          identity=ended.identity, machine=ended.machine, workspace=ended.workspace,
                          exit_code=prev.exit_code, spec_digest=prev.spec.digest, spec_path=prev.spec.path)
        return Change(name, Action.NONE, code, f"{why}; nothing running", prev.phase, gen, att,
                      spec_digest=prev.spec.digest, spec_path=prev.spec.path)
    if ended is not None:
        # It finished before the stop: its own end is the run's end, kept with its exit code.
        phase = ENDED_PHASE[ended.state]
        p = parse(ended.identity)
        exit_note = f" (exit {ended.exit_code})" if ended.exit_code is not None else ""
        return Change(name, Action.COLLECT, code, f"{why}; {ended.identity} had already {ended.state}{exit_note}",
                      phase, p.generation, p.attempt, identity=ended.identity,
                      machine=ended.machine, workspace=ended.workspace, exit_code=ended.exit_code,
                      # The spec that attempt ran, not the one that stops it: the end belongs to it
                      # (so flipping Stopped back gives the same result whenever passes ran).
                      spec_digest=ended.spec_digest or (prev.spec.digest if prev else None),
                      spec_path=path or (prev.spec.path if prev else None))
    unknown = _on_unreachable(world, prev)
    if unknown:
        return Change(name, Action.WAIT, "MachineUnreachable",
                      f"{why}, but {unknown} does not answer; it is stopped when it is back",
                      prev.phase if prev else "Unknown", gen, att, spec_digest=digest, spec_path=path)
    if prev is None:  # never launched: record it, with nothing to stop
        return Change(name, Action.NONE, code, f"{why}; never launched", "Terminated", gen, att,
                      spec_digest=digest, spec_path=path)
    return Change(name, Action.TERMINATE, code, f"{why}; nothing was running", "Terminated", gen, att,
                  spec_digest=digest, spec_path=path)

ENDED_PHASE = {"succeeded": "Succeeded", "failed": "Failed", "terminated": "Terminated"}


def _ended_uncollected(name: str, prev: RunStatus | None, world: ObservedWorld) -> ObservedRun | None:
    """The run's own finished, not yet collected instance: the one its status names, else its newest."""
    ended = [r for r in world.instances(name) if r.state in ENDED_PHASE and not r.collected]
    if not ended:
        return None
    current = prev.handle.identity if prev is not None and prev.handle is not None else None
    mine = [r for r in ended if r.identity == current]
    if mine:
        return mine[0]
    return max(ended, key=lambda r: parse(r.identity)[1:])  # instances() holds parsed identities only


def _on_unreachable(world: ObservedWorld, prev: RunStatus | None) -> str | None:
    if prev is None or prev.handle is None or prev.handle.machine is None:
        return None
    m = world.machines.get(prev.handle.machine)
    if m is not None and not m.reachable and prev.phase not in TERMINAL:
        # A rental its provider no longer has cannot come back with the instance: not waited for.
        return None if evaporated(world, prev.handle.machine) else prev.handle.machine
    return None
