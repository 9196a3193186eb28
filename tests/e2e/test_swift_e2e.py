"""ms-swift end to end on this machine's CPU: real `swift sft` / `swift rlhf` runs driven by the reconciler.

Real parts only: a real git repository, the reconciler's passes (`Reconciler.run_pass`), the launch
wrapper, the precheck and the GPU sampler started with the execution plane's python (the ms-swift venv,
RECONCILER_SWIFT_PYTHON, default /opt/swift-venv/bin/python), a tiny random Qwen2 built locally (no
download) and the 20-row dataset in tests/data/swift. Without the venv these tests skip; with CI=true
they fail instead, so CI can never silently skip them.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import git
import pytest
import yaml

from tests.repo_helpers import make_repo, reconciler, status_of, workspace

pytestmark = [pytest.mark.swift, pytest.mark.e2e]

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "data" / "swift"
MAKE_MODEL = HERE.parents[1] / "scripts" / "make_tiny_model.py"
SWIFT_PYTHON = os.environ.get("RECONCILER_SWIFT_PYTHON", "/opt/swift-venv/bin/python")
INSTALL_HINT = "set RECONCILER_SWIFT_PYTHON or run .ci/install-swift.sh /opt/swift-venv"


def _swift_problem() -> str | None:
    if not os.access(SWIFT_PYTHON, os.X_OK):
        return f"no ms-swift python at {SWIFT_PYTHON}"
    p = subprocess.run([SWIFT_PYTHON, "-c", "import swift, torch, tokenizers, pynvml"], capture_output=True,
                       text=True, timeout=120)
    if p.returncode != 0:
        return f"{SWIFT_PYTHON} cannot import swift, torch, tokenizers and pynvml: {p.stderr.strip()[-300:]}"
    return None


def _run_folder(tmp_path_factory) -> Path:
    """This run's temporary folder, the same for all of its pytest-xdist workers."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # above each worker's own


