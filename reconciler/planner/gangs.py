"""Runs on several machines (gangs): all their nodes placed at once or none, the room of an ending
attempt's nodes given back, and every change of an attempt carried out on each of its nodes.
"""

from __future__ import annotations

from reconciler.core.actions import Action
from reconciler.core.identity import node_identity
from reconciler.core.observed import ObservedRun, ObservedWorld
from reconciler.core.plan import Change, Kill, Node, Plan
from reconciler.spec.load import DesiredState, RunEntry
from reconciler.spec.resolve import effective

from .capacity import SHOWN, Slot, _judge, _shown


def _place_gang(name, eff, candidates, res, ident, action, code, why, stale, base, resume_from, book) -> Change:
    """N machines at once or none (gang placement): each node needs the run's GPUs, CPUs and
    memory on a machine of its own. The nodes go where the fewest matching GPUs stay free, then the
    fewest tasks, then by name; rank 0 (the rendezvous) is the first of them."""
    ranked, rejected = [], []
    for slot in candidates:
        option, no = _judge(slot, res, res.wanted_types(), eff.selector)
        if option is None:
            rejected.append(no)
        else:
            ranked.append((option, slot))
    shown = _shown(rejected)
    if len(ranked) < res.nodes:
        return Change(name, Action.WAIT, "NoCapacity", f"no capacity: {res.nodes} machines needed at once, "
                      f"{len(ranked)} have room" + ("; " + "; ".join(shown) if shown else ""), "Pending",
                      identity=ident, kill=stale, retry_after=30.0, considered=shown, **base)
    ranked.sort(key=lambda x: x[0])
    nodes = []
    for rank, ((_, _, _, _, t), slot) in enumerate(ranked[:res.nodes]):
        gpus = slot.hold(res, t)
        if book is not None:
            book.placed_on(slot.name, name)
            book.room_changed(slot)
        nodes.append(Node(slot.name, node_identity(ident, rank), gpus=gpus))
    considered = [f"{n.machine}: node n{k}" + (" (the rendezvous)" if k == 0 else "") for k, n in enumerate(nodes)]
    considered += [f"{slot.name}: fits, not needed" for _, slot in ranked[res.nodes:]][:SHOWN] + shown
    return Change(name, action, code, why, "Running", identity=ident, machine=nodes[0].machine, backend=eff.backend,
                  gpus=list(nodes[0].gpus), kill=stale, resume_from=resume_from, considered=considered, nodes=nodes,
                  **base)


def _stop_nodes(changes: list[Change], gang: ObservedRun) -> list[Change]:
    """The attempt is over: its nodes still alive are stopped with the change that ends it."""
    have = {k.identity for k in changes[-1].kill}
    changes[-1].kill = changes[-1].kill + [Kill(r.machine, r.identity, r.workspace) for r in gang.nodes
                                           if r.alive and r.identity not in have]
    return changes


def _resources(entry: RunEntry, desired: DesiredState, book=None):
    if book is not None:
        return book.effective(entry).resources
    return effective(entry.run, desired.templates[entry.run.spec.template]).resources


def _free_nodes(gang: ObservedRun, slots: dict[str, Slot], book, res) -> None:
    """Give back, in this plan, the room of an ending attempt's live nodes (the change that ends
    the attempt stops them before it launches anything); ``res``: what each node holds."""
    for r in gang.nodes:
        slot = slots.get(r.machine)
        if not r.alive or slot is None:
            continue
        slot.give_back(r.gpus, res)
        if book is not None:
            book.room_changed(slot, grew=True)


def expand_gangs(plan: Plan, world: ObservedWorld) -> None:
    """Changes name a run on several machines by its attempt's identity; what is done is done on
    each node: a stop or a clean-up on each node's machine, a collection of each node."""
    def nodes_of(ident: str | None) -> list[ObservedRun]:
        gang = world.find(ident) if ident else None
        return gang.nodes if gang is not None else []

    def flat(kills: list[Kill]) -> list[Kill]:
        out = []
        for k in kills:
            parts = nodes_of(k.identity)
            out += [Kill(r.machine, r.identity, r.workspace, k.grace) for r in parts] if parts else [k]
        return out

    for c in plan.changes:
        if c.kill:
            c.kill = flat(c.kill)
        if c.cleanup:
            c.cleanup = flat(c.cleanup)
        if c.collect_first is not None and nodes_of(c.collect_first.identity):
            c.collect_nodes = [Node(r.machine, r.identity, r.workspace, list(r.gpus))
                               for r in nodes_of(c.collect_first.identity)]
        if c.action == Action.COLLECT and not c.nodes and nodes_of(c.identity):
            c.nodes = [Node(r.machine, r.identity, r.workspace, list(r.gpus)) for r in nodes_of(c.identity)]
