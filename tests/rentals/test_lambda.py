"""The lambda adapter against a fake Lambda Cloud API (tests/fakes/lambdacloud.py) whose
instances are real sshd servers on their own loopback addresses."""

from __future__ import annotations

import subprocess

import yaml

from tests.fakes.lambdacloud import FakeLambda
from tests.infra._proc import free_port
from tests.rentals.conftest import RENTAL_TEMPLATES
from tests.world import TEMPLATES, World, remote_root, run_spec


def test_a_lambda_instance_is_launched_used_and_terminated(tmp_path, monkeypatch) -> None:
    port = free_port("127.0.0.2")
    fake = FakeLambda(tmp_path / "cloud", token="lambda-key", delay=0.2, ssh_port=port).start()
    monkeypatch.setenv("LAMBDA_API_KEY", "lambda-key")
    key = tmp_path / "id_rentals"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    TEMPLATES.update(RENTAL_TEMPLATES)
    w = World(tmp_path / "w")
    root = remote_root()
    w.roots.append(root)
    doc = {"apiVersion": "reconciler/v1", "kind": "Provider", "metadata": {"name": "lambda"},
           "spec": {"type": "lambda", "endpoint": fake.url + "/api/v1", "credentials": "LAMBDA_API_KEY",
                    "rateLimit": {"requestsPerSecond": 20, "burst": 5},
                    "offers": [{"id": "a10", "resource": "gpu_1x_a10", "region": "us-east-1", "gpu_count": 0,
                                "price_per_hour": 1.29}],
                    "ssh": {"user": "rctest", "port": port, "identity_file": str(key), "workspace_root": root}}}
    (w.repo / "specs" / "providers").mkdir()
    (w.repo / "specs" / "providers" / "lambda.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    w.commit("lambda")
    try:
        w.add_run(run_spec("l1", "rental-host", ["sh", "-c", "echo on-lambda"]))
        fake.chaos.storm(429, 2, body="API requests too frequent")  # Lambda: no Retry-After
        st = w.until("l1", lambda s: s.phase == "Succeeded", timeout=40)
        iid = st.handle.rental["id"]
        assert st.handle.machine == f"lambda/{iid}" and st.cost["price_per_hour"] == 1.29
        assert fake.calls("POST", "/api/v1/instance-operations/launch") == 1
        w.until("l1", lambda s: iid not in fake.machines)
        assert fake.calls("POST", "/api/v1/instance-operations/terminate") == 1
        assert (w.bundle(st.handle.identity) / "artifacts" / "stdout.log").read_text() == "on-lambda\n"
    finally:
        w.cleanup()
        fake.close()
