"""Observe: ask every machine, in parallel and with per-host timeouts, what its runs are doing.

One agent call per machine reports all of its workspaces. What it says passes the trust boundary
(``core/boundary.py``: bounded, validated, per run) and is bound to the machine: a machine reports only
on the runs it hosts. A machine that fails to answer, or whose answer cannot be read, is marked
unreachable, not empty: its runs are Unknown until a grace period passes. The moment it stopped
answering is read back from the status files' MachineReachable condition, so the grace clock
survives a reconciler restart or a move to another VM.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Callable

from reconciler.core import boundary, replies
from reconciler.core.boundary import ProbeReply
from reconciler.core.errors import ReconcilerError
from reconciler.core.identity import parse
from reconciler.core.observed import ObservedMachine, ObservedWorld
from reconciler.core.parse_reuse import ParseMemo
from reconciler.spec.load import DesiredState
from reconciler.core.runstatus import TERMINAL, RunStatus, parse_iso

log = logging.getLogger("reconciler")
# A machine names the same identities pass after pass: their parse (pure, immutable) is kept.
_identity = functools.lru_cache(maxsize=1 << 16)(parse)


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
    # A range's iterator hands out each index once to whichever thread asks: its next() runs in C,
    # under the interpreter lock, so no lock of ours is needed (one was contended by 16 threads).
    it = iter(range(len(items)))

    def worker() -> None:
        while not errors:
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


def expected_workspace(transport, identity: str) -> str | None:
    """Where ``identity``'s workspace is on the transport's machine, as the control plane knows it
    (its configured root, or the root the machine's probe resolved a relative one to); None when
    that is not known without asking the machine again."""
    if getattr(transport, "_root", "") is None:  # an SSH root not resolved: asking costs a round trip
        return None
    try:
        return transport.workspace(identity)
    except Exception:  # noqa: BLE001 - unknown: the report is judged without it
        return None


def observe(machines: list[str], transport_for: Callable[[str], object], names: list[str],
            previous: dict[str, RunStatus], now: float, parallel: int = 16,
            recorded: Callable[[str], RunStatus | None] | None = None,
            memo: ParseMemo | None = None) -> ObservedWorld:
    """Every machine's report, validated (``core/boundary.py``) and bound to the machine: a report about
    an attempt whose status records another machine is dropped and noted on the reporting
    machine. ``recorded``: the status of a run not in ``previous`` (a settled run's, read on demand).
    ``memo``: the parses of earlier observations, reused for identical run entries (a long-lived
    reconciler keeps one)."""
    world = ObservedWorld(at=now)
    if memo is not None:
        memo.rotate()
    looked_up: dict[str, RunStatus | None] = {}

    def handle_of(ident: str):
        p = _identity(ident)
        if p is None:
            return None
        st = previous.get(p.name)
        if st is None and recorded is not None:
            if p.name not in looked_up:
                looked_up[p.name] = recorded(p.name)
            st = looked_up[p.name]
        return st.handle if st is not None else None

    def one(name: str) -> tuple[ObservedMachine, object, ProbeReply | None]:
        m = ObservedMachine(name)
        t = None
        try:
            t = transport_for(name)
            fleet_machine = getattr(getattr(t, "machine", None), "fleet_machine", None)
            avoid = getattr(fleet_machine, "foreign_gpus", "ignore") == "avoid"
            # The decoded reply keeps its share of the decoding budget until it is checked (and
            # dropped): what parallel probes hold at once stays within ssh_decode_budget_bytes.
            with replies.REPLY_BUDGET.scope():
                answer = t.agent({"op": "probe", "names": names, **({"gpu_processes": True} if avoid else {})})
                reply = boundary.parse_probe(answer, memo, name)
            m.round_trips = getattr(t, "round_trips", 1)
        except Exception as e:  # noqa: BLE001 - a probe failure must never stop the pass
            # A reply that cannot be read at all is as good as no reply: the machine is unreachable
            # for this pass (its runs wait out the grace), with the reason.
            if isinstance(e, boundary.BadReply):
                why = f"its probe answer was rejected: {e}"
            else:
                why = str(e) if isinstance(e, ReconcilerError) else f"{type(e).__name__}: {e}"
            m.reachable, m.error = False, boundary.clean_text(why)
            m.unreachable_since = unreachable_since(previous, name) or now
            return m, t, None
        m.error = reply.error
        m.draining = reply.draining
        m.foreign_gpus = list(reply.foreign_gpus)
        m.gpu_error = reply.gpu_error if avoid else None  # avoid fails closed: planner/capacity.py
        m.rejected = list(reply.rejected)
        m.same_runs = reply.same_runs
        return m, t, reply

    if len(machines) == 1:
        results = [one(machines[0])]
    else:
        results = each(one, machines, parallel)
    # Binding runs here, on the pass's thread: it may read settled runs' statuses.
    for m, t, reply in results:
        if reply is not None:
            try:
                _bind(m, t, reply, handle_of)
            except Exception as e:  # noqa: BLE001 - never through the pass; never read as "no runs"
                m.runs.clear()
                m.reachable, m.error = False, boundary.clean_text(f"its report could not be checked: "
                                                                  f"{type(e).__name__}: {e}")
                m.unreachable_since = unreachable_since(previous, m.name) or now
        world.machines[m.name] = m
    return world


def _bind(m: ObservedMachine, transport, reply: ProbeReply, handle_of) -> None:
    """The machine's validated runs that it may report on, as ObservedRuns; the others noted."""
    foreign = []
    name, runs, may_report = m.name, m.runs, boundary.may_report
    for ident, r in reply.runs.items():
        handle = handle_of(ident)
        # A status that records the attempt decides without the expected workspace, which is
        # then not worked out (a string per run of a steady fleet): asked only when it matters.
        why = may_report(name, r, handle, None) if handle is not None else "?"
        if why is not None:
            why = may_report(name, r, handle, expected_workspace(transport, ident))
        if why is not None:
            foreign.append(why)
            continue
        r.machine = name
        runs[ident] = r
    if foreign:
        note = "reported runs it does not host: " + "; ".join(foreign[:5]) + (
            f" (and {len(foreign) - 5} more)" if len(foreign) > 5 else "")
        m.rejected.extend(foreign)
        m.error = (m.error + "; " if m.error else "") + note
    if m.rejected:
        log.warning("machine %s: %s", m.name, "; ".join(m.rejected[:5]))