@pytest.fixture(scope="session")
def swift_python(tmp_path_factory) -> str:
    # Checked once per run, not once per module and worker: importing torch and swift takes seconds.
    check = _run_folder(tmp_path_factory) / "swift-check.json"
    with open(f"{check}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not check.exists():
            check.write_text(json.dumps({"problem": _swift_problem()}))
        problem = json.loads(check.read_text())["problem"]
    if problem:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{problem}: {INSTALL_HINT}", pytrace=False)
        pytest.skip(f"{problem}: {INSTALL_HINT}")
    return SWIFT_PYTHON


@pytest.fixture(scope="session")
def tiny_model(swift_python, tmp_path_factory) -> Path:
    # One model for the whole run, whichever module or pytest-xdist worker asks first: building it
    # (torch, transformers) takes many seconds of CPU, and the script leaves a built folder as it is.
    out = _run_folder(tmp_path_factory) / "swift-model" / "tiny-qwen2"
    out.parent.mkdir(exist_ok=True)
    with open(out.parent / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        p = subprocess.run([swift_python, str(MAKE_MODEL), str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return out


def template(python: str) -> str:
    return textwrap.dedent(f"""\
        apiVersion: reconciler/v1
        kind: ExecutionTemplate
        id: local-swift
        description: ms-swift on this machine, with the ms-swift venv's python
        placement: {{kind: local}}
        launch_mode: {{kind: host_process}}
        defaults:
          python: {python}
          runtime_env: {{HF_HUB_OFFLINE: "1", TOKENIZERS_PARALLELISM: "false", OMP_NUM_THREADS: "1"}}
        """)


COMMON = """\
    model_type: qwen2
    template: qwen
    tuner_type: full
    torch_dtype: float32
    logging_steps: 1
    per_device_train_batch_size: 2
    gradient_accumulation_steps: 1
    learning_rate: 1.0e-4
    max_length: 256
    seed: 42
"""
PASSTHROUGH = "    args: {dataloader_num_workers: 0, dataset_num_proc: 1, split_dataset_ratio: 0}\n"


def run_yaml(name: str, task: str, spec_extra: str = "", retries: int = 0) -> str:
    return (textwrap.dedent(f"""\
        apiVersion: reconciler/v1
        kind: Run
        metadata:
          name: {name}
        spec:
          template: local-swift
          restartPolicy: {{maxRetries: {retries}, backoffSeconds: 0}}
        """) + spec_extra + "  task:\n" + task + COMMON + PASSTHROUGH)


def setup_repo(tmp_path: Path, python: str, runs: dict[str, str], files: dict[str, Path | str] | None = None) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    for rel, src in (files or {}).items():
        dst = root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(src, Path) and src.is_dir():
            shutil.copytree(src, dst)
        elif isinstance(src, Path):
            shutil.copy2(src, dst)
        else:
            dst.write_text(src)
    return make_repo(root, runs, {"local-swift": template(python)})


def poll(rec, name: str, phases: tuple[str, ...], timeout: float = 120.0, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        rec.run_pass()
        st = status_of(rec.cfg.repo, name)
        if st is not None and st.phase in phases:
            return st
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} did not reach {phases} in {timeout}s; last status: "
                                 f"{st.model_dump() if st else None}")
        time.sleep(interval)


def step_lines(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if "loss" in rec:
            out.append(rec)
    return out


def code_repo(tmp_path: Path) -> tuple[Path, str]:
    """A small upstream code repository with one commit (the code pin's target)."""
    root = tmp_path / "trainer-code"
    root.mkdir()
    repo = git.Repo.init(root, initial_branch="main")
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "Upstream")
        cw.set_value("user", "email", "upstream@example.invalid")
    (root / "plugin.py").write_text("# a custom reward or loss would live here\nVALUE = 1\n")
    repo.git.add("-A")
    repo.git.commit("-m", "plugin")
    return root, repo.head.commit.hexsha


# ---------------------------------------------------------------- the scenarios


def test_sft_succeeds_with_progress_checkpoints_manifest_and_nvml_event(tmp_path, ws_root, swift_python, tiny_model):
    code_dir, sha = code_repo(tmp_path)
    task = textwrap.dedent("""\
        type: swift-sft
        model: inputs/models/tiny-qwen2
        dataset: [inputs/data/sft.jsonl]
        max_steps: 10
        save_steps: 5
        requires: {swift_version: "4.6.0"}
    """)
    extra = (f"  inputs: [data/sft.jsonl, models/tiny-qwen2]\n"
             f"  code: {{repo: {code_dir}, commit: {sha}, path: trainer}}\n")
    spec = run_yaml("sft", textwrap.indent(task, "    "), extra)
    repo = setup_repo(tmp_path, swift_python, {"sft": spec},
                      {"data/sft.jsonl": DATA / "sft.jsonl", "models/tiny-qwen2": tiny_model})
    rec = reconciler(repo, ws_root, local_gpus=0)
    t0 = time.monotonic()
    st = poll(rec, "sft", ("Succeeded", "Failed"))
    elapsed = time.monotonic() - t0
    ws = workspace(ws_root, "sft-g1-a1")
    assert st.phase == "Succeeded", (st.message, (ws / "artifacts" / "stderr.log").read_text()[-3000:])
    print(f"swift-sft via the reconciler: {elapsed:.1f}s")

    # Progress: the last step line, normalised.
    assert st.progress["step"] == 10 and st.progress["max_steps"] == 10
    assert isinstance(st.progress["loss"], float) and st.progress["loss"] > 0
    assert set(st.progress) == {"step", "max_steps", "loss", "learning_rate", "epoch", "updated_at"}

    # The rendered config: bundle-relative staged paths, the reconciler's output_dir.
    cfg = yaml.safe_load((ws / "scripts" / "swift-config.yaml").read_text())  # as a YAML 1.1 reader sees it
    assert cfg["model"] == "inputs/models/tiny-qwen2" and cfg["dataset"] == ["inputs/data/sft.jsonl"]
    assert cfg["output_dir"] == "artifacts/output" and cfg["add_version"] is False
    assert (ws / "scripts" / "precheck.args").read_text() == "--expect-swift-version\n4.6.0\n"

    out = ws / "artifacts" / "output"
    assert (out / "logging.jsonl").is_file() and (out / "checkpoint-10" / "trainer_state.json").is_file()
    assert [r["global_step/max_steps"] for r in step_lines(out / "logging.jsonl")][-1] == "10/10"
    # The sampler had no NVML here: exactly one clear event, and it exited.
    audit = [json.loads(x) for x in (ws / "artifacts" / "nvml-audit.jsonl").read_text().splitlines()]
    assert [e["event"] for e in audit] == ["nvml_unavailable"]
    assert "NVML" in audit[0]["reason"]
    pre = json.loads((ws / "artifacts" / "runtime-precheck.json").read_text())
    assert pre["ok"] is True and pre["swift"]["version"] == "4.6.0"

    # The provenance manifest.
    m = json.loads((ws / "artifacts" / "manifest.json").read_text())
    r, run = m["reproducibility"], m["run"]
    spec_commit = git.Repo(repo).git.log("-1", "--format=%H", "--", "specs/runs/sft.yaml")
    assert r["spec"] == {"digest": st.spec.digest, "commit": spec_commit}
    assert r["template"]["id"] == "local-swift" and r["template"]["defaults"]["python"] == swift_python
    assert r["task"]["type"] == "swift-sft" and r["task"]["max_steps"] == 10
    assert r["code"]["commit"] == sha and r["code"]["path"] == "inputs/trainer" and len(r["code"]["tree_sha256"]) == 64
    assert (ws / "inputs" / "trainer" / "plugin.py").is_file() and not (ws / "inputs" / "trainer" / ".git").exists()
    assert {i["path"] for i in r["inputs"]} == {"data/sft.jsonl", "models/tiny-qwen2"}
    assert all(len(i["sha256"]) == 64 for i in r["inputs"])
    env = r["environment"]
    assert env["swift"]["version"] == "4.6.0" and env["torch"]["version"].startswith("2.")
    assert env["packages"]["transformers"] and env["checks"] == [{"name": "swift_version", "ok": True,
                                                                  "expected": "4.6.0"}]
    assert m["reproducibility_digest"].startswith("sha256:")
    assert run["machine"] == "local" and run["hostname"] and run["identity"] == "sft-g1-a1"
    assert run["gpu_inventory"]["available"] is False and "NVML" in run["gpu_inventory"]["reason"]
    assert all(run["timestamps"][k] for k in ("launched_at", "started_at", "finished_at", "collected_at"))
    assert run["result"] == {"state": "succeeded", "exit_code": 0}
    arts = {a["path"]: a for a in run["artifacts"]}
    assert "artifacts/output/logging.jsonl" in arts and "artifacts/output/checkpoint-10/model.safetensors" in arts
    assert all(len(a["sha256"]) == 64 and a["size"] >= 0 for a in arts.values())
    assert st.provenance["reproducibility_digest"] == m["reproducibility_digest"]
    assert st.provenance["swift"] == "4.6.0" and st.provenance["code"] == f"{code_dir}@{sha}"

    # `reconcile provenance NAME` prints it; the same manifest against itself differs in nothing.
    env = dict(os.environ, RECONCILER_WORKSPACE_ROOT=str(ws_root), RECONCILER_NAMESPACE="test")
    p = subprocess.run([sys.executable, "-m", "reconciler", "provenance", "sft", "--repo", str(repo)],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == m
    p = subprocess.run([sys.executable, "-m", "reconciler", "provenance", "sft", "--diff", "sft-g1-a1",
                        "--repo", str(repo)], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    assert "reproducibility: identical" in p.stdout and "run: identical" in p.stdout


def test_rlhf_dpo_succeeds(tmp_path, ws_root, swift_python, tiny_model):
    task = textwrap.dedent(f"""\
        type: swift-rlhf
        rlhf_type: dpo
        beta: 0.1
        model: {tiny_model}
        dataset: [inputs/data/dpo.jsonl]
        max_steps: 10
        save_steps: 5
    """)
    spec = run_yaml("dpo", textwrap.indent(task, "    "), "  inputs: [data/dpo.jsonl]\n")
    repo = setup_repo(tmp_path, swift_python, {"dpo": spec}, {"data/dpo.jsonl": DATA / "dpo.jsonl"})
    rec = reconciler(repo, ws_root, local_gpus=0)
    st = poll(rec, "dpo", ("Succeeded", "Failed"))
    ws = workspace(ws_root, "dpo-g1-a1")
    assert st.phase == "Succeeded", (st.message, (ws / "artifacts" / "stderr.log").read_text()[-3000:])
    assert st.progress["step"] == 10 and st.progress["max_steps"] == 10
    assert abs(step_lines(ws / "artifacts" / "output" / "logging.jsonl")[0]["loss"] - 0.6931) < 0.01  # ln 2


def test_killed_mid_run_relaunch_resumes_from_latest_checkpoint(tmp_path, ws_root, swift_python, tiny_model):
    task = textwrap.dedent(f"""\
        type: swift-sft
        model: {tiny_model}
        dataset: [inputs/data/sft.jsonl]
        max_steps: 20
        save_steps: 5
    """)
    spec = run_yaml("resume", textwrap.indent(task, "    "), "  inputs: [data/sft.jsonl]\n", retries=1)
    repo = setup_repo(tmp_path, swift_python, {"resume": spec}, {"data/sft.jsonl": DATA / "sft.jsonl"})
    rec = reconciler(repo, ws_root, local_gpus=0)
    rec.run_pass()
    ws1 = workspace(ws_root, "resume-g1-a1")
    deadline = time.monotonic() + 90
    while not (ws1 / "artifacts" / "output" / "checkpoint-5" / "trainer_state.json").is_file():
        assert time.monotonic() < deadline, (ws1 / "artifacts" / "stderr.log").read_text()[-3000:]
        assert not (ws1 / "runtime" / "result.json").exists(), (ws1 / "artifacts" / "stderr.log").read_text()[-3000:]
        time.sleep(0.05)
    os.killpg(int((ws1 / "runtime" / "pid").read_text()), signal.SIGKILL)  # the wrapper, swift and its child
    time.sleep(0.5)
    killed_at = max(r["global_step/max_steps"] for r in step_lines(ws1 / "artifacts" / "output" / "logging.jsonl"))
    assert not (ws1 / "runtime" / "result.json").exists()

    st = poll(rec, "resume", ("Succeeded", "Failed"), timeout=150)
    ws2 = workspace(ws_root, "resume-g1-a2")
    assert st.phase == "Succeeded" and st.attempt == 2, st.message
    job = json.loads((ws2 / "job.json").read_text())["payload"]
    ckpt = job["resume_from"]
    assert ckpt.startswith(str(ws1 / "artifacts" / "output" / "checkpoint-")), ckpt
    n = int(ckpt.rsplit("-", 1)[1])
    assert n >= 5 and n % 5 == 0
    assert f'resume_from_checkpoint: "{ckpt}"' in (ws2 / "scripts" / "swift-config.yaml").read_text()
    steps = [int(r["global_step/max_steps"].split("/")[0])
             for r in step_lines(ws2 / "artifacts" / "output" / "logging.jsonl")]
    assert steps[0] == n + 1 and steps[0] > 5 and steps[-1] == 20, (steps[:3], killed_at)
    assert st.progress["step"] == 20
    m = json.loads((ws2 / "artifacts" / "manifest.json").read_text())
    assert m["run"]["resumed_from"] == ckpt and m["run"]["attempt"] == 2


def test_precheck_fork_mismatch_fails_before_training_with_the_reason(tmp_path, ws_root, swift_python, tiny_model):
    manifest = {"format": 1, "name": "acme-swift", "version": "4.6.0", "tree_sha256": "0" * 64}
    task = textwrap.dedent(f"""\
        type: swift-sft
        model: {tiny_model}
        dataset: [inputs/data/sft.jsonl]
        max_steps: 10
        requires: {{swift_fork: inputs/forks/acme/FORK_MANIFEST.json}}
    """)
    spec = run_yaml("forked", textwrap.indent(task, "    "), "  inputs: [data/sft.jsonl, forks/acme]\n", retries=2)
    repo = setup_repo(tmp_path, swift_python, {"forked": spec},
                      {"data/sft.jsonl": DATA / "sft.jsonl", "forks/acme/FORK_MANIFEST.json": json.dumps(manifest)})
    rec = reconciler(repo, ws_root, local_gpus=0)
    st = poll(rec, "forked", ("Succeeded", "Failed"), timeout=60)
    ws = workspace(ws_root, "forked-g1-a1")
    assert st.phase == "Failed" and st.attempt == 1 and st.exit_code == 3  # retries left, none used
    assert "precheck failed" in st.message and "is not fork 'acme-swift'" in st.message, st.message
    assert "retrying cannot help" in st.message
    ready = st.condition("Ready")
    assert ready.status == "False" and "is not fork 'acme-swift'" in ready.message
    assert not (ws / "artifacts" / "output" / "logging.jsonl").exists()  # nothing trained
    assert "run sh:" not in (ws / "artifacts" / "stdout.log").read_text()
    pre = json.loads((ws / "artifacts" / "runtime-precheck.json").read_text())
    assert pre["ok"] is False
    m = json.loads((ws / "artifacts" / "manifest.json").read_text())
    assert m["run"]["precheck"]["ok"] is False and m["run"]["result"]["exit_code"] == 3
    assert not workspace(ws_root, "forked-g1-a2").exists()
