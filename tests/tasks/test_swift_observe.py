"""Without ms-swift: progress parsing, stall detection, precheck failures, provenance and its diff."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from reconciler.artifacts import provenance
from reconciler.planner.make import make_plan
from reconciler.runtime import probe
from reconciler.status.summarize import summarize
from tests.tasks.test_swift_render import build_bundle, git_repo, run_model
from tests.planner.test_plan import build

STEP = {"loss": 6.48347759, "grad_norm": 3.3, "learning_rate": 9.755e-05, "token_acc": 0.0, "epoch": 0.1,
        "global_step/max_steps": "1/10", "elapsed_time": "0s", "remaining_time": "0s", "train_speed(s/it)": 0.02}


def logging_lines(n: int, max_steps: int = 10, summary: bool = True, history_pad: int = 0) -> list[dict]:
    lines = [dict(STEP, loss=6.5 - i / 10, epoch=i / 10, **{"global_step/max_steps": f"{i}/{max_steps}"})
             for i in range(1, n + 1)]
    if summary:  # the two lines ms-swift writes after training: no "loss" key
        lines.append({"train_runtime": 1.2, "train_loss": 6.4, "epoch": 1.0, "global_step/max_steps": f"{n}/{max_steps}"})
        lines.append({"last_model_checkpoint": "x", "global_step": n,
                      "log_history": [dict(STEP, step=i) for i in range(n)] + [{"pad": "x" * history_pad}]})
    return lines


def write_ws(ws: Path, lines: list[dict]) -> Path:
    out = ws / "artifacts" / "output"
    out.mkdir(parents=True, exist_ok=True)
    (out / "logging.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return out / "logging.jsonl"


# ---------------------------------------------------------------- progress


def test_normalize_progress_takes_step_lines_only():
    p = probe.normalize_progress(dict(STEP, **{"global_step/max_steps": "3/10"}), 0.0)
    assert p == {"step": 3, "max_steps": 10, "loss": 6.48347759, "learning_rate": 9.755e-05, "epoch": 0.1,
                 "updated_at": "1970-01-01T00:00:00Z"}
    assert probe.normalize_progress({"train_loss": 6.4, "global_step/max_steps": "10/10"}, 0.0) is None
    assert probe.normalize_progress({"loss": "nan?"}, 0.0) is None
    assert probe.normalize_progress({"loss": 1.0, "step": 7}, None)["step"] == 7  # log_history style


def test_progress_skips_summary_lines_even_when_the_last_is_huge(tmp_path):
    # The final line repeats the whole log history: far larger than one read chunk.
    path = write_ws(tmp_path, logging_lines(10, history_pad=300_000))
    os.utime(path, (1_800_000_000, 1_800_000_000))
    p = probe._progress(str(tmp_path))
    assert p["step"] == 10 and p["max_steps"] == 10 and p["loss"] == 5.5
    assert p["updated_at"] == "2027-01-15T08:00:00Z"


def test_progress_of_a_resumed_run_appended_to_the_same_file(tmp_path):
    write_ws(tmp_path, logging_lines(5, max_steps=5) + logging_lines(8, max_steps=10, summary=False)[5:])
    p = probe._progress(str(tmp_path))
    assert (p["step"], p["max_steps"]) == (8, 10)


def test_no_progress_before_the_first_step(tmp_path):
    assert probe._progress(str(tmp_path)) is None
    write_ws(tmp_path, [])
    assert probe._progress(str(tmp_path)) is None


def test_probe_reports_precheck_refusal_as_permanent(tmp_path):
    ws = tmp_path / "root" / "r-g1-a1"
    (ws / "runtime").mkdir(parents=True)
    (ws / "artifacts").mkdir()
    (ws / "runtime" / "result.json").write_text(json.dumps({"state": "failed", "exit_code": 3, "finished_ts": 5}))
    (ws / "artifacts" / "runtime-precheck.json").write_text(json.dumps({"ok": False, "reason": "swift 4.6.0 != 4.5"}))
    run = probe.probe(str(tmp_path / "root"), ["r"])["runs"]["r-g1-a1"]
    assert run["permanent"] is True and run["message"] == "precheck failed: swift 4.6.0 != 4.5"
    (ws / "artifacts" / "runtime-precheck.json").write_text(json.dumps({"ok": True}))
    run = probe.probe(str(tmp_path / "root"), ["r"])["runs"]["r-g1-a1"]
    assert "permanent" not in run


# ---------------------------------------------------------------- plan and status: stall, precheck


def swift_case(stall: dict | None, progress_at: float | None, now: float, retries: int = 0) -> dict:
    spec = {"task": {"type": "swift-sft", "model": "m", "dataset": ["d"]},
            "restartPolicy": {"maxRetries": retries, "backoffSeconds": 0}}
    if stall:
        spec["stall"] = stall
    progress = None
    if progress_at is not None:
        progress = {"step": 3, "max_steps": 10, "loss": 6.1,
                    "updated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(progress_at))}
    return {"now": now, "runs": {"sft": spec},
            "observed": {"local": {"runs": {"sft-g1-a1": {"state": "running", "pid": 42, "started_at": 1000.0,
                                                          "progress": progress}}}},
            "previous": {"sft": {"phase": "Running", "generation": 1, "attempt": 1, "spec": {"digest": "auto"},
                                 "handle": {"machine": "local", "identity": "sft-g1-a1"}}}}


def plan_for(case: dict):
    desired, world, previous, now, settings = build(case)
    plan = make_plan(desired, world, previous, now, settings)
    return plan.for_run("sft"), previous, world


def test_progressing_run_is_not_stalled():
    change, _, _ = plan_for(swift_case({"afterSeconds": 60}, progress_at=1100.0, now=1150.0))
    assert change.action == "none" and change.stalled is None


def test_stall_sets_a_condition_without_terminating_by_default():
    change, previous, world = plan_for(swift_case({"afterSeconds": 60}, progress_at=1100.0, now=1200.0))
    assert change.action == "none" and change.phase == "Running"
    # No running count in the message: it would rewrite the status on every pass.
    assert change.stalled == ("no training progress since step 3 at 1970-01-01T00:18:20Z "
                              "(stall.afterSeconds 60)")
    st = summarize(previous["sft"], change, None, world.find("sft-g1-a1"), 1200.0, None)
    c = st.condition("Stalled")
    assert c.status == "True" and c.reason == "NoProgress" and "since step 3" in c.message
    # Still stalled a pass later: the status does not move.
    later, _, world_later = plan_for(swift_case({"afterSeconds": 60}, progress_at=1100.0, now=1260.0))
    assert summarize(st, later, None, world_later.find("sft-g1-a1"), 1260.0, None) is st
    assert st.progress["step"] == 3
    # Progress again: the condition flips back.
    change2, _, world2 = plan_for(swift_case({"afterSeconds": 60}, progress_at=1290.0, now=1300.0))
    st2 = summarize(st, change2, None, world2.find("sft-g1-a1"), 1300.0, None)
    assert st2.condition("Stalled").status == "False" and st2.condition("Stalled").reason == "Progressing"


def test_stall_before_the_first_step_counts_from_the_start():
    change, _, _ = plan_for(swift_case({"afterSeconds": 60}, progress_at=None, now=1100.0))
    assert "since the start" in change.stalled


def test_stall_terminates_only_with_action_terminate():
    change, _, _ = plan_for(swift_case({"afterSeconds": 60, "action": "terminate"}, progress_at=1000.0, now=1200.0))
    assert change.action == "terminate" and change.code == "Stalled"
    assert [k.identity for k in change.kill] == ["sft-g1-a1"]
    change, _, _ = plan_for(swift_case(None, progress_at=1000.0, now=99999.0))
    assert change.action == "none" and change.stalled is None


def test_precheck_failure_is_not_retried():
    case = swift_case(None, None, 1200.0, retries=3)
    case["observed"]["local"]["runs"]["sft-g1-a1"] = {
        "state": "failed", "exit_code": 3, "finished_at": 1100.0, "permanent": True,
        "message": "precheck failed: swift imported from /x is not fork 'acme'"}
    change, _, _ = plan_for(case)
    assert change.action == "collect" and change.phase == "Failed"
    assert change.reason == ("sft-g1-a1 failed (exit 3): precheck failed: swift imported from /x is not fork 'acme'; "
                             "not retried: retrying cannot help")
    case["observed"]["local"]["runs"]["sft-g1-a1"]["permanent"] = False  # an ordinary failure is retried
    change, _, _ = plan_for(case)
    assert change.action == "relaunch" and change.resume_from == "sft-g1-a1"


# ---------------------------------------------------------------- provenance


def fake_run(bundle: Path, hostname: str, started: int, loss: float) -> None:
    (bundle / "runtime").mkdir(exist_ok=True)
    (bundle / "runtime" / "started_at").write_text(f"{started}\n")
    (bundle / "runtime" / "launched_at").write_text(f"{started - 1}\n")
    (bundle / "runtime" / "result.json").write_text(json.dumps({"state": "succeeded", "exit_code": 0,
                                                                "finished_at": "2026-11-23T04:00:00Z"}))
    arts = bundle / "artifacts"
    (arts / "runtime-precheck.json").write_text(json.dumps({
        "ok": True, "reason": None, "duration_s": 1.5,
        "python": {"executable": "/opt/swift-venv/bin/python", "version": "3.11.7", "implementation": "CPython"},
        "platform": {"hostname": hostname, "platform": "Linux-x86_64"},
        "packages": {"torch": {"present": True, "version": "2.13.0"}, "ms-swift": {"present": True, "version": "4.6.0"}},
        "torch": {"present": True, "version": "2.13.0+cpu", "cuda_version": None, "cudnn_version": None},
        "swift": {"present": True, "version": "4.6.0", "file": "/x/swift/__init__.py"},
        "checks": [{"name": "swift_version", "ok": True, "expected": "4.6.0", "actual": "4.6.0"}]}))
    (arts / "nvml-audit.jsonl").write_text(json.dumps({"ts": 1, "event": "nvml_unavailable",
                                                       "reason": "NVML Shared Library Not Found"}) + "\n")
    write_ws(bundle, logging_lines(10)[:-2] + [dict(STEP, loss=loss, **{"global_step/max_steps": "10/10"})])


def test_two_runs_of_the_same_spec_have_identical_reproducibility(tmp_path):
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    (repo / "data" / "sft.jsonl").write_text('{"messages": []}\n')
    code = git_repo(tmp_path / "upstream", {"train.py": "x = 1\n"})
    run = run_model({"model": "Qwen/Qwen2.5-0.5B", "dataset": ["inputs/data/sft.jsonl"]}, inputs=["data/sft.jsonl"],
                    code={"repo": str(tmp_path / "upstream"), "commit": code.head.commit.hexsha})
    a = build_bundle(tmp_path, run, identity="r-g1-a1", machine="local")
    b = build_bundle(tmp_path, run, identity="r-g1-a2", machine="gpu-1")
    fake_run(a, "host-a", 1_800_000_000, 5.5)
    fake_run(b, "host-b", 1_800_000_100, 5.6)
    ma, mb = provenance.write(a, 1_800_000_200), provenance.write(b, 1_800_000_300)
    assert json.loads((a / "artifacts" / "manifest.json").read_text()) == ma
    assert ma["reproducibility"] == mb["reproducibility"]
    assert ma["reproducibility_digest"] == mb["reproducibility_digest"]
    r = ma["reproducibility"]
    assert r["spec"]["commit"] == "d" * 40 and r["code"]["commit"] == code.head.commit.hexsha
    assert r["inputs"][0]["path"] == "data/sft.jsonl" and r["environment"]["swift"] == {"version": "4.6.0"}
    run_a = ma["run"]
    assert run_a["hostname"] == "host-a" and run_a["machine"] == "local" and run_a["attempt"] == 1
    assert run_a["gpu_inventory"] == {"source": "artifacts/nvml-audit.jsonl", "available": False,
                                      "reason": "NVML Shared Library Not Found", "samples": 0}
    assert run_a["timestamps"]["started_at"] == "2027-01-15T08:00:00Z"
    assert run_a["last_step"]["step"] == 10
    assert {x["path"] for x in run_a["artifacts"]} >= {"artifacts/output/logging.jsonl", "artifacts/nvml-audit.jsonl"}
    assert "artifacts/manifest.json" not in {x["path"] for x in run_a["artifacts"]}

    text, differs = provenance.diff_text(ma, mb, "r-g1-a1", "r-g1-a2")
    assert not differs and "reproducibility: identical (sha256:" in text
    assert "  run.machine: local -> gpu-1" in text and "  run.hostname: host-a -> host-b" in text
    assert "run.artifacts[artifacts/output/logging.jsonl].sha256" in text

    summary = provenance.summary(ma)
    assert summary["reproducibility_digest"] == ma["reproducibility_digest"]
    assert summary["gpus"] == "none (NVML Shared Library Not Found)" and summary["swift"] == "4.6.0"


def test_diff_names_the_reproducibility_fields_that_differ(tmp_path):
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    (repo / "data" / "sft.jsonl").write_text("one\n")
    run = run_model({"model": "m", "dataset": ["inputs/data/sft.jsonl"]}, inputs=["data/sft.jsonl"])
    a = build_bundle(tmp_path, run, identity="r-g1-a1")
    (repo / "data" / "sft.jsonl").write_text("two\n")
    run2 = run_model({"model": "m", "dataset": ["inputs/data/sft.jsonl"], "learning_rate": 1e-5},
                     inputs=["data/sft.jsonl"])
    b = build_bundle(tmp_path, run2, identity="r-g2-a1")
    fake_run(a, "h", 1, 5.5)
    fake_run(b, "h", 2, 5.5)
    text, differs = provenance.diff_text(provenance.build(a), provenance.build(b), "A", "B")
    assert differs
    assert "reproducibility.inputs[data/sft.jsonl].sha256:" in text
    assert "reproducibility.task.learning_rate: null -> 1e-05" in text
    assert "reproducibility.spec.digest:" in text


def test_flatten_keys_records_by_path():
    flat = provenance.flatten({"a": [{"path": "x", "n": 1}, {"path": "y", "n": 2}], "b": {"c": None}, "e": []})
    assert flat == {"a[x].path": "x", "a[x].n": 1, "a[y].path": "y", "a[y].n": 2, "b.c": None, "e": []}


def test_after_a_stall_terminate_the_reason_says_so():
    case = swift_case({"afterSeconds": 60, "action": "terminate"}, progress_at=1000.0, now=1200.0)
    change, previous, world = plan_for(case)
    st = summarize(previous["sft"], change, None, world.find("sft-g1-a1"), 1200.0, None)
    assert st.condition("Stalled").status == "True"
    case["observed"]["local"]["runs"]["sft-g1-a1"].update(state="terminated", exit_code=143, finished_at=1201.0)
    desired, world2, _, _, settings = build(case)
    nxt = make_plan(desired, world2, {"sft": st}, 1210.0, settings).for_run("sft")
    assert "sft-g1-a1 was stopped after stalling (no training progress since" in nxt.reason
