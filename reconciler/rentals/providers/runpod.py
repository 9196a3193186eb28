"""RunPod: rentals are GPU pods, reached over SSH straight to the pod's own sshd.

The calls (RunPod REST v2, ``https://api.runpod.io``, ``Authorization: Bearer <key>``; the
OpenAPI document github.com/runpod/docs ``api-reference-v2/openapi.json``; REST v1 is retired on
2026-11-15 and GraphQL in early 2027, ``api-reference/overview.mdx``):
- ``GET /v2/account/ssh-keys`` → ``{keys}``, ``PUT /v2/account/ssh-keys {keys}``: the PUT replaces
  the whole set, so the reconciler's key is added to what is there (read first, put the union);
  ``startSsh: true`` then puts the account's keys into the pod's ``PUBLIC_KEY``, from which
  RunPod's images start sshd;
- ``POST /v2/pods {name, image, gpu{id, count}, cloud, dataCenterIds, ports: ["22/tcp"], env,
  disk, startSsh}`` → 201 Pod (``name`` min 1 character, need not be unique; unknown
  fields are refused: ``unevaluatedProperties: false``);
- ``GET /v2/pods`` → ``{pods}``: the inventory (no name filter, no paging), and the look-up of a
  create whose answer was lost (by name);
- ``DELETE /v2/pods/{id}`` → 204; 404 when gone (success here); 409 for a cluster's pod;
- ``GET /v2/catalog/gpus?include=AVAILABILITY&product=POD&cloud=…`` → ``{gpus}``: the live offers,
  ``price{secure, community}`` per GPU, ``maxCount`` per cloud, ``memory`` (GB of VRAM) and
  ``availability`` NONE/LOW/MEDIUM/HIGH.

States (PodStatus): PROVISIONING and STARTING → provisioning; RUNNING → running once ``ssh.direct``
is published (it is null until the running pod has a public port for 22/tcp); EXITED (the
container stopped: nothing runs there) and ERROR → failed; TERMINATED → terminated; anything
else → provisioning, never running (provisionTimeout ends it).

SSH: ``ssh.direct{host, port}``. ``ssh.proxy`` carries an interactive shell only (no SCP, SFTP,
rsync or port forwarding, per the OpenAPI's PodSsh), so it is never used.

Names: ``offers.provider_name`` (a hash; RunPod has no limit that it could break), with the
reconciler's name in ``env.RECONCILER_RENTAL`` (a pod's env is part of every Pod reply).

Spot: REST v2 has no interruptible pods (CreatePodRequest has no such field), so an offer with
``spot: true`` is refused here rather than silently rented on demand.

Rate: 429 with ``Retry-After`` and ``RateLimit``/``RateLimit-Policy`` headers (the OpenAPI's
example policy is 60 a minute): 1 request/s is the default when the Provider sets no rateLimit.
"""

from __future__ import annotations

from reconciler.core.errors import PermanentError, TemporaryError
from reconciler.spec.models.provider import Offer, Provider
from reconciler.spec.offers import provider_name
from .base import AdapterContext, OfferUnavailable, Rental, capped, live_offer, number, offer_resource, parse_time, \
    public_key, rental_id, ssh_endpoint, text, valid_rentals
from .http import AnswerLost, ApiError, HttpAdapter

BASE = "https://api.runpod.io"
STATES = {"PROVISIONING": "provisioning", "STARTING": "provisioning", "RUNNING": "running", "EXITED": "failed",
          "ERROR": "failed", "TERMINATED": "terminated"}
NAME_ENV = "RECONCILER_RENTAL"
COUNTS = (1, 2, 4, 8)  # pod sizes listed per GPU type, up to its maxCount in the cloud
MAX_PODS = 10000


def make(provider: Provider, ctx: AdapterContext) -> "RunpodAdapter":
    return RunpodAdapter(provider, ctx)


