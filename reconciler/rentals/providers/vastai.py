"""Vast.ai: rentals are instances on a host's ask, reached through Vast's SSH proxy (or directly).

The calls (``https://console.vast.ai/api/v0``, ``Authorization: Bearer <key>``; as the official
client calls them, github.com/vast-ai/vast-cli ``vastai/api/{instances,keys,offers,client}.py``;
shared/notes/provider-apis.md, V1-V3):
- ``POST /bundles/ {verified, external, rentable, rented, order, type, limit, allocated_storage}``
  → ``{offers}`` (works without a key): the live offers, one per host ask, ``id`` (the ask),
  ``gpu_name``, ``num_gpus``, ``gpu_ram`` (MB), ``cpu_cores_effective``, ``cpu_ram`` (MB),
  ``geolocation``, ``dph_total`` (USD/h on demand), ``min_bid`` (USD/h interruptible). ``type:
  bid`` lists the interruptible ones. A search changes nothing, so it may be repeated;
- ``GET /ssh/``, ``POST /ssh/ {ssh_key}``: the reconciler's key on the account, which Vast puts
  on instances created afterwards;
- ``PUT /asks/{ask}/ {client_id: "me", image, disk, label, env, runtype, price?}`` → ``{success,
  new_contract}`` (the instance id). ``price`` is a bid: the instance is interruptible. A bid that
  fails can still leave a stopped instance behind (``new_contract`` with ``success: false``, V3
  dstack), which is given back at once. Renting is not idempotent, so this PUT is never repeated
  blindly: a lost answer is looked up by label;
- ``GET /instances/?owner=me`` → ``{instances}``: the inventory, and the look-up by ``label``;
- ``DELETE /instances/{id}/`` → ``{success}``; gone already (404, ``no_such_instance``) is success.

States (``actual_status``, as SkyPilot's vast provisioner maps them, V3): null, created, loading,
restarting, rebooting → provisioning; running → running (with an endpoint); exited, stopped,
frozen, offline → failed (the instance runs nothing: a spot instance outbid is stopped, and is
replaced like any machine that evaporated); unknown or anything else → provisioning, never running.

SSH: as root, through ``ssh_host:ssh_port`` (the proxy, sshN.vast.ai), which SkyPilot found the
reliable path; with ``vastai.direct``, runtype ``ssh_direc ssh_proxy`` and
``public_ipaddr`` + ``ports["22/tcp"][0].HostPort``.

Names: the label is ``offers.provider_name`` (30 characters; labels have no documented limit and
dstack keeps to 60, V3), the reconciler's name travels in ``env.RECONCILER_RENTAL``.

Rate: 429 per endpoint and identity, often plain text ("API requests too frequent"), with no
Retry-After (https://docs.vast.ai/api-reference/rate-limits-and-errors): the client backs off.
"""

from __future__ import annotations

from reconciler.core.errors import PermanentError, TemporaryError
from reconciler.spec.models.provider import Offer, Provider
from reconciler.spec.offers import provider_name
from .base import AdapterContext, OfferUnavailable, Rental, capped, live_offer, number, offer_resource, \
    public_key, rental_id, ssh_endpoint, text, valid_rentals
from .http import AnswerLost, ApiError, HttpAdapter

BASE = "https://console.vast.ai/api/v0"
STATES = {"": "provisioning", "null": "provisioning", "created": "provisioning", "loading": "provisioning",
          "restarting": "provisioning", "rebooting": "provisioning", "running": "running", "exited": "failed",
          "stopped": "failed", "frozen": "failed", "offline": "failed", "unknown": "provisioning"}
NAME_ENV = "RECONCILER_RENTAL"
SEARCH_LIMIT = 200
MAX_INSTANCES = 10000


def make(provider: Provider, ctx: AdapterContext) -> "VastAdapter":
    return VastAdapter(provider, ctx)


