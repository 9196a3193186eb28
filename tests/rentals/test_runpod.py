"""The runpod adapter, called directly, against a fake of RunPod's REST v2 API that enforces the
published contract (tests/fakes/runpod.py says which and where from): the name and env it sends,
the account key set it keeps whole, every pod status, SSH over ``ssh.direct`` to a real sshd,
creates whose answer is lost, terminate twice, 429 with Retry-After, and the live catalog."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from reconciler.core.errors import PermanentError, TemporaryError
from reconciler.rentals.providers.base import AdapterContext, OfferUnavailable
from reconciler.rentals.providers.http import ApiClient, ApiError, TokenBucket
from reconciler.rentals.providers.runpod import RunpodAdapter
from reconciler.spec.models.provider import Offer, Provider
from reconciler.spec.offers import effective_offers, parse_rental_name, provider_name, rental_name
from tests.fakes.runpod import FakeRunpod

NS = "r-0123456789ab"
NAME = rental_name(NS, "finetune-qwen2-7b-lora-sweep-r16-g1-a1", 1)
RTX = {"id": "rtx4090", "resource": "NVIDIA GeForce RTX 4090", "gpu_type": "RTX 4090", "gpu_count": 1,
       "price_per_hour": 0.69}


@pytest.fixture
def key(tmp_path):
    path = tmp_path / "id_rentals"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def provider(url: str, key, offers=None, **spec) -> Provider:
    body = {"type": "runpod", "endpoint": url, "credentials": "RUNPOD_API_KEY",
            "offers": [RTX] if offers is None else offers,
            "ssh": {"identity_file": str(key), "image": "runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04"},
            **{"rateLimit": {"requestsPerSecond": 50, "burst": 20}, **spec}}
    return Provider.model_validate({"apiVersion": "reconciler/v1", "kind": "Provider",
                                    "metadata": {"name": "runpod"}, "spec": body})


@pytest.fixture
def rp(tmp_path, key):
    fake = FakeRunpod(tmp_path / "cloud", token="rpa_test", delay=0.1).start()
    ctx = AdapterContext(secret_source={"RUNPOD_API_KEY": "rpa_test"}.get, state_dir=tmp_path / "state")
    yield fake, RunpodAdapter(provider(fake.url, key), ctx)
    fake.close()


def until(fn, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError("timed out")


def test_a_pod_is_named_by_hash_reached_over_ssh_direct_and_terminated(rp) -> None:
    fake, a = rp
    fake.keys = ["ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ someone@else"]  # the account's own key stays
    r = a.provision(NAME, a.provider.spec.offers[0])
    body = fake.bodies[0]
    assert body["name"] == provider_name(NAME) and body["env"] == {"RECONCILER_RENTAL": NAME}
    assert body["ports"] == ["22/tcp"] and body["startSsh"] is True and body["gpu"] == {
        "id": "NVIDIA GeForce RTX 4090", "count": 1}
    assert len(fake.keys) == 2 and fake.keys[0].startswith("ssh-rsa")  # PUT sent the union
    [got] = until(lambda: [x for x in a.inventory() if x.state == "running"])
    assert got.name == NAME and parse_rental_name(got.name).identity.startswith("finetune-qwen2")
    assert got.host == "127.0.0.1" and got.port == fake.machines[r.id]["port"] and got.offer == "rtx4090"
    assert got.price_per_hour == 0.69 and got.created_at is not None
    out = subprocess.run(["ssh", "-i", str(a.provider.spec.ssh.identity_file), "-p", str(got.port), "-o",
                          "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
                          "-o", "ConnectTimeout=5", f"{fake.servers[0].user}@127.0.0.1", "echo on-the-pod"],
                         capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "on-the-pod", out.stderr
    # a new process (no name book): the name comes back from the pod's env
    fresh = RunpodAdapter(a.provider, AdapterContext(secret_source=a.ctx.secret_source,
                                                     state_dir=a.ctx.state_dir.parent / "other"))
    assert [x.name for x in fresh.inventory()] == [NAME]
    a.terminate(r.id)
    a.terminate(r.id)  # 404: gone already, success
    assert a.inventory() == [] and fake.calls("DELETE") == 2


@pytest.mark.parametrize("status,state", [("PROVISIONING", "provisioning"), ("STARTING", "provisioning"),
                                          ("EXITED", "failed"), ("ERROR", "failed"),
                                          ("TERMINATED", "terminated"), ("MIGRATING", "provisioning")])
def test_every_pod_status_is_mapped_and_an_unknown_one_is_never_running(rp, status, state) -> None:
    fake, a = rp
    r = a.provision(NAME, a.provider.spec.offers[0])
    fake.set_status(r.id, status)
    [got] = a.inventory()
    assert got.state == state and got.host is None
    if status == "MIGRATING":
        assert "unknown pod status" in got.message


def test_a_running_pod_without_22_tcp_published_is_not_running_yet(rp) -> None:
    fake, a = rp
    r = a.provision(NAME, a.provider.spec.offers[0])
    fake.machines[r.id]["ports"] = ["8888/http"]  # as if 22/tcp had no public port
    got = until(lambda: [x for x in a.inventory() if fake.machines[r.id]["status"] == "RUNNING"])
    assert got[0].state == "provisioning" and got[0].host is None


@pytest.mark.parametrize("how", ["drop", 502])
def test_a_create_whose_answer_is_lost_is_found_by_name_not_repeated(rp, how) -> None:
    fake, a = rp
    fake.lose_answer("POST", "/v2/pods", how)
    r = a.provision(NAME, a.provider.spec.offers[0])
    assert list(fake.machines) == [r.id] and fake.calls("POST", "/v2/pods") == 1
    assert a.provision(NAME, a.provider.spec.offers[0]).id == r.id  # asked again: found, not made twice
    assert len(fake.machines) == 1 and fake.calls("POST", "/v2/pods") == 1


def test_unknown_fields_spot_and_missing_image_are_refused(rp, tmp_path, key) -> None:
    fake, a = rp
    spot = Offer(id="rtx-spot", resource="NVIDIA GeForce RTX 4090", gpu_type="RTX 4090", gpu_count=1,
                 price_per_hour=0.3, spot=True)
    with pytest.raises(PermanentError, match="no interruptible"):
        a.provision(NAME, spot)
    bare = RunpodAdapter(provider(fake.url, key, ssh={"identity_file": str(key)}), a.ctx)
    with pytest.raises(PermanentError, match="ssh.image"):
        bare.provision(NAME, a.provider.spec.offers[0])
    status, doc = fake._create({"name": "x", "image": "i", "gpu": {"id": "NVIDIA GeForce RTX 4090"},
                                "interruptible": True})
    assert status == 400 and doc["errors"] == ["$: additional properties 'interruptible' not allowed"]
    assert fake.machines == {}


def test_no_stock_is_this_offer_unavailable_now(rp) -> None:
    fake, a = rp
    a100 = Offer(id="a100", resource="NVIDIA A100 80GB PCIe", gpu_type="A100", gpu_count=1, price_per_hour=1.64)
    with pytest.raises(OfferUnavailable) as e:
        a.provision(NAME, a100)
    assert e.value.offer == "a100" and isinstance(e.value, TemporaryError) and fake.machines == {}


def test_429_with_retry_after_is_waited_out(tmp_path) -> None:
    fake = FakeRunpod(tmp_path / "cloud", token="rpa_test").start()
    try:
        fake.limit(2.0, 2)
        client = ApiClient("runpod", fake.url, {"Authorization": "Bearer rpa_test"}, TokenBucket(100, 100))
        t0 = time.monotonic()
        for _ in range(4):
            client.request("GET", "/v2/pods")
        assert fake.throttled >= 1 and client.throttled == fake.throttled
        assert time.monotonic() - t0 >= 0.9  # Retry-After: 1 was honoured
    finally:
        fake.close()


def test_live_catalog_lists_each_gpu_by_count_and_the_catalog_filters_it(rp) -> None:
    fake, a = rp
    live = a.live_offers()
    rtx = [o for o in live if o.resource == "NVIDIA GeForce RTX 4090"]
    assert [o.gpu_count for o in rtx] == [1, 2, 4, 8] and rtx[1].price_per_hour == pytest.approx(1.38)
    assert all(o.available for o in rtx) and not any(o.available for o in live if o.resource.startswith("NVIDIA A100"))
    assert rtx[0].gpu_memory_gb == 24 and rtx[0].gpu_type == "RTX 4090" and not rtx[0].spot
    assert fake.requests[-1] == ("GET", "/v2/catalog/gpus")
    # no catalog: every available offer; a catalog entry by GPU model: the cheapest match, its id
    bare = provider(fake.url, "k", offers=[])
    assert {o.resource for o in effective_offers(bare, live)} == {"NVIDIA GeForce RTX 4090", "NVIDIA H100 80GB HBM3"}
    h100 = provider(fake.url, "k", offers=[{"id": "h100x8", "gpu_type": "H100", "gpu_count": 8}])
    [o] = effective_offers(h100, live)
    assert o.id == "h100x8" and o.resource == "NVIDIA H100 80GB HBM3" and o.price_per_hour == pytest.approx(21.52)


def test_a_hostile_catalog_is_bounded_and_parsed_strictly(rp) -> None:
    fake, a = rp
    fake.gpus = [{"id": "x\x1b[31m", "name": "evil", "memory": 24, "secure": True, "price": {"secure": 1},
                  "maxCount": {"secure": 1}, "availability": "HIGH"},
                 {"id": "NaN price", "name": "n", "memory": 24, "secure": True, "price": {"secure": "cheap"},
                  "maxCount": {"secure": 1}, "availability": "HIGH"},
                 {"id": "huge", "name": "H", "memory": 10 ** 9, "secure": True, "price": {"secure": 1e12},
                  "maxCount": {"secure": 1}, "availability": "HIGH"},
                 {"id": "ok", "name": "L4", "memory": 10 ** 9, "secure": True, "price": {"secure": 0.4},
                  "maxCount": {"secure": 10 ** 6}, "availability": "HIGH"}] + ["not a dict"] * 5
    live = a.live_offers()
    assert [(o.resource, o.gpu_count) for o in live] == [("ok", 1)]  # maxCount out of range: 1 only
    assert live[0].gpu_memory_gb is None  # 10^9 GB of VRAM is not believed


def test_a_run_on_a_live_runpod_offer_is_rented_gpu_checked_run_and_given_back(tmp_path, monkeypatch, key) -> None:
    """A RunPod Provider without a catalog, through real passes: the run asks for one RTX 4090;
    the pass rents the live offer at its live price, SSH reaches the pod over ssh.direct, the GPU
    check reads the pod's nvidia-smi (the fake's stand-in), the run succeeds and the pod is given
    back. Nothing in the repository names a price."""
    import yaml

    from tests.infra.sshd import TEST_USER
    from tests.rentals.conftest import RENTAL_TEMPLATES
    from tests.world import TEMPLATES, World, remote_root, run_spec

    fake = FakeRunpod(tmp_path / "cloud", token="rpa_test", delay=0.2).start()
    monkeypatch.setenv("RUNPOD_API_KEY", "rpa_test")
    TEMPLATES.update(RENTAL_TEMPLATES)
    w = World(tmp_path / "w")
    root = remote_root()
    w.roots.append(root)
    doc = {"apiVersion": "reconciler/v1", "kind": "Provider", "metadata": {"name": "runpod"},
           "spec": {"type": "runpod", "endpoint": fake.url, "credentials": "RUNPOD_API_KEY",
                    "rateLimit": {"requestsPerSecond": 50, "burst": 20},
                    "ssh": {"user": TEST_USER, "identity_file": str(key), "image": "runpod/base:0.6.2-cuda12.4",
                            "workspace_root": root}}}
    (w.repo / "specs" / "providers").mkdir()
    (w.repo / "specs" / "providers" / "runpod.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    w.commit("runpod")
    try:
        w.add_run(run_spec("runpod-lora-rtx4090-smoke", "rental-host", ["sh", "-c", "echo on-runpod"],
                           overrides={"resources": {"gpu_type": "RTX 4090", "gpu_count": 1}}))
        st = w.until("runpod-lora-rtx4090-smoke", lambda s: s.phase == "Succeeded", timeout=60)
        pid = st.handle.rental["id"]
        assert st.handle.machine == f"runpod/{pid}" and st.handle.rental["price_per_hour"] == 0.69
        assert st.handle.rental["offer"].startswith("nvidia-geforce-rtx-4090-x1-")
        gpus = st.condition("GpuVerified")
        assert gpus.status == "True" and gpus.reason == "Verified" and "RTX 4090" in gpus.message
        assert fake.calls("POST", "/v2/pods") == 1 and fake.bodies[0]["gpu"] == {"id": "NVIDIA GeForce RTX 4090",
                                                                                 "count": 1}
        assert (w.bundle(st.handle.identity) / "artifacts" / "stdout.log").read_text() == "on-runpod\n"
        w.until("runpod-lora-rtx4090-smoke", lambda s: pid not in fake.machines)
        assert fake.calls("DELETE", f"/v2/pods/{pid}") == 1
    finally:
        w.cleanup()
        fake.close()


def test_a_problem_body_shows_its_title_and_detail_not_raw_json(rp) -> None:
    """RunPod REST v2 errors are problem details ({title, status, detail, errors}): the message
    says "title: detail" and which field, never the JSON it came in."""
    fake, a = rp
    ghost = Offer(id="ghost", resource="NVIDIA Imaginary 1", gpu_type="Imaginary", gpu_count=1, price_per_hour=1.0)
    with pytest.raises(ApiError) as e:
        a.provision(NAME, ghost)
    assert e.value.status == 404
    assert str(e.value).endswith("HTTP 404: Not Found: gpu type 'NVIDIA Imaginary 1' not found"), str(e.value)
    assert "{" not in str(e.value)
    fake.chaos.storm(400, 1, {"Content-Type": "application/problem+json"},
                     json.dumps({"title": "Bad Request", "status": 400, "detail": "request validation failed",
                                 "errors": ["$: additional properties 'x' not allowed"]}))
    with pytest.raises(ApiError, match=r"HTTP 400: Bad Request: request validation failed; "
                                       r"\$: additional properties 'x' not allowed$"):
        a.client.request("GET", "/v2/pods")


def test_a_hostile_problem_body_is_bounded_and_printable(rp) -> None:
    """The body is the provider's (or whatever answers in its place): terminal escapes, line
    breaks and bidirectional overrides never reach a status or a log, and a huge detail is cut."""
    fake, a = rp
    fake.chaos.storm(400, 1, {"Content-Type": "application/problem+json"},
                     json.dumps({"title": "Bad\x1b[2J Request\u202e", "status": 400,
                                 "detail": "line one\nline two " + "x" * 5000, "errors": [{"nested": "object"}, 7]}))
    with pytest.raises(ApiError) as e:
        a.client.request("GET", "/v2/pods")
    shown = str(e.value).split("HTTP 400: ", 1)[1]
    assert shown.isprintable() and "\x1b" not in shown and "\u202e" not in shown and "\n" not in shown
    assert shown.startswith("Bad [2J Request : line one line two xxx") and len(shown) <= 300
    assert "nested" not in shown  # a structure inside errors is never rendered
