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
from .models.provider import CATALOG_ONLY, Offer, Provider

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


def gpu_tokens(name: str) -> list[str]:
    return [t for t in re.split(r"[\s_\-/()]+", name.lower()) if t]


def gpu_matches(offered: str | None, wanted: str | None) -> bool:
    """Without regard to case, and by words: "H100" is any of "H100 SXM", "H100 PCIe" (providers
    name variants so), "RTX 4090" is "NVIDIA GeForce RTX 4090"; "A10" is never "A100"."""
    if wanted is None:
        return True
    if offered is None:
        return False
    return offered.lower() == wanted.lower() or set(gpu_tokens(wanted)) <= set(gpu_tokens(offered))


def fits(offer: Offer, res: Resources) -> bool:
    """Whether a machine of ``offer`` can hold a run needing ``res``. An offer that does not say
    how much memory (or how many CPUs) it has does not fit a run that asks for some; one without a
    price (a catalog entry whose live price is not known this pass) cannot be ranked, so it fits
    nothing."""
    if offer.price_per_hour is None or not _gpus_fit(offer, res):
        return False
    if res.gpu_memory_gb is not None and res.gpu_count and (offer.gpu_memory_gb or 0) < res.gpu_memory_gb:
        return False
    if res.memory_gb is not None and (offer.memory_gb is None or offer.memory_gb < res.memory_gb):
        return False
    if res.cpu_count is not None and (offer.cpu_count is None or offer.cpu_count < res.cpu_count):
        return False
    return True


def _gpus_fit(offer: Offer, res: Resources) -> bool:
    if offer.gpu_count < res.gpu_count:
        return False
    return not res.gpu_count or any(gpu_matches(offer.gpu_type, t) for t in res.wanted_types())


def fitting_offers(provider: Provider, res: Resources) -> list[Offer]:
    """The catalog's offers that fit; for a provider with live offers, whose market is not known
    here (validation reads no API), a stand-in that fits: what it sells is decided each pass."""
    if provider.spec.type not in CATALOG_ONLY:
        if not provider.spec.offers:
            return [Offer(id="live", price_per_hour=0)]
        return [o for o in provider.spec.offers if _gpus_fit(o, res)]
    return [o for o in provider.spec.offers if fits(o, res)]


def offer_key(provider: str, offer: Offer) -> tuple:
    """Cheapest first; ties go to fewer GPUs (less waste), then by provider and offer name, so that
    the same repository always plans the same choice."""
    price = offer.price_per_hour if offer.price_per_hour is not None else float("inf")
    return (price, offer.gpu_count, provider, offer.id)


def gpu_summary(offer: Offer) -> str:
    if not offer.gpu_count:
        return "no GPU"
    mem = f" {offer.gpu_memory_gb:g} GB" if offer.gpu_memory_gb else ""
    return f"{offer.gpu_count} x {offer.gpu_type or 'GPU'}{mem}"


# ---------------------------------------------------------------------------- live offers
# What a provider sells now (Targon /inventory, Lambda /instance-types, RunPod /v2/catalog/gpus,
# Vast.ai /bundles/), parsed by the adapters at the trust boundary, and how the Provider's catalog
# turns it into the offers a pass may rent.

MAX_LIVE_OFFERS = 2000  # per provider and pass: a listing longer than this is cut (cheapest kept)


@dataclass(frozen=True)
class LiveOffer:
    """One shape a provider rents out now. ``resource`` is what its create call takes (a Targon
    resource_name, a Lambda instance type, a RunPod GPU type id, a Vast.ai ask id)."""

    resource: str
    gpu_type: str | None
    gpu_count: int
    price_per_hour: float
    available: bool
    spot: bool = False
    gpu_memory_gb: float | None = None
    cpu_count: int | None = None
    memory_gb: float | None = None
    region: str | None = None

    @property
    def id(self) -> str:
        return live_offer_id(self.resource, self.region, self.spot, self.gpu_count)

    def as_offer(self, over: dict | None = None) -> Offer:
        """This offer as a catalog entry; ``over``: fields a catalog entry sets, which win."""
        fields = dict(id=self.id, resource=self.resource, gpu_type=self.gpu_type, gpu_count=self.gpu_count,
                      gpu_memory_gb=self.gpu_memory_gb, cpu_count=self.cpu_count, memory_gb=self.memory_gb,
                      region=self.region, price_per_hour=self.price_per_hour, spot=self.spot)
        fields.update(over or {})
        if not fields["gpu_count"]:
            fields["gpu_type"], fields["gpu_memory_gb"] = None, None
        return Offer.model_validate(fields)


