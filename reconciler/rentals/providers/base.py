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

    def provision(self, name: str, offer: Offer) -> Rental: ...

    def inventory(self) -> list[Rental]: ...

    def terminate(self, rental_id: str) -> None: ...


ADAPTERS = {"local": "local", "targon": "targon", "lambda": "lambdacloud", "command": "command"}


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


def offer_resource(offer: Offer) -> str:
    return offer.resource or offer.id


__all__ = ["Adapter", "AdapterContext", "OfferUnavailable", "RENTAL_ID", "Rental", "RentalState", "adapter_for",
           "bad_rental_id", "credential", "drop", "parse_time", "public_key", "offer_resource", "rental_id", "valid_rentals"]
