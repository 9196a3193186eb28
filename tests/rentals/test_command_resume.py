"""A ``command`` run resumes on a new rental from the checkpoint copied off the one that vanished.

The contract (docs/rentals.md, "Resume for command runs"): the run writes
``artifacts/output/checkpoint-N/`` with ``trainer_state.json`` last; a relaunch of the same
generation finds the newest one in ``$RECONCILER_RESUME_DIR``. Real parts: the local provider's
sshd rentals, the reconciler's passes, a shell command as the training job.
"""

from __future__ import annotations

import json
import time

from reconciler.rentals import checkpoints
from tests.world import run_spec

# Attempt 1 saves a checkpoint at step 3 and keeps training; an attempt given a checkpoint says
# where it resumed from and at which step, and ends.
TRAIN = """
if [ -n "${RECONCILER_RESUME_DIR:-}" ]; then
  echo "$RECONCILER_RESUME_DIR" > artifacts/resumed_from
  cp "$RECONCILER_RESUME_DIR/step" artifacts/resumed_step
  exit 0
fi
mkdir -p artifacts/output/checkpoint-3.tmp
echo 3 > artifacts/output/checkpoint-3.tmp/step
echo '{"global_step": 3}' > artifacts/output/checkpoint-3.tmp/trainer_state.json
mv artifacts/output/checkpoint-3.tmp artifacts/output/checkpoint-3
sleep 120
"""


def test_a_command_run_resumes_on_a_new_rental_from_its_copied_checkpoint(rental_world) -> None:
    w = rental_world(flags={"unreachable_grace": 300.0})
    w.add_run(run_spec("cmd", "rental-host", ["sh", "-c", TRAIN], restartPolicy={"maxRetries": 1, "backoffSeconds": 0}))
    rec = w.reconciler()
    store = w.repo / ".reconciler" / "checkpoints" / "cmd" / "g1"
    deadline = time.monotonic() + 60
    while not (store / "checkpoint-3" / "step").exists():
        assert time.monotonic() < deadline, w.status("cmd")
        rec.run_pass()
        time.sleep(0.2)
    first = w.status("cmd")
    assert first.phase == "Running" and first.attempt == 1
    assert not (w.bundle("cmd-g1-a1") / "artifacts" / "resumed_from").exists()

    w.adapter().evaporate(first.handle.machine.split("/", 1)[1])  # the machine is gone, with its disk
    st = w.until("cmd", lambda s: s.phase == "Succeeded", timeout=60)
    assert st.attempt == 2 and st.handle.machine != first.handle.machine, st.message
    bundle = w.bundle("cmd-g1-a2")
    resumed_from = (bundle / "artifacts" / "resumed_from").read_text().strip()
    assert resumed_from == st.handle.workspace + "/inputs/.reconciler/resume/checkpoint-3", resumed_from
    assert (bundle / "artifacts" / "resumed_step").read_text() == "3\n"
    assert json.loads((bundle / "job.json").read_text())["payload"]["resume_from"] == resumed_from
    w.until("cmd", lambda s: not w.rentals())  # and the new rental goes back too


def test_a_command_run_without_checkpoints_starts_over_with_no_variable(rental_world) -> None:
    w = rental_world()
    w.add_run(run_spec("plain", "rental-host", ["sh", "-c", 'echo "[${RECONCILER_RESUME_DIR:-}]"; exit 3'],
                       restartPolicy={"maxRetries": 1, "backoffSeconds": 0}))
    st = w.until("plain", lambda s: s.phase == "Failed" and s.attempt == 2, timeout=60)
    assert (w.bundle("plain-g1-a2") / "artifacts" / "stdout.log").read_text() == "[]\n"
    assert json.loads((w.bundle("plain-g1-a2") / "job.json").read_text())["payload"]["resume_from"] is None
    assert st.exit_code == 3


def test_the_resume_folder_is_named_as_the_run_sees_it() -> None:
    ws = "/home/u/work/ns/r-g1-a2"
    staged = ws + "/inputs/.reconciler/resume/checkpoint-7"
    # In a container the workspace is /bundle: a staged copy needs no mount.
    assert checkpoints.container_view(staged, ws + "/") == ("/bundle/inputs/.reconciler/resume/checkpoint-7", None)
    # Another workspace's checkpoint is mounted read-only beside it, outside /bundle.
    prior = "/home/u/work/ns/r-g1-a1/artifacts/output/checkpoint-7"
    assert checkpoints.container_view(prior, ws) == ("/reconciler-resume/checkpoint-7",
                                                     (prior, "/reconciler-resume/checkpoint-7"))
    # What docker run -v cannot carry is not resumed from: the run starts over.
    assert checkpoints.container_view("/home/u/a:b/checkpoint-7", ws) == (None, None)
    assert checkpoints.container_view("/home/u/a,b/checkpoint-7", ws) == (None, None)
    assert checkpoints.container_view(None, ws) == (None, None)
    assert checkpoints.previous_attempt("r-g2-a3") == "r-g2-a2"
    assert checkpoints.previous_attempt("r-g2-a1") is None and checkpoints.previous_attempt("not an id") is None
