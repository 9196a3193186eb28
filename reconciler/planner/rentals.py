"""The planner's rental half: which machine a rental run gets, and which rentals go back. Pure.

Placement, in order (the first that applies wins):
1. the rental the run already holds, or one provisioned under its identity (a reconciler killed
   between asking for a machine and recording it finds it here by name: never a second one);
   still provisioning → wait; failed → replaced; past ``provisionTimeout`` → replaced;
2. a warm rental nobody holds whose offer fits the run (kept up by ``idle`` after its last run),
   cheapest first;
3. a new rental: the cheapest fitting offer of the providers the run may use (ties: fewer GPUs,
   then provider and offer name), unless the run's ``maxCost`` or the provider's limits say no,
   or the offer failed a GPU check or had no capacity lately.

Every rental named as this repository's is then swept: failed ones, ones past ``maxDuration``,
idle ones past ``idle`` and orphans past ``orphanGrace`` are released. A rental with anything
alive or uncollected on it, or that a run holds, stays. Rentals under any other name are never
in ``world.rentals`` (observation drops them), so they are never touched.
"""

from __future__ import annotations

from typing import Callable

from reconciler.core.actions import Action
from reconciler.core.identity import parse
from reconciler.core.observed import ObservedRental
from reconciler.core.plan import Change
from reconciler.core.runstatus import TERMINAL, RunStatus, cost_so_far, iso, parse_iso
from reconciler.spec.models.provider import Offer
from reconciler.spec.offers import fits, offer_key, rental_name

from .book import LIVE, PlanBook


def rental_info(r: ObservedRental, offer: Offer | None = None) -> dict:
    info = {"provider": r.provider, "id": r.id, "name": r.name, "offer": r.offer,
            "price_per_hour": r.price_per_hour if r.price_per_hour is not None else (offer.price_per_hour if offer else None)}
    return info


def place_rental(book: PlanBook, name: str, entry, eff, prev: RunStatus | None, ident: str, action: Action,
                 code: str, why: str, stale: list, base: dict, resume_from: str | None,
                 target_any: bool = False) -> list:
    res = eff.resources
    target = None if target_any else eff.target  # an ssh template's fallback: its target names a fleet
    providers = {n: p for n, p in book.desired.providers.items() if target is None or n == target}
    if not providers:
        return [Change(name, Action.WAIT, "NoProvider", f"no Provider named {target!r}" if target
                       else "no Provider is defined", "Pending", identity=ident, kill=stale, retry_after=60.0, **base)]
    side: list = []

    def launch_on(r: ObservedRental, note: str) -> list:
        book.held[r.machine] = name
        offer = book.offer(r)
        verify = ({"type": offer.gpu_type, "count": offer.gpu_count, "memory_gb": offer.gpu_memory_gb}
                  if offer is not None and offer.gpu_count else None)
        return side + [Change(name, action, code, f"{why}; {note}", "Running", identity=ident, machine=r.machine,
                              backend=eff.backend, kill=stale, resume_from=resume_from,
                              rental=dict(rental_info(r, offer), verify=verify), **base)]

    # 1. what this run holds, or what was provisioned under its identity
    out = _held(book, name, prev, ident, res, providers, side, stale, base, launch_on)
    if out is not None:
        return out
    # 2. a warm rental nobody holds
    out = _warm(book, res, providers, launch_on)
    if out is not None:
        return out
    # 3. a new rental
    return _new(book, name, entry, prev, ident, res, providers, side, why, stale, base)


