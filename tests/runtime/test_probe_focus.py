"""The probe's cheaper looks: a group known alive by its leader without a scan of every process,
the processes carrying an identity found without reading every ``stat``, and a probe of a few
runs' workspaces only (runtime/readings.py, runtime/probe.py). Real processes."""

from __future__ import annotations

import os
import subprocess

from reconciler.machines import remote_agent
from reconciler.runtime import probe, readings, resident
from tests.repo_helpers import wait_for


def _start(ws, identity: str, new_session: bool = True) -> subprocess.Popen:
    env = {"PATH": os.environ["PATH"], "RECONCILER_IDENTITY": identity, "RECONCILER_BUNDLE": str(ws)}
    return subprocess.Popen(["sleep", "300"], env=env, start_new_session=new_session)


def _workspace(root, identity: str, pid: int) -> None:
    rt = root / identity / "runtime"
    rt.mkdir(parents=True)
    (rt / "pid").write_text(f"{pid}\n")


def test_a_leader_that_lives_and_carries_the_identity_proves_its_group_alive(tmp_path):
    leader = _start(tmp_path / "x-g1-a1", "x-g1-a1")
    member = _start(tmp_path / "x-g1-a1", "x-g1-a1", new_session=False)  # in the test's own group
    try:
        assert readings.leader_alive(leader.pid, "x-g1-a1")
        assert readings.group_alive(leader.pid, "x-g1-a1")
        assert not readings.leader_alive(leader.pid, "y-g1-a1")  # a recycled pid: another identity
        assert not readings.leader_alive(member.pid, "x-g1-a1")  # alive, but leads no group of its own
    finally:
        leader.kill()
        member.kill()
    leader.wait()  # reaped: gone
    member.wait()
    assert not readings.leader_alive(leader.pid, "x-g1-a1")


def test_carriers_without_a_scan_of_every_stat_find_the_same_processes(tmp_path):
    p = _start(tmp_path / "c-g1-a1", "c-g1-a1")
    try:
        wait_for(lambda: readings.carriers(None, str(tmp_path)).get("c-g1-a1"), what="the carrier")
        assert readings.carriers(None, str(tmp_path)) == readings.carriers(readings._process_groups(),
                                                                           str(tmp_path)) == {"c-g1-a1": [p.pid]}
    finally:
        p.kill()
        p.wait()
    assert readings.carriers(None, str(tmp_path)) == {}


def test_a_probe_of_some_runs_judges_only_their_workspaces(tmp_path):
    a, b = _start(tmp_path / "a-g1-a1", "a-g1-a1"), _start(tmp_path / "b-g1-a1", "b-g1-a1")
    try:
        _workspace(tmp_path, "a-g1-a1", a.pid)
        _workspace(tmp_path, "b-g1-a1", b.pid)
        every = probe.probe(str(tmp_path), ["a", "b"])["runs"]
        some = probe.probe(str(tmp_path), ["a", "b"], only={"a"})["runs"]
        assert set(every) == {"a-g1-a1", "b-g1-a1"} and set(some) == {"a-g1-a1"}
        assert some["a-g1-a1"] == every["a-g1-a1"]  # judged as a full probe judges it
        assert some["a-g1-a1"]["state"] == "running" and some["a-g1-a1"]["live"] == 1
        assert probe.probe(str(tmp_path), ["a", "b"], only=set())["runs"] == {}
    finally:
        a.kill()
        b.kill()
        a.wait()
        b.wait()


