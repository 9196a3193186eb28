"""Targon: rentals are workloads of type RENTAL with a DIRECT TCP port for SSH.

The calls (Targon's v2 API, ``Authorization: Bearer <key>``; fields as in the official SDK and CLI,
github.com/manifold-inc/targon-sdk ``libs/python/src/targon/client/workload.py`` and
``cli/src/client/types/workload.rs``):
- ``GET /ssh-keys`` / ``POST /ssh-keys {name, ssh_key}``: the reconciler's public key, registered
  once and attached by uid (the account's record of it);
- ``POST /workloads {name, image, resource_name, type: RENTAL, project_id, ports, ssh_keys, envs}``
  then ``POST /workloads/{uid}/deploy``: a rental (states registered → provisioning → running);
- ``GET /workloads?type=RENTAL[&name=]`` (paged by ``next_cursor``): the inventory, and the look-up
  of a create whose answer was lost;
- ``GET /workloads/{uid}/state``: the SSH endpoint, ``urls[port == P].url`` = ``http://IP:PORT``
  (else ``public_ip``/``ssh_port``), asked once per rental when it first runs;
- ``GET /workloads/{uid}``: the ``envs`` of a workload whose name this reconciler cannot place;
- ``DELETE /workloads/{uid}``: give it back (404: gone already);
- ``GET /inventory?type=rental&gpu=true`` (no key needed): the live offers, ``name``,
  ``spec{gpu_type, gpu_count, vcpu, memory (MB)}``, ``cost_per_hour``, ``available`` (how many are
  free: an int), a JSON list (T1 ``client/inventory.py``, T2 inventory).

SSH: no public source says Targon writes attached ``ssh_keys`` into a container's own sshd, and
ports below 1024 are refused (``ports[].port`` 1024–65535, the Targon Hub API clients in
shared/notes/provider-apis.md, T4). So the SSH port defaults to 2222 (DIRECT routing, as those
clients map 22 to 2222) and the public key travels in ``envs`` as ``PUBLIC_KEY`` (with
``SSH_PORT``): the image's entrypoint writes authorized_keys and starts sshd on that port.
Targon's gateway (``ssh <uid>@ssh.deployments.targon.com``, T3) prints a banner into the session
and needs sftp in the image; it is not used.

Names: Targon has no labels, and names are at most 32 characters of [a-z0-9-] (T4), so a workload
is named ``offers.provider_name`` (a hash) and carries the reconciler's name in
``envs.RECONCILER_RENTAL``; the adapter's name book maps it back (see names.py).
"""

from __future__ import annotations

import time
from urllib.parse import urlparse

from reconciler.core.errors import PermanentError, TemporaryError
from reconciler.spec.models.provider import Offer, Provider
from reconciler.spec.offers import provider_name
from .base import AdapterContext, Rental, bad_rental_id, capped, drop, live_offer, number, offer_of, offer_resource, \
    parse_time, public_key, rental_id
from .http import AnswerLost, HttpAdapter

BASE = "https://api.targon.com/tha/v2"
# The CLI's state constants (registered, provisioning, running, error, suspended, deleted:
# cli/src/client/types/common.rs) and the SDK's terminal set (failed, stopped, terminated:
# libs/python/src/targon/client/workload.py). A stopped workload runs nothing: it is failed, so
# it is given back and replaced. Anything unknown counts as provisioning (provisionTimeout ends it).
STATES = {"registered": "provisioning", "pending": "provisioning", "provisioning": "provisioning",
          "deploying": "provisioning", "running": "running", "error": "failed", "failed": "failed",
          "suspended": "failed", "stopped": "failed", "deleting": "terminating", "deleted": "terminated",
          "terminated": "terminated"}
SSH_PORT = 2222  # Targon refuses ports below 1024 (T4); 2222 is what its clients use for SSH
PORT_MIN = 1024
REDEPLOY_SECONDS = 60.0  # a workload left registered (its deploy failed) is deployed again this often
NAME_ENV = "RECONCILER_RENTAL"


def make(provider: Provider, ctx: AdapterContext) -> "TargonAdapter":
    return TargonAdapter(provider, ctx)


def ssh_port(provider: Provider) -> int:
    """The container port sshd listens on: 2222 unless the spec names one, which must be ≥ 1024."""
    ssh = provider.spec.ssh
    if "port" not in ssh.model_fields_set:
        return SSH_PORT
    if ssh.port < PORT_MIN:
        raise PermanentError(f"provider {provider.metadata.name}: ssh.port {ssh.port}: Targon accepts ports "
                             f"{PORT_MIN}-65535 only; leave it unset for {SSH_PORT}")
    return ssh.port


