"""The targon adapter against a fake Targon API (tests/fakes/targon.py) whose machines are real
sshd servers: real HTTP calls, real SSH, and the provider's bad days (429 and 500 storms)."""

from __future__ import annotations

import subprocess
import time

import pytest
import yaml

from tests.fakes.targon import FakeTargon
from tests.infra.sshd import TEST_USER
from tests.rentals.conftest import RENTAL_TEMPLATES
from tests.world import TEMPLATES, World, remote_root, run_spec


@pytest.fixture
def targon(tmp_path, monkeypatch):
    fake = FakeTargon(tmp_path / "cloud", token="tg-test-token", delay=0.2).start()
    monkeypatch.setenv("TARGON_API_KEY", "tg-test-token")
    key = tmp_path / "id_rentals"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    TEMPLATES.update(RENTAL_TEMPLATES)
    w = World(tmp_path / "w")
    root = remote_root()
    doc = {"apiVersion": "reconciler/v1", "kind": "Provider", "metadata": {"name": "targon"},
           "spec": {"type": "targon", "endpoint": fake.url + "/tha/v2", "credentials": "TARGON_API_KEY",
                    "rateLimit": {"requestsPerSecond": 50, "burst": 10},
                    "offers": [{"id": "h200-small", "gpu_count": 0, "price_per_hour": 2.4}],
                    "ssh": {"user": TEST_USER, "identity_file": str(key), "image": "acme/sshd:1",
                            "workspace_root": root}}}
    (w.repo / "specs" / "providers").mkdir()
    (w.repo / "specs" / "providers" / "targon.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    w.commit("targon")
    w.roots.append(root)
    yield w, fake
    w.cleanup()
    fake.close()


def test_a_targon_rental_is_created_deployed_used_and_deleted(targon) -> None:
    w, fake = targon
    w.add_run(run_spec("targon-pretrain-small-t1", "rental-host", ["sh", "-c", "echo on-targon"]))
    st = w.until("targon-pretrain-small-t1", lambda s: s.phase == "Succeeded")
    uid = st.handle.rental["id"]
    assert uid.startswith("wrk-") and st.handle.machine == f"targon/{uid}"
    assert st.cost["price_per_hour"] == 2.4
    assert fake.calls("POST", "/tha/v2/workloads") == 2  # create + deploy, once
    assert fake.calls("POST", "/tha/v2/ssh-keys") == 1
    w.until("targon-pretrain-small-t1", lambda s: uid not in fake.machines)
    assert fake.calls("DELETE", f"/tha/v2/workloads/{uid}") == 1
    assert (w.bundle(st.handle.identity) / "artifacts" / "stdout.log").read_text() == "on-targon\n"


def test_429_storms_are_waited_out_and_500_storms_leave_the_run_waiting(targon) -> None:
    w, fake = targon
    w.add_run(run_spec("targon-pretrain-small-t2", "rental-host", ["true"]))
    fake.chaos.storm(500, 20)  # every try of this pass's inventory listing fails
    rec = w.reconciler()
    rec.run_pass()
    st = w.status("targon-pretrain-small-t2")
    assert st.phase == "Pending" and st.condition("Provisioned").reason == "ProviderUnavailable"
    assert "HTTP 500" in st.condition("Provisioned").message
    assert fake.machines == {}  # nothing asked for while the inventory is unknown
    fake.chaos.queue.clear()
    fake.chaos.storm(429, 3, {"Retry-After": "0.1"})
    fake.chaos.storm(429, 2)  # no Retry-After: backoff
    deadline = time.monotonic() + 30
    while (st := w.status("targon-pretrain-small-t2")).phase != "Succeeded" and time.monotonic() < deadline:
        rec.run_pass()  # one reconciler: its adapter's client counts what it met
    assert st.phase == "Succeeded"
    assert rec.providers.get("targon").client.throttled == 5 and fake.chaos.queue == []
    assert fake.calls("POST", "/tha/v2/workloads") == 2  # one rental: create + deploy


def test_a_run_is_still_followed_while_the_api_is_down_or_the_provider_spec_invalid(targon) -> None:
    w, fake = targon
    w.add_run(run_spec("targon-pretrain-small-t3", "rental-host", ["sleep", "60"]))
    st = w.until("targon-pretrain-small-t3", lambda s: s.phase == "Running")
    uid = st.handle.rental["id"]
    assert st.handle.rental["host"] == "127.0.0.1" and st.handle.rental["port"] == fake.machines[uid]["port"]
    rec = w.reconciler()
    fake.chaos.storm(500, 100)
    result = rec.run_pass()  # the inventory fails: the recorded endpoint is used
    assert result.world.provider_errors and result.world.machines[f"targon/{uid}"].reachable
    assert result.world.find("targon-pretrain-small-t3-g1-a1").alive
    assert result.plan.for_run("targon-pretrain-small-t3").action == "none"
    fake.chaos.queue.clear()
    path = w.repo / "specs" / "providers" / "targon.yaml"
    good = path.read_text()
    path.write_text(good.replace("type: targon", "type: targon\n  colour: blue"))  # unknown key: invalid
    w.commit("break the provider")
    result = rec.run_pass()
    assert "invalid" in result.world.provider_errors["targon"]
    assert result.world.find("targon-pretrain-small-t3-g1-a1").alive
    assert w.status("targon-pretrain-small-t3").phase == "Running"
    assert not [c for c in result.plan.changes if c.action == "release"] and uid in fake.machines
    path.write_text(good)
    w.commit("fix the provider")
    assert rec.run_pass().plan.for_run("targon-pretrain-small-t3").action == "none"
