"""A fake of Targon's rental API (the subset the targon adapter calls), for tests only.

Workloads go registered → (deploy) provisioning → running after ``delay`` seconds; only when
running does ``GET /workloads/{uid}/state`` publish the SSH URL, ``http://127.0.0.1:<port>`` of a
real sshd started for it (see tests/fakes/cloud.py). Lists are paged with ``next_cursor``.
"""

from __future__ import annotations

import itertools
import time
import uuid
from typing import Any

from tests.fakes.cloud import FakeCloud


class FakeTargon(FakeCloud):
    page_size = 2  # small pages, so that paging is exercised

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.keys: dict[str, dict] = {}
        self._seq = itertools.count(1)

    def _page(self, items: list, query: dict) -> dict:
        start = int(query.get("cursor") or 0)
        end = start + self.page_size
        return {"items": items[start:end], "next_cursor": str(end) if end < len(items) else None}

    def _status(self, w: dict) -> str:
        if w["status"] == "provisioning" and self.ready(w):
            key = next(iter(self.keys.values()))["public_key_raw"] if self.keys else ""
            for uid in w["ssh_keys"]:
                key = self.keys.get(uid, {}).get("public_key_raw", key)
            self.boot(w, key)
            w["status"] = "running"
        return w["status"]

    def route(self, method: str, path: str, query: dict, body: Any) -> tuple[int, Any]:
        parts = [p for p in path.split("/") if p][2:]  # after /tha/v2
        if parts == ["ssh-keys"] and method == "GET":
            return 200, self._page(list(self.keys.values()), query)
        if parts == ["ssh-keys"] and method == "POST":
            uid = f"shk-{uuid.uuid4().hex[:8]}"
            self.keys[uid] = {"uid": uid, "name": body["name"], "public_key_raw": body["ssh_key"]}
            return 200, self.keys[uid]
        if parts == ["workloads"] and method == "POST":
            if body.get("type") != "RENTAL" or not body.get("resource_name"):
                return 400, {"error": "bad workload", "reason": "INVALID_WORKLOAD"}
            uid = f"wrk-{uuid.uuid4().hex[:10]}"
            self.machines[uid] = {"id": uid, "uid": uid, "name": body["name"], "status": "registered",
                                  "resource_name": body["resource_name"], "ssh_keys": body.get("ssh_keys", []),
                                  "ports": body.get("ports", []), "created": time.time(),
                                  "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                  "project_id": body.get("project_id")}
            return 200, {"uid": uid, "name": "", "state": {"status": "registered", "message": "Workload registered, "
                         "awaiting deploy", "ready_replicas": 0, "total_replicas": 0}, "created_at": "0001-01-01T00:00:00Z"}
        if len(parts) == 3 and parts[0] == "workloads" and parts[2] == "deploy" and method == "POST":
            w = self.machines[parts[1]]
            w["status"], w["created"] = "provisioning", time.time()
            return 200, {"uid": w["uid"], "name": w["name"], "cost_per_hour": 2.4,
                         "state": {"status": "provisioning", "message": "Deployment initiated"}}
        if parts == ["workloads"] and method == "GET":
            items = [{"uid": w["uid"], "name": w["name"], "resource_name": w["resource_name"],
                      "state": {"status": self._status(w)}, "created_at": w["created_at"], "cost_per_hour": 2.4}
                     for w in self.machines.values() if query.get("type") in (None, "RENTAL")]
            return 200, self._page(items, query)
        if len(parts) == 3 and parts[0] == "workloads" and parts[2] == "state" and method == "GET":
            w = self.machines[parts[1]]
            status = self._status(w)
            urls = []
            if status == "running":
                urls = [{"port": p["port"], "url": f"http://127.0.0.1:{w['port']}"} for p in w["ports"]]
            return 200, {"uid": w["uid"], "workload_type": "RENTAL", "status": status, "message": status.title(),
                         "urls": urls}
        if len(parts) == 2 and parts[0] == "workloads" and method == "DELETE":
            self.evaporate(parts[1])
            return 200, {"uid": parts[1], "deleted": True}
        return 404, {"error": "not found", "reason": "NOT_FOUND"}
