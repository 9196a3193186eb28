"""The observed world as the committed status files last recorded it: what ``plan --offline`` plans on.

A pull request's CI job must say what merging would do without SSH, secrets or any machine: it may
run for a fork, on a runner that reaches nothing. The status files hold what the last pass saw of
each run (its instance, machine and GPUs, and whether its machine answered), so the world they
describe is the best offline guess of the machines' state: every run that was live is taken as
still running where it was, with its GPUs, and every machine a status says did not answer is
taken as unreachable since then. The planner, unchanged, does the rest; plain values only, like
``observed.py``, so an offline plan is computed from fixtures in tests.
"""

from __future__ import annotations

from reconciler.core.actions import Action
from reconciler.core.observed import ObservedMachine, ObservedRental, ObservedRun, ObservedWorld
from reconciler.spec.offers import parse_rental_name
from reconciler.core.names import LOCAL
from reconciler.spec.load import DesiredState
from reconciler.core.runstatus import TERMINAL, RunStatus, parse_iso


def recorded_world(desired: DesiredState, previous: dict[str, RunStatus], now: float) -> ObservedWorld:
    world = ObservedWorld(at=now)
    names = {LOCAL} | {m.name for f in desired.fleets.values() for m in f.spec.machines}
    for st in previous.values():
        if st.handle is not None and st.handle.machine:
            names.add(st.handle.machine)
    for name in sorted(names):
        world.machines[name] = ObservedMachine(name)
    for st in previous.values():
        # A run's rental as its status recorded it: provisioning while the run was, running once
        # the run had a machine there (a finished run's rental may be gone: it is not assumed).
        r = st.handle.rental if st.handle is not None else None
        parsed = parse_rental_name((r or {}).get("name") or "")
        if not r or not r.get("id") or parsed is None or st.phase in TERMINAL:
            continue
        machine = f"{r['provider']}/{r['id']}"
        running = st.handle.machine == machine
        world.rentals[machine] = ObservedRental(
            machine=machine, provider=r["provider"], id=r["id"], name=r["name"],
            state="running" if running else "provisioning", identity=parsed.identity, n=parsed.n,
            host="recorded" if running else None, port=22 if running else None,
            price_per_hour=r.get("price_per_hour"), offer=r.get("offer"), host_key=r.get("host_key"))
    for st in previous.values():
        h = st.handle
        if h is None or not h.machine or not h.identity:
            continue
        m = world.machines[h.machine]
        reach = st.condition("MachineReachable")
        if reach is not None and reach.status == "False" and st.phase not in TERMINAL:
            since = parse_iso(reach.last_transition)
            m.reachable, m.error = False, reach.message or "did not answer at the last pass"
            if since is not None:
                m.unreachable_since = min(since, m.unreachable_since or since)
            continue  # an unreachable machine reports no runs
        if st.phase in TERMINAL or st.phase == "Pending":
            continue  # nothing of it is live: a finished run was collected, a pending one never started
        if st.phase == "Invalid" and not (h.pid or h.container):
            continue  # invalid before its last valid spec ever started
        m.runs[h.identity] = ObservedRun(identity=h.identity, machine=h.machine, state="running",
                                         gpus=list(h.gpus), workspace=h.workspace, pid=h.pid,
                                         container=h.container, started_at=parse_iso(h.launched_at),
                                         spec_digest=st.spec.digest)
    return world


def has_changes(plan) -> bool:
    """What ``--detailed-exitcode`` calls changes: anything but "none" (a wait that changes a
    status counts: merging changes what the repository says)."""
    return any(c.action != Action.NONE for c in plan.changes)
