"""Lambda Cloud: on-demand GPU instances.

The calls (``https://cloud.lambda.ai/api/v1``, the production server of the Lambda Cloud OpenAPI
1.10.0, which calls cloud.lambdalabs.com deprecated; ``Authorization: Bearer <key>``):
- ``GET /ssh-keys`` / ``POST /ssh-keys {name, public_key}``: the reconciler's key, registered once;
- ``GET /instance-types``: ``regions_with_capacity_available`` per type, where an offer without a
  region is launched (and whether its region has capacity now); also the live offers, one per
  type and region with capacity, priced by ``price_cents_per_hour`` and sized by ``specs{vcpus,
  memory_gib, gpus}`` and ``gpu_description`` ("H100 (80 GB SXM5)");
- ``POST /instance-operations/launch {region_name, instance_type_name, ssh_key_names, quantity: 1,
  name, tags}`` → ``{data: {instance_ids: [...]}}`` (region_name, instance_type_name and exactly one
  ssh key name are required; name ≤ 64 characters);
- ``GET /instances`` → ``{data: [{id, name, ip, status, instance_type: {name}, tags, ...}]}``: the
  whole inventory with every endpoint in one call (status booting, active, unhealthy,
  terminating, terminated, preempted);
- ``POST /instance-operations/terminate {instance_ids}`` (404 ``global/object-does-not-exist``: gone).

Instances carry no creation time (the OpenAPI's Instance has none): the adapter records when it
asked for or first saw each one (names.py), so provisionTimeout, maxDuration and orphanGrace count.
Names: ``offers.provider_name`` (a hash, within the 64), with the reconciler's name in the tag
``rc-rental`` (tag keys ``^[a-z][a-z0-9-:]+$`` ≤ 55, values ≤ 128: RequestedTagEntry).

Rate: "about 1 request per second", launches 1 per 12 s (OpenAPI 1.10.0 description; older docs
said 1 per 10 s), answered with a 429 without Retry-After: 1 request/s is the default when the
Provider sets no rateLimit, and launches are paced apart here.
"""

from __future__ import annotations

import re
import threading
import time

from reconciler.core.errors import TemporaryError
from reconciler.spec.models.provider import Offer, Provider
from reconciler.spec.offers import provider_name
from .base import AdapterContext, OfferUnavailable, Rental, capped, live_offer, offer_of, offer_resource, \
    parse_time, public_key, rental_id, valid_rentals
from .http import AnswerLost, ApiError, HttpAdapter

BASE = "https://cloud.lambda.ai/api/v1"
# InstanceStatus in the OpenAPI 1.10.0. A preempted instance is lost: it is failed, so the
# reconciler gives it back and replaces it. Unhealthy could be restarted; giving it back is safer.
STATES = {"booting": "provisioning", "active": "running", "unhealthy": "failed", "terminating": "terminating",
          "terminated": "terminated", "preempted": "failed"}
LAUNCH_INTERVAL = 12.0  # seconds between launches (OpenAPI 1.10.0: 1 per 12 s)
NO_CAPACITY = "instance-operations/launch/insufficient-capacity"
TAG = "rc-rental"
_LAUNCHES: dict[tuple, float] = {}  # (base, provider) → when the last launch was sent, per process
_LAUNCH_LOCK = threading.Lock()


def make(provider: Provider, ctx: AdapterContext) -> "LambdaAdapter":
    return LambdaAdapter(provider, ctx)


