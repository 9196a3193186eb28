"""A fake of Vast.ai's API (the subset the vastai adapter calls), for tests only.

Asks are offers of hosts; renting one (``PUT /asks/{id}/``) makes an instance that goes loading →
running after ``delay`` seconds, with a real sshd (tests/fakes/cloud.py) behind both its proxy
endpoint (``ssh_host``/``ssh_port``) and its direct one (``public_ipaddr`` + ``ports["22/tcp"]``),
trusting the account's SSH keys as they were when it was made; its sessions find the ask's GPUs
in a stand-in ``nvidia-smi`` (tests/fakes/gpus.py).

The published contract it enforces (shared/notes/provider-apis.md; github.com/vast-ai/vast-cli
``vastai/api/{instances,keys,offers,client}.py``, V1; https://docs.vast.ai/api-reference/rate-limits-and-errors, V2;
dstack and SkyPilot's Vast.ai backends, V3):
- ``POST /bundles/`` needs no key (gpuhunt searches without one, V3); ``type`` is ``on-demand``
  or ``bid``; offers ``{id, gpu_name, num_gpus, gpu_ram (MB), cpu_cores_effective, cpu_ram (MB),
  geolocation, dph_total, min_bid, rentable, rented}``; a rented ask is not listed.
- ``PUT /asks/{id}/``: ``client_id: "me"`` and ``image`` are required (V1 create); ``label`` is
  kept to 60 characters (dstack: "undocumented but names of len 60 work", V3); ``runtype`` is one
  of the CLI's values (V1 ``cli/commands/instances.py``); an ask already rented or unknown is
  refused; a ``price`` below the ask's ``min_bid`` leaves a stopped instance behind and answers
  ``success: false`` with its ``new_contract`` (V3 dstack).
- ``actual_status``: loading, running, exited, stopped, ... (V3 SkyPilot's map; ``set_status``
  forces one; ``outbid`` stops a spot instance as a higher bid would).
- ``DELETE /instances/{id}/`` of an unknown id: 404 ``{success: false, error: "no_such_instance"}`` (V3).
- 429 per endpoint and identity, plain text "API requests too frequent", no Retry-After (V2).
"""

from __future__ import annotations

import itertools
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from tests.fakes.cloud import FakeCloud
from tests.fakes.gpus import boot_with_gpus

RUNTYPES = {"ssh", "ssh_proxy", "ssh_direc ssh_proxy", "ssh_direct", "jupyter", "args"}
CREATE_FIELDS = {"client_id", "image", "disk", "label", "env", "onstart", "runtype", "price", "image_login", "args",
                 "args_str", "use_jupyter_lab", "jupyter_dir", "python_utf8", "lang_utf8", "template_hash_id",
                 "force", "cancel_unavail", "volume_info"}
LABEL_MAX = 60
ASKS = [
    {"id": 7001, "gpu_name": "RTX 4090", "num_gpus": 1, "gpu_ram": 24564, "cpu_cores_effective": 16, "cpu_ram": 64000,
     "geolocation": "Texas, US", "dph_total": 0.42, "min_bid": 0.21},
    {"id": 7002, "gpu_name": "H100 SXM", "num_gpus": 8, "gpu_ram": 81559, "cpu_cores_effective": 128,
     "cpu_ram": 1031000, "geolocation": "Quebec, CA", "dph_total": 19.9, "min_bid": 12.5},
    {"id": 7003, "gpu_name": "RTX 4090", "num_gpus": 1, "gpu_ram": 24564, "cpu_cores_effective": 8, "cpu_ram": 32000,
     "geolocation": "Finland, FI", "dph_total": 0.39, "min_bid": 0.18},
]


def refused(status: int, error: str, msg: str) -> tuple[int, dict]:
    return status, {"success": False, "error": error, "msg": msg}


