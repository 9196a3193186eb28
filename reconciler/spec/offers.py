"""Offers and rental names: which catalog entries fit a run, which one it gets, and how a rental
is named so that it can be found again. Pure (the planner and validation both use it).

A rental is named ``rc-<repository id>-<run identity>-x<n>``: the repository id keeps two
repositories' rentals apart on one account, the run identity lets a reconciler that died between
asking for a machine and recording it find the machine by name and adopt it, and ``n`` counts the
rentals one identity needed (a machine that failed its GPU check is replaced by the next). Only a
name of this form is ever reaped: a machine someone rented by hand never is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .models import Offer, Provider, Resources

PREFIX = "rc-"
_NAME = re.compile(r"^rc-(?P<ns>[a-z0-9-]+?)--(?P<identity>[a-z0-9-]+-g\d+-a\d+)-x(?P<n>\d+)$")


def rental_name(namespace: str, identity: str, n: int = 1) -> str:
    # The double dash ends the namespace: a run identity never starts with one.
    return f"{PREFIX}{namespace}--{identity}-x{n}"


@dataclass(frozen=True)
class RentalName:
    namespace: str
    identity: str
    n: int


def parse_rental_name(name: str) -> RentalName | None:
    m = _NAME.match(name or "")
    if m is None:
        return None
    return RentalName(m.group("ns"), m.group("identity"), int(m.group("n")))


def gpu_matches(offered: str | None, wanted: str | None) -> bool:
    if wanted is None:
        return True
    return offered is not None and offered.lower() == wanted.lower()


def fits(offer: Offer, res: Resources) -> bool:
    """Whether a machine of ``offer`` can hold a run needing ``res``. An offer that does not say
    how much memory (or how many CPUs) it has does not fit a run that asks for some."""
    if offer.gpu_count < res.gpu_count:
        return False
    if res.gpu_count and not any(gpu_matches(offer.gpu_type, t) for t in res.wanted_types()):
        return False
    if res.gpu_memory_gb is not None and res.gpu_count and (offer.gpu_memory_gb or 0) < res.gpu_memory_gb:
        return False
    if res.memory_gb is not None and (offer.memory_gb is None or offer.memory_gb < res.memory_gb):
        return False
    if res.cpu_count is not None and (offer.cpu_count is None or offer.cpu_count < res.cpu_count):
        return False
    return True


def fitting_offers(provider: Provider, res: Resources) -> list[Offer]:
    return [o for o in provider.spec.offers if fits(o, res)]


def offer_key(provider: str, offer: Offer) -> tuple:
    """Cheapest first; ties go to fewer GPUs (less waste), then by provider and offer name, so that
    the same repository always plans the same choice."""
    return (offer.price_per_hour, offer.gpu_count, provider, offer.id)


def gpu_summary(offer: Offer) -> str:
    if not offer.gpu_count:
        return "no GPU"
    mem = f" {offer.gpu_memory_gb:g} GB" if offer.gpu_memory_gb else ""
    return f"{offer.gpu_count} x {offer.gpu_type or 'GPU'}{mem}"
