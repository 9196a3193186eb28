"""A fake of RunPod's REST v2 API (the subset the runpod adapter calls), for tests only.

Pods go PROVISIONING → RUNNING after ``delay`` seconds; only then is ``ssh.direct`` published, as
``127.0.0.1:<port>`` of a real sshd started for the pod (see tests/fakes/cloud.py) that trusts
the pod's ``PUBLIC_KEY`` and nothing else, and whose sessions find the pod's GPUs in a stand-in
``nvidia-smi`` (tests/fakes/gpus.py).

The published contract it enforces (RunPod REST v2 OpenAPI, github.com/runpod/docs
``api-reference-v2/openapi.json``; shared/notes/provider-apis.md, R1):
- ``CreatePodRequest``: ``name`` is required with at least 1 character and need not be unique;
  ``image`` is required unless ``templateId`` is set; exactly one of ``gpu`` and ``cpu``; ``gpu.id``
  is required and ``gpu.count`` ≥ 1; properties the schema does not name are refused
  (``unevaluatedProperties: false``), as 400 ``application/problem+json`` ``{title, status,
  detail, errors: ["$: additional properties 'x' not allowed"]}`` (ErrorResponse).
- ``startSsh`` puts the account's registered keys into ``env.PUBLIC_KEY`` unless the request sets
  one; with no key registered the pod has no SSH access. ``PUT /v2/account/ssh-keys`` replaces the
  whole set (``additionalProperties: false``; each key ``^(ssh|ecdsa|sk)-[^\\s]+ [^\\s]+...``).
- ``ssh.direct`` is null unless ``22/tcp`` is in ``ports`` and the pod is running (PodSsh).
- PodStatus is PROVISIONING, STARTING, RUNNING, EXITED, ERROR or TERMINATED (``set_status``
  forces one); ``cost`` is 0 when EXITED or TERMINATED.
- ``DELETE /v2/pods/{id}``: 204 without a body; 404 when the pod is not there.
- ``GET /v2/catalog/gpus``: ``include=AVAILABILITY`` needs ``product`` (400 either way, the
  GpuProductFilter parameter); GpuType ``{id, name, memory, secure, community, price{secure,
  community}, maxCount{secure, community}, availability}``.
- 429: ``Retry-After`` (seconds) with a problem+json body (TooManyRequestsError).
- A create of a GPU type without stock: the OpenAPI says only that such a request "yields a
  capacity error"; the fake answers 400 with "no capacity" in the detail.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from tests.fakes.cloud import FakeCloud
from tests.fakes.gpus import boot_with_gpus

CREATE_FIELDS = {"name", "cloud", "cpu", "dataCenterIds", "globalNetworking", "gpu", "mounts", "startJupyter",
                 "startSsh", "templateId", "image", "env", "ports", "disk", "args", "registry"}
GPU_FIELDS = {"id", "count", "allowedCudaVersions", "minCudaVersion"}
KEY = re.compile(r"^(ssh|ecdsa|sk)-[^\s]+ [^\s]+([ \t][^\n\r]*)?$")
PORT = re.compile(r"^\d{1,5}/(tcp|http)$")
GPUS = [
    {"id": "NVIDIA GeForce RTX 4090", "name": "RTX 4090", "pool": "ADA_24", "manufacturer": "Nvidia", "memory": 24,
     "secure": True, "community": True, "price": {"secure": 0.69, "community": 0.34},
     "maxCount": {"secure": 8, "community": 4}, "availability": "HIGH"},
    {"id": "NVIDIA H100 80GB HBM3", "name": "H100 SXM", "pool": "HOPPER_141", "manufacturer": "Nvidia", "memory": 80,
     "secure": True, "community": False, "price": {"secure": 2.69, "community": 0},
     "maxCount": {"secure": 8, "community": 0}, "availability": "LOW"},
    {"id": "NVIDIA A100 80GB PCIe", "name": "A100 PCIe", "pool": "AMPERE_80", "manufacturer": "Nvidia", "memory": 80,
     "secure": True, "community": True, "price": {"secure": 1.64, "community": 1.19},
     "maxCount": {"secure": 8, "community": 8}, "availability": "NONE"},
]


def problem(status: int, title: str, detail: str, errors: list[str] | None = None) -> tuple[int, dict]:
    doc = {"title": title, "status": status, "detail": detail}
    if errors:
        doc["errors"] = errors
    return status, doc


class FakeRunpod(FakeCloud):
    throttle_answer = ({"Retry-After": "1", "Content-Type": "application/problem+json"},
                       json.dumps({"title": "Too Many Requests", "status": 429,
                                   "detail": "rate limit exceeded for the minute window"}))

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.keys: list[str] = []
        self.gpus = [dict(g) for g in GPUS]
        self.bodies: list[dict] = []  # every accepted create body
        self.bindirs: list[Path] = []  # the nvidia-smi stand-ins' folders

    def set_status(self, pid: str, status: str) -> None:
        self.machines[pid]["status"] = status

    def boot(self, record: dict, public_key: str, port: int | None = None, host: str = "127.0.0.1"):
        """The pod's sshd, whose sessions find the pod's GPUs in nvidia-smi (tests/fakes/gpus.py)."""
        if not self.boot_machines:
            return super().boot(record, public_key, port, host)
        gpu = next((g for g in self.gpus if isinstance(g, dict) and g["id"] == record["gpu"]["id"]), {})
        return boot_with_gpus(self, record, public_key, gpu.get("id", "NVIDIA GPU"), int(gpu.get("memory", 24)) * 1024,
                              record["gpu"]["count"], port, host)

    def close(self) -> None:
        super().close()
        for d in self.bindirs:
            shutil.rmtree(d, ignore_errors=True)

    def _validate(self, body: Any) -> tuple[int, dict] | None:
        if not isinstance(body, dict):
            return problem(400, "Bad Request", "the body is not an object")
        extra = sorted(set(body) - CREATE_FIELDS)
        if extra:
            return problem(400, "Bad Request", "request validation failed",
                           [f"$: additional properties '{k}' not allowed" for k in extra])
        if not isinstance(body.get("name"), str) or not body["name"]:
            return problem(400, "Bad Request", "request validation failed", ["$.name: minLength 1"])
        if not body.get("image") and not body.get("templateId"):
            return problem(400, "Bad Request", "image is required unless templateId is set")
        if ("gpu" in body) == ("cpu" in body):
            return problem(400, "Bad Request", "exactly one of gpu or cpu must be set")
        gpu = body.get("gpu") or {}
        if set(gpu) - GPU_FIELDS or not gpu.get("id") or not isinstance(gpu.get("count", 1), int) or \
                gpu.get("count", 1) < 1:
            return problem(400, "Bad Request", "request validation failed", ["$.gpu: invalid"])
        if any(not isinstance(p, str) or not PORT.match(p) for p in body.get("ports") or []):
            return problem(400, "Bad Request", "ports are port/protocol, e.g. 22/tcp")
        return None

    def _create(self, body: Any) -> tuple[int, Any]:
        bad = self._validate(body)
        if bad is not None:
            return bad
        gpu = next((g for g in self.gpus if g["id"] == body["gpu"]["id"]), None)
        if gpu is None:
            return problem(404, "Not Found", f"gpu type {body['gpu']['id']!r} not found")
        if gpu["availability"] == "NONE":
            return problem(400, "Bad Request", f"no capacity for {gpu['id']} in the requested configuration")
        env = dict(body.get("env") or {})
        if body.get("startSsh") and "PUBLIC_KEY" not in env and self.keys:
            env["PUBLIC_KEY"] = "\n".join(self.keys)
        pid = uuid.uuid4().hex[:14]
        cloud = body.get("cloud", "SECURE")
        count = body["gpu"].get("count", 1)
        self.bodies.append(body)
        self.machines[pid] = {
            "id": pid, "name": body["name"], "status": "PROVISIONING", "image": body["image"], "env": env,
            "ports": list(body.get("ports") or []), "gpu": {"id": gpu["id"], "count": count}, "cloud": cloud,
            "created": time.time(), "createdAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "price": gpu["price"][cloud.lower()] * count}
        return 201, self._pod(self.machines[pid])

    def _pod(self, pod: dict) -> dict:
        if pod["status"] in ("PROVISIONING", "STARTING") and self.ready(pod):
            self.boot(pod, pod["env"].get("PUBLIC_KEY", ""))
            pod["status"] = "RUNNING"
        running = pod["status"] == "RUNNING"
        direct = None
        if running and "22/tcp" in pod["ports"]:
            direct = {"host": "127.0.0.1", "port": pod["port"], "username": "root",
                      "command": f"ssh root@127.0.0.1 -p {pod['port']}"}
        proxy = {"host": "ssh.runpod.io", "port": 22, "username": f"{pod['id']}-64411eb2",
                 "command": f"ssh {pod['id']}-64411eb2@ssh.runpod.io"}
        return {"id": pod["id"], "name": pod["name"], "status": pod["status"], "image": pod["image"],
                "env": pod["env"], "ports": pod["ports"], "gpu": pod["gpu"], "cloud": pod["cloud"],
                "cost": pod["price"] if pod["status"] not in ("EXITED", "TERMINATED") else 0.0,
                "createdAt": pod["createdAt"], "startedAt": pod["createdAt"] if running else None,
                "ssh": {"proxy": proxy, "direct": direct}}

    def _catalog(self, query: dict) -> tuple[int, Any]:
        if ("include" in query) != ("product" in query):
            return problem(400, "Bad Request", "product is required with include=AVAILABILITY, and valid only with it")
        gpus = []
        for g in self.gpus:  # a test may plant entries that are not objects: served as they are
            gpus.append({k: v for k, v in g.items() if k != "availability" or "include" in query}
                        if isinstance(g, dict) else g)
        return 200, {"gpus": gpus}

    def route(self, method: str, path: str, query: dict, body: Any) -> tuple[int, Any]:
        parts = [p for p in path.split("/") if p]
        if parts == ["v2", "account", "ssh-keys"] and method == "GET":
            return 200, {"keys": list(self.keys)}
        if parts == ["v2", "account", "ssh-keys"] and method == "PUT":
            if not isinstance(body, dict) or set(body) != {"keys"} or \
                    any(not isinstance(k, str) or not KEY.match(k) for k in body["keys"]):
                return problem(422, "Unprocessable Entity", "keys: a list of authorized_keys lines")
            self.keys = list(body["keys"])
            return 200, {"keys": list(self.keys)}
        if parts == ["v2", "pods"] and method == "POST":
            return self._create(body)
        if parts == ["v2", "pods"] and method == "GET":
            return 200, {"pods": [self._pod(p) for p in self.machines.values()]}
        if len(parts) == 3 and parts[:2] == ["v2", "pods"] and method == "GET":
            if parts[2] not in self.machines:
                return problem(404, "Not Found", "pod not found")
            return 200, self._pod(self.machines[parts[2]])
        if len(parts) == 3 and parts[:2] == ["v2", "pods"] and method == "DELETE":
            if parts[2] not in self.machines:
                return problem(404, "Not Found", "pod not found")
            self.evaporate(parts[2])
            return 204, None
        if parts == ["v2", "catalog", "gpus"] and method == "GET":
            return self._catalog(query)
        return problem(404, "Not Found", "no such route")