class FakeVast(FakeCloud):
    throttle_answer = ({"Content-Type": "text/plain"}, "API requests too frequent endpoint threshold=1.5")

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.asks = {a["id"]: dict(a, rentable=True, rented=False) for a in ASKS}
        self.keys: list[dict] = []
        self.ids = itertools.count(31000001)
        self.local = threading.local()  # whether the request being routed carried the key
        self.bodies: list[dict] = []
        self.bindirs: list[Path] = []  # the nvidia-smi stand-ins' folders

    def boot(self, record: dict, public_key: str, port: int | None = None, host: str = "127.0.0.1"):
        """The instance's sshd, whose sessions find the ask's GPUs in nvidia-smi (tests/fakes/gpus.py)."""
        if not self.boot_machines:
            return super().boot(record, public_key, port, host)
        return boot_with_gpus(self, record, public_key, f"NVIDIA GeForce {record['gpu_name']}"
                              if "RTX" in record["gpu_name"] else f"NVIDIA {record['gpu_name']}",
                              record.get("gpu_ram") or 24564, record["num_gpus"], port, host)

    def close(self) -> None:
        super().close()
        for d in self.bindirs:
            shutil.rmtree(d, ignore_errors=True)

    def authorized(self, header: str) -> bool:
        # The search is open to all (V3); everything else needs the key: checked in route().
        self.local.ok = header == f"Bearer {self.token}"
        return True

    def set_status(self, iid: str, status: str) -> None:
        self.machines[iid]["actual_status"] = status

    def outbid(self, iid: str) -> None:
        inst = self.machines[iid]
        inst["actual_status"], inst["intended_status"], inst["status_msg"] = "stopped", "stopped", "outbid"

    def _create(self, ask_id: str, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict) or body.get("client_id") != "me" or not body.get("image"):
            return refused(400, "invalid_args", "client_id 'me' and image are required")
        extra = sorted(set(body) - CREATE_FIELDS)
        if extra:
            return refused(400, "invalid_args", f"unknown fields: {', '.join(extra)}")
        if len(str(body.get("label") or "")) > LABEL_MAX:
            return refused(400, "invalid_args", f"label longer than {LABEL_MAX}")
        if body.get("runtype", "ssh") not in RUNTYPES:
            return refused(400, "invalid_args", "unknown runtype")
        ask = self.asks.get(int(ask_id)) if ask_id.isdigit() else None
        if ask is None or ask["rented"]:
            return refused(404, "no_such_ask", f"ask {ask_id} is not available")
        iid = str(next(self.ids))
        bid = body.get("price")
        self.bodies.append(body)
        low = bid is not None and bid < ask["min_bid"]
        ask["rented"] = not low
        self.machines[iid] = {
            "id": int(iid), "label": body.get("label"), "gpu_ram": ask.get("gpu_ram"), "actual_status": "stopped" if low else "loading",
            "intended_status": "stopped" if low else "running", "image": body["image"], "created": time.time(),
            "start_date": time.time(), "gpu_name": ask["gpu_name"], "num_gpus": ask["num_gpus"],
            "dph_total": bid if bid is not None else ask["dph_total"], "ask": ask["id"],
            "extra_env": [[k, v] for k, v in (body.get("env") or {}).items()], "runtype": body.get("runtype"),
            "keys": [k["public_key"] for k in self.keys], "status_msg": ""}
        if low:
            return 200, {"success": False, "new_contract": int(iid), "error": "bid_too_low",
                         "msg": f"bid {bid} is below the ask's minimum {ask['min_bid']}"}
        return 200, {"success": True, "new_contract": int(iid)}

    def _instance(self, inst: dict) -> dict:
        if inst["actual_status"] == "loading" and self.ready(inst):
            self.boot(inst, "\n".join(inst["keys"]))
            inst["actual_status"] = "running"
        doc = {k: v for k, v in inst.items() if k not in ("created", "keys", "server", "port", "ask")}
        if inst["actual_status"] == "running":
            doc.update(ssh_host="127.0.0.1", ssh_port=inst["port"], public_ipaddr="127.0.0.1",
                       ports={"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(inst["port"])}]})
        return doc

    def _search(self, body: Any) -> tuple[int, Any]:
        kind = (body or {}).get("type", "on-demand")
        if kind not in ("on-demand", "bid", "reserved"):
            return refused(400, "invalid_args", "type is on-demand, bid or reserved")
        offers = [dict(a) for a in self.asks.values() if a["rentable"] and not a["rented"]]
        return 200, {"offers": sorted(offers, key=lambda a: a["dph_total"])[:int((body or {}).get("limit") or 64)]}

    def route(self, method: str, path: str, query: dict, body: Any) -> tuple[int, Any]:
        parts = [p for p in path.split("/") if p][2:]  # after /api/v0
        if parts == ["bundles"] and method == "POST":
            return self._search(body)
        if not getattr(self.local, "ok", False):
            return refused(401, "auth_error", "invalid api key")
        if parts == ["ssh"] and method == "GET":
            return 200, list(self.keys)
        if parts == ["ssh"] and method == "POST":
            self.keys.append({"id": len(self.keys) + 1, "public_key": body["ssh_key"]})
            return 200, {"success": True, "key": self.keys[-1]}
        if len(parts) == 2 and parts[0] == "asks" and method == "PUT":
            return self._create(parts[1], body)
        if parts == ["instances"] and method == "GET":
            return 200, {"instances": [self._instance(i) for i in self.machines.values()]}
        if len(parts) == 2 and parts[0] == "instances" and method == "DELETE":
            if parts[1] not in self.machines:
                return refused(404, "no_such_instance", "Instance not found")
            self.evaporate(parts[1])
            return 200, {"success": True}
        return refused(404, "not_found", "no such route")