class TargonAdapter(HttpAdapter):
    api = "targon"
    default_base = BASE

    def __init__(self, provider: Provider, ctx: AdapterContext):
        super().__init__(provider, ctx)
        self._key_uid: str | None = None
        self._endpoints: dict[str, tuple[str, int]] = {}  # uid → (host, port), once running
        self._names: dict[str, str | None] = {}  # uid → envs name (None: none), asked once
        self._deployed: dict[str, float] = {}  # uid → when a deploy was last sent
        self._offers = {offer_resource(o): o for o in provider.spec.offers}

    def _ssh_key(self) -> str:
        if self._key_uid is not None:
            return self._key_uid
        mine = public_key(self.provider, self.ctx)
        for item in self._pages("/ssh-keys"):
            if " ".join(str(item.get("public_key_raw", "")).split()[:2]) == mine:
                self._key_uid = item["uid"]
                return self._key_uid
        # Repeating this POST makes at most a second copy of a key: harmless, so it may be retried.
        made = self.client.request("POST", "/ssh-keys", {"name": f"reconciler-{self.provider.metadata.name}"[:64],
                                                         "ssh_key": mine}, idempotent=True)
        self._key_uid = (made or {}).get("uid")
        if not self._key_uid:
            raise TemporaryError(f"provider {self.provider.metadata.name}: the new SSH key has no uid")
        return self._key_uid

    def provision(self, name: str, offer: Offer) -> Rental:
        self._auth()
        spec = self.provider.spec
        if not spec.ssh.image:
            raise PermanentError(f"provider {self.provider.metadata.name}: ssh.image is needed (a Targon rental "
                                 "boots an image that starts sshd from the PUBLIC_KEY it is given)")
        port, key = ssh_port(self.provider), public_key(self.provider, self.ctx)
        tried = provider_name(name) in self.book.names  # asked for before: its answer may have been lost
        pname = self.book.remember(name)  # before the create: a lost answer is still recognised
        found = self._find(pname) if tried else None
        if found is not None:  # an earlier create went through after all
            return self._adopt(found, name, offer)
        body = {"name": pname, "image": spec.ssh.image, "resource_name": offer_resource(offer), "type": "RENTAL",
                "ports": [{"port": port, "protocol": "TCP", "routing": "DIRECT"}],
                "ssh_keys": [self._ssh_key()],
                "envs": [{"name": "PUBLIC_KEY", "value": key}, {"name": "SSH_PORT", "value": str(port)},
                         {"name": NAME_ENV, "value": name}]}
        if spec.project:
            body["project_id"] = spec.project
        try:
            made = self.client.request("POST", "/workloads", body)
        except AnswerLost as e:
            found = self._find(pname)
            if found is None:
                raise TemporaryError(f"{e}; no workload named {pname} yet: the next pass looks again") from None
            return self._adopt(found, name, offer)
        uid = (made or {}).get("uid")
        if not uid:
            raise TemporaryError(f"provider {self.provider.metadata.name}: the new workload has no uid")
        uid = rental_id(self.provider.metadata.name, uid, "POST /workloads")  # it goes into the next URL
        self.book.first_seen(uid)
        return self._deploy(uid, name, offer)

    def _deploy(self, uid: str, name: str, offer: Offer | None) -> Rental:
        self._deployed[uid] = time.time()
        try:
            deployed = self.client.request("POST", f"/workloads/{uid}/deploy", None) or {}
        except AnswerLost:
            deployed = {}  # registered or deploying: the inventory tells, and deploys it again if need be
        price = deployed.get("cost_per_hour")
        fallback = offer.price_per_hour if offer is not None else None
        return Rental(id=uid, name=name, state="provisioning", offer=offer.id if offer is not None else None,
                      price_per_hour=float(price) if isinstance(price, (int, float)) else fallback,
                      created_at=self.book.first_seen(uid))

    def _find(self, pname: str) -> dict | None:
        query = {"type": "RENTAL", "project_id": self.provider.spec.project, "name": pname}
        for item in self._pages("/workloads", query):
            status = str((item.get("state") or {}).get("status") or item.get("status") or "").lower()
            if item.get("name") == pname and item.get("uid") and STATES.get(status) != "terminated":
                return item
        return None

    def _adopt(self, item: dict, name: str, offer: Offer) -> Rental:
        uid = rental_id(self.provider.metadata.name, item["uid"], "GET /workloads")
        status = str((item.get("state") or {}).get("status") or "").lower()
        if status == "registered":
            return self._deploy(uid, name, offer)
        return Rental(id=uid, name=name, state=STATES.get(status, "provisioning"), offer=offer.id,
                      price_per_hour=offer.price_per_hour, created_at=self.book.first_seen(uid))

    def inventory(self) -> list[Rental]:
        self._auth()
        query = {"type": "RENTAL", "project_id": self.provider.spec.project}
        out: list[Rental] = []
        # Look-ups (endpoints, names, deploys) are spread over passes, at most a burst's worth
        # each: after a restart with many rentals, a pass must not wait out the rate limit for all.
        budget = [self.provider.spec.rateLimit.burst]
        self.dropped = []
        for item in self._pages("/workloads", query):
            uid = item.get("uid")
            if not uid:
                continue
            why = bad_rental_id(uid)
            if why is not None:  # never asked about: the id would be in a URL
                drop(self.provider.metadata.name, why, self.dropped)
                continue
            r = self._rental(uid, item, budget)
            if r is not None:
                out.append(r)
        seen = {r.id for r in out}
        for uid in [u for u in self._endpoints if u not in seen]:
            del self._endpoints[uid]
        self.book.forget_except(seen)
        return out

    def _rental(self, uid: str, item: dict, budget: list[int]) -> Rental | None:
        pname = str(item.get("name") or "")
        name = self.book.resolve(pname)
        if name is None and pname.startswith("rc-") and budget[0] > 0 and uid not in self._names:
            budget[0] -= 1
            name = self.book.resolve(pname, self._envs_name(uid))
        if name is None:
            name = pname  # someone else's: listed as it is, never adopted or reaped
        state_doc = item.get("state") if isinstance(item.get("state"), dict) else {}
        status = str(state_doc.get("status") or item.get("status") or "").lower()
        state = STATES.get(status, "provisioning")
        if status == "registered" and name != pname and budget[0] > 0:
            if time.time() - self._deployed.get(uid, 0.0) > REDEPLOY_SECONDS:
                budget[0] -= 1  # created, never deployed (the deploy failed or was lost): again
                try:
                    self._deploy(uid, name, None)
                except (PermanentError, TemporaryError) as e:  # e.g. no credits: the listing goes on
                    state_doc = dict(state_doc, message=f"deploy refused: {e}")
        host = port = None
        if state == "running" and (uid in self._endpoints or budget[0] > 0):
            budget[0] -= uid not in self._endpoints
            host, port = self._endpoint(uid, state_doc)
            if host is None:
                state = "provisioning"  # running, but no SSH endpoint published yet
        resource = item.get("resource_name") or (item.get("resource") or {}).get("name")
        offer = offer_of(self.provider, resource) or self._offers.get(resource)
        price = item.get("cost_per_hour")
        created = parse_time(item.get("created_at")) or (self.book.first_seen(uid) if name != pname else None)
        return Rental(id=uid, name=name, state=state, host=host, port=port, user=self.provider.spec.ssh.user,
                      price_per_hour=float(price) if isinstance(price, (int, float)) else (
                          offer.price_per_hour if offer else None),
                      created_at=created, offer=offer.id if offer else None,
                      message=str(state_doc.get("message") or ""))

    def _envs_name(self, uid: str) -> str | None:
        """The reconciler name a workload carries in its envs (asked once per workload)."""
        doc = self.client.request("GET", f"/workloads/{uid}", ok_missing=True) or {}
        value = None
        for env in doc.get("envs") or []:
            if isinstance(env, dict) and env.get("name") == NAME_ENV:
                value = str(env.get("value") or "")
        self._names[uid] = value
        return value

    def _endpoint(self, uid: str, summary: dict) -> tuple[str | None, int | None]:
        if uid in self._endpoints:
            return self._endpoints[uid]
        doc = self.client.request("GET", f"/workloads/{uid}/state", ok_missing=True) or {}
        want = ssh_port(self.provider)
        for u in doc.get("urls") or []:
            if isinstance(u, dict) and u.get("port") == want and u.get("url"):
                parsed = urlparse(u["url"] if "://" in u["url"] else "tcp://" + u["url"])
                if parsed.hostname and parsed.port:
                    self._endpoints[uid] = (parsed.hostname, parsed.port)
                    return self._endpoints[uid]
        # The state also has public_ip and ssh_port (WorkloadSummary.state in the SDK)
        ip, port = doc.get("public_ip") or summary.get("public_ip"), doc.get("ssh_port") or summary.get("ssh_port")
        if isinstance(ip, str) and ip and isinstance(port, int) and port > 0:
            self._endpoints[uid] = (ip, port)
            return self._endpoints[uid]
        return None, None

    def live_offers(self) -> list:
        """What Targon rents out now. The inventory needs no key; it is sent when there is one."""
        if self.provider.spec.credentials and self.ctx.secret_source(self.provider.spec.credentials):
            self._auth()
        doc = self.client.request("GET", "/inventory", query={"type": "rental", "gpu": "true"})
        items = doc.get("items") if isinstance(doc, dict) else doc
        out = []
        for item in items if isinstance(items, list) else []:
            if not isinstance(item, dict):
                continue
            spec = item.get("spec") if isinstance(item.get("spec"), dict) else {}
            mem_mb = spec.get("memory")
            free = number(item.get("available"), 0, 1e6)  # machines free now (an int in the SDK's Inventory)
            out.append(live_offer(self.provider.metadata.name, item.get("name"), spec.get("gpu_type"),
                                  spec.get("gpu_count", 0), item.get("cost_per_hour"), bool(free),
                                  cpu_count=spec.get("vcpu"),
                                  memory_gb=mem_mb / 1024 if isinstance(mem_mb, (int, float)) else None))
        return capped(out)

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
