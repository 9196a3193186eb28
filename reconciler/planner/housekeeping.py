"""What no run's own change deals with: live instances to fence, finished leftovers to collect and
clean, and checkpoints to copy off rented machines.
"""

from __future__ import annotations

from operator import attrgetter

from reconciler.core.actions import Action
from reconciler.core.identity import parse
from reconciler.core.names import LOCAL
from reconciler.core.observed import ObservedWorld
from reconciler.core.plan import Change, Kill, Plan
from reconciler.core.runstatus import iso


def _saves(plan: Plan, world: ObservedWorld) -> list[Change]:
    """A run training on a rental gets its newest complete checkpoint copied off the machine,
    once: the machine may vanish, the copy is what a relaunch elsewhere resumes from."""
    out = []
    for c in list(plan.changes):
        if c.phase != "Running" or c.action not in (Action.NONE, Action.ADOPT) or not c.identity:
            continue
        obs = world.find(c.identity)
        if obs is None or not obs.alive or obs.machine not in world.rentals or not obs.checkpoints:
            continue
        newest = obs.checkpoints[-1]
        if newest.rsplit("/", 1)[-1] in world.saved_checkpoints.get((c.name, c.generation), set()):
            continue
        out.append(Change(c.name, Action.SAVE, "CheckpointCopy", f"copying {newest} of {c.identity} off {obs.machine}",
                          None, c.generation, c.attempt, identity=c.identity, machine=obs.machine,
                          workspace=obs.workspace, checkpoint=newest))
    return out


def _accounted(plan: Plan) -> set[str]:
    """Identities some change of the plan already deals with."""
    changes = plan.changes
    covered = set(map(_IDENTITY, changes))  # every change names one (or None, or "": taken out below)
    covered.discard(None)
    covered.discard("")
    # Most changes stop, clean and collect nothing: those that do are picked out by sweeps that
    # run in C (a Kill is always true: collect_first is set exactly when it is not None).
    for c in filter(_KILL, changes):
        covered.update(k.identity for k in c.kill)
    for c in filter(_CLEANUP, changes):
        covered.update(k.identity for k in c.cleanup)
    for c in filter(_COLLECT_FIRST, changes):
        covered.add(c.collect_first.identity)
    return covered


_IDENTITY, _KILL, _CLEANUP, _COLLECT_FIRST = (attrgetter("identity"), attrgetter("kill"), attrgetter("cleanup"),
                                              attrgetter("collect_first"))


def _attempt(ident: str) -> str:
    """The attempt a node's identity belongs to (the identity itself for a one-machine attempt)."""
    p = parse(ident)
    return str(p) if p is not None else ident


def _fences(world: ObservedWorld, protected: set[str], covered: set[str], known: set[str], now: float,
            orphan_grace: float, warnings: list[str]) -> list[Change]:
    """Live instances no change accounts for (``covered``): an old attempt that came back, a
    foreign leftover. ``protected``: runs whose spec is invalid; what they run is left alone.

    An instance of a run the repository does not know at all (``known``: no spec, no status) is
    stopped only once it has run ``orphan_grace`` seconds, with a warning until then: it may
    belong to a newer checkout than this one; one without a start time of its own counts from
    the first pass that saw it (``world.first_seen``). Anything not named like a run identity is
    never reported by the probe, so never touched."""
    out = []
    for m in world.machines.values():
        if not m.reachable or not m.runs:
            continue
        for ident, r in sorted(m.runs.items()):
            if (r.alive or r.lingering) and ident not in covered and _attempt(ident) not in covered:
                p = parse(ident)
                if p is not None and p.name in protected:
                    continue
                if p is not None and p.name not in known:
                    # No start time of its own: the first pass that saw it alive is its start.
                    start = r.started_at
                    if start is None:
                        start = world.first_seen.get(f"{m.name} {ident}", now)
                    until = start + orphan_grace
                    if now < until:
                        warnings.append(f"{ident} runs on {m.name} but no spec or status names {p.name}; "
                                        f"it is stopped at {iso(until)} unless a spec claims it")
                        continue
                why = (f"{ident} is alive on {m.name} but no spec or status names {p.name}"
                       if p is not None and p.name not in known else
                       f"{ident} is alive on {m.name} but is not the run's current instance")
                out.append(Change(p.name if p else ident, Action.TERMINATE, "Fenced", why,
                                  None, p.generation if p else 0, p.attempt if p else 0,
                                  kill=[Kill(m.name, ident, r.workspace)]))
    return out


def _leftovers(plan: Plan, world: ObservedWorld, protected: set[str], known: set[str],
               covered: set[str]) -> list[Change]:
    """Finished or never-started workspaces that are no run's current instance: collect and clean.

    A fenced instance, a lost one, or a staged bundle a crash left behind would otherwise stay on
    its machine for ever (and keep its run from settling). Each is collected once: its logs are
    fetched into the local bundle folder and its workspace is marked collected. The workspace is
    removed when nothing can need it again: a bundle that never started, an instance of another
    generation than the run's current one (retries resume only within a generation), or one of a
    run the repository does not know at all. Earlier attempts of the current generation stay until
    the run's final collection removes them with the rest.
    """
    current_gen = None  # run → its current generation, gathered from the plan once a leftover needs it
    out = []
    for m in world.machines.values():
        if not m.reachable or not m.runs:
            continue
        for ident, r in sorted(m.runs.items()):
            if (r.alive or r.lingering or r.collected or r.state == "unknown" or ident in covered
                    or _attempt(ident) in covered):
                continue
            p = parse(ident)
            if p is None or p.name in protected:
                continue
            # A local workspace is also the attempt's local record (remote ones are fetched into
            # one): it stays, marked collected, while its run is known.
            if current_gen is None:
                current_gen = {c.name: c.generation for c in plan.changes if c.phase is not None}
            remove = (r.state == "staged" or p.name not in known
                      or (m.name != LOCAL and current_gen.get(p.name) != p.generation))
            what = "staged but never started" if r.state == "staged" else r.state
            out.append(Change(p.name, Action.COLLECT, "Leftover",
                              f"{ident} on {m.name} ({what}) is not the run's current instance; "
                              + ("collecting and removing it" if remove else "collecting it"),
                              None, p.generation, p.attempt, identity=ident, machine=m.name,
                              workspace=r.workspace, remove=remove, ran=r.state != "staged"))
    return out