def test_the_resident_helper_keeps_the_last_list_of_names_under_its_reference(tmp_path):
    import io
    import json

    done = tmp_path / "old-g1-a1" / "runtime"  # a collected end: reported only while its run is watched
    done.mkdir(parents=True)
    (done / "result.json").write_text('{"exit_code": 0, "finished_at": 1000.0}')
    (done / "collected").write_text("")
    root = str(tmp_path)
    lines = [{"op": "probe", "root": root, "names": ["old"], "names_ref": "a"},
             {"op": "probe", "root": root, "names_ref": "a"},  # the list kept under "a"
             {"op": "probe", "root": root, "names_ref": "b"},  # not kept: an error, nothing guessed
             {"op": "probe", "root": root, "names": [], "names_ref": "c"},
             {"op": "probe", "root": root, "names_ref": "a"}]  # only the last list is kept
    out = io.StringIO()
    assert resident.serve(io.StringIO("".join(json.dumps(x) + "\n" for x in lines)), out, probe.dispatch) == 0
    answers = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [sorted(a.get("runs", {})) for a in answers[:2]] == [["old-g1-a1"], ["old-g1-a1"]]
    assert "not kept" in answers[2]["__error__"] and "not kept" in answers[4]["__error__"]
    assert answers[3]["runs"] == {}


def _collected(root, name: str) -> None:
    done = root / f"{name}-g1-a1" / "runtime"  # an ended attempt, collected: reported only while watched
    done.mkdir(parents=True)
    (done / "result.json").write_text('{"exit_code": 0, "finished_at": 1000.0}')
    (done / "collected").write_text("")


def _served(lines: list[bytes]) -> list[dict]:
    import io
    import json

    out = io.StringIO()
    assert resident.serve(io.StringIO(b"".join(lines).decode()), out, probe.dispatch) == 0
    return [json.loads(x) for x in out.getvalue().splitlines()]


def test_a_helper_holding_an_earlier_list_is_sent_only_the_change(tmp_path):
    """At 1,000 watched names a run that starts or settles changes one name: the helper is sent that
    name, not the list, and what it reports follows the new list."""
    for name in ("old", "new"):
        _collected(tmp_path, name)
    base = [f"run-{i:04d}" for i in range(1000)]
    first, second = sorted([*base, "old"]), sorted([*base, "new"])
    args = {"op": "probe", "root": str(tmp_path)}
    line1, ref1 = remote_agent.resident_request({**args, "names": first}, None)
    line2, ref2 = remote_agent.resident_request({**args, "names": second}, ref1)
    assert ref1 != ref2 and b'"names":' not in line2 and len(line2) < len(line1) / 40
    assert b'"names_add":["new"]' in line2 and b'"names_drop":["old"]' in line2
    line3, _ = remote_agent.resident_request({**args, "names": second}, ref2)
    answers = _served([line1, line2, line3])
    assert [sorted(a["runs"]) for a in answers] == [["old-g1-a1"], ["new-g1-a1"], ["new-g1-a1"]]
    # A helper that holds none of the lists kept here is sent the whole list.
    whole, _ = remote_agent.resident_request({**args, "names": second}, "another")
    assert b'"names":["new",' in whole


def test_a_change_the_helper_cannot_apply_is_an_error_never_a_guess(tmp_path):
    _collected(tmp_path, "old")
    args = {"op": "probe", "root": str(tmp_path)}
    line1, ref1 = remote_agent.resident_request({**args, "names": sorted(["a", "old"] + [f"x{i}" for i in range(50)])}, None)
    line2, ref2 = remote_agent.resident_request({**args, "names": sorted(["a"] + [f"x{i}" for i in range(50)])}, ref1)
    assert b'"names_base"' in line2
    other_base = line2.replace(ref1.encode(), b"0" * 32)  # a list the helper never held
    wrong = line2.replace(b'"names_drop":["old"]', b'"names_drop":[]')  # not the list referenced
    answers = _served([line1, other_base, wrong, line1, line2])
    assert "not kept" in answers[1]["__error__"]
    assert "does not give the list" in answers[2]["__error__"]
    assert sorted(answers[3]["runs"]) == ["old-g1-a1"] and answers[4]["runs"] == {}
    # Names that are not sorted and unique are never sent as a change: the helper rebuilds sorted lists.
    _, ref3 = remote_agent.resident_request({**args, "names": ["b", "a"] + [f"x{i}" for i in range(50)]}, None)
    line4, _ = remote_agent.resident_request({**args, "names": ["b", "a", "c"] + [f"x{i}" for i in range(50)]}, ref3)
    assert b'"names_base"' not in line4 and b'"names":["b","a","c",' in line4
