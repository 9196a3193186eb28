"""Lambda Cloud: on-demand GPU instances.

The calls (``https://cloud.lambdalabs.com/api/v1``, ``Authorization: Bearer <key>``):
- ``GET /ssh-keys`` / ``POST /ssh-keys {name, public_key}``: the reconciler's key, registered once;
- ``POST /instance-operations/launch {region_name, instance_type_name, ssh_key_names, quantity: 1,
  name}`` → ``{data: {instance_ids: [...]}}``;
- ``GET /instances`` → ``{data: [{id, name, ip, status, instance_type: {name}, ...}]}``: the whole
  inventory with every endpoint in one call (status booting → active; unhealthy, terminating,
  terminated);
- ``POST /instance-operations/terminate {instance_ids}``.

Lambda documents tight limits on launches (about one per 10 to 12 s) and answers 429 without
Retry-After: the shared token bucket and the client's backoff keep to them. Instances are found
again by name.
"""

from __future__ import annotations

from reconciler.core.errors import TemporaryError
from reconciler.spec.models import Offer, Provider
from reconciler.core.runstatus import parse_iso
from .base import AdapterContext, Rental, offer_resource, public_key, rental_id, valid_rentals
from .http import HttpAdapter

BASE = "https://cloud.lambdalabs.com/api/v1"
STATES = {"booting": "provisioning", "active": "running", "unhealthy": "failed", "terminating": "terminating",
          "terminated": "terminated"}


def make(provider: Provider, ctx: AdapterContext) -> "LambdaAdapter":
    return LambdaAdapter(provider, ctx)


class LambdaAdapter(HttpAdapter):
    api = "lambda"
    default_base = BASE

    def __init__(self, provider: Provider, ctx: AdapterContext):
        super().__init__(provider, ctx)
        self._key_name: str | None = None
        self._offers = {offer_resource(o): o for o in provider.spec.offers}

    def _ssh_key(self) -> str:
        if self._key_name is not None:
            return self._key_name
        mine = public_key(self.provider, self.ctx)
        doc = self.client.request("GET", "/ssh-keys") or {}
        for item in doc.get("data") or []:
            if " ".join(str(item.get("public_key", "")).split()[:2]) == mine:
                self._key_name = item["name"]
                return self._key_name
        name = f"reconciler-{self.provider.metadata.name}"
        self.client.request("POST", "/ssh-keys", {"name": name, "public_key": mine})
        self._key_name = name
        return name

    def provision(self, name: str, offer: Offer) -> Rental:
        self._auth()
        body = {"instance_type_name": offer_resource(offer), "ssh_key_names": [self._ssh_key()], "quantity": 1,
                "name": name, "file_system_names": []}
        if offer.region:
            body["region_name"] = offer.region
        doc = self.client.request("POST", "/instance-operations/launch", body) or {}
        ids = ((doc.get("data") or {}).get("instance_ids")) or []
        if not ids:
            raise TemporaryError(f"provider {self.provider.metadata.name}: launch returned no instance id")
        iid = rental_id(self.provider.metadata.name, ids[0], "launch")
        return Rental(id=iid, name=name, state="provisioning", offer=offer.id,
                      price_per_hour=offer.price_per_hour)

    def inventory(self) -> list[Rental]:
        self._auth()
        doc = self.client.request("GET", "/instances") or {}
        out = []
        for item in doc.get("data") or []:
            if not isinstance(item, dict) or not item.get("id"):
                continue
            state = STATES.get(str(item.get("status") or "").lower(), "provisioning")
            ip = item.get("ip")
            if state == "running" and not ip:
                state = "provisioning"
            itype = (item.get("instance_type") or {}).get("name")
            offer = self._offers.get(itype)
            cents = (item.get("instance_type") or {}).get("price_cents_per_hour")
            price = cents / 100.0 if isinstance(cents, (int, float)) else (offer.price_per_hour if offer else None)
            created = item.get("created_at") or item.get("launched_at")
            out.append(Rental(id=str(item["id"]), name=str(item.get("name") or ""), state=state,
                              host=ip if state == "running" else None,
                              port=self.provider.spec.ssh.port if state == "running" else None,
                              user=self.provider.spec.ssh.user, price_per_hour=price,
                              created_at=parse_iso(created) if isinstance(created, str) else None,
                              offer=offer.id if offer else None))
        self.dropped = []
        return valid_rentals(self.provider.metadata.name, out, self.dropped)

    def terminate(self, rental_id_: str) -> None:
        self._auth()
        iid = rental_id(self.provider.metadata.name, rental_id_, "terminate")
        self.client.request("POST", "/instance-operations/terminate", {"instance_ids": [iid]}, ok_missing=True)
