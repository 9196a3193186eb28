"""Rentals where they could leak or double: a machine dead but still listed, limits reached then
lifted, an offer kept only for a live rental. Real parts: the local provider's sshd rentals, the
fake RunPod API (tests/fakes/runpod.py) whose pods are real sshd servers, the reconciler's passes."""

from __future__ import annotations

import time

import yaml

from tests.fakes.runpod import FakeRunpod
from tests.world import run_spec

RETRY = {"maxRetries": 1, "backoffSeconds": 0}


def test_a_dead_but_listed_rental_is_replaced_after_the_grace_and_given_back(rental_world) -> None:
    """The machine died (its sshd and its processes) and the provider still lists it running: it
    may only be slow, so the run is Unknown for the grace; after it, the run is lost, relaunched on
    a new rental, and the dead one, which nothing can ever be collected from, goes back."""
    w = rental_world(flags={"unreachable_grace": 2.0})
    w.add_run(run_spec("d", "rental-host", ["sleep", "60"], restartPolicy=RETRY))
    st = w.until("d", lambda s: s.phase == "Running")
    dead = st.handle.machine.split("/", 1)[1]
    w.adapter().crash(dead)
    assert [(r.id, r.state) for r in w.rentals()] == [(dead, "running")]  # still listed, as running
    rec = w.reconciler()
    rec.run_pass()
    st = w.status("d")
    assert st.phase == "Unknown" and st.attempt == 1, st.message  # within the grace: waited for
    assert [r.id for r in w.rentals()] == [dead]
    time.sleep(2.1)  # past the grace on the real clock: the next pass declares it lost
    st = w.until("d", lambda s: s.phase == "Running" and s.attempt == 2, timeout=30)
    assert st.handle.machine != f"local/{dead}"
    w.until("d", lambda s: dead not in [r.id for r in w.rentals()], timeout=30)
    assert [r.id for r in w.rentals()] == [st.handle.machine.split("/", 1)[1]]  # one machine, the new one


def test_limits_reached_then_lifted_the_runs_get_their_rentals_and_none_is_left(rental_world) -> None:
    w = rental_world(limits={"maxMachines": 0})
    w.add_run(run_spec("lim", "rental-host", ["true"]))
    w.add_run(run_spec("cost", "rental-host", ["true"], maxCost=0))
    rec = w.reconciler()
    for _ in range(2):  # a second pass changes nothing: still waiting, still nothing rented
        rec.run_pass()
        assert w.status("lim").condition("Provisioned").reason == "RentalLimit"
        assert w.status("cost").condition("Provisioned").reason == "CostLimit"
        assert w.rentals() == []
    doc = w.provider_doc
    doc["spec"].pop("limits")
    w.set_provider(doc)
    w.add_run(run_spec("cost", "rental-host", ["true"], maxCost=5))
    for name in ("lim", "cost"):
        st = w.until(name, lambda s: s.phase == "Succeeded", timeout=30)
        assert st.handle.machine.startswith("local/lr-")
    w.until("lim", lambda s: not w.rentals())  # idle 0: both went back once collected


def test_an_offer_kept_only_for_a_live_rental_is_refused_once_and_set_aside(tmp_path, monkeypatch) -> None:
    """A rental's offer stays known after it leaves the market (its GPUs are checked against it),
    so a new run may be placed on it. The provider refuses it (no capacity): that offer is set
    aside, the new run waits without asking again, and the live rental is not disturbed; once the
    market has it again and the set-aside is over, the run is rented."""
    import subprocess

    from tests.infra.sshd import TEST_USER
    from tests.rentals.conftest import RENTAL_TEMPLATES
    from tests.world import TEMPLATES, World, remote_root

    key = tmp_path / "id_rentals"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    fake = FakeRunpod(tmp_path / "cloud", token="rpa_test", delay=0.1).start()
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
    gpu = {"resources": {"gpu_type": "RTX 4090", "gpu_count": 1}}
    rtx = next(g for g in fake.gpus if g["id"] == "NVIDIA GeForce RTX 4090")
    try:
        w.add_run(run_spec("holder", "rental-host", ["sleep", "60"], overrides=gpu))
        rec = w.reconciler()  # one process throughout, as the daemon: it remembers its rentals' offers
        deadline = time.monotonic() + 60
        while (held := w.status("holder")) is None or held.phase != "Running":
            assert time.monotonic() < deadline, held
            rec.run_pass()
            time.sleep(0.1)
        rtx["availability"] = "NONE"  # sold out: the offer is known only through the live rental
        w.add_run(run_spec("newcomer", "rental-host", ["true"], overrides=gpu))
        rec.run_pass()
        assert fake.calls("POST", "/v2/pods") == 2 and len(fake.machines) == 1, w.status("newcomer").message  # asked once, refused
        for _ in range(3):
            rec.run_pass()
        st = w.status("newcomer")
        assert fake.calls("POST", "/v2/pods") == 2, "a set-aside offer was asked for again"
        assert st.phase == "Pending" and "set aside" in st.message, st.message
        assert w.status("holder").phase == "Running" and w.status("holder").handle.machine == held.handle.machine
        rtx["availability"] = "HIGH"
        later = time.time() + 601  # past the set-aside (OfferUnavailable: 600 s)
        deadline = time.monotonic() + 60
        while (st := w.status("newcomer")).phase != "Succeeded":
            assert time.monotonic() < deadline, st.message
            rec.run_pass(now=later)
            later += 0.5
            time.sleep(0.2)
        assert st.handle.machine != held.handle.machine and fake.calls("POST", "/v2/pods") == 3
    finally:
        w.cleanup()
        fake.close()