class RunpodAdapter(HttpAdapter):
    api = "runpod"
    default_base = BASE
    default_rate = (1.0, 5)

    def __init__(self, provider: Provider, ctx: AdapterContext):
        super().__init__(provider, ctx)
        self.settings = provider.spec.runpod
        self.cloud = self.settings.cloud if self.settings else "SECURE"
        self._key_ok = False
        self._rented: dict[str, str] = {}  # pod id → the offer it was rented from (this process)

    def _ssh_key(self) -> None:
        """The reconciler's key among the account's; PUT replaces the set, so the union is sent."""
        if self._key_ok:
            return
        mine = public_key(self.provider, self.ctx)
        doc = self.client.request("GET", "/v2/account/ssh-keys") or {}
        keys = [k for k in doc.get("keys") or [] if isinstance(k, str)]
        if not any(" ".join(k.split()[:2]) == mine for k in keys):
            self.client.request("PUT", "/v2/account/ssh-keys", {"keys": keys + [mine]})
        self._key_ok = True

    def _body(self, pname: str, name: str, offer: Offer) -> dict:
        spec = self.provider.spec
        if offer.spot:
            raise PermanentError(f"provider {self.provider.metadata.name}: offer {offer.id}: RunPod's REST v2 has "
                                 "no interruptible pods; remove spot: true")
        if not offer.gpu_count:
            raise PermanentError(f"provider {self.provider.metadata.name}: offer {offer.id}: RunPod pods are rented "
                                 "with GPUs here (gpu_count ≥ 1)")
        if not spec.ssh.image:
            raise PermanentError(f"provider {self.provider.metadata.name}: ssh.image is needed (an image that starts "
                                 "sshd from PUBLIC_KEY, as RunPod's own images do)")
        body = {"name": pname, "image": spec.ssh.image, "cloud": self.cloud, "ports": ["22/tcp"],
                "gpu": {"id": offer_resource(offer), "count": offer.gpu_count}, "startSsh": True,
                "env": {NAME_ENV: name},
                "disk": self.settings.containerDiskGb if self.settings else 50}
        if offer.region:
            body["dataCenterIds"] = [offer.region]
        return body

    def provision(self, name: str, offer: Offer) -> Rental:
        self._auth()
        tried = provider_name(name) in self.book.names  # asked for before: its answer may have been lost
        pname = self.book.remember(name)  # before the create: a lost answer is still recognised
        found = self._find(pname) if tried else None
        if found is not None:
            return self._adopt(found, name, offer)
        body = self._body(pname, name, offer)
        self._ssh_key()
        try:
            pod = self.client.request("POST", "/v2/pods", body) or {}
        except AnswerLost as e:
            found = self._find(pname)
            if found is None:
                raise TemporaryError(f"{e}; no pod named {pname} yet: the next pass looks again") from None
            return self._adopt(found, name, offer)
        except ApiError as e:
            if e.status in (400, 404, 409, 422) and "capacity" in str(e).lower():  # no machine of this type free now
                raise OfferUnavailable(str(e), offer.id) from None
            raise
        if not isinstance(pod, dict) or not pod.get("id"):
            raise TemporaryError(f"provider {self.provider.metadata.name}: the new pod has no id")
        return self._adopt(pod, name, offer)

    def _find(self, pname: str) -> dict | None:
        for pod in self._pods():
            if pod.get("name") == pname and pod.get("id") and \
                    STATES.get(str(pod.get("status") or "")) != "terminated":
                return pod
        return None

    def _adopt(self, pod: dict, name: str, offer: Offer) -> Rental:
        pid = rental_id(self.provider.metadata.name, pod["id"], "POST /v2/pods")
        cost = number(pod.get("cost"), 0, 100000)
        self._rented[pid] = offer.id
        return Rental(id=pid, name=name, state="provisioning", offer=offer.id,
                      price_per_hour=cost if cost else offer.price_per_hour,
                      created_at=parse_time(pod.get("createdAt")) or self.book.first_seen(pid))

    def _pods(self) -> list[dict]:
        doc = self.client.request("GET", "/v2/pods") or {}
        pods = doc.get("pods") if isinstance(doc, dict) else None
        return [p for p in (pods if isinstance(pods, list) else [])[:MAX_PODS] if isinstance(p, dict)]

    def inventory(self) -> list[Rental]:
        self._auth()
        out = [self._rental(p) for p in self._pods() if p.get("id")]
        self.dropped = []
        out = valid_rentals(self.provider.metadata.name, out, self.dropped)
        self.book.forget_except({r.id for r in out})
        return out

    def _rental(self, pod: dict) -> Rental:
        status = str(pod.get("status") or "")
        state = STATES.get(status, "provisioning")
        pname = str(pod.get("name") or "")
        env = pod.get("env") if isinstance(pod.get("env"), dict) else {}
        name = self.book.resolve(pname, text(env.get(NAME_ENV))) or pname
        ssh = pod.get("ssh") if isinstance(pod.get("ssh"), dict) else {}
        direct = ssh.get("direct") if isinstance(ssh.get("direct"), dict) else {}
        endpoint = ssh_endpoint(direct.get("host"), direct.get("port")) if state == "running" else None
        if state == "running" and endpoint is None:
            state = "provisioning"  # running, but no public port for 22/tcp yet
        gpu = pod.get("gpu") if isinstance(pod.get("gpu"), dict) else {}
        created = parse_time(pod.get("createdAt")) or (
            self.book.first_seen(str(pod["id"])) if name != pname else None)
        message = {"EXITED": "the pod's container exited", "ERROR": "the pod is in an unrecoverable error state"}
        return Rental(id=str(pod["id"]), name=name, state=state, host=endpoint[0] if endpoint else None,
                      port=endpoint[1] if endpoint else None, user=self.provider.spec.ssh.user,
                      price_per_hour=number(pod.get("cost"), 0, 100000), created_at=created,
                      offer=self._rented.get(str(pod["id"])) or self._offer_of(text(gpu.get("id")), gpu.get("count")),
                      message=message.get(status, "" if status in STATES else f"unknown pod status {status[:40]!r}"))

    def _offer_of(self, gpu_id: str | None, count) -> str | None:
        for o in self.provider.spec.offers:
            if gpu_id and offer_resource(o) == gpu_id and o.gpu_count == count:
                return o.id
        return None

    def terminate(self, rental_id_: str) -> None:
        self._auth()
        pid = rental_id(self.provider.metadata.name, rental_id_, "terminate")
        self.client.request("DELETE", f"/v2/pods/{pid}", ok_missing=True)  # 404: gone already

    def live_offers(self) -> list:
        """Each GPU type at 1, 2, 4 and 8 GPUs (up to the cloud's maxCount), priced per GPU times
        the count; availability is the catalog's overall level for the cloud (NONE: unavailable)."""
        self._auth()
        doc = self.client.request("GET", "/v2/catalog/gpus", query={"include": "AVAILABILITY", "product": "POD",
                                                                     "cloud": self.cloud}) or {}
        gpus = doc.get("gpus") if isinstance(doc, dict) else None
        key = self.cloud.lower()
        out = []
        for g in (gpus if isinstance(gpus, list) else [])[:1000]:
            if not isinstance(g, dict) or g.get(key) is False:
                continue
            price = (g.get("price") or {}).get(key) if isinstance(g.get("price"), dict) else None
            top = (g.get("maxCount") or {}).get(key) if isinstance(g.get("maxCount"), dict) else None
            top = number(top, 0, 64) or 1
            each = number(price, 0, 100000)
            available = g.get("availability") in ("LOW", "MEDIUM", "HIGH")
            for n in [c for c in COUNTS if c <= top]:
                out.append(live_offer(self.provider.metadata.name, g.get("id"), g.get("name"), n,
                                      each * n if each is not None else None, available,
                                      gpu_memory_gb=g.get("memory")))
        return capped(out)
