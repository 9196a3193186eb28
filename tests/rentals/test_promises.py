"""What the rental life cycle promises, checked the way a user and a crash meet it: separate
`reconcile` processes over the local provider's real sshd rentals on loopback."""

from __future__ import annotations

import json
import subprocess

from reconciler.spec.offers import parse_rental_name, rental_name
from tests.repo_helpers import reconcile_cli
from tests.world import git, run_spec


def env_of(w, namespace: str = "test") -> dict:
    return {"RECONCILER_WORKSPACE_ROOT": str(w.local_root), "RECONCILER_NAMESPACE": namespace,
            "RECONCILER_PUSH": "false"}


def test_a_namespace_rental_names_cannot_hold_is_refused_where_it_is_configured(rental_world) -> None:
    w = rental_world()
    for bad in ("Team_A", "team--b", "team-", "-team", "a" * 41):
        out = reconcile_cli(w.repo, "config", env=env_of(w, bad))
        assert out.returncode != 0 and "namespace" in out.stderr and "single hyphens" in out.stderr, (bad, out)
    (w.repo / "reconciler.yaml").write_text("namespace: Team.A\n")
    out = reconcile_cli(w.repo, "config", env={"RECONCILER_WORKSPACE_ROOT": str(w.local_root)})
    assert out.returncode != 0 and "'Team.A'" in out.stderr, out
    (w.repo / "reconciler.yaml").unlink()
    ok = reconcile_cli(w.repo, "config", env=env_of(w, "team-b2"))
    assert ok.returncode == 0 and json.loads(ok.stdout)["namespace"] == "team-b2", ok.stderr


def test_a_namespace_never_reads_another_namespaces_rentals_as_its_own(rental_world) -> None:
    w = rental_world(orphanGrace=0)
    a = w.adapter()
    offer = a.offers()[0]
    ours = a.provision(rental_name("team", "old-g1-a1"), offer)
    # Rentals of other repositories whose namespaces start with "team": one valid today, one that
    # an older version accepted ("team-", whose names start "rc-team---").
    other = a.provision(rental_name("team-b", "old-g1-a1"), offer)
    dashed = a.provision("rc-team---old-g1-a1-x1", offer)
    assert parse_rental_name(other.name, "team") is None and parse_rental_name(dashed.name) is None
    assert parse_rental_name(ours.name, "team").identity == "old-g1-a1"
    listed = json.loads(reconcile_cli(w.repo, "rentals", "--json", env=env_of(w, "team")).stdout)
    assert [r["machine"] for r in listed["rentals"]] == [f"local/{ours.id}"]
    reaped = reconcile_cli(w.repo, "rentals", "--reap", env=env_of(w, "team"))
    assert reaped.returncode == 0, reaped.stderr
    assert sorted(r.id for r in w.rentals()) == sorted([other.id, dashed.id])
    listed = json.loads(reconcile_cli(w.repo, "rentals", "--json", env=env_of(w, "team-b")).stdout)
    assert [r["machine"] for r in listed["rentals"]] == [f"local/{other.id}"]


def test_the_rentals_command_calls_an_unclaimed_rental_an_orphan_during_its_grace(rental_world) -> None:
    w = rental_world(orphanGrace=600)
    w.add_run(run_spec("busy", "rental-host", ["sleep", "30"]))
    st = w.until("busy", lambda s: s.phase == "Running")
    a = w.adapter()
    lost = a.provision(rental_name("test", "gone-g1-a1"), a.offers()[0])
    warnings = json.loads(reconcile_cli(w.repo, "plan", "--json", env=env_of(w)).stdout)["warnings"]
    assert [x for x in warnings if f"rental local/{lost.id}" in x and "no run claims it" in x], warnings
    rows = {r["machine"]: r for r in json.loads(reconcile_cli(w.repo, "rentals", "--json", env=env_of(w)).stdout)["rentals"]}
    assert rows[f"local/{lost.id}"]["orphan"] is True and rows[f"local/{lost.id}"]["release"] is None
    assert rows[st.handle.machine]["orphan"] is False and rows[st.handle.machine]["run"] == "busy"
    table = reconcile_cli(w.repo, "rentals", env=env_of(w)).stdout
    assert [line.split()[-1] for line in table.splitlines() if f"local/{lost.id}" in line] == ["yes"], table


def test_a_rental_whose_spec_was_removed_while_it_provisioned_goes_back_as_idle_says(rental_world) -> None:
    w = rental_world(local={"delaySeconds": 3600}, idle=0)  # orphanGrace: its 600 s default
    w.add_run(run_spec("gone", "rental-host", ["true"]))
    first = reconcile_cli(w.repo, "--once", env=env_of(w))
    assert first.returncode == 0, first.stderr
    [rental] = w.rentals()
    assert rental.state == "provisioning" and w.status("gone").phase == "Provisioning"
    (w.repo / "specs" / "runs" / "gone.yaml").unlink()
    w.commit("remove gone")
    second = reconcile_cli(w.repo, "--once", "--json", env=env_of(w))
    assert second.returncode == 0, second.stderr
    changes = json.loads(second.stdout)["changes"]
    assert [(c["action"], c["code"]) for c in changes if c["action"] == "release"] == [("release", "Idle")]
    assert w.rentals() == [] and w.status("gone").phase == "Terminated"


