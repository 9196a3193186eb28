"""The adapter contract: list offers, provision by name, list the inventory, terminate.

Every adapter call is idempotent where the provider allows it: terminating a rental that is gone
succeeds; provisioning is guarded by the caller, which always lists the inventory first and never
asks twice for a name it can see. A rental carries the name it was provisioned under, which is
how the reconciler tells its own machines from everyone else's (``offers.parse_rental_name``).

Errors follow ``errors.py``: a refused credential or a malformed request is a ``PermanentError``;
a timeout, a 429 or a 5xx is a ``TemporaryError`` (the pass moves on; the next one retries).
"""

from __future__ import annotations

import importlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Protocol

from reconciler.core.errors import PermanentError, TemporaryError
from reconciler.spec.models.provider import Offer, Provider

# provisioning: asked for, not usable yet. running: has an SSH endpoint (sshd may still be starting).
# failed: the provider gave up on it. terminating / terminated: on its way out, or gone.
RentalState = Literal["provisioning", "running", "failed", "terminating", "terminated"]

log = logging.getLogger("reconciler.providers")
# A provider's id for a rental goes into API paths (``/workloads/{id}``), machine names
# (``provider/id``), status files and logs. Every provider's ids fit this (UUIDs, hex, short
# slugs); one that does not (a slash, a "..", a space, a control character, a novel) is refused
# where the reply is read, so it can reach none of those.
RENTAL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass
class Rental:
    id: str
    name: str
    state: RentalState
    host: str | None = None
    port: int | None = None
    user: str | None = None
    price_per_hour: float | None = None
    created_at: float | None = None  # unix time
    offer: str | None = None  # the catalog offer id it was provisioned from, when known
    message: str = ""
    workspace_root: str | None = None  # where workspaces go, when the provider decides it
    host_key: str | None = None  # when the provider itself vouches for it (the local provider does)

    @property
    def endpoint(self) -> str | None:
        return f"{self.host}:{self.port}" if self.host and self.port else None


@dataclass
class AdapterContext:
    """What an adapter may use from the reconciler: secrets by name, a state folder, the clock."""

    secret_source: Callable[[str], str | None] = os.environ.get
    state_dir: Path = Path(".reconciler")
    repo: Path = Path(".")


class Adapter(Protocol):
    provider: Provider
    calls: int  # API calls made so far (benchmarks and tests read it)

    def offers(self) -> list[Offer]: ...

    # Adapters of providers with a market also have ``live_offers() -> list[LiveOffer]``: what the
    # provider sells now, parsed here at the trust boundary (``live_offer`` below). Local and
    # command providers have none: their catalog is all there is.

    def provision(self, name: str, offer: Offer) -> Rental: ...

    def inventory(self) -> list[Rental]: ...

    def terminate(self, rental_id: str) -> None: ...


ADAPTERS = {"local": "local", "targon": "targon", "lambda": "lambdacloud", "runpod": "runpod", "vastai": "vastai",
            "command": "command"}


def adapter_for(provider: Provider, ctx: AdapterContext) -> Adapter:
    module = ADAPTERS.get(provider.spec.type)
    if module is None:
        raise PermanentError(f"provider {provider.metadata.name}: no adapter for type {provider.spec.type!r}")
    mod = importlib.import_module(f"{__package__}.{module}")
    return mod.make(provider, ctx)


def credential(provider: Provider, ctx: AdapterContext) -> str:
    name = provider.spec.credentials
    if not name:
        raise PermanentError(f"provider {provider.metadata.name}: spec.credentials (the API key's secret name) "
                             "is not set")
    value = ctx.secret_source(name)
    if not value:
        raise PermanentError(f"provider {provider.metadata.name}: secret {name} is not set on the reconciler host")
    return value


def public_key(provider: Provider, ctx: AdapterContext) -> str:
    """The public half of the provider's login key (its identity_file's .pub)."""
    path = provider.spec.ssh.identity_file
    if not path:
        raise PermanentError(f"provider {provider.metadata.name}: ssh.identity_file is not set")
    pub = Path(os.path.expanduser(path) + ".pub")
    try:
        return " ".join(pub.read_text().split()[:2])
    except OSError as e:
        raise PermanentError(f"provider {provider.metadata.name}: cannot read {pub}: {e.strerror}") from None


def bad_rental_id(value) -> str | None:
    """Why ``value`` cannot be a rental id, or None when it can."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return f"the id is a {type(value).__name__}, not a string"
    text = str(value)
    if not RENTAL_ID.match(text):
        shown = text[:40].encode("unicode_escape").decode("ascii")
        return f"the id {shown!r}{'…' if len(text) > 40 else ''} is not 1-128 letters, digits, '.', '_' or '-'"
    return None


def rental_id(provider: str, value, what: str) -> str:
    """``value`` as a rental id, or a ``PermanentError`` naming ``what`` (the call) and why."""
    why = bad_rental_id(value)
    if why is not None:
        raise PermanentError(f"provider {provider}: {what}: {why}")
    return str(value)


def valid_rentals(provider: str, rentals: list["Rental"], dropped: list[str] | None = None) -> list["Rental"]:
    """The rentals whose ids are usable; each one left out is logged with the reason (and added
    to ``dropped`` when given)."""
    out = []
    for r in rentals:
        why = bad_rental_id(r.id)
        if why is None:
            out.append(r)
        else:
            drop(provider, why, dropped)
    return out


def drop(provider: str, why: str, dropped: list[str] | None = None) -> None:
    reason = f"provider {provider}: a rental in the inventory is ignored: {why}"
    log.warning(reason)
    if dropped is not None:
        dropped.append(reason)


class OfferUnavailable(TemporaryError):
    """The provider has no capacity for this offer now (Lambda's 400
    ``instance-operations/launch/insufficient-capacity``): not the spec's fault, and not the
    provider's either; another offer (or the same one later) may do."""

    def __init__(self, message: str, offer: str, retry_after: float = 600.0):
        super().__init__(message, retry_after=retry_after)
        self.offer = offer