def _held(book: PlanBook, name: str, prev: RunStatus | None, ident: str, res, providers: dict, side: list,
          stale: list, base: dict, launch_on: Callable) -> list | None:
    """The rental the run holds, or one provisioned under its identity: waited for while it is
    provisioning, launched on once it runs; one past ``provisionTimeout`` is given back (in ``side``)."""
    held_m = prev.handle.machine if prev is not None and prev.handle is not None and prev.phase not in TERMINAL else None
    prov = (prev.handle.rental or {}) if prev is not None and prev.handle is not None else {}
    mine: list[ObservedRental] = []
    for m in (held_m, f"{prov.get('provider')}/{prov.get('id')}" if prov.get("id") else None):
        r = book.world.rentals.get(m) if m else None
        if r is not None and r not in mine and r.provider in providers:
            mine.append(r)
    mine += sorted((r for r in book.world.rentals.values() if r.identity == ident and r not in mine
                    and r.provider in providers), key=lambda r: -r.n)
    for r in mine:
        offer = book.offer(r)
        if r.state not in LIVE or r.machine in book.released:
            continue
        if offer is not None and not fits(offer, res):
            continue  # the spec changed its resources: the old rental is swept once nobody holds it
        if r.state == "provisioning":
            timeout = book.desired.providers[r.provider].spec.provisionTimeout
            since = r.created_at or book.now
            if book.now - since > timeout:
                side.append(_release(book, r, name, "ProvisionTimeout",
                                     f"{r.name} on {r.provider} still not running after {timeout:g}s; giving it back"))
                continue
            book.held[r.machine] = name
            return side + [Change(name, Action.WAIT, "Provisioning",
                                  f"rental {r.provider}/{r.id} ({r.offer}) is being provisioned since {iso(since)}",
                                  "Provisioning", identity=ident, kill=stale, retry_after=2.0,
                                  rental=rental_info(r, offer), **base)]
        if r.host and r.port and not _lost_on(book, prev, ident, r):
            return launch_on(r, f"on rental {r.machine} ({r.offer})")
    return None


def _lost_on(book: PlanBook, prev: RunStatus | None, ident: str, r: ObservedRental) -> bool:
    """The run's previous attempt was on ``r``, which does not answer: its relaunch goes to another
    machine. A provider may list a dead machine as running for as long as it is paid for, so the
    relaunch of a run lost there would wait on it for ever; the dead one is swept (``sweep``)."""
    m = book.world.machines.get(r.machine)
    return (m is not None and not m.reachable and prev is not None and prev.handle is not None
            and prev.handle.machine == r.machine and prev.handle.identity not in (None, ident))


def _warm(book: PlanBook, res, providers: dict, launch_on: Callable) -> list | None:
    """The cheapest warm rental nobody holds whose offer fits, or None."""
    warm = []
    for r in book.world.rentals.values():
        offer = book.offer(r)
        if (r.state == "running" and r.provider in providers and r.machine not in book.held
                and r.machine not in book.released and not book.busy(r.machine) and offer is not None
                and fits(offer, res) and not book.is_bad(r.provider, r.offer) and r.host and r.port
                and book.world.machines.get(r.machine) is not None and book.world.machines[r.machine].reachable):
            warm.append((offer_key(r.provider, offer), r.machine, r))
    if warm:
        warm.sort()
        r = warm[0][2]
        out = launch_on(r, f"on warm rental {r.machine} ({r.offer}, kept up after its last run)")
        out[-1].considered = [f"{r.machine}: chosen (warm rental, {r.offer} at {r.price_per_hour:g}/h)"] + [
            f"{x.machine}: warm, ranked lower ({x.offer} at {x.price_per_hour:g}/h)" for _, _, x in warm[1:]]
        return out
    return None


