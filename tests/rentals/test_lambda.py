"""The lambda adapter against a fake Lambda Cloud API (tests/fakes/lambdacloud.py) whose
instances are real sshd servers on their own loopback addresses."""

from __future__ import annotations

import subprocess

import yaml

from tests.fakes.lambdacloud import FakeLambda
from tests.infra._proc import free_port
from tests.infra.sshd import TEST_USER
from tests.rentals.conftest import RENTAL_TEMPLATES
from tests.world import TEMPLATES, World, remote_root, run_spec


def lambda_world(tmp_path, monkeypatch, offers: list[dict], **fake_kw) -> tuple[FakeLambda, World]:
    """A repository with a Lambda Provider of ``offers`` on a fake Lambda API whose instances are
    real sshd servers on a loopback address."""
    port = free_port("127.0.0.2")
    fake = FakeLambda(tmp_path / "cloud", token="lambda-key", delay=0.2, ssh_port=port, **fake_kw).start()
    monkeypatch.setenv("LAMBDA_API_KEY", "lambda-key")
    key = tmp_path / "id_rentals"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    TEMPLATES.update(RENTAL_TEMPLATES)
    w = World(tmp_path / "w")
    root = remote_root()
    w.roots.append(root)
    doc = {"apiVersion": "reconciler/v1", "kind": "Provider", "metadata": {"name": "lambda"},
           "spec": {"type": "lambda", "endpoint": fake.url + "/api/v1", "credentials": "LAMBDA_API_KEY",
                    "offers": offers,
                    "ssh": {"user": TEST_USER, "port": port, "identity_file": str(key), "workspace_root": root}}}
    (w.repo / "specs" / "providers").mkdir()
    (w.repo / "specs" / "providers" / "lambda.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    w.commit("lambda")
    return fake, w


A10 = {"id": "a10", "resource": "gpu_1x_a10", "region": "us-east-1", "gpu_count": 0, "price_per_hour": 1.29}


def test_a_lambda_instance_is_launched_used_and_terminated(tmp_path, monkeypatch) -> None:
    fake, w = lambda_world(tmp_path, monkeypatch, [A10])
    try:
        w.add_run(run_spec("lambda-finetune-llama-8b-l1", "rental-host", ["sh", "-c", "echo on-lambda"]))
        fake.chaos.storm(429, 2, body="API requests too frequent")  # Lambda: no Retry-After
        st = w.until("lambda-finetune-llama-8b-l1", lambda s: s.phase == "Succeeded", timeout=40)
        iid = st.handle.rental["id"]
        assert st.handle.machine == f"lambda/{iid}" and st.cost["price_per_hour"] == 1.29
        assert fake.calls("POST", "/api/v1/instance-operations/launch") == 1
        w.until("lambda-finetune-llama-8b-l1", lambda s: iid not in fake.machines)
        assert fake.calls("POST", "/api/v1/instance-operations/terminate") == 1
        assert (w.bundle(st.handle.identity) / "artifacts" / "stdout.log").read_text() == "on-lambda\n"
    finally:
        w.cleanup()
        fake.close()


def test_an_offer_without_capacity_is_set_aside_and_the_run_gets_the_next_one(tmp_path, monkeypatch) -> None:
    """Lambda answers a launch where the type has no capacity with a 400 (insufficient-capacity):
    not the spec's fault, so the run is not failed; the offer is set aside and the next pass rents
    the next offer that fits."""
    fake, w = lambda_world(tmp_path, monkeypatch, [A10, dict(A10, id="a100", resource="gpu_1x_a100",
                                                             price_per_hour=1.79)])
    fake.capacity = {"gpu_1x_a10": [], "gpu_1x_a100": ["us-east-1"]}
    try:
        w.add_run(run_spec("lambda-capacity-fallback-run", "rental-host", ["sh", "-c", "echo on-a100"]))
        st = w.until("lambda-capacity-fallback-run", lambda s: s.phase == "Succeeded", timeout=60)
        assert st.handle.rental["offer"] == "a100"
        assert (w.bundle(st.handle.identity) / "artifacts" / "stdout.log").read_text() == "on-a100\n"
        # One machine was made, the one with capacity; the run was never failed on the way.
        assert fake.calls("POST", "/api/v1/instance-operations/terminate") <= 1
        assert [t.phase for t in st.history].count("Failed") == 0
        w.until("lambda-capacity-fallback-run", lambda s: not fake.machines)
    finally:
        w.cleanup()
        fake.close()
