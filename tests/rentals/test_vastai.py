"""The vastai adapter, called directly, against a fake of Vast.ai's API that enforces the published
contract (tests/fakes/vastai.py says which and where from): renting a live ask under a short label,
the key on the account, SSH through the proxy endpoint and directly, every instance status, a
spot instance outbid, a failed bid's leftover, creates whose answer is lost, terminate twice,
plain-text 429s without Retry-After, and the offer search."""

from __future__ import annotations

import subprocess
import time

import pytest

from reconciler.core.errors import PermanentError, TemporaryError
from reconciler.rentals.providers.base import AdapterContext, OfferUnavailable
from reconciler.rentals.providers.http import ApiClient, TokenBucket
from reconciler.rentals.providers.vastai import VastAdapter
from reconciler.spec.models.provider import Offer, Provider
from reconciler.spec.offers import effective_offers, provider_name, rental_name
from tests.fakes.vastai import FakeVast

NS = "r-0123456789ab"
NAME = rental_name(NS, "pretrain-tinyllama-1b-ablation-7-g2-a1", 1)


@pytest.fixture
def key(tmp_path):
    path = tmp_path / "id_rentals"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def provider(url: str, key, offers=None, **spec) -> Provider:
    body = {"type": "vastai", "endpoint": url + "/api/v0", "credentials": "VAST_API_KEY",
            "offers": [{"id": "rtx4090", "gpu_type": "RTX 4090", "gpu_count": 1}] if offers is None else offers,
            "ssh": {"identity_file": str(key), "image": "vastai/base-image:cuda-12.4"},
            **{"rateLimit": {"requestsPerSecond": 50, "burst": 20}, **spec}}
    return Provider.model_validate({"apiVersion": "reconciler/v1", "kind": "Provider",
                                    "metadata": {"name": "vast"}, "spec": body})


def adapter(fake: FakeVast, key, tmp_path, **spec) -> VastAdapter:
    ctx = AdapterContext(secret_source={"VAST_API_KEY": "vast-test"}.get, state_dir=tmp_path / "state")
    return VastAdapter(provider(fake.url, key, **spec), ctx)


@pytest.fixture
def vast(tmp_path, key):
    fake = FakeVast(tmp_path / "cloud", token="vast-test", delay=0.1).start()
    yield fake, adapter(fake, key, tmp_path)
    fake.close()


def offer(a: VastAdapter) -> Offer:
    """The pass's offer for the catalog entry: the cheapest matching ask, as the inventory merges it."""
    [o] = effective_offers(a.provider, a.live_offers())
    return o


