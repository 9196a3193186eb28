"""The targon and lambda adapters, called directly, against fakes that enforce the providers'
published contracts (tests/fakes/targon.py, tests/fakes/lambdacloud.py say which and where from):
names that fit, the SSH port and key Targon accepts, Lambda's required region and missing
creation time, every documented state, capacity, rate limits, and creates whose answer is lost."""

from __future__ import annotations

import subprocess
import time

import pytest

from reconciler.core.errors import PermanentError, TemporaryError
from reconciler.rentals.providers.base import AdapterContext, OfferUnavailable
from reconciler.rentals.providers.http import ApiClient, TokenBucket
from reconciler.rentals.providers import lambdacloud
from reconciler.rentals.providers.lambdacloud import LambdaAdapter
from reconciler.rentals.providers.targon import TargonAdapter
from reconciler.spec.models.provider import Provider
from reconciler.spec.offers import parse_rental_name, provider_name, rental_name
from tests.fakes.lambdacloud import FakeLambda
from tests.fakes.targon import FakeTargon

NS = "r-0123456789ab"
NAME = rental_name(NS, "finetune-llama-3-8b-sweep-lr3e-4-g1-a1", 1)  # 60 characters


@pytest.fixture
def key(tmp_path):
    path = tmp_path / "id_rentals"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def provider(kind: str, url: str, key, **spec) -> Provider:
    body = {"type": kind, "endpoint": url, "credentials": "API_KEY",
            "offers": [{"id": "a10", "resource": "gpu_1x_a10", "gpu_count": 0, "price_per_hour": 1.29}],
            "ssh": {"identity_file": str(key), "image": "acme/sshd:1"}, **spec}
    return Provider.model_validate({"apiVersion": "reconciler/v1", "kind": "Provider",
                                    "metadata": {"name": kind}, "spec": body})


def ctx(tmp_path, token: str) -> AdapterContext:
    return AdapterContext(secret_source={"API_KEY": token}.get, state_dir=tmp_path / "state")


@pytest.fixture
def targon(tmp_path, key):
    fake = FakeTargon(tmp_path / "cloud", token="tg", delay=0.1).start()
    yield fake, TargonAdapter(provider("targon", fake.url + "/tha/v2", key), ctx(tmp_path, "tg"))
    fake.close()


@pytest.fixture
def lam(tmp_path, key):
    lambdacloud._LAUNCHES.clear()
    fake = FakeLambda(tmp_path / "cloud", token="lk", delay=0.1, ssh_port=22, boot_machines=False).start()
    yield fake, LambdaAdapter(provider("lambda", fake.url + "/api/v1", key), ctx(tmp_path, "lk"))
    fake.close()


