"""Owned machines first, then rented, with priorities and a team quota, on real parts: two SSH
machines of different sizes (real sshd servers on loopback) and the local rental provider."""

from __future__ import annotations

import subprocess
import sys

import yaml

from tests.rentals.conftest import provider_doc
from tests.world import World, fleet, machine, run_spec


def test_in_house_first_then_rented_with_a_team_over_quota_waiting(tmp_path, sshd, sshd_factory) -> None:
    small = sshd_factory()
    m_big = machine(sshd, "big", gpus=2, gpu_type="H100", max_tasks=4)
    m_small = machine(small, "small", gpus=1, gpu_type="H100", max_tasks=4)
    w = World(tmp_path / "w", [fleet([m_big, m_small])])
    (w.repo / "execution_templates" / "lab-then-rent.yaml").write_text(yaml.safe_dump({
        "apiVersion": "reconciler/v1", "kind": "ExecutionTemplate", "id": "lab-then-rent",
        "placement": {"kind": "ssh", "fallback": "rental"}, "launch_mode": {"kind": "host_process"},
        "defaults": {"target": "lab", "resources": {"gpu_type": "H100", "gpu_count": 1}},
        "allow_overrides": ["resources"]}))
    provider = provider_doc(tmp_path / "provider", offers=[
        {"id": "h100", "gpu_type": "H100", "gpu_count": 1, "gpu_memory_gb": 80, "price_per_hour": 2.0}])
    (w.repo / "specs" / "providers").mkdir()
    (w.repo / "specs" / "providers" / "local.yaml").write_text(yaml.safe_dump(provider))
    (w.repo / "specs" / "policy.yaml").write_text(yaml.safe_dump({
        "apiVersion": "reconciler/v1", "kind": "Policy", "metadata": {"name": "policy"},
        "spec": {"priorityClasses": [{"name": "urgent", "value": 10}, {"name": "normal", "value": 1,
                                                                        "default": True}],
                 "teams": [{"name": "vision", "maxGpus": 0}]}}))
    w.commit("scheduling")
    try:
        for name, extra in (("a", {}), ("b", {}), ("c", {}), ("d", {"priority": "urgent"})):
            w.add_run(run_spec(name, "lab-then-rent", ["sleep", "60"], **extra), commit=False)
        doc = run_spec("v", "lab-then-rent", ["sleep", "60"])
        doc["metadata"]["labels"] = {"team": "vision"}
        w.add_run(doc)
        rec = w.reconciler()
        first = rec.run_pass().plan
        placed = {c.name: (c.action, c.machine or (c.rental or {}).get("offer")) for c in first.changes if c.phase}
        # d (urgent) first, then a, b in name order: 3 owned GPUs (big: 2, small: 1), packed; c rents.
        assert placed["d"] == ("launch", "small") and placed["a"] == ("launch", "big")
        assert placed["b"] == ("launch", "big") and placed["c"] == ("provision", "h100")
        assert placed["v"][0] == "wait" and first.for_run("v").code == "QuotaExceeded"
        st = w.until("c", lambda s: s.phase == "Running")
        assert st.handle.machine.startswith("local/") and st.condition("GpuVerified").status == "True"
        env = {"RECONCILER_WORKSPACE_ROOT": str(w.local_root), "RECONCILER_NAMESPACE": "test"}
        out = subprocess.run([sys.executable, "-m", "reconciler", "explain", "v", "--repo", str(w.repo)],
                             capture_output=True, text=True, env={**__import__("os").environ, **env})
        assert out.returncode == 0, out.stderr
        assert "v: wait (QuotaExceeded)" in out.stdout and "team vision holds 0 of its maxGpus 0" in out.stdout
        out = subprocess.run([sys.executable, "-m", "reconciler", "explain", "c", "--repo", str(w.repo)],
                             capture_output=True, text=True, env={**__import__("os").environ, **env})
        assert "owned machines are full: renting" in out.stdout, out.stdout
        assert w.status("c").placement["action"] == "launch"  # the decision recorded: launched on the rental
    finally:
        w.cleanup()
        from reconciler.rentals.providers.local import LocalAdapter
        from reconciler.spec.models.provider import Provider

        a = LocalAdapter(Provider.model_validate(provider), None)
        for r in a.inventory():
            a.terminate(r.id)
