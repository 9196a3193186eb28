"""A rental's whole life on the local provider: asked for, reached, verified, used, given back."""

from __future__ import annotations

from tests.world import run_spec


def test_a_run_rents_a_machine_trains_and_gives_it_back(rental_world) -> None:
    w = rental_world()
    w.add_run(run_spec("r1", "rental-host", ["sh", "-c", "echo trained > artifacts/out.txt"]))
    rec = w.reconciler()
    first = rec.run_pass()
    change = first.plan.for_run("r1")
    assert change.action == "provision" and change.rental["offer"] == "cpu-small"
    assert [r.state for r in w.rentals()] == ["running"]  # delay 0: ready at once
    st = w.until("r1", lambda s: s.phase == "Succeeded")
    assert st.handle.machine.startswith("local/lr-")
    assert st.handle.rental["host_key"].startswith("ssh-ed25519 ")
    assert {c.type: c.status for c in st.conditions}["Provisioned"] == "True"
    assert st.condition("SshReady").status == "True"
    assert st.cost["price_per_hour"] == 0.1 and "since" not in st.cost
    assert (w.bundle(st.handle.identity) / "artifacts" / "out.txt").read_text() == "trained\n"
    # idle 0: the rental goes back once the run is collected
    w.until("r1", lambda s: not w.rentals())


def test_a_warm_rental_is_reused_by_the_next_run_then_given_back_after_idle(rental_world) -> None:
    w = rental_world(idle=3600)
    w.add_run(run_spec("a", "rental-host", ["true"]))
    a = w.until("a", lambda s: s.phase == "Succeeded")
    [rental] = w.rentals()
    assert a.handle.machine == f"local/{rental.id}"
    rec = w.reconciler()
    rec.run_pass()
    assert [r.id for r in w.rentals()] == [rental.id]  # kept warm
    w.add_run(run_spec("b", "rental-host", ["true"]))
    b = w.until("b", lambda s: s.phase == "Succeeded")
    assert b.handle.machine == a.handle.machine  # the same machine, no second rental
    assert len(w.rentals()) == 1
    # Past its idle time (seen from a clock an hour on), it goes back.
    import time

    later = time.time() + 3601
    result = rec.run_pass(now=later)
    released = [c for c in result.plan.changes if c.action == "release"]
    assert [c.code for c in released] == ["Idle"]
    assert w.rentals() == []


def test_a_failed_provisioning_is_replaced(rental_world) -> None:
    w = rental_world(local={"failureRate": 1.0, "seed": 1})
    w.add_run(run_spec("f", "rental-host", ["true"]))
    rec = w.reconciler()
    rec.run_pass()
    [failed] = w.rentals()
    assert failed.state == "failed"
    plan = rec.run_pass().plan
    assert [(c.action, c.code) for c in plan.changes if c.action == "release"] == [("release", "RentalFailed")]
    assert all(r.id != failed.id for r in w.rentals())


def test_a_provisioning_timeout_gives_the_rental_back(rental_world) -> None:
    w = rental_world(local={"delaySeconds": 3600}, provisionTimeout=1)
    w.add_run(run_spec("t", "rental-host", ["true"]))
    rec = w.reconciler()
    rec.run_pass()
    st = w.status("t")
    assert st.phase == "Provisioning" and st.condition("Provisioned").reason == "Provisioning"
    [slow] = w.rentals()
    import time

    plan = rec.run_pass(now=time.time() + 5).plan
    codes = [(c.action, c.code) for c in plan.changes if c.name == "t"]
    assert ("release", "ProvisionTimeout") in codes and ("provision", "Provision") in codes
    names = sorted(r.name for r in w.rentals())
    assert slow.id not in [r.id for r in w.rentals()] and names[0].endswith("-x2")


def test_a_gpu_that_is_not_what_the_offer_promised_is_given_back(rental_world) -> None:
    offers = [{"id": "h100", "gpu_type": "H100", "gpu_count": 1, "gpu_memory_gb": 80, "price_per_hour": 2.0},
              {"id": "h100-b", "gpu_type": "H100", "gpu_count": 1, "gpu_memory_gb": 80, "price_per_hour": 2.5}]
    w = rental_world(offers=offers, local={"misreport": {"h100": "NVIDIA A10"}})
    w.add_run(run_spec("g", "rental-host", ["true"], overrides={"resources": {"gpu_type": "H100", "gpu_count": 1}}))
    rec = w.reconciler()
    rec.run_pass()  # provisions the cheapest: h100 (which will lie)
    rec.run_pass()  # launch: the GPU check fails, the rental goes back
    st = w.status("g")
    assert st.condition("GpuVerified").status == "False" and "A10" in st.condition("GpuVerified").message
    assert w.rentals() == []
    st = w.until("g", lambda s: s.phase == "Succeeded")
    assert st.handle.rental["offer"] == "h100-b"
    assert st.condition("GpuVerified").status == "True" and "H100" in st.condition("GpuVerified").message