def _new(book: PlanBook, name: str, entry, prev: RunStatus | None, ident: str, res, providers: dict, side: list,
         why: str, stale: list, base: dict) -> list:
    """A new rental: the cheapest fitting offer the run's cost, the quotas and the providers' limits
    allow; else the wait, with every offer's reason (after ``side``: the releases placement decided)."""
    cost = cost_so_far(prev, book.now) if prev is not None else 0.0
    max_cost = entry.run.spec.maxCost
    if max_cost is not None and cost >= max_cost:
        return side + [Change(name, Action.WAIT, "CostLimit", f"the run's rentals cost {cost:.2f} of its maxCost "
                              f"{max_cost:g}; no new rental", "Pending", identity=ident, kill=stale,
                              retry_after=300.0, **base)]
    options = sorted((offer_key(pn, o), pn, o) for pn, p in providers.items() for o in p.spec.offers if fits(o, res))
    if not options:
        return side + [Change(name, Action.WAIT, "NoOffer", "no provider offer fits the run's resources", "Pending",
                              identity=ident, kill=stale, retry_after=300.0, **base)]
    blocked = []
    quotas = getattr(book, "quotas", None)
    for _, pn, o in options:
        p = providers[pn]
        over = quotas.exceeded(name, 0, o.price_per_hour) if quotas is not None else None
        if over:
            blocked.append(f"{pn}/{o.id}: {over}")
            continue
        if pn in book.world.provider_errors:
            blocked.append(f"{pn}: inventory unknown ({book.world.provider_errors[pn]})")
            continue
        if book.is_bad(pn, o.id):
            blocked.append(f"{pn}/{o.id}: set aside until {iso(book.bad_offers[(pn, o.id)])} "
                           "(it failed a GPU check or had no capacity)")
            continue
        lim = p.spec.limits
        count, price = book.live(pn)
        if lim.maxMachines is not None and count + 1 > lim.maxMachines:
            blocked.append(f"{pn}: {count} of maxMachines {lim.maxMachines} rented")
            continue
        if lim.maxPricePerHour is not None and price + o.price_per_hour > lim.maxPricePerHour + 1e-9:
            blocked.append(f"{pn}/{o.id}: {price:g}/h rented + {o.price_per_hour:g}/h > maxPricePerHour "
                           f"{lim.maxPricePerHour:g}")
            continue
        spent = book.spend.get(pn, 0.0)
        if lim.budget is not None and spent >= lim.budget:
            blocked.append(f"{pn}: budget {lim.budget:g} reached ({spent:.2f} spent)")
            continue
        n = 1 + max((r.n for r in book.world.rentals.values() if r.identity == ident), default=0)
        rname = rental_name(book.namespace, ident, n)
        book.planned.append((pn, o.price_per_hour))
        considered = blocked + [f"{pn}/{o.id}: chosen (cheapest that fits and is allowed, {o.price_per_hour:g}/h)"]
        considered += [f"{qn}/{q.id}: fits, ranked lower ({q.price_per_hour:g}/h)" for _, qn, q in options
                       if (qn, q.id) != (pn, o.id) and not any(b.startswith(f"{qn}/{q.id}:") or b.startswith(f"{qn}:")
                                                               for b in blocked)]
        return side + [Change(name, Action.PROVISION, "Provision",
                              f"{why}; renting {o.id} from {pn} ({o.price_per_hour:g}/h)",
                              "Provisioning", identity=ident, kill=stale, retry_after=2.0, considered=considered,
                              rental={"provider": pn, "id": None, "name": rname, "offer": o.id,
                                      "price_per_hour": o.price_per_hour}, **base)]
    code = "BudgetReached" if any("budget" in b or "maxPricePerHour" in b for b in blocked) else "RentalLimit"
    if all("inventory unknown" in b for b in blocked):
        code = "ProviderUnavailable"
    elif all("team " in b for b in blocked):
        code = "QuotaExceeded"
    return side + [Change(name, Action.WAIT, code, "no rental: " + "; ".join(blocked), "Pending", identity=ident,
                          kill=stale, retry_after=60.0 if code == "ProviderUnavailable" else 300.0,
                          considered=blocked, **base)]


def _release(book: PlanBook, r: ObservedRental, who: str, code: str, why: str):
    c = Change(who, Action.RELEASE, code, why, None, machine=r.machine, rental=rental_info(r))
    book.released[r.machine] = c
    return c


def _dead_and_replaced(book: PlanBook, r: ObservedRental, final: dict) -> bool:
    """A rental that does not answer, rented for an attempt its run has replaced (lost there, and
    relaunched elsewhere: ``_lost_on``): nothing on it can be collected or resumed, and the
    provider may list it as running for as long as it is paid for."""
    m = book.world.machines.get(r.machine)
    p = parse(r.identity)
    c = final.get(p.name) if p is not None else None
    return m is not None and not m.reachable and c is not None and c.identity not in (None, r.identity)


def _never_ran_on(book: PlanBook, name: str, machine: str) -> bool:
    st = book.previous.get(name)
    return st is None or st.handle is None or st.handle.machine != machine