def parse_time(value) -> float | None:
    """A provider's ISO 8601 time as unix time; None when absent or a zero value (Targon answers a
    create with ``created_at: "0001-01-01T00:00:00Z"``). Fractions past microseconds (Go's
    nanoseconds) are cut, which ``fromisoformat`` on Python 3.10 would refuse."""
    from datetime import datetime, timezone

    if not isinstance(value, str) or not value:
        return None
    text = value.strip().replace("Z", "+00:00").replace("z", "+00:00")
    m = re.match(r"^(.*?\d\d:\d\d:\d\d)(\.\d+)?(.*)$", text)
    if m is not None and m.group(2):
        text = m.group(1) + m.group(2)[:7] + m.group(3)
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.timestamp() if t.year >= 2000 else None


def number(value, low: float, high: float) -> float | None:
    """A number from a provider's reply when it is one and within [low, high]; else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    v = float(value)
    return v if low <= v <= high and v == v else None


_TEXT = re.compile(r"^[\x20-\x7e]{1,128}$")


def text(value, limit: int = 128) -> str | None:
    """A short printable ASCII string from a provider's reply; None for anything else (a control
    character, a terminal escape, a novel)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or len(value) > limit or not _TEXT.match(value):
        return None
    return value


def live_offer(provider: str, resource, gpu_type, gpu_count, price, available: bool, spot: bool = False,
               gpu_memory_gb=None, cpu_count=None, memory_gb=None, region=None):
    """A LiveOffer from the raw values of a reply, each checked: a resource name and a price are
    needed, counts and sizes must be in range (the same bounds as a catalog entry), texts short and
    printable. A value out of range is dropped (None), a missing name or price drops the offer
    (None, logged), so one strange entry never stops a listing."""
    from reconciler.spec.offers import LiveOffer

    res, cost, gpus = text(resource), number(price, 0, 100000), number(gpu_count, 0, 64)
    if res is None or cost is None or gpus is None or gpus != int(gpus):
        log.info("provider %s: a live offer is ignored (resource, price or GPU count missing or out of range)",
                 provider)
        return None
    cpus = number(cpu_count, 1, 4096)
    return LiveOffer(resource=res, gpu_type=text(gpu_type, 64) if gpus else None, gpu_count=int(gpus),
                     price_per_hour=round(cost, 6), available=bool(available), spot=bool(spot),
                     gpu_memory_gb=number(gpu_memory_gb, 0.001, 1024), cpu_count=int(cpus) if cpus else None,
                     memory_gb=number(memory_gb, 0.001, 65536), region=text(region, 64))


def capped(offers: list) -> list:
    """At most MAX_LIVE_OFFERS, the cheapest: a provider answering with millions cannot flood a pass."""
    from reconciler.spec.offers import MAX_LIVE_OFFERS

    offers = [o for o in offers if o is not None]
    if len(offers) > MAX_LIVE_OFFERS:
        offers = sorted(offers, key=lambda o: o.price_per_hour)[:MAX_LIVE_OFFERS]
    return offers


_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*$")


def ssh_endpoint(host, port) -> tuple[str, int] | None:
    """(host, port) from a provider's reply when the host is an IP address or a DNS name and the
    port a TCP port; None otherwise: it goes into an ssh command line and known_hosts, so nothing
    else (an option such as ``-oProxyCommand=``, a space, a newline) may pass."""
    import ipaddress

    if isinstance(port, str) and port.isdigit() and len(port) <= 5:
        port = int(port)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535 or not isinstance(host, str):
        return None
    try:
        return str(ipaddress.ip_address(host)), port
    except ValueError:
        pass
    return (host.lower(), port) if _HOSTNAME.match(host) and not host.replace(".", "").isdigit() else None


def offer_of(provider: Provider, resource, region=None) -> Offer | None:
    """This pass's offer (the catalog merged with the live offers) a rental of ``resource`` in
    ``region`` was rented from, so the planner knows its GPUs, fit and price."""
    for o in provider.spec.offers:
        if resource and offer_resource(o) == resource and (o.region is None or region is None or o.region == region):
            return o
    return None


def offer_resource(offer: Offer) -> str:
    return offer.resource or offer.id


__all__ = ["Adapter", "AdapterContext", "OfferUnavailable", "RENTAL_ID", "Rental", "RentalState", "adapter_for",
           "bad_rental_id", "capped", "credential", "drop", "live_offer", "number", "parse_time", "public_key",
           "ssh_endpoint",
           "offer_of", "offer_resource", "rental_id", "text", "valid_rentals"]
