"""A fake of Lambda Cloud's instance API (the subset the lambda adapter calls), for tests only.

Lambda gives an instance an IP and nothing else: SSH is port 22 of that IP. Here each instance
gets an address of its own in 127.0.0.0/8 (127.0.0.2, .3, ...) with a real sshd on the one port
the provider's spec names, so the adapter's endpoint logic is the real one. Instances go booting →
active after ``delay`` seconds.

The published contract it enforces (Lambda Cloud OpenAPI 1.10.0, api-evangelist/lambda-labs
``openapi/lambda-labs-instances-api-openapi.yml``; shared/notes/provider-apis.md, L1):
- launch: ``region_name``, ``instance_type_name`` and ``ssh_key_names`` are required, the latter
  with exactly one name; ``name`` ≤ 64 characters; ``tags[].key`` ``^[a-z][a-z0-9-:]+$`` ≤ 55 and
  ``value`` ≤ 128; a 400 is ``{error: {code, message, suggestion}}`` with code
  ``global/invalid-parameters``, or ``instance-operations/launch/insufficient-capacity`` when the
  region has no capacity for the type (``capacity`` says where there is, as ``GET
  /instance-types``' ``regions_with_capacity_available`` reports it).
- Instances have no creation time; ``InstanceStatus`` is booting, active, unhealthy, terminated,
  terminating or preempted (``set_status`` forces one).
- terminate of an unknown id: 404 ``global/object-does-not-exist``.
- Rate: about 1 request/s, launches 1 per 12 s (the OpenAPI's description), answered 429 without
  Retry-After (SkyPilot ``lambda_utils.py`` backs off itself, L2); the body is Cloudflare's
  "error code: 1015" (the older docs, L5).
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

from tests.fakes.cloud import FakeCloud

TAG_KEY = re.compile(r"^[a-z][a-z0-9-:]+$")


def invalid(message: str) -> tuple[int, dict]:
    return 400, {"error": {"code": "global/invalid-parameters", "message": message,
                           "suggestion": "Check the request against the API reference"}}


class FakeLambda(FakeCloud):
    throttle_answer = ({"Content-Type": "text/plain"}, "error code: 1015")

    def __init__(self, *args, ssh_port: int, rate_limits: bool = True, **kw):
        super().__init__(*args, **kw)
        self.ssh_port = ssh_port
        self.keys: list[dict] = []
        self.ip_seq = 2
        self.capacity: dict[str, list[str]] = {"gpu_1x_a10": ["us-east-1", "us-west-1"]}
        if rate_limits:
            self.limit(1.0, 2)  # "about 1 request/s": one call of slack for arrival jitter
            self.limit(1 / 12, 1, "POST", "/api/v1/instance-operations/launch")

    def next_ip(self) -> str:
        """A loopback address of the instance's own (a long soak may ask for a range of its own)."""
        ip = f"127.0.0.{self.ip_seq}"
        self.ip_seq += 1
        return ip

    def set_status(self, iid: str, status: str) -> None:
        self.machines[iid]["status"] = status

    def _status(self, inst: dict) -> str:
        if inst["status"] == "booting" and self.ready(inst):
            key = next((k["public_key"] for k in self.keys if k["name"] in inst["ssh_key_names"]), "")
            self.boot(inst, key, port=self.ssh_port, host=inst["ip"])
            inst["status"] = "active"
        return inst["status"]

    def _launch(self, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict):
            return invalid("the body is not an object")
        for field in ("region_name", "instance_type_name", "ssh_key_names"):
            if not body.get(field):
                return invalid(f"{field} is required")
        if len(body["ssh_key_names"]) != 1:
            return invalid("exactly one SSH key must be specified")
        if len(str(body.get("name") or "")) > 64:
            return invalid("name must be 64 characters or fewer")
        for tag in body.get("tags") or []:
            if not TAG_KEY.match(str(tag.get("key"))) or len(tag["key"]) > 55 or len(str(tag.get("value"))) > 128:
                return invalid(f"tag {tag!r} is not a valid tag")
        itype, region = body["instance_type_name"], body["region_name"]
        if region not in self.capacity.get(itype, []):
            return 400, {"error": {"code": "instance-operations/launch/insufficient-capacity",
                                   "message": "Not enough capacity to fulfill launch request.",
                                   "suggestion": "Choose a different region or try again later."}}
        iid = uuid.uuid4().hex[:16]
        ip = self.next_ip()
        self.machines[iid] = {"id": iid, "name": body.get("name"), "status": "booting", "ip": ip,
                              "ssh_key_names": body["ssh_key_names"], "created": time.time(),
                              "region": {"name": region}, "tags": body.get("tags") or [],
                              "instance_type": {"name": itype, "price_cents_per_hour": 129}}
        return 200, {"data": {"instance_ids": [iid]}}

    def route(self, method: str, path: str, query: dict, body: Any) -> tuple[int, Any]:
        p = path.removeprefix("/api/v1")
        if p == "/ssh-keys" and method == "GET":
            return 200, {"data": self.keys}
        if p == "/ssh-keys" and method == "POST":
            if not 1 <= len(body.get("name") or "") <= 64:
                return invalid("name must be 1-64 characters")
            self.keys.append({"id": uuid.uuid4().hex, "name": body["name"], "public_key": body["public_key"]})
            return 200, {"data": self.keys[-1]}
        if p == "/instance-types" and method == "GET":
            return 200, {"data": {t: {"instance_type": {"name": t, "price_cents_per_hour": 129},
                                      "regions_with_capacity_available": [{"name": r} for r in regions]}
                                  for t, regions in self.capacity.items()}}
        if p == "/instance-operations/launch" and method == "POST":
            return self._launch(body)
        if p == "/instances" and method == "GET":
            data = []
            for inst in list(self.machines.values()):  # a machine may vanish meanwhile
                status = self._status(inst)
                data.append({"id": inst["id"], "name": inst["name"], "status": status,
                             "ip": inst["ip"] if status == "active" else None, "instance_type": inst["instance_type"],
                             "region": inst["region"], "tags": inst["tags"], "ssh_key_names": inst["ssh_key_names"]})
            return 200, {"data": data}
        if p == "/instance-operations/terminate" and method == "POST":
            ids = body.get("instance_ids", [])
            if any(iid not in self.machines for iid in ids):
                return 404, {"error": {"code": "global/object-does-not-exist", "message": "Instance not found"}}
            gone = []
            for iid in ids:
                self.evaporate(iid)
                gone.append({"id": iid, "status": "terminating"})
            return 200, {"data": {"terminated_instances": gone}}
        return 404, {"error": {"code": "global/object-does-not-exist", "message": "not found"}}
