"""A fake of Targon's rental API (the subset the targon adapter calls), for tests only.

Workloads go registered → (deploy) provisioning → running after ``delay`` seconds; only when
running does ``GET /workloads/{uid}/state`` publish the SSH URL, ``http://127.0.0.1:<port>`` of a
real sshd started for it (see tests/fakes/cloud.py). Lists are paged with ``next_cursor``.

The published contract it enforces (sources as in shared/notes/provider-apis.md):
- ``name``: at most 32 characters of [a-z0-9-] (T4: the Targon Hub API clients; T2 states the
  charset); ``ports[].port`` 1024–65535 (T4); unknown request fields are refused (T4); ``type``,
  ``image`` and ``resource_name`` are required (T1 ``CreateWorkloadRequest``); a 400 is
  ``{error, reason}`` (T1 ``core/objects.py``, ``cli/src/client/http.rs``).
- The container gets no key from ``ssh_keys``: no source says Targon writes them into a
  container's own sshd, so the fake's sshd trusts only ``envs.PUBLIC_KEY`` and listens behind the
  DIRECT port the workload declared.
- States: registered, provisioning, running, error, suspended, deleted (T1 ``common.rs``) and
  failed, stopped, terminated (T1 ``workload.py``); ``set_status`` forces any of them.
- Deletes are soft: a deleted workload stays listed as ``deleted`` (T4); a second DELETE is a 404.
- ``GET /workloads`` filters by ``type``, ``name`` and ``project_id`` (T1 ``ListWorkloadsParams``).
- No rate limit is documented (T1 retries 429 without reading Retry-After); ``limit`` adds one
  for a test, answered ``{error, reason}`` like every other error.
"""

from __future__ import annotations

import itertools
import re
import time
import uuid
from typing import Any

from tests.fakes.cloud import FakeCloud

NAME = re.compile(r"^[a-z0-9-]{1,32}$")  # T4 (≤ 32), T2 (lowercase alphanumerics and hyphens)
FIELDS = {"name", "image", "resource_name", "type", "project_id", "ports", "ssh_keys", "envs", "commands", "args",
          "registry_auth", "volumes"}  # T1 CreateWorkloadRequest; anything else is refused (T4)


def bad(reason: str, error: str) -> tuple[int, dict]:
    return 400, {"error": error, "reason": reason}


