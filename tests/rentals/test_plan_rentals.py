"""The rental half of the planner, pure: offers chosen, limits and budget, warm rentals, the
sweep; and validation of what no offer can hold. From fixtures: no provider, no SSH."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from reconciler.core.observed import ObservedMachine, ObservedRental, ObservedWorld
from reconciler.spec.offers import parse_rental_name, rental_name
from reconciler.core.plan import PlanSettings
from reconciler.planner.make import make_plan
from reconciler.planner.render import text
from reconciler.spec.load import load_tree
from reconciler.core.runstatus import Handle, RunStatus

NOW = 1_800_000_000.0
OFFERS = [{"id": "a10", "gpu_type": "A10", "gpu_count": 1, "price_per_hour": 0.75},
          {"id": "h100", "gpu_type": "H100", "gpu_count": 1, "gpu_memory_gb": 80, "price_per_hour": 2.5},
          {"id": "h100x2", "gpu_type": "H100", "gpu_count": 2, "price_per_hour": 2.5}]


def repo(tmp_path: Path, runs: dict[str, dict], providers: dict[str, dict] | None = None) -> Path:
    (tmp_path / "execution_templates").mkdir()
    (tmp_path / "execution_templates" / "rent.yaml").write_text(yaml.safe_dump({
        "apiVersion": "reconciler/v1", "kind": "ExecutionTemplate", "id": "rent", "placement": {"kind": "rental"},
        "launch_mode": {"kind": "host_process"}, "allow_overrides": ["target", "resources"]}))
    for sub, docs in (("runs", runs), ("providers", providers or {"cloud": {}})):
        (tmp_path / "specs" / sub).mkdir(parents=True)
        for name, body in docs.items():
            if sub == "runs":
                doc = {"apiVersion": "reconciler/v1", "kind": "Run", "metadata": {"name": name},
                       "spec": {"template": "rent", "task": {"type": "command", "argv": ["true"]}, **body}}
            else:
                doc = {"apiVersion": "reconciler/v1", "kind": "Provider", "metadata": {"name": name},
                       "spec": {"type": "command", "offers": OFFERS,
                                "command": {"provision": ["p"], "inventory": ["i"], "terminate": ["t"]}, **body}}
            (tmp_path / "specs" / sub / f"{name}.yaml").write_text(yaml.safe_dump(doc))
    return tmp_path


def gpus(n: int, t: str) -> dict:
    return {"overrides": {"resources": {"gpu_type": t, "gpu_count": n}}}


def plan(root: Path, world: ObservedWorld | None = None, previous=None, **settings):
    desired = load_tree(root)
    assert not desired.diagnostics, [d.text() for d in desired.diagnostics]
    return make_plan(desired, world or ObservedWorld(at=NOW), previous or {}, NOW,
                     PlanSettings(namespace="ns", **settings))


def test_the_cheapest_fitting_offer_wins_and_ties_go_to_fewer_gpus(tmp_path) -> None:
    root = repo(tmp_path, {"small": gpus(1, "h100"), "any": {}, "pair": gpus(2, "H100")})
    p = plan(root)
    got = {c.name: (c.action, c.rental["offer"], c.rental["price_per_hour"]) for c in p.changes}
    assert got == {"small": ("provision", "h100", 2.5), "any": ("provision", "a10", 0.75),
                   "pair": ("provision", "h100x2", 2.5)}
    name = p.for_run("small").rental["name"]
    assert name == rental_name("ns", "small-g1-a1") and parse_rental_name(name).identity == "small-g1-a1"
    assert "renting cloud/h100 at 2.5/h" in text(p) and "New rentals: 3, estimated 5.75 per hour." in text(p)
    from reconciler.cli.prcomment import markdown

    assert "New rentals: 3, estimated **5.75 per hour**." in markdown(p)


def test_limits_budget_and_bad_offers(tmp_path) -> None:
    root = repo(tmp_path, {"a": gpus(1, "H100"), "b": gpus(1, "H100")},
                {"cloud": {"limits": {"maxPricePerHour": 3, "budget": 100}}})
    p = plan(root)
    assert [(c.name, c.action) for c in p.changes] == [("a", "provision"), ("b", "wait")]
    assert p.for_run("b").code == "BudgetReached" and "maxPricePerHour 3" in p.for_run("b").reason
    p = plan(root, spend={"cloud": 100.0})
    assert {c.code for c in p.changes} == {"BudgetReached"} and "budget 100 reached" in p.changes[0].reason
    # h100 failed a GPU check lately: the next offer that fits (two H100 for the same price)
    p = plan(root, bad_offers={("cloud", "h100"): NOW + 60})
    assert p.for_run("a").rental["offer"] == "h100x2"


def test_a_warm_rental_is_taken_before_a_new_one_and_idle_ones_are_swept(tmp_path) -> None:
    root = repo(tmp_path, {"next": gpus(1, "A10")}, {"cloud": {"idle": 600}})
    warm = ObservedRental(machine="cloud/w1", provider="cloud", id="w1", name=rental_name("ns", "prev-g1-a1"),
                          state="running", identity="prev-g1-a1", host="127.0.0.1", port=22, offer="a10",
                          price_per_hour=0.75, created_at=NOW - 3600)
    world = ObservedWorld(at=NOW, rentals={"cloud/w1": warm}, machines={"cloud/w1": ObservedMachine("cloud/w1")})
    prev = {"prev": RunStatus(name="prev", phase="Succeeded", handle=Handle(machine="cloud/w1"),
                              history=[{"time": "2027-01-15T07:50:00Z", "phase": "Succeeded"}])}
    p = plan(root, world, prev)
    assert p.for_run("next").action == "launch" and p.for_run("next").machine == "cloud/w1"
    assert "warm rental" in p.for_run("next").reason
    # Without a run to take it: kept for idle seconds after its last run, then given back.
    (root / "specs" / "runs" / "next.yaml").unlink()
    p = plan(root, world, prev)
    assert [c.code for c in p.changes if c.action == "release"] == ["Idle"]  # ended 07:50, idle 600, now 08:00


def test_validate_refuses_a_run_no_offer_can_hold_at_its_override(tmp_path) -> None:
    root = repo(tmp_path, {"huge": gpus(8, "H100"), "ok": gpus(1, "A10")})
    r = subprocess.run([sys.executable, "-m", "reconciler", "validate", "--repo", str(root)], capture_output=True,
                       text=True)
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert any(line.startswith("specs/runs/huge.yaml:") and "no provider offer fits 8 x H100" in line
               for line in lines), r.stdout
    assert not any("ok.yaml" in line for line in lines)
    (root / "specs" / "runs" / "huge.yaml").unlink()
    (root / "specs" / "runs" / "gone.yaml").write_text(yaml.safe_dump({
        "apiVersion": "reconciler/v1", "kind": "Run", "metadata": {"name": "gone"},
        "spec": {"template": "rent", "overrides": {"target": "nowhere"}, "task": {"type": "command", "argv": ["x"]}}}))
    r = subprocess.run([sys.executable, "-m", "reconciler", "validate", "--repo", str(root)], capture_output=True,
                       text=True)
    assert "provider 'nowhere' not found (known: cloud)" in r.stdout


def test_the_offline_plan_sees_recorded_rentals_and_prices_new_ones(tmp_path) -> None:
    from reconciler.status.offline import recorded_world

    root = repo(tmp_path, {"waiting": gpus(1, "A10"), "new": gpus(1, "H100")})
    rental = {"provider": "cloud", "id": "r9", "name": rental_name("ns", "waiting-g1-a1"), "offer": "a10",
              "price_per_hour": 0.75}
    desired = load_tree(root)
    from reconciler.spec.load import run_digest

    prev = {"waiting": RunStatus(name="waiting", phase="Provisioning", generation=1, attempt=1,
                                 spec={"digest": run_digest(desired.runs["waiting"].run)},
                                 handle=Handle(identity="waiting-g1-a1", rental=rental))}
    world = recorded_world(desired, prev, NOW)
    p = make_plan(desired, world, prev, NOW, PlanSettings(namespace="ns"))
    assert (p.for_run("waiting").action, p.for_run("waiting").code) == ("wait", "Provisioning")
    assert p.for_run("new").action == "provision" and p.for_run("new").rental["price_per_hour"] == 2.5