def _ended_by_name(book: PlanBook, plan, ended: dict[str, float]) -> None:
    """Rentals whose run has ended though it never ran on them (its spec was removed, or it was
    stopped, while the rental was provisioning): the rental's name says whose it is, and the
    reconciler knows that run is over, so the provider's ``idle`` applies from the run's end (this
    pass when this plan ends it), not ``orphanGrace``, which is for rentals nobody can account for."""
    final = {c.name: c for c in plan.changes if c.phase is not None}
    for m, r in book.world.rentals.items():
        p = parse(r.identity) if m not in ended else None
        c = final.get(p.name) if p is not None else None
        if c is None or c.phase not in TERMINAL:
            continue
        st = book.previous.get(p.name)
        if st is not None and st.phase in TERMINAL and st.history:
            ended[m] = parse_iso(st.history[-1].time) or book.now
        else:
            ended[m] = book.now


def sweep(book: PlanBook, plan, warnings: list[str]) -> list:
    """Release what nobody needs: failed, too old, idle too long, or nobody's."""
    out = []
    final = {c.name: c for c in plan.changes if c.phase is not None}
    # A run still provisioning holds its rental; one this plan ends (its spec removed, or
    # stopped) no longer does, and the rental's name still says whose it was (_ended_by_name).
    holding = {m: who for m, who in book.held.items()
               if not (who in final and final[who].phase in TERMINAL and _never_ran_on(book, who, m))}
    for c in plan.changes:
        if c.phase is not None and c.phase not in TERMINAL:
            m = c.machine or (f"{c.rental['provider']}/{c.rental['id']}" if c.rental and c.rental.get("id") else None)
            if m in book.world.rentals:
                holding.setdefault(m, c.name)
    ended: dict[str, float] = {}
    for name, st in book.previous.items():
        m = st.handle.machine if st.handle is not None else None
        if m in book.world.rentals and st.phase in TERMINAL:
            t = parse_iso(st.history[-1].time) if st.history else None
            ended[m] = max(ended.get(m, 0.0), t or 0.0)
    current = {c.identity: c for c in plan.changes if c.phase is not None and c.identity}
    _ended_by_name(book, plan, ended)
    for m, r in sorted(book.world.rentals.items()):
        if (m in book.released or r.state in ("terminating", "terminated")
                or r.provider in book.desired.invalid_providers):
            continue  # an invalid provider spec protects its rentals until it is fixed
        spec = book.desired.providers.get(r.provider)
        who = holding.get(m) or (parse(r.identity).name if parse(r.identity) else r.name)
        age = book.now - r.created_at if r.created_at else 0.0
        if r.state == "failed":
            out.append(_release(book, r, who, "RentalFailed", f"{m} failed at the provider"
                                + (f" ({r.message})" if r.message else "") + "; giving it back"))
            continue
        if spec is not None and spec.spec.maxDuration is not None and age > spec.spec.maxDuration:
            out.append(_release(book, r, who, "MaxDuration", f"{m} is {age:.0f}s old, past the provider's maxDuration "
                                f"{spec.spec.maxDuration:g}s; giving it back"))
            continue
        if m in holding or book.busy(m):
            continue
        c = current.get(r.identity)
        if c is not None and c.phase not in TERMINAL:
            continue  # provisioned for a run that still wants it (adopted by its placement)
        if _dead_and_replaced(book, r, final):
            out.append(_release(book, r, who, "Lost", f"{m} does not answer and {r.identity}, the attempt it was "
                                "rented for, has been replaced; giving it back"))
            continue
        if spec is None:
            # Its provider's file is gone: nothing says how long to keep it, so it goes now.
            out.append(_release(book, r, who, "ProviderRemoved", f"{m}: provider {r.provider} is no longer "
                                "defined; giving it back"))
            continue
        if m in ended:
            until = ended[m] + spec.spec.idle
            if book.now >= until:
                out.append(_release(book, r, who, "Idle", f"{m} idle since {iso(ended[m])} "
                                    f"(idle {spec.spec.idle:g}s); giving it back"))
            continue
        until = (r.created_at or book.now) + spec.spec.orphanGrace
        plan.orphans[m] = until
        if book.now >= until:
            out.append(_release(book, r, who, "Orphan", f"{m} ({r.name}) is named as this repository's but no "
                                f"run claims it; giving it back"))
        else:
            warnings.append(f"rental {m} ({r.name}) is named as this repository's but no run claims it; it is "
                            f"given back at {iso(until)} unless a run does")
    return out
