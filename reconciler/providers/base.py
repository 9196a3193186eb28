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
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Protocol

from ..errors import PermanentError
from ..spec.models import Offer, Provider

# provisioning: asked for, not usable yet. running: has an SSH endpoint (sshd may still be starting).
# failed: the provider gave up on it. terminating / terminated: on its way out, or gone.
RentalState = Literal["provisioning", "running", "failed", "terminating", "terminated"]


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


def offer_resource(offer: Offer) -> str:
    return offer.resource or offer.id


__all__ = ["Adapter", "AdapterContext", "Rental", "RentalState", "adapter_for", "credential", "public_key",
           "offer_resource"]
