"""Placement that explains itself: priorities, first come first served, team quotas, packing,
owned machines before rented ones; every case checks the explanation too. Pure: fixtures in,
plan out (no SSH, no provider)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from reconciler.identity import make
from reconciler.observed import ObservedMachine, ObservedRun, ObservedWorld
from reconciler.plan import PlanSettings, make_plan
from reconciler.spec.load import load_tree
from reconciler.status import RunStatus, Transition

NOW = 1_800_000_000.0
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICqRT6LKgEqdobuvittBCu1add1q6i1ofysL9m5i7d6G"


def write(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def repo(tmp_path: Path, runs: dict[str, dict], machines: dict[str, int], policy: dict | None = None,
         fallback: bool = False, offers: list[dict] | None = None) -> Path:
    write(tmp_path / "execution_templates" / "gpu.yaml", {
        "apiVersion": "reconciler/v1", "kind": "ExecutionTemplate", "id": "gpu",
        "placement": {"kind": "ssh", **({"fallback": "rental"} if fallback else {})},
        "launch_mode": {"kind": "host_process"}, "allow_overrides": ["resources"]})
    write(tmp_path / "specs" / "fleets" / "lab.yaml", {
        "apiVersion": "reconciler/v1", "kind": "Fleet", "metadata": {"name": "lab"},
        "spec": {"machines": [{"name": m, "ssh": {"host": "h", "user": "u", "host_key": KEY}, "max_tasks": 8,
                               "resources": {"gpus": [{"type": "H100", "count": n}]}} for m, n in machines.items()]}})
    if offers is not None:
        write(tmp_path / "specs" / "providers" / "cloud.yaml", {
            "apiVersion": "reconciler/v1", "kind": "Provider", "metadata": {"name": "cloud"},
            "spec": {"type": "command", "offers": offers,
                     "command": {"provision": ["p"], "inventory": ["i"], "terminate": ["t"]}}})
    if policy is not None:
        write(tmp_path / "specs" / "policy.yaml", {"apiVersion": "reconciler/v1", "kind": "Policy",
                                                   "metadata": {"name": "policy"}, "spec": policy})
    for name, body in runs.items():
        labels = body.pop("labels", {})
        gpus = body.pop("gpus", 1)
        write(tmp_path / "specs" / "runs" / f"{name}.yaml", {
            "apiVersion": "reconciler/v1", "kind": "Run", "metadata": {"name": name, "labels": labels},
            "spec": {"template": "gpu", "task": {"type": "command", "argv": ["train"]},
                     "overrides": {"resources": {"gpu_type": "H100", "gpu_count": gpus}}, **body}})
    return tmp_path


def world(machines: dict[str, int], busy: dict[str, tuple[str, int]] | None = None) -> ObservedWorld:
    """``busy``: run name → (machine, GPUs it holds), live."""
    w = ObservedWorld(at=NOW)
    for m in machines:
        w.machines[m] = ObservedMachine(m)
    used: dict[str, int] = {}
    for name, (m, n) in (busy or {}).items():
        first = used.get(m, 0)
        ident = make(name, 1, 1)
        w.machines[m].runs[ident] = ObservedRun(ident, m, "running", gpus=list(range(first, first + n)),
                                                 started_at=NOW - 100)
        used[m] = first + n
    return w


def plan(root: Path, w: ObservedWorld, previous: dict | None = None):
    desired = load_tree(root)
    assert not desired.diagnostics, [d.text() for d in desired.diagnostics]
    return make_plan(desired, w, previous or {}, NOW, PlanSettings(namespace="ns"))


POLICY = {"priorityClasses": [{"name": "urgent", "value": 1000}, {"name": "normal", "value": 100, "default": True}],
          "teams": [{"name": "nlp", "maxGpus": 2}, {"name": "vision", "maxGpus": 8}]}


def test_higher_priority_is_placed_first_whatever_its_name(tmp_path) -> None:
    root = repo(tmp_path, {"a-batch": {}, "z-urgent": {"priority": "urgent"}}, {"gpu-1": 1}, POLICY)
    p = plan(root, world({"gpu-1": 1}))
    assert [(c.name, c.action) for c in p.changes] == [("a-batch", "wait"), ("z-urgent", "launch")]
    assert p.for_run("z-urgent").considered == ["gpu-1: chosen (owned; 0 matching GPU(s) left free)"]
    assert p.for_run("a-batch").considered == ["gpu-1: 0 free H100 GPU(s) of 1 wanted"]


def test_first_come_first_served_within_a_priority(tmp_path) -> None:
    root = repo(tmp_path, {"a": {}, "b": {}}, {"gpu-1": 1}, POLICY)
    waited = {"b": RunStatus(name="b", phase="Pending", history=[Transition(time="2027-01-01T00:00:00Z",
                                                                            phase="Pending")])}
    p = plan(root, world({"gpu-1": 1}), waited)
    assert p.for_run("b").action == "launch" and p.for_run("a").action == "wait"


def test_a_team_over_its_gpu_quota_waits_and_another_team_does_not(tmp_path) -> None:
    runs = {"nlp-2": {"labels": {"team": "nlp"}, "gpus": 1}, "vis": {"labels": {"team": "vision"}, "gpus": 2}}
    root = repo(tmp_path, runs, {"gpu-1": 8}, POLICY)
    p = plan(root, world({"gpu-1": 8}, {"nlp-1": ("gpu-1", 2)}))
    # nlp-1 runs but has no spec: its GPUs count only for a run the policy knows. Give it one:
    write(root / "specs" / "runs" / "nlp-1.yaml", {
        "apiVersion": "reconciler/v1", "kind": "Run", "metadata": {"name": "nlp-1", "labels": {"team": "nlp"}},
        "spec": {"template": "gpu", "task": {"type": "command", "argv": ["train"]},
                 "overrides": {"resources": {"gpu_type": "H100", "gpu_count": 2}}}})
    p = plan(root, world({"gpu-1": 8}, {"nlp-1": ("gpu-1", 2)}))
    wait = p.for_run("nlp-2")
    assert (wait.action, wait.code) == ("wait", "QuotaExceeded")
    assert wait.reason == "team nlp holds 2 of its maxGpus 2 GPUs; this run needs 1 more"
    assert p.for_run("vis").action == "launch"


def test_gpu_runs_are_packed_to_keep_whole_machines_free(tmp_path) -> None:
    root = repo(tmp_path, {"small": {"gpus": 1}}, {"big": 8, "half": 4})
    p = plan(root, world({"big": 8, "half": 4}, {"other": ("half", 2)}))
    c = p.for_run("small")
    assert c.machine == "half"
    assert c.considered == ["half: chosen (owned; 1 matching GPU(s) left free)", "big: fits, ranked lower"]


def test_owned_machines_first_then_a_rental_when_they_are_full(tmp_path) -> None:
    offers = [{"id": "h100", "gpu_type": "H100", "gpu_count": 1, "price_per_hour": 2.5},
              {"id": "h100-dear", "gpu_type": "H100", "gpu_count": 1, "price_per_hour": 4.0}]
    root = repo(tmp_path, {"r": {}}, {"gpu-1": 1}, fallback=True, offers=offers)
    free = plan(root, world({"gpu-1": 1}))
    assert (free.for_run("r").action, free.for_run("r").machine) == ("launch", "gpu-1")
    full = plan(root, world({"gpu-1": 1}, {"x": ("gpu-1", 1)}))
    c = full.for_run("r")
    assert (c.action, c.rental["offer"]) == ("provision", "h100")
    assert c.considered == ["gpu-1: 0 free H100 GPU(s) of 1 wanted", "owned machines are full: renting",
                            "cloud/h100: chosen (cheapest that fits and is allowed, 2.5/h)",
                            "cloud/h100-dear: fits, ranked lower (4/h)"]


def test_validate_checks_priority_classes_and_one_policy(tmp_path) -> None:
    root = repo(tmp_path, {"a": {"priority": "nope"}}, {"gpu-1": 1}, POLICY)
    write(root / "specs" / "policy2.yaml", {"apiVersion": "reconciler/v1", "kind": "Policy",
                                            "metadata": {"name": "policy2"}, "spec": {}})
    r = subprocess.run([sys.executable, "-m", "reconciler", "validate", "--repo", str(root)], capture_output=True,
                       text=True)
    assert r.returncode == 1
    assert "specs/runs/a.yaml:" in r.stdout and "priority class 'nope' is not defined (known: normal, urgent)" in r.stdout
    assert "specs/policy2.yaml:" in r.stdout and "a repository has one Policy; specs/policy.yaml is it" in r.stdout
