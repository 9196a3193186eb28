"""Offers and rental names: which catalog entries fit a run, which one it gets, and how a rental
is named so that it can be found again. Pure (the planner and validation both use it).

A rental is named ``rc-<repository id>--<run identity>-x<n>``: the repository id keeps two
repositories' rentals apart on one account, the run identity lets a reconciler that died between
asking for a machine and recording it find the machine by name and adopt it, and ``n`` counts the
rentals one identity needed (a machine that failed its GPU check is replaced by the next). Only a
name of this form is ever reaped: a machine someone rented by hand never is.

That name is the reconciler's own (status files, plans, logs). What a provider is sent is
``provider_name``: ``rc-<namespace hash>-<name hash>``, 30 characters of ``[a-z0-9-]``, because the
strictest provider allows little (Targon workload names: at most 32 characters of lowercase
letters, digits and hyphens, per the Targon Hub API clients summarised in
shared/notes/provider-apis.md, source T4; Lambda instance names: at most 64, per the Lambda Cloud
OpenAPI 1.10.0 ``InstanceLaunchRequest.name maxLength 64``). The hash is stable, so the provider
name of a rental can always be computed again from the reconciler's name; the way back (provider
name to reconciler name) is kept by the adapters (provider metadata where there is some, and a
state file), and the namespace hash alone still says whose machine it is when both are lost.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass

from .models.common import Resources
from .models.provider import Offer, Provider

PREFIX = "rc-"
# A namespace has no double hyphen and neither starts nor ends with one (core/config.py checks it
# where it is configured), so the first "--" of a name ends it: "team" can never read a rental of
# "team--b" or "team-" as its own. A run identity starts with a letter or a digit.
NAMESPACE = r"[a-z0-9]+(?:-[a-z0-9]+)*"
_NAME = re.compile(rf"^rc-(?P<ns>{NAMESPACE})--(?P<identity>[a-z0-9][a-z0-9-]*-g\d+-a\d+)-x(?P<n>\d+)\Z")


def rental_name(namespace: str, identity: str, n: int = 1) -> str:
    # The double dash ends the namespace: a run identity never starts with one.
    return f"{PREFIX}{namespace}--{identity}-x{n}"


PROVIDER_NAME_MAX = 32  # Targon's limit, the smallest of the supported providers (see above)
_NS_HASH, _NAME_HASH = 8, 18
_PROVIDER_NAME = re.compile(rf"^rc-(?P<ns>[a-z2-7]{{{_NS_HASH}}})-(?P<h>[a-z2-7]{{{_NAME_HASH}}})$")


def _digest(text: str, length: int) -> str:
    # base32 keeps to [a-z2-7] once lowercased: every provider's charset holds it
    return base64.b32encode(hashlib.sha256(text.encode()).digest()).decode().lower()[:length]


def namespace_hash(namespace: str) -> str:
    return _digest("ns:" + namespace, _NS_HASH)


def provider_name(name: str) -> str:
    """The name a provider is sent for the reconciler's rental name ``name``: stable, 30 characters
    of [a-z0-9-], the namespace's hash first (whose machine it is) and then the whole name's (90
    bits: two rentals never share one)."""
    parsed = parse_rental_name(name)
    ns = parsed.namespace if parsed is not None else ""
    return f"{PREFIX}{namespace_hash(ns)}-{_digest(name, _NAME_HASH)}"


def split_provider_name(name: str) -> tuple[str, str] | None:
    """(namespace hash, name hash) of a name ``provider_name`` made; None for any other name."""
    m = _PROVIDER_NAME.match(name or "")
    return (m.group("ns"), m.group("h")) if m else None


def lost_rental_name(namespace: str, pname: str) -> str:
    """A reconciler name for a rental whose provider name says it is ``namespace``'s but whose full
    name is known nowhere any more: an identity no run has, so the orphan sweep gives it back."""
    h = (split_provider_name(pname) or ("", pname))[1]
    return rental_name(namespace, f"lost-{h}-g0-a0", 0)


@dataclass(frozen=True)
class RentalName:
    namespace: str
    identity: str
    n: int


def parse_rental_name(name: str, namespace: str | None = None) -> RentalName | None:
    """The parts of a rental name; None for any other name, and, with ``namespace``, for a name
    that is not exactly that namespace's (a prefix of another namespace never matches)."""
    m = _NAME.match(name or "")
    if m is None:
        return None
    if namespace is not None and m.group("ns") != namespace:
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
