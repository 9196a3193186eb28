"""Observe: ask every machine, in parallel and with per-host timeouts, what its runs are doing.

One agent call per machine reports all of its workspaces. A machine that fails to answer is marked
unreachable, not empty: its runs are Unknown until a grace period passes. The moment it stopped
answering is read back from the status files' MachineReachable condition, so the grace clock
survives a reconciler restart or a move to another VM.
"""

from __future__ import annotations

import threading
from typing import Callable

from .errors import ReconcilerError
from .observed import ObservedMachine, ObservedRun, ObservedWorld
from .spec.load import DesiredState
from .status import TERMINAL, RunStatus, parse_iso

RUN_STATES = ("running", "succeeded", "failed", "terminated", "lost", "staged", "unknown")


def names_to_watch(desired: DesiredState, previous: dict[str, RunStatus],
                   settled: frozenset[str] = frozenset()) -> list[str]:
    names = set(desired.runs) - settled
    names.update(n for n, s in previous.items() if s.phase not in TERMINAL)
    return sorted(names)


def unreachable_since(previous: dict[str, RunStatus], machine: str) -> float | None:
    times = []
    for st in previous.values():
        if st.handle is None or (st.handle.machine != machine
                                 and not any(n.get("machine") == machine for n in st.handle.nodes or ())):
            continue
        c = st.condition("MachineReachable")
        if c is not None and c.status == "False":
            t = parse_iso(c.last_transition)
            if t is not None:
                times.append(t)
    return min(times) if times else None


def each(fn: Callable, items: list, parallel: int) -> list:
    """``fn`` over ``items`` on ``parallel`` threads that each take the next item when done: a
    slow machine holds one thread, not a share of the list. Cheaper than a future per machine
    when there are a thousand (the futures' locks contend for the interpreter with the probes).
    The results are in the items' order; the first exception raised is raised here."""
    if parallel <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    out: list = [None] * len(items)
    errors: list[BaseException] = []
    it = iter(range(len(items)))
    lock = threading.Lock()

    def worker() -> None:
        while not errors:
            with lock:
                i = next(it, None)
            if i is None:
                return
            try:
                out[i] = fn(items[i])
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                errors.append(e)

    threads = [threading.Thread(target=worker, name=f"each-{n}", daemon=True)
               for n in range(min(parallel, len(items)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


def observe(machines: list[str], transport_for: Callable[[str], object], names: list[str],
            previous: dict[str, RunStatus], now: float, parallel: int = 16) -> ObservedWorld:
    world = ObservedWorld(at=now)

    def one(name: str) -> ObservedMachine:
        m = ObservedMachine(name)
        try:
            t = transport_for(name)
            fleet_machine = getattr(getattr(t, "machine", None), "fleet_machine", None)
            avoid = getattr(fleet_machine, "foreign_gpus", "ignore") == "avoid"
            report = t.agent({"op": "probe", "names": names, **({"gpu_processes": True} if avoid else {})})
            m.round_trips = getattr(t, "round_trips", 1)
        except Exception as e:  # noqa: BLE001 - a probe failure must never stop the pass
            m.reachable, m.error = False, str(e) if isinstance(e, ReconcilerError) else f"{type(e).__name__}: {e}"
            m.unreachable_since = unreachable_since(previous, name) or now
            return m
        if report.get("error"):
            m.error = report["error"]
        drain = report.get("drain")
        if isinstance(drain, dict):
            m.draining = str(drain.get("reason") or "") or "drained from the machine"
        foreign = report.get("foreign_gpus")
        if isinstance(foreign, dict):
            m.foreign_gpus = [g for g in foreign.get("gpus") or [] if isinstance(g, int)]
            if foreign.get("error"):
                m.error = (m.error + "; " if m.error else "") + str(foreign["error"])
        for ident, r in report.get("runs", {}).items():
            state = r.get("state")
            if state not in RUN_STATES:
                continue
            m.runs[ident] = ObservedRun(
                identity=ident, machine=name, state=state, exit_code=r.get("exit_code"),
                finished_at=r.get("finished_at"), started_at=r.get("started_at"),
                pid=r.get("pid"), container=r.get("container"),
                workspace=r.get("workspace"), gpus=list(r.get("gpus") or []), collected=bool(r.get("collected")),
                message=r.get("message", ""), progress=r.get("progress"), permanent=bool(r.get("permanent")),
                spec_digest=r.get("spec_digest"),
                checkpoints=[c for c in r.get("checkpoints") or [] if isinstance(c, str)],
                queued=r.get("queued"), job=r.get("slurm_job"), heartbeat_age=r.get("heartbeat_age"),
                gang=r.get("gang") if isinstance(r.get("gang"), dict) else None,
            )
        return m

    if len(machines) == 1:
        results = [one(machines[0])]
    else:
        results = each(one, machines, parallel)
    for m in results:
        world.machines[m.name] = m
    return world
