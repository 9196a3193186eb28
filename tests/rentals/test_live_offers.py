"""Live offers: every adapter with a market lists it (Targon /inventory, Lambda /instance-types,
RunPod's catalog, Vast.ai's search) as untrusted input; a pass merges it with the Provider's
catalog (a filter and price override) and the plan rents at the live price; ``reconcile offers``
prints the table, through the real command, against fakes on loopback."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from reconciler.rentals.inventory import Providers
from reconciler.rentals.providers.base import AdapterContext
from reconciler.rentals.providers.lambdacloud import LambdaAdapter
from reconciler.rentals.providers.targon import TargonAdapter
from reconciler.spec.load import DesiredState
from reconciler.spec.models.provider import Provider
from reconciler.spec.offers import effective_offers, gpu_matches
from tests.fakes.lambdacloud import FakeLambda
from tests.fakes.runpod import FakeRunpod
from tests.fakes.targon import FakeTargon
from tests.fakes.vastai import FakeVast
from tests.repo_helpers import make_repo, reconcile_cli, run_spec

TARGON_INVENTORY = [
    {"name": "h200-small", "display_name": "H200 x1", "type": "rental", "gpu": True,
     "spec": {"gpu_type": "H200", "gpu_count": 1, "vcpu": 24, "memory": 262144, "storage": 500},
     "cost_per_hour": 3.5, "available": 4},
    {"name": "h200-large", "display_name": "H200 x8", "type": "rental", "gpu": True,
     "spec": {"gpu_type": "H200", "gpu_count": 8, "vcpu": 192, "memory": 2097152, "storage": 4000},
     "cost_per_hour": 28.0, "available": 0},
    {"name": "cpu-only", "type": "rental", "gpu": False, "spec": {"gpu_count": 0, "vcpu": 8, "memory": 16384},
     "cost_per_hour": 0.2, "available": 9},
]


def doc(kind: str, url: str, offers: list | None = None, **spec) -> dict:
    body = {"type": kind, "endpoint": url, "credentials": f"{kind.upper()}_KEY", **spec}
    if offers is not None:
        body["offers"] = offers
    return {"apiVersion": "reconciler/v1", "kind": "Provider", "metadata": {"name": kind}, "spec": body}


def test_gpu_models_match_by_words() -> None:
    assert gpu_matches("H100 SXM", "h100") and gpu_matches("NVIDIA GeForce RTX 4090", "RTX 4090")
    assert not gpu_matches("A100 PCIe", "A10") and not gpu_matches(None, "H100") and gpu_matches(None, None)


def test_targon_inventory_is_read_without_a_key_and_bounded(tmp_path) -> None:
    fake = FakeTargon(tmp_path / "cloud", token="tg").start()
    try:
        fake.inventory = TARGON_INVENTORY + [{"name": "bad\x00", "spec": {"gpu_count": 1}, "cost_per_hour": 1,
                                              "available": 1}, "junk"]
        fake.authorized = lambda header: header == ""  # the inventory is public (T4): no key sent
        p = Provider.model_validate(doc("targon", fake.url + "/tha/v2"))
        a = TargonAdapter(p, AdapterContext(secret_source={}.get, state_dir=tmp_path / "s"))
        live = a.live_offers()
        assert [(o.resource, o.gpu_count, o.price_per_hour, o.available) for o in live] == [
            ("h200-small", 1, 3.5, True), ("h200-large", 8, 28.0, False)]  # gpu=true: no CPU rental
        assert live[0].memory_gb == 256 and live[0].cpu_count == 24 and live[0].gpu_type == "H200"
        # the catalog names one by id (older specs) and overrides its price
        p2 = Provider.model_validate(doc("targon", fake.url, [{"id": "h200-small", "price_per_hour": 3.0},
                                                              {"id": "h200-large", "price_per_hour": 20}]))
        [o] = effective_offers(p2, live)  # h200-large has none free
        assert (o.id, o.price_per_hour, o.gpu_count, o.gpu_type) == ("h200-small", 3.0, 1, "H200")
    finally:
        fake.close()


def test_lambda_instance_types_are_offers_per_region_with_capacity(tmp_path) -> None:
    fake = FakeLambda(tmp_path / "cloud", token="lk", ssh_port=22, rate_limits=False).start()
    try:
        fake.capacity = {"gpu_1x_a10": ["us-east-1", "us-west-1"], "gpu_8x_h100_sxm5": []}
        p = Provider.model_validate(doc("lambda", fake.url + "/api/v1"))
        a = LambdaAdapter(p, AdapterContext(secret_source={"LAMBDA_KEY": "lk"}.get, state_dir=tmp_path / "s"))
        live = a.live_offers()
        assert sorted((o.resource, o.region, o.available) for o in live) == [
            ("gpu_1x_a10", "us-east-1", True), ("gpu_1x_a10", "us-west-1", True), ("gpu_8x_h100_sxm5", None, False)]
        assert {o.price_per_hour for o in live} == {1.29}
        assert len({o.id for o in effective_offers(p, live)}) == 2  # no catalog: each available one
    finally:
        fake.close()


def test_a_pass_rents_a_live_offer_and_the_plan_names_its_price(tmp_path, monkeypatch) -> None:
    """A Lambda Provider without a catalog: the pass's offers come from /instance-types and the
    plan rents the cheapest at the live price; a listing that fails leaves the catalog as written."""
    fake = FakeLambda(tmp_path / "cloud", token="lk", ssh_port=22, rate_limits=False, boot_machines=False).start()
    try:
        repo = make_repo(tmp_path / "repo", templates={"rental-host": yaml.safe_dump(
            {"apiVersion": "reconciler/v1", "kind": "ExecutionTemplate", "id": "rental-host",
             "placement": {"kind": "rental"}, "launch_mode": {"kind": "host_process"}})})
        key = tmp_path / "id"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        (repo / "specs" / "providers").mkdir()
        (repo / "specs" / "providers" / "lambda.yaml").write_text(yaml.safe_dump(
            doc("lambda", fake.url + "/api/v1", ssh={"identity_file": str(key)})))
        (repo / "specs" / "runs" / "eval-llama-3-8b-mmlu-fewshot.yaml").write_text(
            run_spec("eval-llama-3-8b-mmlu-fewshot", ["true"], template="rental-host"))
        subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
        subprocess.run(["git", "-C", str(repo), "commit", "-qm", "lambda"], check=True)
        fake.capacity = {"gpu_1x_a10": ["us-west-1"]}
        env = {"LAMBDA_KEY": "lk", "RECONCILER_NAMESPACE": "test", "RECONCILER_PUSH": "false"}
        plan = reconcile_cli(repo, "plan", env=env)
        assert plan.returncode == 0, plan.stderr
        assert "renting lambda/gpu-1x-a10-x0-us-west-1-" in plan.stdout and "at 1.29/h" in plan.stdout, plan.stdout
        assert fake.calls("GET", "/api/v1/instance-types") == 1 and fake.calls("POST") == 0
    finally:
        fake.close()


def test_the_merged_offers_reach_the_pass_and_a_failed_listing_keeps_the_catalog(tmp_path) -> None:
    fake = FakeRunpod(tmp_path / "cloud", token="rp").start()
    try:
        p = Provider.model_validate(doc("runpod", fake.url, [{"id": "h100", "gpu_type": "H100", "gpu_count": 1},
                                                             {"id": "old", "resource": "gone", "gpu_count": 1,
                                                              "gpu_type": "X1", "price_per_hour": 1.0}]))
        providers = Providers(tmp_path, tmp_path / "state", {"RUNPOD_KEY": "rp"}.get)
        desired = DesiredState(providers={"runpod": p})
        providers.sync(desired)
        [o] = desired.providers["runpod"].spec.offers
        assert (o.id, o.resource, o.price_per_hour) == ("h100", "NVIDIA H100 80GB HBM3", 2.69)
        assert providers.get("runpod").provider.spec.offers == [o]  # what apply looks the offer up in
        assert p.spec.offers[0].price_per_hour is None  # the loaded spec itself is left alone
        fake.close()
        desired = DesiredState(providers={"runpod": p})
        providers.sync(desired)
        assert [x.id for x in desired.providers["runpod"].spec.offers] == ["old"]  # priced entries, as written
        assert "runpod" in providers.offer_errors
    finally:
        fake.close()


@pytest.fixture
def market(tmp_path):
    """A repository with four providers: RunPod and Vast.ai fakes, a Lambda that cannot be
    reached, and a local one with its catalog."""
    rp = FakeRunpod(tmp_path / "rp", token="rp-secret-token").start()
    vast = FakeVast(tmp_path / "vast", token="vast-secret-token").start()
    repo = make_repo(tmp_path / "repo")
    d = repo / "specs" / "providers"
    d.mkdir()
    fast = {"rateLimit": {"requestsPerSecond": 50, "burst": 20}}
    (d / "runpod.yaml").write_text(yaml.safe_dump(doc("runpod", rp.url, **fast)))
    (d / "vastai.yaml").write_text(yaml.safe_dump(doc("vastai", vast.url + "/api/v0", **fast)))
    (d / "lambda.yaml").write_text(yaml.safe_dump(doc("lambda", "http://127.0.0.1:9/api/v1", **fast)))
    (d / "local.yaml").write_text(yaml.safe_dump(
        {"apiVersion": "reconciler/v1", "kind": "Provider", "metadata": {"name": "local"},
         "spec": {"type": "local", "offers": [{"id": "cpu-small", "cpu_count": 2, "memory_gb": 4,
                                               "price_per_hour": 0.1}]}}))
    env = {"RUNPOD_KEY": "rp-secret-token", "VASTAI_KEY": "vast-secret-token", "LAMBDA_KEY": "lambda-secret-token"}
    yield repo, env, rp, vast
    rp.close()
    vast.close()


def test_reconcile_offers_prints_every_market_and_one_line_per_failed_provider(market) -> None:
    repo, env, rp, vast = market
    r = reconcile_cli(repo, "offers", env=env)
    assert r.returncode == 1, r.stderr  # lambda cannot be listed
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["PROVIDER", "GPU", "COUNT", "GPU", "MEM", "CPUS", "RAM", "REGION", "PRICE/H", "SPOT",
                                "AVAILABLE"]
    assert lines[1].split()[0] == "local" and "0.10" in lines[1]  # cheapest first
    assert any(line.startswith("vastai") and "RTX 4090" in line and "Finland, FI" in line for line in lines)
    assert any(line.startswith("runpod") and "H100 SXM" in line and " 8 " in line for line in lines)
    [err] = r.stderr.splitlines()
    assert err.startswith("provider lambda: offers unavailable:")
    for secret in env.values():
        assert secret not in r.stdout + r.stderr
    assert rp.calls("GET", "/v2/catalog/gpus") == 1 and rp.calls("POST") + rp.calls("PUT") == 0  # read-only
    assert vast.calls("PUT") == 0 and vast.calls("DELETE") == 0


def test_reconcile_offers_filters_and_json(market) -> None:
    repo, env, rp, vast = market
    r = reconcile_cli(repo, "offers", "--gpu", "rtx 4090", "--min-gpus", "2", "--max-price", "1.5", "--json", env=env)
    got = json.loads(r.stdout)
    assert {(o["provider"], o["gpu_count"], o["price_per_hour"]) for o in got["offers"]} == {("runpod", 2, 1.38)}
    assert set(got["provider_errors"]) == {"lambda"} and r.returncode == 1
    one = reconcile_cli(repo, "offers", "--provider", "vastai", "--gpu", "H100", env=env)
    assert one.returncode == 0 and one.stderr == "" and "H100 SXM" in one.stdout and "yes" in one.stdout
    assert "RTX" not in one.stdout and "runpod" not in one.stdout
    unknown = reconcile_cli(repo, "offers", "--provider", "nope", env=env)
    assert unknown.returncode == 2 and "provider 'nope' is not defined" in unknown.stderr
    bad = reconcile_cli(repo, "offers", "--max-price", "cheap", env=env)
    assert bad.returncode == 2 and "not a price" in bad.stderr


def test_a_run_is_rented_used_and_given_back_on_a_live_offer(tmp_path, monkeypatch) -> None:
    """A Lambda Provider without a catalog, through real passes: the run gets the live offer of
    the region with capacity at its live price, apply finds that offer, the run succeeds, and the
    machine is given back."""
    from tests.rentals.test_lambda import lambda_world
    from tests.world import run_spec as world_run_spec

    fake, w = lambda_world(tmp_path, monkeypatch, [])
    fake.capacity = {"gpu_1x_a10": ["us-west-1"], "gpu_1x_a100": []}
    try:
        w.add_run(world_run_spec("lambda-live-offer-eval-run", "rental-host", ["sh", "-c", "echo live"]))
        st = w.until("lambda-live-offer-eval-run", lambda s: s.phase == "Succeeded", timeout=60)
        assert st.handle.rental["offer"].startswith("gpu-1x-a10-x0-us-west-1-")
        assert st.handle.rental["price_per_hour"] == 1.29 and st.cost["price_per_hour"] == 1.29
        [inst] = [m for m in fake.requests if m == ("POST", "/api/v1/instance-operations/launch")]
        assert inst and fake.calls("GET", "/api/v1/instance-types") >= 1
        w.until("lambda-live-offer-eval-run", lambda s: not fake.machines)
    finally:
        w.cleanup()
        fake.close()


def test_the_offer_of_a_live_rental_stays_known_when_it_leaves_the_market(tmp_path) -> None:
    """A rental's offer is what the planner checks its GPUs and fit against: it must not vanish
    from the pass's offers because the provider has no more of it for sale."""
    from tests.rentals.test_runpod import NAME

    key = tmp_path / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    fake = FakeRunpod(tmp_path / "cloud", token="rp", boot_machines=False).start()
    try:
        p = Provider.model_validate(doc("runpod", fake.url, [{"id": "rtx", "gpu_type": "RTX 4090", "gpu_count": 1}],
                                        ssh={"identity_file": str(key), "image": "runpod/base:1"}))
        providers = Providers(tmp_path, tmp_path / "state", {"RUNPOD_KEY": "rp"}.get)
        desired = DesiredState(providers={"runpod": p})
        providers.sync(desired)
        [offer] = desired.providers["runpod"].spec.offers
        providers.get("runpod").provision(NAME, offer)
        rentals, errors = providers.observe("r-0123456789ab")
        assert not errors and [r.offer for r in rentals.values()] == ["rtx"]
        fake.gpus[0]["availability"] = "NONE"  # sold out
        desired = DesiredState(providers={"runpod": p})
        providers.sync(desired)
        assert [o.id for o in desired.providers["runpod"].spec.offers] == ["rtx"]
        assert desired.providers["runpod"].spec.offers[0].price_per_hour == 0.69
    finally:
        fake.close()