def until(fn, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError("timed out")


def ssh_echo(key, server, port: int) -> str:
    out = subprocess.run(["ssh", "-i", str(key), "-p", str(port), "-o", "StrictHostKeyChecking=no", "-o",
                          "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
                          f"{server.user}@127.0.0.1", "echo on-vast"], capture_output=True, text=True, timeout=30)
    return out.stdout.strip() or out.stderr


def test_the_cheapest_matching_ask_is_rented_labelled_and_reached_through_the_proxy(vast, key) -> None:
    fake, a = vast
    o = offer(a)
    assert o.id == "rtx4090" and o.resource == "7003" and o.price_per_hour == 0.39  # Finland's is cheaper
    r = a.provision(NAME, o)
    body = fake.bodies[0]
    assert body["label"] == provider_name(NAME) and len(body["label"]) <= 60 and body["runtype"] == "ssh_proxy"
    assert body["env"] == {"RECONCILER_RENTAL": NAME} and "price" not in body and fake.asks[7003]["rented"]
    assert [k["public_key"] for k in fake.keys] == [" ".join(open(f"{key}.pub").read().split()[:2])]
    [got] = until(lambda: [x for x in a.inventory() if x.state == "running"])
    assert got.name == NAME and got.id == r.id and got.offer == "rtx4090" and got.user == "root"
    assert (got.host, got.port) == ("127.0.0.1", fake.machines[r.id]["port"]) and got.created_at is not None
    assert ssh_echo(key, fake.servers[0], got.port) == "on-vast"
    fresh = VastAdapter(a.provider, AdapterContext(secret_source=a.ctx.secret_source,
                                                   state_dir=a.ctx.state_dir.parent / "other"))
    assert [x.name for x in fresh.inventory()] == [NAME]  # the name comes back from the instance's env
    a.terminate(r.id)
    a.terminate(r.id)  # no_such_instance: gone already, success
    assert a.inventory() == [] and fake.calls("DELETE") == 2


def test_direct_ssh_uses_the_public_ip_and_the_mapped_port(tmp_path, key) -> None:
    fake = FakeVast(tmp_path / "cloud", token="vast-test", delay=0.1).start()
    try:
        a = adapter(fake, key, tmp_path, vastai={"direct": True})
        r = a.provision(NAME, offer(a))
        assert fake.bodies[0]["runtype"] == "ssh_direc ssh_proxy"
        [got] = until(lambda: [x for x in a.inventory() if x.state == "running"])
        assert got.port == int(fake.machines[r.id]["port"]) and got.host == "127.0.0.1"
    finally:
        fake.close()


@pytest.mark.parametrize("status,state", [("loading", "provisioning"), ("created", "provisioning"),
                                          ("restarting", "provisioning"), ("exited", "failed"),
                                          ("stopped", "failed"), ("frozen", "failed"), ("offline", "failed"),
                                          ("unknown", "provisioning"), ("hibernating", "provisioning")])
def test_every_instance_status_is_mapped_and_an_unknown_one_is_never_running(vast, status, state) -> None:
    fake, a = vast
    r = a.provision(NAME, offer(a))
    fake.set_status(r.id, status)
    fake.machines[r.id]["created"] = time.time() + 3600  # the fake must not move it on by itself
    [got] = a.inventory()
    assert got.state == state and got.host is None
    if status == "hibernating":
        assert "unknown instance status" in got.message


def test_a_spot_instance_bids_and_an_outbid_one_is_lost(tmp_path, key) -> None:
    fake = FakeVast(tmp_path / "cloud", token="vast-test", delay=0.1).start()
    try:
        a = adapter(fake, key, tmp_path, offers=[{"id": "rtx4090-spot", "gpu_type": "RTX 4090", "gpu_count": 1,
                                                  "spot": True}])
        o = offer(a)
        assert o.spot and o.price_per_hour == 0.18  # the cheapest ask's min_bid
        r = a.provision(NAME, o)
        assert fake.bodies[0]["price"] == 0.18
        until(lambda: [x for x in a.inventory() if x.state == "running"])
        fake.outbid(r.id)
        [got] = a.inventory()
        assert got.state == "failed" and "stopped" in got.message and "outbid" in got.message
    finally:
        fake.close()


def test_a_bid_below_the_minimum_leaves_nothing_behind(vast) -> None:
    fake, a = vast
    low = Offer(id="low", resource="7001", gpu_type="RTX 4090", gpu_count=1, price_per_hour=0.01, spot=True)
    with pytest.raises(OfferUnavailable, match="below the ask's minimum"):
        a.provision(NAME, low)
    assert fake.machines == {} and fake.calls("DELETE") == 1  # the stopped leftover was given back


def test_an_ask_taken_meanwhile_is_this_offer_unavailable_now(vast) -> None:
    fake, a = vast
    o = offer(a)
    fake.asks[int(o.resource)]["rented"] = True  # someone else was quicker
    with pytest.raises(OfferUnavailable) as e:
        a.provision(NAME, o)
    assert e.value.offer == "rtx4090" and isinstance(e.value, TemporaryError) and fake.machines == {}


@pytest.mark.parametrize("how", ["drop", 503])
def test_a_create_whose_answer_is_lost_is_found_by_label_not_repeated(vast, how) -> None:
    fake, a = vast
    o = offer(a)
    fake.lose_answer("PUT", f"/api/v0/asks/{o.resource}/", how)
    r = a.provision(NAME, o)
    assert list(fake.machines) == [r.id] and fake.calls("PUT", "/api/v0/asks/") == 1
    assert a.provision(NAME, o).id == r.id and fake.calls("PUT", "/api/v0/asks/") == 1


def test_a_catalog_offer_that_is_not_an_ask_is_refused(vast) -> None:
    fake, a = vast
    with pytest.raises(PermanentError, match="ask"):
        a.provision(NAME, Offer(id="h100", gpu_type="H100", gpu_count=1, price_per_hour=2.0))
    assert fake.calls("PUT") == 0


def test_plain_text_429_without_retry_after_is_backed_off(tmp_path) -> None:
    fake = FakeVast(tmp_path / "cloud", token="vast-test").start()
    try:
        fake.limit(2.0, 1, "GET", "/api/v0/instances")
        client = ApiClient("vast", fake.url + "/api/v0", {"Authorization": "Bearer vast-test"},
                           TokenBucket(100, 100), backoff=0.3)
        for _ in range(3):
            client.request("GET", "/instances/", query={"owner": "me"})
        assert fake.throttled >= 1 and client.throttled == fake.throttled
    finally:
        fake.close()


def test_the_default_rate_is_one_call_per_second(tmp_path, key) -> None:
    p = provider("http://127.0.0.1:9", key)
    bare = Provider.model_validate(dict(p.model_dump(mode="json", exclude_none=True),
                                        spec={k: v for k, v in p.spec.model_dump(mode="json", exclude_none=True).items()
                                              if k != "rateLimit"}))
    a = VastAdapter(bare, AdapterContext(secret_source={}.get, state_dir=tmp_path / "s"))
    assert (a.client.bucket.rate, a.client.bucket.burst) == (1.0, 2)


def test_offer_search_needs_no_key_and_is_parsed_strictly(tmp_path, key) -> None:
    fake = FakeVast(tmp_path / "cloud", token="vast-test").start()
    try:
        a = VastAdapter(provider(fake.url, key), AdapterContext(secret_source={}.get, state_dir=tmp_path / "s"))
        fake.asks[9] = {"id": 9, "gpu_name": "RTX\n4090", "num_gpus": 1, "dph_total": 0.1, "min_bid": 0.05,
                        "rentable": True, "rented": False}
        fake.asks[10] = {"id": 10, "gpu_name": "H100", "num_gpus": 1000, "dph_total": 0.1, "min_bid": 0.05,
                         "rentable": True, "rented": False}
        fake.asks[11] = {"id": "11; rm -rf /", "gpu_name": "H100", "num_gpus": 1, "dph_total": 0.1, "min_bid": 0.05,
                         "rentable": True, "rented": False}
        live = a.live_offers()
        ondemand = sorted((o.resource, o.gpu_count, o.price_per_hour) for o in live if not o.spot)
        assert ondemand == [("7001", 1, 0.42), ("7002", 8, 19.9), ("7003", 1, 0.39), ("9", 1, 0.1)]
        nine = next(o for o in live if o.resource == "9")
        assert nine.gpu_type is None  # a newline in the GPU name is not believed
        assert {o.price_per_hour for o in live if o.spot and o.resource == "7002"} == {12.5}
        seven = next(o for o in live if o.resource == "7002" and not o.spot)
        assert seven.gpu_memory_gb == pytest.approx(79.6, abs=0.1) and seven.cpu_count == 128
        assert fake.calls("POST", "/api/v0/bundles/") == 2 and fake.calls("GET") == 0
        with pytest.raises(PermanentError, match="VAST_API_KEY"):
            a.inventory()  # everything else needs the key
    finally:
        fake.close()


def test_a_run_on_a_spot_vast_offer_is_rented_by_bid_gpu_checked_run_and_given_back(tmp_path, monkeypatch,
                                                                                     key) -> None:
    """Through real passes: a catalog entry that opts into spot for one RTX 4090; the pass rents
    the cheapest matching ask by bidding its minimum, SSH goes through the instance's proxy
    endpoint, the GPU check reads its nvidia-smi (the fake's stand-in), the run succeeds and the
    instance is given back."""
    import yaml

    from tests.infra.sshd import TEST_USER
    from tests.rentals.conftest import RENTAL_TEMPLATES
    from tests.world import TEMPLATES, World, remote_root, run_spec

    fake = FakeVast(tmp_path / "cloud", token="vast-test", delay=0.2).start()
    monkeypatch.setenv("VAST_API_KEY", "vast-test")
    TEMPLATES.update(RENTAL_TEMPLATES)
    w = World(tmp_path / "w")
    root = remote_root()
    w.roots.append(root)
    doc = {"apiVersion": "reconciler/v1", "kind": "Provider", "metadata": {"name": "vast"},
           "spec": {"type": "vastai", "endpoint": fake.url + "/api/v0", "credentials": "VAST_API_KEY",
                    "rateLimit": {"requestsPerSecond": 50, "burst": 20},
                    "offers": [{"id": "rtx4090-spot", "gpu_type": "RTX 4090", "gpu_count": 1, "spot": True}],
                    "ssh": {"user": TEST_USER, "identity_file": str(key), "image": "vastai/base-image:cuda-12.4",
                            "workspace_root": root}}}
    (w.repo / "specs" / "providers").mkdir()
    (w.repo / "specs" / "providers" / "vast.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    w.commit("vast")
    try:
        w.add_run(run_spec("vast-spot-qlora-rtx4090-smoke", "rental-host", ["sh", "-c", "echo on-vast"],
                           overrides={"resources": {"gpu_type": "RTX 4090", "gpu_count": 1}}))
        st = w.until("vast-spot-qlora-rtx4090-smoke", lambda s: s.phase == "Succeeded", timeout=60)
        iid = st.handle.rental["id"]
        assert st.handle.rental["offer"] == "rtx4090-spot" and st.handle.rental["price_per_hour"] == 0.18
        assert fake.bodies[0]["price"] == 0.18 and fake.machines.get(iid, {"ask": 7003})["ask"] == 7003
        gpus = st.condition("GpuVerified")
        assert gpus.status == "True" and "RTX 4090" in gpus.message
        assert (w.bundle(st.handle.identity) / "artifacts" / "stdout.log").read_text() == "on-vast\n"
        w.until("vast-spot-qlora-rtx4090-smoke", lambda s: iid not in fake.machines)
        assert fake.calls("PUT", "/api/v0/asks/") == 1 and fake.calls("DELETE", f"/api/v0/instances/{iid}/") == 1
    finally:
        w.cleanup()
        fake.close()