def live_offer_id(resource: str, region: str | None, spot: bool, gpu_count: int = 0) -> str:
    """A DNS label for a live offer, stable for the same resource, GPU count, region and kind
    (RunPod sells one GPU type at several counts): a slug that a person recognises, and a short
    hash of the exact text so two resources that slug alike stay apart."""
    kind = "spot" if spot else ""
    raw = f"{resource}|{gpu_count}|{region or ''}|{kind}"
    slug = re.sub(r"[^a-z0-9]+", "-", f"{resource} x{gpu_count} {region or ''} {kind}".lower()).strip("-")
    h = hashlib.sha256(raw.encode()).hexdigest()[:6]
    slug = (slug[:50].rstrip("-") or "offer")
    return f"{slug}-{h}" if slug[0].isalnum() else f"o-{slug}-{h}"


def _entry_matches(entry: Offer, live: LiveOffer) -> bool:
    """A catalog entry selects live offers: by its resource when it names one, else by GPU model
    and count when it names a model, else by its id (older catalogs named the resource by id).
    Its region, spot flag and any size it states must agree too."""
    if entry.spot != live.spot or (entry.region and entry.region != live.region):
        return False
    if entry.resource:
        if live.resource != entry.resource:
            return False
    elif entry.gpu_type:
        if not gpu_matches(live.gpu_type, entry.gpu_type) or live.gpu_count != entry.gpu_count:
            return False
    elif live.resource != entry.id:
        return False
    for want, have in ((entry.cpu_count, live.cpu_count), (entry.memory_gb, live.memory_gb),
                       (entry.gpu_memory_gb, live.gpu_memory_gb)):
        if want is not None and have is not None and have < want * 0.95:
            return False
    return True


def selections(provider: Provider, live: list[LiveOffer]) -> list[tuple[LiveOffer, Offer | None]]:
    """Which live offer each catalog entry rents this pass (entry None: no catalog, the live offer
    under its own id). Without a catalog: every available on-demand live offer (spot is opt-in,
    through a catalog entry with ``spot: true``). With one: per entry, the cheapest available live
    offer it matches; an entry nothing matches is not offered."""
    ready = sorted((x for x in live if x.available), key=lambda x: (x.price_per_hour, x.resource, x.region or ""))
    if not provider.spec.offers:
        seen: set[str] = set()
        out: list[tuple[LiveOffer, Offer | None]] = []
        for x in ready:
            if not x.spot and x.id not in seen:
                seen.add(x.id)
                out.append((x, None))
        return out
    picked = ((next((x for x in ready if _entry_matches(entry, x)), None), entry) for entry in provider.spec.offers)
    return [(x, entry) for x, entry in picked if x is not None]


def effective_offers(provider: Provider, live: list[LiveOffer] | None) -> list[Offer]:
    """The offers a pass may rent from ``provider`` (see ``selections``), each under its catalog
    entry's id and fields, the entry's price overriding the live one when it sets one. ``live``
    None: no live listing (a catalog-only provider, or the listing failed this pass): the
    catalog's priced entries, as written."""
    if live is None:
        return [o for o in provider.spec.offers if o.price_per_hour is not None]
    out = []
    for x, entry in selections(provider, live):
        over = {k: getattr(entry, k) for k in entry.model_fields_set - {"resource", "region"}} if entry else {}
        if entry is not None:
            over["id"] = entry.id
            if entry.price_per_hour is None:
                over.pop("price_per_hour", None)  # the live price
        try:
            out.append(x.as_offer(over))
        except ValueError:  # a combination no catalog entry could state: not offered, the rest are
            continue
    return out
