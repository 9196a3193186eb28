"""Status files: stable bytes, lenient reading, and one place that decides the next status."""

from __future__ import annotations

from reconciler.core.runstatus import Handle, RunStatus, SpecRef, iso
from reconciler.status import store as st
from reconciler.status.summarize import record, set_condition, summarize
from reconciler.engine.apply import Outcome
from reconciler.machines.base import LaunchResult
from reconciler.core.observed import ObservedRun
from reconciler.core.plan import Change


def running(name: str = "r") -> RunStatus:
    s = RunStatus(name=name, generation=1, attempt=1, spec=SpecRef(digest="sha256:d"),
                     handle=Handle(machine="local", identity=f"{name}-g1-a1"), progress={"step": 7})
    record(s, "Running", "new run", 1000.0)
    set_condition(s, "MachineReachable", "True", "Reachable", "", 1000.0)
    return s


def test_dump_is_stable_and_round_trips(tmp_path):
    s = running()
    s.message = "yes: a 'quoted'\nmulti-line message"
    assert st.write_if_changed(tmp_path, s) is True
    first = (tmp_path / "r.yaml").read_bytes()
    assert st.write_if_changed(tmp_path, s) is False  # unchanged: not even rewritten
    assert (tmp_path / "r.yaml").read_bytes() == first
    again = st.load_all(tmp_path)["r"]
    assert again == s
    assert first.decode().splitlines()[1:4] == ["apiVersion: reconciler/v1", "kind: RunStatus", "name: r"]


def test_reading_is_lenient(tmp_path):
    (tmp_path / "new.yaml").write_text("name: new\nphase: Running\nfrom_the_future: {x: 1}\n")
    (tmp_path / "broken.yaml").write_text("name: [unclosed\n")
    (tmp_path / "misnamed.yaml").write_text("name: other\nphase: Running\n")
    loaded = st.load_all(tmp_path)
    assert set(loaded) == {"new"} and loaded["new"].phase == "Running"


def test_steady_run_keeps_its_status_object():
    prev = running()
    change = Change("r", "none", "Running", "running", "Running", 1, 1, identity="r-g1-a1", spec_digest="sha256:d")
    obs = ObservedRun("r-g1-a1", "local", "running", progress={"step": 7})
    assert summarize(prev, change, None, obs, 2000.0, None) is prev
    moved = ObservedRun("r-g1-a1", "local", "running", progress={"step": 8})
    new = summarize(prev, change, None, moved, 2000.0, None)
    assert new is not prev and new.progress == {"step": 8} and prev.progress == {"step": 7}
    assert new.history == prev.history  # progress is not a transition


def test_relaunch_forgets_the_previous_attempts_progress_and_records_one_transition():
    prev = running()
    change = Change("r", "relaunch", "Relaunch", "r-g1-a1 failed (exit 3); retry 1/2", "Running", 1, 2,
                    identity="r-g1-a2", machine="local", spec_digest="sha256:d")
    out = Outcome("r", "relaunch", launched=LaunchResult("r-g1-a2", "/ws/r-g1-a2", pid=99))
    prev.artifacts = [{"path": "artifacts/stdout.log", "size": 3}]
    prev.provenance = {"manifest": "artifacts/manifest.json", "reproducibility_digest": "sha256:g1"}
    new = summarize(prev, change, out, None, 2000.0, "abc")
    assert new.progress is None and new.attempt == 2 and new.handle.identity == "r-g1-a2" and new.handle.pid == 99
    assert [h.attempt for h in new.history] == [1, 2]
    assert new.artifacts == [] and new.provenance is None  # the running attempt's, not the last one's


def test_a_new_run_records_when_it_was_created_once():
    s = running()
    assert s.created_at == iso(1000.0)
    record(s, "Succeeded", "done", 5000.0)
    assert s.created_at == iso(1000.0)


def test_condition_transition_time_moves_only_when_its_status_flips():
    s = running()
    set_condition(s, "MachineReachable", "False", "Unreachable", "no reply", 1500.0)
    t = s.condition("MachineReachable").last_transition
    set_condition(s, "MachineReachable", "False", "Unreachable", "still no reply", 1600.0)
    assert s.condition("MachineReachable").last_transition == t == iso(1500.0)


def test_permanent_failure_fails_the_run_with_the_reason():
    prev = running()
    change = Change("r", "relaunch", "Relaunch", "retry", "Running", 1, 2, identity="r-g1-a2", machine="local")
    out = Outcome("r", "relaunch", ok=False, error="image 'x' not found on local", permanent=True)
    new = summarize(prev, change, out, None, 2000.0, None)
    assert new.phase == "Failed" and "image 'x' not found" in new.message
    assert new.condition("Ready").reason == "LaunchFailed"


def test_the_curve_gets_every_step_logged_since_the_last_pass():
    from reconciler.core.boundary import clean_curve
    from reconciler.status.summarize import extend_curve_with

    curve = [(5, 2.0)]
    points = clean_curve([[3, 2.1], [5, 2.0], [6, 1.9], [7, 1.8], [8, 1.7], ["9", 1.0], [9, float("nan")], [4, 9.9]])
    assert points == [(3, 2.1), (5, 2.0), (6, 1.9), (7, 1.8), (8, 1.7)]  # bad and falling steps dropped
    out = extend_curve_with(curve, points, {"step": 8, "loss": 1.7})
    assert out == [(5, 2.0), (6, 1.9), (7, 1.8), (8, 1.7)]
    assert extend_curve_with([], points, {"step": 8, "loss": 1.7})[0] == (3, 2.1)
    restarted = extend_curve_with(out, [(1, 3.0), (2, 2.9)], {"step": 2, "loss": 2.9})
    assert restarted == [(2, 2.9)]  # a restart from scratch drops what it replaces
    assert clean_curve("nonsense") == [] and len(clean_curve([[i, 1.0] for i in range(1000)])) == 64
