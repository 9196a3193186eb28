"""Rentals under faults: a reconciler killed mid-way, a machine that evaporates, limits reached."""

from __future__ import annotations

from tests.repo_helpers import reconcile_cli
from tests.world import run_spec


def env_of(w) -> dict:
    return {"RECONCILER_WORKSPACE_ROOT": str(w.local_root), "RECONCILER_NAMESPACE": "test",
            "RECONCILER_PUSH": "false"}


def test_kill_between_provisioning_and_the_status_commit_adopts_the_rental(rental_world) -> None:
    w = rental_world(local={"delaySeconds": 0.5})
    w.add_run(run_spec("k", "rental-host", ["true"]))
    crashed = reconcile_cli(w.repo, "--once", env=env_of(w), crash_after="apply")
    assert crashed.returncode == 137, crashed.stderr
    assert w.status("k") is None  # nothing recorded: the rental exists only at the provider
    [rental] = w.rentals()
    plan = reconcile_cli(w.repo, "plan", env=env_of(w))
    assert "rental local/" + rental.id in plan.stdout or "on rental local/" + rental.id in plan.stdout, plan.stdout
    st = w.until("k", lambda s: s.phase == "Succeeded")
    assert st.handle.machine == f"local/{rental.id}"
    assert len(w.rentals()) <= 1 and all(r.id == rental.id for r in w.rentals())


def test_a_rental_that_evaporates_mid_run_is_replaced_without_waiting_for_the_grace(rental_world) -> None:
    """Gone from the provider's inventory and not answering: it cannot come back, so nothing of
    the old attempt can live on; the run is replaced at once, not after unreachable_grace."""
    w = rental_world(flags={"unreachable_grace": 300.0})
    w.add_run(run_spec("e", "rental-host", ["sleep", "60"], restartPolicy={"maxRetries": 1, "backoffSeconds": 0}))
    st = w.until("e", lambda s: s.phase == "Running")
    first = st.handle.machine
    w.adapter().evaporate(first.split("/", 1)[1])
    rec = w.reconciler()
    rec.run_pass()
    st = w.status("e")
    assert st.attempt == 2 and st.phase in ("Provisioning", "Starting", "Running"), st.message
    assert any("gone" in h.reason for h in st.history), [h.reason for h in st.history]
    st = w.until("e", lambda s: s.phase == "Running" and s.attempt == 2)
    assert st.handle.machine != first and st.handle.machine.startswith("local/")
    assert [r.id for r in w.rentals()] == [st.handle.machine.split("/", 1)[1]]


def test_budget_and_max_cost_stop_new_rentals_with_a_reason(rental_world) -> None:
    w = rental_world(limits={"budget": 0})
    w.add_run(run_spec("b", "rental-host", ["true"]))
    rec = w.reconciler()
    rec.run_pass()
    st = w.status("b")
    assert st.phase == "Pending" and st.condition("Provisioned").reason == "BudgetReached"
    assert "budget 0 reached" in st.message
    w2 = rental_world()
    w2.add_run(run_spec("c", "rental-host", ["true"], maxCost=0))
    w2.reconciler().run_pass()
    st = w2.status("c")
    assert st.condition("Provisioned").reason == "CostLimit" and w2.rentals() == []