class VastAdapter(HttpAdapter):
    api = "vastai"
    default_base = BASE
    default_rate = (1.0, 2)

    def __init__(self, provider: Provider, ctx: AdapterContext):
        super().__init__(provider, ctx)
        self.settings = provider.spec.vastai
        self.direct = bool(self.settings and self.settings.direct)
        self.disk = self.settings.diskGb if self.settings else 50.0
        self._key_ok = False
        self._rented: dict[str, str] = {}  # instance id → the offer it was rented from (this process)

    def _ssh_key(self) -> None:
        if self._key_ok:
            return
        mine = public_key(self.provider, self.ctx)
        doc = self.client.request("GET", "/ssh/")
        items = doc if isinstance(doc, list) else (doc.get("keys") or doc.get("ssh_keys") or []) \
            if isinstance(doc, dict) else []
        have = [str(k.get("public_key") or k.get("ssh_key") or "") for k in items if isinstance(k, dict)]
        if not any(" ".join(k.split()[:2]) == mine for k in have):
            # Repeating it adds at most a second copy of the key: harmless.
            self.client.request("POST", "/ssh/", {"ssh_key": mine}, idempotent=True)
        self._key_ok = True

    def provision(self, name: str, offer: Offer) -> Rental:
        self._auth()
        spec = self.provider.spec
        if not spec.ssh.image:
            raise PermanentError(f"provider {self.provider.metadata.name}: ssh.image is needed (the Docker image "
                                 "the instance runs; Vast starts sshd in it)")
        ask = text(offer_resource(offer))
        if ask is None or not ask.isdigit():
            raise PermanentError(f"provider {self.provider.metadata.name}: offer {offer.id}: a Vast.ai offer is a "
                                 "host's ask (a number, from the live offers), not a fixed shape")
        tried = provider_name(name) in self.book.names
        pname = self.book.remember(name)
        found = self._find(pname) if tried else None
        if found is not None:
            return self._adopt(found, name, offer)
        self._ssh_key()
        body = {"client_id": "me", "image": spec.ssh.image, "disk": self.disk, "label": pname,
                "env": {NAME_ENV: name}, "runtype": "ssh_direc ssh_proxy" if self.direct else "ssh_proxy"}
        if offer.spot:
            body["price"] = offer.price_per_hour  # the bid: interruptible at this price per hour
        try:
            doc = self.client.request("PUT", f"/asks/{ask}/", body, idempotent=False) or {}
        except AnswerLost as e:
            found = self._find(pname)
            if found is None:
                raise TemporaryError(f"{e}; no instance labelled {pname} yet: the next pass looks again") from None
            return self._adopt(found, name, offer)
        except ApiError as e:
            if e.status in (400, 404, 409, 410):  # the ask was taken or withdrawn: asks live minutes
                raise OfferUnavailable(str(e), offer.id, retry_after=60.0) from None
            raise
        return self._made(doc if isinstance(doc, dict) else {}, name, offer)

    def _made(self, doc: dict, name: str, offer: Offer) -> Rental:
        contract = doc.get("new_contract")
        if not doc.get("success"):
            if contract is not None and rental_id(self.provider.metadata.name, contract, "PUT /asks"):
                self.terminate(str(contract))  # a failed bid left a stopped instance behind
            why = text(doc.get("msg") or doc.get("error"), 120) or "no reason given"
            raise OfferUnavailable(f"provider {self.provider.metadata.name}: ask {offer_resource(offer)} not "
                                   f"rented: {why}", offer.id, retry_after=60.0)
        iid = rental_id(self.provider.metadata.name, contract, "PUT /asks")
        self._rented[iid] = offer.id
        return Rental(id=iid, name=name, state="provisioning", offer=offer.id, price_per_hour=offer.price_per_hour,
                      created_at=self.book.first_seen(iid))

    def _find(self, pname: str) -> dict | None:
        for inst in self._instances():
            if inst.get("label") == pname and inst.get("id") is not None:
                return inst
        return None

    def _adopt(self, inst: dict, name: str, offer: Offer) -> Rental:
        iid = rental_id(self.provider.metadata.name, inst["id"], "GET /instances")
        self._rented[iid] = offer.id
        return Rental(id=iid, name=name, state="provisioning", offer=offer.id, price_per_hour=offer.price_per_hour,
                      created_at=self._started(inst) or self.book.first_seen(iid))

    def _instances(self) -> list[dict]:
        doc = self.client.request("GET", "/instances/", query={"owner": "me"}) or {}
        items = doc.get("instances") if isinstance(doc, dict) else None
        return [i for i in (items if isinstance(items, list) else [])[:MAX_INSTANCES] if isinstance(i, dict)]

    @staticmethod
    def _started(inst: dict) -> float | None:
        return number(inst.get("start_date"), 946684800, 32503680000)  # 2000 … 3000, unix seconds

    def inventory(self) -> list[Rental]:
        self._auth()
        out = [self._rental(i) for i in self._instances() if i.get("id") is not None]
        self.dropped = []
        out = valid_rentals(self.provider.metadata.name, out, self.dropped)
        self.book.forget_except({r.id for r in out})
        return out

    def _endpoint(self, inst: dict) -> tuple[str, int] | None:
        if self.direct:
            ports = inst.get("ports") if isinstance(inst.get("ports"), dict) else {}
            mapped = ports.get("22/tcp")
            first = mapped[0] if isinstance(mapped, list) and mapped and isinstance(mapped[0], dict) else {}
            return ssh_endpoint(inst.get("public_ipaddr"), first.get("HostPort"))
        return ssh_endpoint(inst.get("ssh_host"), inst.get("ssh_port"))

    def _rental(self, inst: dict) -> Rental:
        status = str(inst.get("actual_status") if inst.get("actual_status") is not None else "").lower()[:40]
        state = STATES.get(status, "provisioning")
        endpoint = self._endpoint(inst) if state == "running" else None
        if state == "running" and endpoint is None:
            state = "provisioning"  # running, but its SSH port is not published yet
        pname = str(inst.get("label") or "")
        hint = None
        for pair in inst.get("extra_env") or []:
            if isinstance(pair, list) and len(pair) == 2 and pair[0] == NAME_ENV:
                hint = text(pair[1])
        name = self.book.resolve(pname, hint) or pname
        iid = str(inst["id"])
        created = self._started(inst) or (self.book.first_seen(iid) if name != pname else None)
        message = text(inst.get("status_msg"), 120) or ""
        if state == "failed":
            message = f"instance {status}" + (f": {message}" if message else "")
        elif status not in STATES:
            message = f"unknown instance status {status!r}"
        return Rental(id=iid, name=name, state=state, host=endpoint[0] if endpoint else None,
                      port=endpoint[1] if endpoint else None, user=self.provider.spec.ssh.user,
                      price_per_hour=number(inst.get("dph_total"), 0, 100000), created_at=created,
                      message=message, offer=self._rented.get(iid) or self._offer_of(inst))

    def _offer_of(self, inst: dict) -> str | None:
        """The catalog entry (or live offer) of the instance's GPU model and count, when only one
        kind fits: the ask it was rented from is off the market by now."""
        gpu, count = text(inst.get("gpu_name"), 64), inst.get("num_gpus")
        ids = {o.id for o in self.provider.spec.offers
               if gpu and o.gpu_type and o.gpu_type.lower() == gpu.lower() and o.gpu_count == count}
        return ids.pop() if len(ids) == 1 else None

    def terminate(self, rental_id_: str) -> None:
        self._auth()
        iid = rental_id(self.provider.metadata.name, rental_id_, "terminate")
        try:
            self.client.request("DELETE", f"/instances/{iid}/", ok_missing=True)
        except ApiError as e:
            if "no_such_instance" not in str(e):
                raise

    def live_offers(self) -> list:
        """The on-demand asks and the interruptible ones (``type: bid``, priced by ``min_bid``);
        the search needs no key, and it is sent when there is one."""
        if self.provider.spec.credentials and self.ctx.secret_source(self.provider.spec.credentials):
            self._auth()
        out = []
        for kind in ("on-demand", "bid"):
            query = {"verified": {"eq": True}, "external": {"eq": False}, "rentable": {"eq": True},
                     "rented": {"eq": False}, "order": [["dph_total", "asc"]], "type": kind, "limit": SEARCH_LIMIT,
                     "allocated_storage": self.disk}
            doc = self.client.request("POST", "/bundles/", query, idempotent=True) or {}
            offers = doc.get("offers") if isinstance(doc, dict) else None
            for o in (offers if isinstance(offers, list) else [])[:SEARCH_LIMIT * 5]:
                if isinstance(o, dict):
                    out.append(self._offer(o, spot=kind == "bid"))
        return capped(out)

    def _offer(self, o: dict, spot: bool):
        mb = 1024.0
        gpu_ram, cpu_ram = number(o.get("gpu_ram"), 0, 1024 * mb), number(o.get("cpu_ram"), 0, 65536 * mb)
        ask = o.get("id") if isinstance(o.get("id"), int) and not isinstance(o.get("id"), bool) else None
        price = o.get("min_bid") if spot else o.get("dph_total", o.get("dph_base"))
        cpus = number(o.get("cpu_cores_effective"), 1, 4096)
        return live_offer(self.provider.metadata.name, ask, o.get("gpu_name"), o.get("num_gpus"), price,
                          o.get("rentable", True) is True and not o.get("rented"), spot=spot,
                          gpu_memory_gb=gpu_ram / mb if gpu_ram else None, cpu_count=int(cpus) if cpus else None,
                          memory_gb=cpu_ram / mb if cpu_ram else None, region=o.get("geolocation"))
