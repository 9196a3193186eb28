"""Placement that explains itself: priorities, first come first served, team quotas, packing,
owned machines before rented ones; every case checks the explanation too. Pure: fixtures in,
plan out (no SSH, no provider)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from reconciler.core.identity import make
from reconciler.core.observed import ObservedMachine, ObservedRun, ObservedWorld
from reconciler.core.plan import PlanSettings
from reconciler.planner.make import make_plan
from reconciler.spec.load import load_tree
from reconciler.core.runstatus import RunStatus, Transition

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


def test_the_room_index_chooses_what_a_scan_of_every_machine_would() -> None:
    import random

    from reconciler.planner.capacity import RoomIndex, Slot

    rng = random.Random(7)
    for _ in range(30):
        slots = []
        for i in range(rng.randint(1, 40)):
            types = {g: rng.choice(["H100", "A100"]) for g in range(rng.choice([0, 1, 2, 4, 8]))}
            s = Slot(f"m{i:02d}", "ssh", "f", rng.choice([None, 1, 2, 4]), types, tasks=rng.randint(0, 2),
                     reachable=rng.random() > 0.1, draining=None if rng.random() > 0.1 else "swap")
            s.used_gpus.update(g for g in types if rng.random() < 0.3)
            slots.append(s)
        index = RoomIndex(slots)
        for _ in range(40):
            gtype, count = rng.choice([None, "h100", "A100"]), rng.choice([0, 1, 2, 4])
            fit = [s for s in slots if s.fits(count, gtype)]
            key = (lambda s: (s.free_count(gtype) - count, s.tasks, s.name)) if count else (lambda s: (s.tasks, s.name))
            want = min(fit, key=key) if fit else None
            got = index.best(gtype, count)
            assert got is want, (gtype, count, got and got.name, want and want.name)
            assert index.fitting(gtype, count) == len(fit)
            if got is not None:
                got.take(count, gtype)
                index.changed(got)


PREEMPT = {"priorityClasses": [{"name": "urgent", "value": 1000}, {"name": "batch", "value": 1, "default": True}],
           "preemption": {"enabled": True, "graceSeconds": 30, "minRuntimeSeconds": 600}}


def test_a_higher_priority_run_preempts_a_lower_one_that_has_run_long_enough(tmp_path) -> None:
    root = repo(tmp_path, {"low": {}, "high": {"priority": "urgent"}}, {"gpu-1": 1}, PREEMPT)
    w = world({"gpu-1": 1}, {"low": ("gpu-1", 1)})
    w.machines["gpu-1"].runs["low-g1-a1"].started_at = NOW - 3600
    p = plan(root, w)
    high, low = p.for_run("high"), p.for_run("low")
    assert (high.action, high.code) == ("wait", "Preempting")
    assert high.reason == "stopping low-g1-a1 (lower priority) on gpu-1 to make room; placed there once they have stopped"
    assert high.considered == ["gpu-1: 0 free H100 GPU(s) of 1 wanted", "gpu-1: room after preempting low-g1-a1"]
    assert (low.action, low.code, low.phase) == ("terminate", "Preempted", "Pending")
    assert [(k.identity, k.grace) for k in low.kill] == [("low-g1-a1", 30)]
    assert low.reason.startswith("preempted by high (urgent) to make room on gpu-1")


def test_no_preemption_within_min_runtime_or_when_it_would_not_make_room(tmp_path) -> None:
    root = repo(tmp_path, {"low": {}, "high": {"priority": "urgent"}}, {"gpu-1": 1}, PREEMPT)
    w = world({"gpu-1": 1}, {"low": ("gpu-1", 1)})
    w.machines["gpu-1"].runs["low-g1-a1"].started_at = NOW - 60  # ran 60 s of its 600
    p = plan(root, w)
    assert p.for_run("high").code == "NoCapacity" and p.for_run("low").code != "Preempted"
    root2 = repo(tmp_path / "two", {"low": {}, "high": {"priority": "urgent", "gpus": 2}}, {"gpu-1": 1}, PREEMPT)
    w.machines["gpu-1"].runs["low-g1-a1"].started_at = NOW - 3600
    p = plan(root2, w)  # two GPUs wanted, one machine of one: stopping low would not be enough
    assert p.for_run("high").code == "NoCapacity" and p.for_run("low").code != "Preempted"


def test_a_preempted_run_comes_back_without_spending_a_retry(tmp_path) -> None:
    from reconciler.core.runstatus import Condition, Handle

    root = repo(tmp_path, {"low": {}, "high": {"priority": "urgent"}}, {"gpu-1": 1}, PREEMPT)
    w = world({"gpu-1": 1}, {"high": ("gpu-1", 1)})
    w.machines["gpu-1"].runs["low-g1-a1"] = ObservedRun("low-g1-a1", "gpu-1", "terminated", exit_code=143,
                                                         started_at=NOW - 3600, finished_at=NOW - 10)
    desired = load_tree(root)
    prev = {"low": RunStatus(name="low", phase="Pending", generation=1, attempt=1, preemptions=1,
                             spec={"digest": desired.runs["low"].digest},
                             handle=Handle(machine="gpu-1", identity="low-g1-a1"),
                             conditions=[Condition(type="Preempted", status="True", reason="Preempted")])}
    p = plan(root, w, prev)
    assert (p.for_run("low").action, p.for_run("low").code) == ("wait", "NoCapacity")  # high holds the GPU
    w.machines["gpu-1"].runs.pop("high-g1-a1")  # high finished, was collected, and its spec removed
    (root / "specs" / "runs" / "high.yaml").unlink()
    p = plan(root, w, prev)
    low = p.for_run("low")
    assert (low.action, low.code, low.identity) == ("launch", "Resume", "low-g1-a2")
    assert low.collect_first.identity == "low-g1-a1"
