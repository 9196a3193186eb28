"""Targon: rentals are workloads of type RENTAL with a DIRECT TCP port for SSH.

The calls (Targon's v2 API, ``Authorization: Bearer <key>``):
- ``GET /ssh-keys`` / ``POST /ssh-keys {name, ssh_key}``: the reconciler's public key, registered
  once and referred to by its uid;
- ``POST /workloads {name, image, resource_name, type: RENTAL, project_id, ports, ssh_keys}`` then
  ``POST /workloads/{uid}/deploy``: a rental (states registered → provisioning → running);
- ``GET /workloads?type=RENTAL`` (paged by ``next_cursor``): the inventory, one listing per pass;
- ``GET /workloads/{uid}/state``: the SSH endpoint, ``urls[port == P].url`` = ``http://IP:PORT``,
  asked once per rental when it first runs (then cached: endpoints do not move while it runs);
- ``DELETE /workloads/{uid}``: give it back (404: gone already).

Targon has no labels: a rental is this repository's by its name. The image must run sshd on
``ssh.port`` and accept the registered key.
"""

from __future__ import annotations

from urllib.parse import urlparse

from reconciler.core.errors import PermanentError, TemporaryError
from reconciler.spec.models import Offer, Provider
from reconciler.core.runstatus import parse_iso
from .base import AdapterContext, Rental, bad_rental_id, drop, offer_resource, public_key, rental_id
from .http import HttpAdapter

BASE = "https://api.targon.com/tha/v2"
STATES = {"registered": "provisioning", "pending": "provisioning", "provisioning": "provisioning",
          "deploying": "provisioning", "running": "running", "error": "failed", "failed": "failed",
          "suspended": "failed", "deleting": "terminating", "deleted": "terminated", "terminated": "terminated"}


def make(provider: Provider, ctx: AdapterContext) -> "TargonAdapter":
    return TargonAdapter(provider, ctx)


class TargonAdapter(HttpAdapter):
    api = "targon"
    default_base = BASE

    def __init__(self, provider: Provider, ctx: AdapterContext):
        super().__init__(provider, ctx)
        self._key_uid: str | None = None
        self._endpoints: dict[str, tuple[str, int]] = {}  # uid → (host, port), once running
        self._offers = {offer_resource(o): o for o in provider.spec.offers}

    def _ssh_key(self) -> str:
        if self._key_uid is not None:
            return self._key_uid
        mine = public_key(self.provider, self.ctx)
        for item in self._pages("/ssh-keys"):
            if " ".join(str(item.get("public_key_raw", "")).split()[:2]) == mine:
                self._key_uid = item["uid"]
                return self._key_uid
        made = self.client.request("POST", "/ssh-keys", {"name": f"reconciler-{self.provider.metadata.name}",
                                                         "ssh_key": mine})
        self._key_uid = (made or {}).get("uid")
        if not self._key_uid:
            raise TemporaryError(f"provider {self.provider.metadata.name}: the new SSH key has no uid")
        return self._key_uid

    def provision(self, name: str, offer: Offer) -> Rental:
        self._auth()
        spec = self.provider.spec
        if not spec.ssh.image:
            raise PermanentError(f"provider {self.provider.metadata.name}: ssh.image is needed (a Targon rental "
                                 "boots an image that runs sshd)")
        body = {"name": name, "image": spec.ssh.image, "resource_name": offer_resource(offer), "type": "RENTAL",
                "ports": [{"port": spec.ssh.port, "protocol": "TCP", "routing": "DIRECT"}],
                "ssh_keys": [self._ssh_key()]}
        if spec.project:
            body["project_id"] = spec.project
        made = self.client.request("POST", "/workloads", body)
        uid = (made or {}).get("uid")
        if not uid:
            raise TemporaryError(f"provider {self.provider.metadata.name}: the new workload has no uid")
        uid = rental_id(self.provider.metadata.name, uid, "POST /workloads")  # it goes into the next URL
        deployed = self.client.request("POST", f"/workloads/{uid}/deploy", None) or {}
        price = deployed.get("cost_per_hour")
        return Rental(id=uid, name=name, state="provisioning", offer=offer.id,
                      price_per_hour=float(price) if isinstance(price, (int, float)) else offer.price_per_hour)

    def inventory(self) -> list[Rental]:
        self._auth()
        query = {"type": "RENTAL", "project_id": self.provider.spec.project}
        out = []
        seen = set()
        # Endpoint look-ups are spread over passes (at most a burst's worth each): after a restart
        # with many rentals, a pass must not wait out the rate limit for all of them. A rental
        # whose endpoint is not known yet is reported running without one (unreachable this pass).
        lookups = self.provider.spec.rateLimit.burst
        self.dropped = []
        for item in self._pages("/workloads", query):
            uid, name = item.get("uid"), item.get("name") or ""
            if not uid:
                continue
            why = bad_rental_id(uid)
            if why is not None:  # never asked for its endpoint: the id would be in the URL
                drop(self.provider.metadata.name, why, self.dropped)
                continue
            seen.add(uid)
            state_doc = item.get("state") if isinstance(item.get("state"), dict) else {}
            status = str(state_doc.get("status") or item.get("status") or "").lower()
            state = STATES.get(status, "provisioning")
            host = port = None
            if state == "running":
                if uid not in self._endpoints and lookups <= 0:
                    host = port = None
                else:
                    lookups -= uid not in self._endpoints
                    host, port = self._endpoint(uid)
                    if host is None:
                        state = "provisioning"  # running, but no SSH endpoint published yet
            resource = item.get("resource_name") or (item.get("resource") or {}).get("name")
            offer = self._offers.get(resource)
            price = item.get("cost_per_hour")
            out.append(Rental(id=uid, name=name, state=state, host=host, port=port, user=self.provider.spec.ssh.user,
                              price_per_hour=float(price) if isinstance(price, (int, float)) else (
                                  offer.price_per_hour if offer else None),
                              created_at=parse_iso(item.get("created_at")) if isinstance(item.get("created_at"), str) else None,
                              offer=offer.id if offer else None, message=str(state_doc.get("message") or "")))
        for uid in [u for u in self._endpoints if u not in seen]:
            del self._endpoints[uid]
        return out

    def _endpoint(self, uid: str) -> tuple[str | None, int | None]:
        if uid in self._endpoints:
            return self._endpoints[uid]
        doc = self.client.request("GET", f"/workloads/{uid}/state", ok_missing=True) or {}
        want = self.provider.spec.ssh.port
        for u in doc.get("urls") or []:
            if isinstance(u, dict) and u.get("port") == want and u.get("url"):
                parsed = urlparse(u["url"] if "://" in u["url"] else "tcp://" + u["url"])
                if parsed.hostname and parsed.port:
                    self._endpoints[uid] = (parsed.hostname, parsed.port)
                    return self._endpoints[uid]
        return None, None

    def terminate(self, rental_id_: str) -> None:
        self._auth()
        uid = rental_id(self.provider.metadata.name, rental_id_, "terminate")  # a status file's, maybe edited
        self.client.request("DELETE", f"/workloads/{uid}", ok_missing=True)
        self._endpoints.pop(uid, None)

    def _pages(self, path: str, query: dict | None = None):
        cursor = None
        for _ in range(1000):  # a runaway cursor must not spin for ever
            doc = self.client.request("GET", path, query=dict(query or {}, limit=100, cursor=cursor)) or {}
            for item in doc.get("items") or []:
                if isinstance(item, dict):
                    yield item
            cursor = doc.get("next_cursor")
            if not cursor:
                return
