"""A fake of Lambda Cloud's instance API (the subset the lambda adapter calls), for tests only.

Lambda gives an instance an IP and nothing else: SSH is port 22 of that IP. Here each instance
gets an address of its own in 127.0.0.0/8 (127.0.0.2, .3, ...) with a real sshd on the one port
the provider's spec names, so the adapter's endpoint logic is the real one. Instances go booting →
active after ``delay`` seconds. A 429 from Lambda carries no Retry-After.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from tests.fakes.cloud import FakeCloud


class FakeLambda(FakeCloud):
    def __init__(self, *args, ssh_port: int, **kw):
        super().__init__(*args, **kw)
        self.ssh_port = ssh_port
        self.keys: list[dict] = []
        self.ip_seq = 2

    def _status(self, inst: dict) -> str:
        if inst["status"] == "booting" and self.ready(inst):
            key = next((k["public_key"] for k in self.keys if k["name"] in inst["ssh_key_names"]), "")
            self.boot(inst, key, port=self.ssh_port, host=inst["ip"])
            inst["status"] = "active"
        return inst["status"]

    def route(self, method: str, path: str, query: dict, body: Any) -> tuple[int, Any]:
        p = path.removeprefix("/api/v1")
        if p == "/ssh-keys" and method == "GET":
            return 200, {"data": self.keys}
        if p == "/ssh-keys" and method == "POST":
            self.keys.append({"id": uuid.uuid4().hex, "name": body["name"], "public_key": body["public_key"]})
            return 200, {"data": self.keys[-1]}
        if p == "/instance-operations/launch" and method == "POST":
            if not body.get("instance_type_name"):
                return 400, {"error": {"code": "global/invalid-parameters", "message": "instance_type_name missing"}}
            iid = uuid.uuid4().hex[:16]
            ip = f"127.0.0.{self.ip_seq}"
            self.ip_seq += 1
            self.machines[iid] = {"id": iid, "name": body.get("name"), "status": "booting", "ip": ip,
                                  "ssh_key_names": body.get("ssh_key_names", []), "created": time.time(),
                                  "instance_type": {"name": body["instance_type_name"], "price_cents_per_hour": 129}}
            return 200, {"data": {"instance_ids": [iid]}}
        if p == "/instances" and method == "GET":
            data = []
            for inst in self.machines.values():
                status = self._status(inst)
                data.append({"id": inst["id"], "name": inst["name"], "status": status,
                             "ip": inst["ip"] if status == "active" else None, "instance_type": inst["instance_type"],
                             "ssh_key_names": inst["ssh_key_names"]})
            return 200, {"data": data}
        if p == "/instance-operations/terminate" and method == "POST":
            gone = []
            for iid in body.get("instance_ids", []):
                if iid in self.machines:
                    self.evaporate(iid)
                    gone.append({"id": iid, "status": "terminated"})
            return 200, {"data": {"terminated_instances": gone}}
        return 404, {"error": {"code": "global/object-does-not-exist", "message": "not found"}}
