"""Benchmark: provider API calls per pass with many live rentals, and submitted → running on the
local provider.

1. API calls: a fake Targon API (tests/fakes/targon.py; machines report running, no sshd behind
   them) holds ``--rentals`` rentals named as this repository's, rate limit 2/s, burst 5. The
   reconciler's passes are run and the HTTP requests the fake received are counted per pass:
   while rentals' SSH endpoints are unknown (a fresh reconciler), one listing plus at most a
   burst of endpoint look-ups; then the listing alone. Target: a few calls per provider per
   pass, whatever the number of rentals.
2. Submitted → running: a run committed to a repository whose template rents from the local
   provider (its rentals are real sshd servers on loopback; needs sshd, and root for a user per
   rental); passes are run back to back, as the daemon does when a change asks to be looked at
   again soon, until the run's process exists. With ``--delay`` the provider takes that long to
   provision. Target: at most 3 s plus the delay.

    python benchmarks/rentals.py [--rentals 100] [--delay 0] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reconciler.spec.offers import rental_name  # noqa: E402
from tests.fakes.targon import FakeTargon  # noqa: E402
from tests.rentals.conftest import RENTAL_TEMPLATES, provider_doc  # noqa: E402
from tests.world import TEMPLATES, World, run_spec  # noqa: E402


def api_calls(base: Path, rentals: int, passes: int) -> tuple[int, list[int]]:
    base.mkdir(parents=True, exist_ok=True)
    fake = FakeTargon(base / "cloud", token="bench", boot_machines=False).start()
    fake.page_size = 100
    os.environ["BENCH_TARGON_KEY"] = "bench"
    key = base / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    w = World(base / "w", ssh_connect_timeout=1.0)
    doc = {"apiVersion": "reconciler/v1", "kind": "Provider", "metadata": {"name": "targon"},
           "spec": {"type": "targon", "endpoint": fake.url + "/tha/v2", "credentials": "BENCH_TARGON_KEY",
                    "rateLimit": {"requestsPerSecond": 2, "burst": 5}, "orphanGrace": 86400,
                    "offers": [{"id": "h200-small", "price_per_hour": 2.4}],
                    "ssh": {"identity_file": str(key), "image": "bench/sshd:1"}}}
    (w.repo / "specs" / "providers").mkdir()
    (w.repo / "specs" / "providers" / "targon.yaml").write_text(yaml.safe_dump(doc))
    w.commit("provider")
    now = time.time()
    for i in range(rentals):
        uid = f"wrk-bench{i:04d}"
        fake.machines[uid] = {"id": uid, "uid": uid, "name": rental_name("test", f"run{i}-g1-a1"),
                              "status": "provisioning", "resource_name": "h200-small", "ssh_keys": [],
                              "ports": [{"port": 22}], "created": now - 10, "created_at": "2026-01-01T00:00:00Z"}
    rec = w.reconciler()
    counts = []
    for _ in range(passes):
        before = len(fake.requests)
        rec.run_pass(dry_run=True)
        counts.append(len(fake.requests) - before)
    fake.close()
    return rentals, counts


def submitted_to_running(base: Path, delay: float) -> float:
    TEMPLATES.update(RENTAL_TEMPLATES)
    w = World(base, ssh_connect_timeout=3.0)
    doc = provider_doc(base / "provider", local={"delaySeconds": delay})
    (w.repo / "specs" / "providers").mkdir()
    (w.repo / "specs" / "providers" / "local.yaml").write_text(yaml.safe_dump(doc))
    w.commit("provider")
    w.add_run(run_spec("bench", "rental-host", ["sleep", "30"]))
    rec = w.reconciler()
    t0 = time.perf_counter()
    try:
        while True:
            result = rec.run_pass()
            st = w.status("bench")
            if st is not None and st.phase == "Running":
                return time.perf_counter() - t0
            if time.perf_counter() - t0 > 60 + delay:
                raise SystemExit(f"not running after {60 + delay:.0f}s: {st.message if st else 'no status'}")
            time.sleep(min(result.retry_after or 0.05, 0.05))
    finally:
        w.cleanup()
        from reconciler.rentals.providers.local import LocalAdapter
        from reconciler.spec.models.provider import Provider

        a = LocalAdapter(Provider.model_validate(doc), None)
        for r in a.inventory():
            a.terminate(r.id)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rentals", type=int, default=100)
    ap.add_argument("--passes", type=int, default=0, help="default: enough to learn every endpoint, plus 2")
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rc-bench-rentals-") as tmp:
        passes = args.passes or -(-args.rentals // 5) + 2
        n, counts = api_calls(Path(tmp) / "api", args.rentals, passes)
        print(f"API calls per pass, {n} live rentals at one provider, {passes} passes: at most {max(counts)} "
              f"(a listing and a burst of endpoint look-ups while endpoints are unknown), "
              f"{counts[-1]} once all are known; {sum(counts)} in all")
        times = [submitted_to_running(Path(tmp) / f"run{i}", args.delay) for i in range(args.rounds)]
        print(f"submitted -> running on the local provider (delay {args.delay:g}s), {args.rounds} rounds: "
              f"median {statistics.median(times):.2f}s, max {max(times):.2f}s")


if __name__ == "__main__":
    main()