class FakeTargon(FakeCloud):
    page_size = 2  # small pages, so that paging is exercised
    throttle_answer = ({}, '{"error": "too many requests", "reason": "RATE_LIMITED"}')

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.keys: dict[str, dict] = {}
        self.deleted: dict[str, dict] = {}
        self.refuse_deploys = 0  # the next deploys fail (no credits): the workload stays registered
        # GET /inventory: a JSON list of {name, spec{gpu_type, gpu_count, vcpu, memory (MB)}, cost_per_hour,
        # available (how many are free)} (T1 client/inventory.py); None: not served (404), as before
        self.inventory: list[dict] | None = None
        self._seq = itertools.count(1)

    def _page(self, items: list, query: dict) -> dict:
        start = int(query.get("cursor") or 0)
        end = start + self.page_size
        return {"items": items[start:end], "next_cursor": str(end) if end < len(items) else ""}

    def set_status(self, uid: str, status: str) -> None:
        self.machines[uid]["status"] = status

    def _status(self, w: dict) -> str:
        if w["status"] == "provisioning" and self.ready(w):
            env = {e["name"]: e["value"] for e in w["envs"]}
            self.boot(w, env.get("PUBLIC_KEY", ""))
            w["status"] = "running"
        return w["status"]

    def _create(self, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict):
            return bad("INVALID_JSON_BODY", "Failed to decode request body")
        unknown = sorted(set(body) - FIELDS)
        if unknown:
            return bad("INVALID_JSON_BODY", f"unknown field(s) {', '.join(unknown)}")
        if body.get("type") != "RENTAL" or not body.get("resource_name") or not body.get("image"):
            return bad("INVALID_WORKLOAD", "type, image and resource_name are required")
        if not NAME.match(str(body.get("name") or "")):
            return bad("INVALID_NAME", "name must be 1-32 lowercase letters, digits or hyphens")
        for p in body.get("ports") or []:
            if not isinstance(p.get("port"), int) or not 1024 <= p["port"] <= 65535:
                return bad("INVALID_PORT", f"port {p.get('port')} is outside 1024-65535")
            if p.get("protocol") not in ("TCP", "UDP", "SCTP") or p.get("routing") not in ("DIRECT", "PROXIED"):
                return bad("INVALID_PORT", "protocol or routing unknown")
        envs = body.get("envs") or []
        if not all(isinstance(e, dict) and set(e) == {"name", "value"} for e in envs):
            return bad("INVALID_ENVS", "envs are [{name, value}]")
        uid = f"wrk-{uuid.uuid4().hex[:10]}"
        self.machines[uid] = {"id": uid, "uid": uid, "name": body["name"], "status": "registered",
                              "resource_name": body["resource_name"], "ssh_keys": body.get("ssh_keys", []),
                              "ports": body.get("ports", []), "envs": envs, "created": time.time(),
                              "created_at": time.strftime("%Y-%m-%dT%H:%M:%S.123456789Z", time.gmtime()),
                              "project_id": body.get("project_id")}
        return 200, {"uid": uid, "name": "", "state": {"status": "registered", "message": "Workload registered, "
                     "awaiting deploy", "ready_replicas": 0, "total_replicas": 0}, "created_at": "0001-01-01T00:00:00Z"}

    def _deploy(self, uid: str) -> tuple[int, Any]:
        w = self.machines[uid]
        if self.refuse_deploys:
            self.refuse_deploys -= 1
            return 402, {"error": "insufficient credits", "reason": "INSUFFICIENT_CREDITS"}
        if w["status"] == "registered":
            w["status"], w["created"] = "provisioning", time.time()
        return 200, {"uid": w["uid"], "name": w["name"], "cost_per_hour": 2.4,
                     "state": {"status": w["status"], "message": "Deployment initiated"}}

    def _list(self, query: dict) -> list[dict]:
        out = []
        for w in list(self.machines.values()) + list(self.deleted.values()):
            if query.get("type") not in (None, "RENTAL") or query.get("name") not in (None, w["name"]):
                continue
            if query.get("project_id") not in (None, w["project_id"]):
                continue
            out.append({"uid": w["uid"], "name": w["name"], "resource": {"name": w["resource_name"]},
                        "state": {"status": self._status(w)}, "created_at": w["created_at"], "cost_per_hour": 2.4})
        return out

    def route(self, method: str, path: str, query: dict, body: Any) -> tuple[int, Any]:
        parts = [p for p in path.split("/") if p][2:]  # after /tha/v2
        if parts == ["ssh-keys"] and method == "GET":
            return 200, self._page(list(self.keys.values()), query)
        if parts == ["ssh-keys"] and method == "POST":
            uid = f"shk-{uuid.uuid4().hex[:8]}"
            self.keys[uid] = {"uid": uid, "name": body["name"], "public_key_raw": body["ssh_key"]}
            return 200, self.keys[uid]
        if parts == ["workloads"] and method == "POST":
            return self._create(body)
        if parts == ["workloads"] and method == "GET":
            return 200, self._page(self._list(query), query)
        if len(parts) == 3 and parts[0] == "workloads" and parts[2] == "deploy" and method == "POST":
            return self._deploy(parts[1])
        if len(parts) == 2 and parts[0] == "workloads" and method == "GET":
            w = self.machines[parts[1]]
            return 200, {"uid": w["uid"], "name": w["name"], "envs": w["envs"], "ports": w["ports"],
                         "resource": {"name": w["resource_name"]}, "state": {"status": self._status(w)}}
        if len(parts) == 3 and parts[0] == "workloads" and parts[2] == "state" and method == "GET":
            w = self.machines[parts[1]]
            status = self._status(w)
            urls = []
            if status == "running":
                urls = [{"port": p["port"], "url": f"http://127.0.0.1:{w['port']}"} for p in w["ports"]]
            return 200, {"uid": w["uid"], "workload_type": "RENTAL", "status": status, "message": status.title(),
                         "urls": urls}
        if len(parts) == 2 and parts[0] == "workloads" and method == "DELETE":
            if parts[1] not in self.machines:
                return 404, {"error": "workload not found", "reason": "NOT_FOUND"}
            self.evaporate(parts[1])
            return 200, {"uid": parts[1], "deleted": True}
        if parts == ["inventory"] and method == "GET" and self.inventory is not None:
            return 200, [i for i in self.inventory if query.get("gpu") != "true" or not isinstance(i, dict)
                         or i["spec"].get("gpu_count")]
        return 404, {"error": "not found", "reason": "NOT_FOUND"}

    def evaporate(self, machine_id: str) -> None:
        record = self.machines[machine_id]
        super().evaporate(machine_id)
        record.pop("server", None)
        self.deleted[machine_id] = dict(record, status="deleted")  # soft delete (T4)