def test_an_orphan_is_reaped_after_its_grace_and_a_foreign_machine_is_left_alone(rental_world) -> None:
    import time

    from reconciler.spec.offers import rental_name

    w = rental_world(orphanGrace=60)
    a = w.adapter()
    offer = a.offers()[0]
    ours = a.provision(rental_name("test", "gone-g1-a1"), offer)  # no spec, no status claims it
    foreign = a.provision("someones-notebook", offer)
    rec = w.reconciler()
    result = rec.run_pass()
    assert any("no run claims it" in warning for warning in result.plan.warnings)
    assert {r.id for r in w.rentals()} == {ours.id, foreign.id}
    result = rec.run_pass(now=time.time() + 61)
    assert [(c.code, c.machine) for c in result.plan.changes if c.action == "release"] == [("Orphan", f"local/{ours.id}")]
    assert [r.id for r in w.rentals()] == [foreign.id]


def test_a_budget_reached_stops_new_rentals_with_a_condition(rental_world) -> None:
    w = rental_world(limits={"maxMachines": 1})
    w.add_run(run_spec("one", "rental-host", ["sleep", "30"]))
    w.add_run(run_spec("two", "rental-host", ["sleep", "30"]))
    w.until("one", lambda s: s.phase == "Running")
    two = w.status("two")
    assert two.phase == "Pending"
    assert two.condition("Provisioned").reason == "RentalLimit"
    assert "maxMachines 1" in two.condition("Provisioned").message
    assert len(w.rentals()) == 1


def test_the_rentals_command_lists_and_reaps(rental_world) -> None:
    import json

    from reconciler.spec.offers import rental_name
    from tests.repo_helpers import reconcile_cli

    w = rental_world(orphanGrace=0)
    a = w.adapter()
    orphan = a.provision(rental_name("test", "old-g1-a1"), a.offers()[0])
    env = {"RECONCILER_WORKSPACE_ROOT": str(w.local_root), "RECONCILER_NAMESPACE": "test"}
    listed = reconcile_cli(w.repo, "rentals", env=env)
    assert listed.returncode == 0, listed.stderr
    assert f"local/{orphan.id}" in listed.stdout and "yes" in listed.stdout
    dry = reconcile_cli(w.repo, "rentals", "--reap", "--dry-run", env=env)
    assert f"would give back local/{orphan.id}: Orphan" in dry.stdout, dry.stdout + dry.stderr
    assert [r.id for r in w.rentals()] == [orphan.id]
    reaped = json.loads(reconcile_cli(w.repo, "rentals", "--reap", "--json", env=env).stdout)
    assert [r["machine"] for r in reaped["reaped"]] == [f"local/{orphan.id}"]
    assert w.rentals() == []


def test_a_docker_run_on_a_rental(rental_world, dockerd) -> None:
    w = rental_world(ssh={"docker_host": dockerd.host})
    w.add_run(run_spec("boxed", "rental-docker", ["sh", "-c", "echo in a box on a rental"]))
    st = w.until("boxed", lambda s: s.phase == "Succeeded", timeout=60)
    assert st.handle.container == "boxed-g1-a1" and st.handle.machine.startswith("local/")
    assert (w.bundle("boxed-g1-a1") / "artifacts" / "stdout.log").read_text() == "in a box on a rental\n"
    assert dockerd.docker("ps", "-aq", "--filter", "name=boxed-g1-a1").stdout.strip() == ""
    w.until("boxed", lambda s: w.rentals() == [])


def test_logs_and_machine_states_reach_a_rental_through_its_recorded_endpoint(rental_world, capsys) -> None:
    """One-off commands read no provider's inventory: they log in where the status says the run is."""
    from reconciler.core import config
    from reconciler.cli.commands import machine_states
    from reconciler.cli.logs import follow_logs

    w = rental_world()
    w.add_run(run_spec("l", "rental-host", ["sh", "-c", "echo hello-from-rental; sleep 30"]))
    st = w.until("l", lambda s: s.phase == "Running")
    cfg = config.load(str(w.repo), flags=w.flags)
    w.until("l", lambda s: follow_logs(cfg, "l", "stdout", 0, False) == 0
            and "hello-from-rental" in capsys.readouterr().out)
    [row] = [r for r in machine_states(cfg) if r["name"] == st.handle.machine]
    assert (row["state"], row["tasks"]) == ("attached", 1)