def test_a_warm_rental_of_a_removed_run_still_waits_for_its_idle(rental_world) -> None:
    w = rental_world(local={"delaySeconds": 3600}, idle=3600)
    w.add_run(run_spec("gone", "rental-host", ["true"]))
    assert reconcile_cli(w.repo, "--once", env=env_of(w)).returncode == 0
    (w.repo / "specs" / "runs" / "gone.yaml").unlink()
    w.commit("remove gone")
    out = reconcile_cli(w.repo, "--once", "--json", env=env_of(w))
    assert [c for c in json.loads(out.stdout)["changes"] if c["action"] == "release"] == []
    assert len(w.rentals()) == 1
    assert not any("no run claims it" in x for x in json.loads(out.stdout)["warnings"])


def test_an_offer_set_aside_is_remembered_between_once_processes(rental_world) -> None:
    offers = [{"id": "h100", "gpu_type": "H100", "gpu_count": 1, "gpu_memory_gb": 80, "price_per_hour": 2.0},
              {"id": "h100-b", "gpu_type": "H100", "gpu_count": 1, "gpu_memory_gb": 80, "price_per_hour": 2.5}]
    w = rental_world(offers=offers, local={"misreport": {"h100": "NVIDIA A10"}})
    w.add_run(run_spec("g", "rental-host", ["true"], overrides={"resources": {"gpu_type": "H100", "gpu_count": 1}}))
    rented = []
    for _ in range(5):
        out = reconcile_cli(w.repo, "--once", "--json", env=env_of(w))
        rented += [c["rental"]["offer"] for c in json.loads(out.stdout)["changes"] if c["action"] == "provision"]
        if w.status("g") is not None and w.status("g").phase == "Succeeded":
            break
    assert rented == ["h100", "h100-b"], rented  # the lying offer once, never again
    assert w.status("g").phase == "Succeeded" and w.status("g").handle.rental["offer"] == "h100-b"
    path = w.repo / ".reconciler" / "bad-offers.json"
    [entry] = json.loads(path.read_text())["offers"]
    assert (entry["provider"], entry["offer"]) == ("local", "h100")
    assert ".reconciler" not in git(w.repo, "status", "--porcelain")  # state, never committed
    assert (w.repo / ".reconciler" / ".gitignore").read_text() == "*\n"
    # A torn or foreign file is read as "nothing set aside", never as a failed pass.
    path.write_text("{not json")
    plan = reconcile_cli(w.repo, "plan", env=env_of(w))
    assert plan.returncode == 0, plan.stderr


# `reconcile` killed as kill -9 would kill it, right after the local provider started a rental's
# sshd and before the rental's records name it.
KILLED_MID_BOOT = ("import os, sys\n"
                   "import reconciler.rentals.providers.local as local\n"
                   "local._after_sshd_start = lambda: os._exit(137)\n"
                   "from reconciler.cli.main import main\n"
                   "sys.argv[0] = 'reconcile'\n"
                   "sys.exit(main())\n")


def test_a_reconcile_killed_while_a_rentals_sshd_starts_leaves_no_second_sshd(rental_world) -> None:
    import os
    import sys
    from pathlib import Path

    w = rental_world()
    w.add_run(run_spec("q", "rental-host", ["sleep", "30"]))
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, **env_of(w), "PYTHONPATH": root}
    killed = subprocess.run([sys.executable, "-c", KILLED_MID_BOOT, "--once", "--repo", str(w.repo)], env=env,
                            capture_output=True, text=True, timeout=60)
    assert killed.returncode == 137, killed.stderr
    assert len(_sshd_for(w)) == 1  # started, never recorded
    st = w.until("q", lambda s: s.phase == "Running")
    assert len(_sshd_for(w)) == 1, _sshd_for(w)  # the one the next pass started, alone
    (w.repo / "specs" / "runs" / "q.yaml").unlink()
    w.commit("remove q")
    w.until("q", lambda s: s.phase == "Terminated" and not w.rentals())
    assert st.handle.machine.startswith("local/") and _sshd_for(w) == []


def _sshd_for(w) -> list[int]:
    """The sshd processes started for the rentals of ``w``'s provider (read from /proc: ps may cut
    long command lines to the terminal's width)."""
    import os

    mark = (str(w.state) + "/").encode()
    found = []
    for entry in os.listdir("/proc"):
        try:
            cmd = open(f"/proc/{entry}/cmdline", "rb").read() if entry.isdigit() else b""
        except OSError:
            continue
        if b"sshd" in cmd and b"sshd_config" in cmd and mark in cmd:
            found.append(int(entry))
    return found