class LambdaAdapter(HttpAdapter):
    api = "lambda"
    default_base = BASE
    default_rate = (1.0, 1)

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
        name = f"reconciler-{self.provider.metadata.name}"[:64]  # SSH key names: 1-64 characters
        self.client.request("POST", "/ssh-keys", {"name": name, "public_key": mine})
        self._key_name = name
        return name

    def _region(self, offer: Offer) -> str:
        """The offer's region when it has capacity there, else any region with capacity for its type."""
        doc = self.client.request("GET", "/instance-types") or {}
        entry = (doc.get("data") or {}).get(offer_resource(offer)) or {}
        regions = [r.get("name") for r in entry.get("regions_with_capacity_available") or [] if isinstance(r, dict)]
        regions = [r for r in regions if r]
        if offer.region and offer.region in regions:
            return offer.region
        if not offer.region and regions:
            return sorted(regions)[0]
        where = f"in {offer.region}" if offer.region else "in any region"
        raise OfferUnavailable(f"provider {self.provider.metadata.name}: no capacity for {offer_resource(offer)} "
                               f"{where} now", offer.id)

    def _pace(self) -> None:
        key = (self.client.base, self.provider.metadata.name)
        with _LAUNCH_LOCK:
            wait = _LAUNCHES.get(key, 0.0) + LAUNCH_INTERVAL - time.monotonic()
            if wait > 0:
                raise TemporaryError(f"provider {self.provider.metadata.name}: one launch per {LAUNCH_INTERVAL:g}s "
                                     "(Lambda's launch limit); the next pass launches", retry_after=wait)
            _LAUNCHES[key] = time.monotonic()

    def provision(self, name: str, offer: Offer) -> Rental:
        self._auth()
        tried = provider_name(name) in self.book.names  # asked for before: its answer may have been lost
        pname = self.book.remember(name)  # before the launch: a lost answer is still recognised
        found = self._find(pname) if tried else None
        if found is not None:
            return self._adopt(found, name, offer)
        body = {"region_name": self._region(offer), "instance_type_name": offer_resource(offer),
                "ssh_key_names": [self._ssh_key()], "quantity": 1, "name": pname, "file_system_names": []}
        if len(name) <= 128:  # RequestedTagEntry.value maxLength 128
            body["tags"] = [{"key": TAG, "value": name}]
        self._pace()
        try:
            doc = self.client.request("POST", "/instance-operations/launch", body) or {}
        except AnswerLost as e:
            found = self._find(pname)
            if found is None:
                raise TemporaryError(f"{e}; no instance named {pname} yet: the next pass looks again") from None
            return self._adopt(found, name, offer)
        except ApiError as e:
            if e.code == NO_CAPACITY:  # a 400, but about now, not about the request
                raise OfferUnavailable(str(e), offer.id) from None
            raise
        ids = ((doc.get("data") or {}).get("instance_ids")) or []
        if not ids:
            raise TemporaryError(f"provider {self.provider.metadata.name}: launch returned no instance id")
        iid = rental_id(self.provider.metadata.name, ids[0], "launch")
        return Rental(id=iid, name=name, state="provisioning", offer=offer.id, price_per_hour=offer.price_per_hour,
                      created_at=self.book.first_seen(iid))

    def _find(self, pname: str) -> dict | None:
        doc = self.client.request("GET", "/instances") or {}
        for item in doc.get("data") or []:
            if isinstance(item, dict) and item.get("name") == pname and item.get("id") and \
                    STATES.get(str(item.get("status") or "").lower()) not in ("terminating", "terminated"):
                return item
        return None

    def _adopt(self, item: dict, name: str, offer: Offer) -> Rental:
        iid = rental_id(self.provider.metadata.name, item["id"], "GET /instances")
        return Rental(id=iid, name=name, state=STATES.get(str(item.get("status") or "").lower(), "provisioning"),
                      offer=offer.id, price_per_hour=offer.price_per_hour, created_at=self.book.first_seen(iid))

    def inventory(self) -> list[Rental]:
        self._auth()
        doc = self.client.request("GET", "/instances") or {}
        out = []
        for item in doc.get("data") or []:
            if not isinstance(item, dict) or not item.get("id"):
                continue
            out.append(self._rental(item))
        self.dropped = []
        out = valid_rentals(self.provider.metadata.name, out, self.dropped)
        self.book.forget_except({r.id for r in out})
        return out

    def _rental(self, item: dict) -> Rental:
        state = STATES.get(str(item.get("status") or "").lower(), "provisioning")
        ip = item.get("ip")
        if state == "running" and not ip:
            state = "provisioning"
        pname = str(item.get("name") or "")
        tags = {t.get("key"): t.get("value") for t in item.get("tags") or [] if isinstance(t, dict)}
        name = self.book.resolve(pname, tags.get(TAG)) or pname
        itype = (item.get("instance_type") or {}).get("name")
        region = (item.get("region") or {}).get("name") if isinstance(item.get("region"), dict) else None
        offer = offer_of(self.provider, itype, region) or self._offers.get(itype)
        cents = (item.get("instance_type") or {}).get("price_cents_per_hour")
        price = cents / 100.0 if isinstance(cents, (int, float)) else (offer.price_per_hour if offer else None)
        created = parse_time(item.get("created_at")) or (
            self.book.first_seen(str(item["id"])) if name != pname or pname.startswith("rc-") else None)
        return Rental(id=str(item["id"]), name=name, state=state, host=ip if state == "running" else None,
                      port=self.provider.spec.ssh.port if state == "running" else None,
                      user=self.provider.spec.ssh.user, price_per_hour=price, created_at=created,
                      offer=offer.id if offer else None)

    def live_offers(self) -> list:
        """One offer per instance type and region with capacity (a type with none anywhere is
        listed once, unavailable): Lambda's own prices, in cents."""
        self._auth()
        doc = self.client.request("GET", "/instance-types") or {}
        data = doc.get("data") if isinstance(doc, dict) else None
        out = []
        for name, entry in (data.items() if isinstance(data, dict) else []):
            itype = entry.get("instance_type") if isinstance(entry, dict) else None
            if not isinstance(itype, dict):
                continue
            specs = itype.get("specs") if isinstance(itype.get("specs"), dict) else {}
            cents = itype.get("price_cents_per_hour")
            desc = str(itype.get("gpu_description") or "")[:128]
            mem = re.search(r"(\d{1,4}) ?GB", desc)
            regions = [r.get("name") for r in entry.get("regions_with_capacity_available") or [] if isinstance(r, dict)]
            for region in regions[:64] or [None]:
                out.append(live_offer(self.provider.metadata.name, name, desc.split(" ")[0] or None,
                                      specs.get("gpus", 0), cents / 100 if isinstance(cents, (int, float)) else None,
                                      region is not None, gpu_memory_gb=int(mem.group(1)) if mem else None,
                                      cpu_count=specs.get("vcpus"), memory_gb=specs.get("memory_gib"), region=region))
        return capped(out)

    def terminate(self, rental_id_: str) -> None:
        self._auth()
        iid = rental_id(self.provider.metadata.name, rental_id_, "terminate")
        self.client.request("POST", "/instance-operations/terminate", {"instance_ids": [iid]}, ok_missing=True,
                            idempotent=True)  # terminating twice ends the same instance: safe to repeat