def until(fn, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError("timed out")


def test_provider_names_fit_every_provider_and_are_stable() -> None:
    longest = rental_name("r-" + "f" * 12, "r" * 63 + "-g12-a9", 9)
    for name in (NAME, longest):
        p = provider_name(name)
        assert p == provider_name(name) and len(p) <= 32 and set(p) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")
    assert provider_name(NAME) != provider_name(rental_name(NS, "finetune-llama-3-8b-sweep-lr3e-4-g1-a1", 2))
    assert provider_name(NAME).split("-")[1] == provider_name(rental_name(NS, "other-run-g1-a1")).split("-")[1]


def test_targon_rental_named_by_hash_keyed_by_envs_on_port_2222(targon) -> None:
    fake, a = targon
    r = a.provision(NAME, a.provider.spec.offers[0])
    w = fake.machines[r.id]
    assert w["name"] == provider_name(NAME) and w["ports"][0]["port"] == 2222 and w["status"] == "provisioning"
    env = {e["name"]: e["value"] for e in w["envs"]}
    assert env["PUBLIC_KEY"].startswith("ssh-ed25519 ") and env["SSH_PORT"] == "2222"
    [got] = until(lambda: [x for x in a.inventory() if x.state == "running"])
    assert got.name == NAME and parse_rental_name(got.name).identity.startswith("finetune")
    assert got.host == "127.0.0.1" and got.port == w["port"] and got.created_at is not None
    # a new process (no name book): the name comes back from the workload's envs
    fresh = TargonAdapter(a.provider, AdapterContext(secret_source=a.ctx.secret_source,
                                                     state_dir=a.ctx.state_dir.parent / "other"))
    assert [x.name for x in fresh.inventory()] == [NAME]
    a.terminate(r.id)
    a.terminate(r.id)  # 404: gone already
    assert [x.state for x in a.inventory()] == ["terminated"]  # soft-deleted, still listed


def test_targon_refuses_a_port_below_1024(tmp_path, key) -> None:
    fake = FakeTargon(tmp_path / "cloud", token="tg").start()
    try:
        p = provider("targon", fake.url + "/tha/v2", key, ssh={"identity_file": str(key), "image": "x:1", "port": 22})
        with pytest.raises(PermanentError, match="1024"):
            TargonAdapter(p, ctx(tmp_path, "tg")).provision(NAME, p.spec.offers[0])
        assert fake.machines == {}
    finally:
        fake.close()


@pytest.mark.parametrize("how", ["drop", 502])
def test_targon_create_whose_answer_is_lost_is_adopted_not_repeated(targon, how) -> None:
    fake, a = targon
    fake.lose_answer("POST", "/tha/v2/workloads", how)
    r = a.provision(NAME, a.provider.spec.offers[0])
    assert list(fake.machines) == [r.id] and fake.requests.count(("POST", "/tha/v2/workloads")) == 1
    assert fake.machines[r.id]["status"] == "provisioning"  # the adopted workload was deployed
    assert a.provision(NAME, a.provider.spec.offers[0]).id == r.id  # asked again: found, not made twice
    assert len(fake.machines) == 1


def test_targon_registered_workload_is_deployed_again(targon) -> None:
    fake, a = targon
    fake.refuse_deploys = 1
    with pytest.raises(PermanentError, match="402"):
        a.provision(NAME, a.provider.spec.offers[0])
    [uid] = fake.machines
    assert fake.machines[uid]["status"] == "registered"
    a._deployed.clear()  # as after REDEPLOY_SECONDS
    [r] = a.inventory()
    assert r.name == NAME and fake.machines[uid]["status"] == "provisioning"


@pytest.mark.parametrize("status,state", [("stopped", "failed"), ("suspended", "failed"), ("error", "failed"),
                                          ("failed", "failed"), ("registered", "provisioning"),
                                          ("deleted", "terminated"), ("terminated", "terminated")])
def test_targon_every_documented_state_is_mapped(targon, status, state) -> None:
    fake, a = targon
    r = a.provision(NAME, a.provider.spec.offers[0])
    fake.set_status(r.id, status)
    a._deployed[r.id] = time.time()
    assert [x.state for x in a.inventory()] == [state]


def test_lambda_launch_sends_region_tags_and_a_short_name(lam) -> None:
    fake, a = lam
    r = a.provision(NAME, a.provider.spec.offers[0])  # the offer has no region: live capacity picks one
    inst = fake.machines[r.id]
    assert inst["region"] == {"name": "us-east-1"} and inst["name"] == provider_name(NAME)
    assert inst["tags"] == [{"key": "rc-rental", "value": NAME}] and r.created_at is not None
    [got] = a.inventory()
    assert got.name == NAME and abs(got.created_at - r.created_at) < 1e-6  # first seen, kept
    fresh = LambdaAdapter(a.provider, AdapterContext(secret_source=a.ctx.secret_source, state_dir=a.ctx.state_dir))
    assert fresh.inventory()[0].created_at == r.created_at  # across restarts (the state folder)


def test_lambda_no_capacity_is_this_offer_unavailable_now(lam) -> None:
    fake, a = lam
    fake.capacity = {"gpu_1x_a10": []}
    with pytest.raises(OfferUnavailable) as e:
        a.provision(NAME, a.provider.spec.offers[0])
    assert e.value.offer == "a10" and isinstance(e.value, TemporaryError) and fake.machines == {}


def test_lambda_insufficient_capacity_400_is_temporary(lam) -> None:
    fake, a = lam
    a._region = lambda offer: "us-south-1"  # capacity gone between the look-up and the launch
    with pytest.raises(OfferUnavailable):
        a.provision(NAME, a.provider.spec.offers[0])


@pytest.mark.parametrize("how", ["drop", 500])
def test_lambda_launch_whose_answer_is_lost_is_adopted(lam, how) -> None:
    fake, a = lam
    fake.lose_answer("POST", "/api/v1/instance-operations/launch", how)
    r = a.provision(NAME, a.provider.spec.offers[0])
    assert list(fake.machines) == [r.id] and fake.calls("POST", "/api/v1/instance-operations/launch") == 1


def test_lambda_preempted_is_lost(lam) -> None:
    fake, a = lam
    r = a.provision(NAME, a.provider.spec.offers[0])
    fake.set_status(r.id, "preempted")
    assert [x.state for x in a.inventory()] == ["failed"]


def test_lambda_default_rate_keeps_to_one_request_per_second(lam) -> None:
    fake, a = lam
    assert (a.client.bucket.rate, a.client.bucket.burst) == (1.0, 1)
    assert a.client.base == fake.url + "/api/v1" and lambdacloud.BASE == "https://cloud.lambda.ai/api/v1"
    for _ in range(4):
        a.inventory()
    assert fake.throttled == 0


def test_lambda_429_shape_is_waited_out(tmp_path) -> None:
    fake = FakeLambda(tmp_path / "cloud", token="lk", ssh_port=22).start()
    try:
        client = ApiClient("lambda", fake.url + "/api/v1", {"Authorization": "Bearer lk"}, TokenBucket(100, 100),
                           backoff=0.5)
        for _ in range(4):
            client.request("GET", "/instances")
        assert fake.throttled >= 1 and client.throttled == fake.throttled
    finally:
        fake.close()
