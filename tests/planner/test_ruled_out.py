"""A permanent end that is the machine's rules that machine out for the run: the next attempt goes
to another machine, is not counted as a retry, and the status keeps the list; with no other
machine the run fails with the reason. The planner is pure: these are plans from values."""

from __future__ import annotations

from reconciler.core.actions import Action
from reconciler.core.plan import Change
from reconciler.core.runstatus import RunStatus
from reconciler.planner.make import make_plan
from reconciler.planner.ruled_out import recorded
from reconciler.status import store
from reconciler.status.summarize import summarize
from tests.planner.test_plan import build

REFUSED = {"state": "failed", "exit_code": 127, "finished_at": 900.0, "permanent": True, "scope": "machine",
           "message": "precheck failed: python /v/bin/python links to /home/a/py, which login u on gpu-1 cannot reach"}


def _case(template: str = "ssh-host", retries: int = 0, machine: str = "gpu-1", ended: dict | None = None,
          previous: dict | None = None, ident: str = "train-g1-a1") -> dict:
    spec = {"template": template, "task": {"type": "command", "argv": ["true"]},
            "restartPolicy": {"maxRetries": retries, "backoffSeconds": 0}}
    prev = {"phase": "Running", "generation": 1, "attempt": int(ident.rsplit("-a", 1)[1]),
            "spec": {"digest": "auto"}, "handle": {"machine": machine, "identity": ident}, **(previous or {})}
    return {"runs": {"train": spec}, "now": 1000.0, "observed": {m: {"runs": {}} for m in ("gpu-1", "gpu-2")} | {
        machine: {"runs": {ident: {**REFUSED, **(ended or {})}}}}, "previous": {"train": prev}}


def _plan(case: dict) -> Change:
    desired, world, previous, now, settings = build(case)
    [c] = [c for c in make_plan(desired, world, previous, now, settings).changes if c.name == "train"]
    return c


def test_the_next_attempt_goes_to_another_machine_and_is_no_retry() -> None:
    c = _plan(_case())
    assert (c.action, c.machine, c.attempt, c.identity) == (Action.RELAUNCH, "gpu-2", 2, "train-g1-a2")
    assert "gpu-1 is ruled out for this run" in c.reason and "not counted as a retry" in c.reason
    assert [e["machine"] for e in c.ruled_out] == ["gpu-1"] and "cannot reach" in c.ruled_out[0]["reason"]
    assert c.collect_first is not None and c.collect_first.identity == "train-g1-a1"  # its logs and report


def test_placement_skips_a_ruled_out_machine_on_later_passes() -> None:
    # Attempt 2 not started yet (its pass died): gpu-1 sorts first and has room, yet it is skipped.
    ruled = [{"machine": "gpu-1", "reason": "no python", "attempt": 1}]
    case = _case(previous={"phase": "Pending", "attempt": 2, "ruled_out": ruled, "handle": None})
    case["observed"]["gpu-1"]["runs"] = {}
    c = _plan(case)
    assert (c.machine, c.identity) == ("gpu-2", "train-g1-a2"), (c.action, c.reason, c.considered)


def test_no_other_machine_fails_with_the_reason_and_keeps_the_list() -> None:
    ruled = [{"machine": "gpu-1", "reason": "no python", "attempt": 1}]
    c = _plan(_case(machine="gpu-2", ident="train-g1-a2", previous={"ruled_out": ruled}))
    assert c.phase == "Failed" and c.action == Action.COLLECT
    assert "not retried" in c.reason and "cannot reach" in c.reason
    assert [e["machine"] for e in c.ruled_out] == ["gpu-1", "gpu-2"]
    c = _plan(_case(template="local-host", machine="local"))  # this machine only: nowhere else to go
    assert c.phase == "Failed" and [e["machine"] for e in c.ruled_out] == ["local"]


def test_the_specs_own_permanent_end_fails_as_before() -> None:
    c = _plan(_case(ended={"scope": None, "exit_code": 3, "message": "precheck failed: swift 4.6 != 4.5"}))
    assert c.phase == "Failed" and c.ruled_out is None


def test_ends_on_ruled_out_machines_are_not_counted_as_retries() -> None:
    ruled = [{"machine": "gpu-1", "reason": "no python", "attempt": 1}]
    plain = {"scope": None, "permanent": False, "exit_code": 1, "message": ""}
    c = _plan(_case(retries=1, machine="gpu-2", ident="train-g1-a2", ended=plain, previous={"ruled_out": ruled}))
    assert c.action == Action.RELAUNCH and "retry 1/1" in c.reason, c.reason
    c = _plan(_case(retries=0, machine="gpu-2", ident="train-g1-a2", ended=plain, previous={"ruled_out": ruled}))
    assert c.phase == "Failed" and "no retries left" in c.reason


def test_the_status_keeps_the_list_until_the_spec_changes() -> None:
    ruled = [{"machine": "gpu-1", "reason": "no python", "attempt": 1}]
    prev = RunStatus(name="train", generation=1, attempt=1, phase="Running")
    st = summarize(prev, Change("train", Action.RELAUNCH, "Relaunch", "moved", "Running", generation=1, attempt=2,
                                identity="train-g1-a2", ruled_out=ruled), None, None, 1000.0, None)
    assert st.ruled_out == ruled
    text = store.dump(st)
    assert "ruled_out:" in text and store.parse_text(text, "train").ruled_out == ruled  # written, read back
    st2 = summarize(st, Change("train", Action.LAUNCH, "SpecChanged", "spec changed", "Running", generation=2,
                               attempt=1, identity="train-g2-a1"), None, None, 1001.0, None)
    assert st2.ruled_out is None
    # Lenient on read: entries that are not ones are skipped; another generation's list is not this one's.
    odd = RunStatus(name="train", generation=1, ruled_out=[ruled[0], "gpu-9", {"machine": 5}, {"machine": "gpu-2"}])
    assert [e["machine"] for e in recorded(odd, 1)] == ["gpu-1", "gpu-2"] and recorded(odd, 2) == []


def test_rentals_are_ruled_out_a_few_times_then_the_run_fails() -> None:
    from types import SimpleNamespace

    from reconciler.planner.ruled_out import RENTAL_TRIES, _another

    desired, world, previous, now, settings = build(_case())
    book = SimpleNamespace(desired=desired, slots={})
    entry = desired.runs["train"]
    tpl = desired.templates["ssh-host"].model_copy(deep=True)
    tpl.placement = tpl.placement.model_copy(update={"kind": "rental"})
    desired.templates["rent"] = tpl
    entry.run.spec.template = "rent"
    assert _another(book, entry, {f"local/lr-{i}" for i in range(RENTAL_TRIES - 1)})
    assert not _another(book, entry, {f"local/lr-{i}" for i in range(RENTAL_TRIES)})
