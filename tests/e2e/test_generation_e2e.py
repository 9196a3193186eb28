"""A generation number never names two spec contents: real passes, two machines over SSH (loopback
sshd), a reconciler killed between its launch and its status commit, a machine that stops answering
while the spec changes again, and a fresh clone that knows nothing of the lost launch.

The status the clone reads records generation 1; generation 2 runs, under the second spec, on the
machine that does not answer. Picking the next number from what is in sight would start the third
spec as generation 2 on the other machine: one identity for two contents, and two attempts alive.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from reconciler.core import config
from reconciler.engine.loop import Reconciler
from reconciler.spec.load import load_tree
from reconciler.status.store import load_all
from tests.e2e.attempts import Sampler, here, reap
from tests.repo_helpers import reconcile_cli
from tests.world import World, fleet, machine, run_spec

pytestmark = pytest.mark.e2e
pytest_plugins = ["tests.infra.fixtures"]


def spec(n: int) -> dict:
    return run_spec("gen", "ssh-host", ["sh", "-c", f"sleep 120; exit {n}"], restartPolicy={"maxRetries": 0})


def digest(repo: Path) -> str:
    return load_tree(repo).runs["gen"].digest


def test_a_lost_launch_on_a_machine_that_does_not_answer_keeps_its_generation_number(tmp_path, sshd_factory):
    a, b = sshd_factory(), sshd_factory()
    machines = [machine(a, "lab-a", max_tasks=1), machine(b, "lab-b", max_tasks=1)]
    servers = {"lab-a": a, "lab-b": b}
    with World(tmp_path, [fleet(machines)], terminate_grace=0.5) as w:
        sampler = Sampler("gen", w)
        sampler.start()
        try:
            w.add_run(spec(1))
            first = w.until("gen", lambda s: s.phase == "Running", timeout=60)
            assert first.handle.identity == "gen-g1-a1"

            # The second spec is launched as generation 2, and the pass dies before any status.
            w.add_run(spec(2))
            second = digest(w.repo)
            env = {"RECONCILER_WORKSPACE_ROOT": str(w.local_root), "RECONCILER_NAMESPACE": "test",
                   "RECONCILER_PUSH": "false", "RECONCILER_TERMINATE_GRACE": "0.5"}
            crashed = reconcile_cli(w.repo, "--once", env=env, crash_after="apply", timeout=120)
            assert crashed.returncode == 137, crashed.stderr[-2000:]
            assert w.status("gen").generation == 1  # git never heard of generation 2
            lost = [m["name"] for m in machines if Path(m["workspace_root"], "test", "gen-g2-a1").is_dir()]
            assert len(lost) == 1 and here(w).get("gen-g2-a1"), lost
            other = next(m["name"] for m in machines if m["name"] != lost[0])

            # Its machine stops answering (what runs there keeps running), the spec changes again,
            # and a fresh clone of the repository takes over.
            servers[lost[0]].stop()
            w.add_run(spec(3))
            clone = tmp_path / "clone"
            subprocess.run(["git", "clone", "-q", str(w.repo), str(clone)], check=True, capture_output=True)
            rec = Reconciler(config.load(str(clone), flags=w.flags))
            for _ in range(2):
                rec.run_pass()
            st = load_all(clone / "status")["gen"]
            assert st.phase == "Pending", st
            assert "may hold a launch of gen that never reached git" in st.message, st.message
            assert lost[0] in st.message and st.generation == 1, st
            other_root = next(m["workspace_root"] for m in machines if m["name"] == other)
            assert not Path(other_root, "test", "gen-g2-a1").exists()  # number 2 was not taken again
            assert here(w).get("gen-g1-a1") is None and here(w).get("gen-g2-a1")

            # Back: the lost launch is in sight, numbered past and stopped; the third spec runs as 3.
            servers[lost[0]].start()
            for _ in range(40):
                rec.run_pass()
                st = load_all(clone / "status")["gen"]
                if st.phase == "Running":
                    break
            assert st.phase == "Running" and st.handle.identity == "gen-g3-a1", st
            assert st.spec.digest == digest(clone) != second
            assert here(w).get("gen-g2-a1") is None
        finally:
            sampler.stop()
            reap("gen", w)
    # The sampler must have watched the whole story (every identity seen); how often it sampled
    # depends on the machine's load, so only a floor that makes "no overlap" mean something.
    assert {"gen-g1-a1", "gen-g2-a1", "gen-g3-a1"} <= sampler.seen and sampler.samples >= 20
    assert sampler.overlaps == [], f"two attempts alive at once: {sampler.overlaps[:3]}"
