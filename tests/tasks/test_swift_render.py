"""swift-sft / swift-rlhf without ms-swift: rendering, bundles, code pins, validation messages."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import git
import pytest
import yaml

from reconciler.artifacts import bundle as bundles
from reconciler.artifacts import codepin
from reconciler.core.errors import PermanentError
from reconciler.spec.load import load_tree, run_digest
from reconciler.spec.models.run import Run
from reconciler.spec.models.tasks import SWIFT_MANAGED, SwiftRlhfTask, SwiftSftTask
from reconciler.spec.models.template import ExecutionTemplate
from reconciler.spec.resolve import effective
from reconciler.tasks import RenderContext, render
from reconciler.tasks.swift import CONFIG_PATH, DEFAULTS, PRECHECK_ARGS, TYPED_SKIP, config_text, swift_arguments, swift_arguments_version, swift_config

PRECHECK = Path(__file__).resolve().parents[2] / "reconciler" / "runtime" / "precheck.py"


def run_model(task: dict, **spec) -> Run:
    base = {"type": "swift-sft", "model": "inputs/models/tiny", "dataset": ["inputs/data/sft.jsonl"]}
    base.update(task)
    return Run.model_validate({"apiVersion": "reconciler/v1", "kind": "Run", "metadata": {"name": "r"},
                               "spec": {"template": "local-swift", "task": base, **spec}})


def template(python: str | None = "/opt/swift-venv/bin/python") -> ExecutionTemplate:
    return ExecutionTemplate.model_validate({
        "apiVersion": "reconciler/v1", "kind": "ExecutionTemplate", "id": "local-swift",
        "placement": {"kind": "local"}, "launch_mode": {"kind": "host_process"},
        "defaults": {"python": python} if python else {}})


# ---------------------------------------------------------------- rendering


def test_config_keys_typed_passthrough_and_managed():
    run = run_model({"tuner_type": "lora", "lora_rank": 8, "max_steps": 10, "learning_rate": 1e-4,
                     "requires": {"swift_version": "4.6.0"}, "args": {"warmup_ratio": 0.05, "report_to": "tensorboard"}})
    cfg = swift_config(run.spec.task, RenderContext(identity="r-g1-a1", python=None))
    assert cfg["model"] == "inputs/models/tiny" and cfg["dataset"] == ["inputs/data/sft.jsonl"]
    assert cfg["tuner_type"] == "lora" and cfg["lora_rank"] == 8 and cfg["max_steps"] == 10
    assert cfg["warmup_ratio"] == 0.05
    assert cfg["report_to"] == "tensorboard" and cfg["check_model"] is False  # args override the defaults
    assert cfg["output_dir"] == "artifacts/output" and cfg["add_version"] is False
    for key in ("type", "args", "resume", "requires", "resume_from_checkpoint", "val_dataset"):
        assert key not in cfg
    assert list(cfg)[-2:] == ["output_dir", "add_version"]


def test_resume_renders_checkpoint_only_with_resume_auto():
    ctx = RenderContext(identity="r-g1-a2", python=None, resume_from="/ws/r-g1-a1/artifacts/output/checkpoint-5")
    assert swift_config(run_model({}).spec.task, ctx)["resume_from_checkpoint"].endswith("checkpoint-5")
    assert "resume_from_checkpoint" not in swift_config(run_model({"resume": "never"}).spec.task, ctx)


def test_rendered_files_entrypoint_and_yaml_round_trip():
    run = run_model({"requires": {"swift_version": "4.6.0", "swift_fork": "inputs/forks/acme/FORK_MANIFEST.json"},
                     "learning_rate": 1e-4, "args": {"gradient_checkpointing": True, "target_modules": ["all-linear"]}})
    r = render(run.spec.task, RenderContext(identity="r-g1-a1", python="/py"))
    loaded = yaml.safe_load(r.files[CONFIG_PATH])  # what ms-swift's parse_yaml_args reads
    assert loaded["learning_rate"] == 1e-4 and loaded["gradient_checkpointing"] is True
    assert loaded["target_modules"] == ["all-linear"] and loaded["add_version"] is False
    assert r.files[PRECHECK_ARGS].decode().splitlines() == [
        "--expect-swift-version", "4.6.0", "--expect-swift-fork", "inputs/forks/acme/FORK_MANIFEST.json"]
    ep = r.entrypoint
    assert ep.index("scripts/precheck.py") < ep.index("cli_main")
    assert "@scripts/precheck.args || exit $?" in ep and ep.rstrip().endswith("sft scripts/swift-config.yaml")
    assert 'PY="${RECONCILER_PYTHON:-python3}"' in ep and "PYTHONPATH" not in ep
    rl = Run.model_validate({"apiVersion": "reconciler/v1", "kind": "Run", "metadata": {"name": "r"},
                             "spec": {"template": "t", "task": {"type": "swift-rlhf", "rlhf_type": "dpo", "beta": 0.1,
                                                                "model": "m", "dataset": ["d"]}}})
    r2 = render(rl.spec.task, RenderContext(identity="r-g1-a1", python=None))
    assert r2.entrypoint.rstrip().endswith("rlhf scripts/swift-config.yaml")
    assert yaml.safe_load(r2.files[CONFIG_PATH])["rlhf_type"] == "dpo"
    assert r2.files[PRECHECK_ARGS] == b""


def test_fork_manifest_root_goes_first_on_pythonpath(tmp_path):
    fork = tmp_path / "inputs" / "forks" / "acme"
    fork.mkdir(parents=True)
    (fork / "FORK_MANIFEST.json").write_text(json.dumps({"format": 1, "name": "acme", "tree_sha256": "x",
                                                         "root": "src"}))
    run = run_model({"requires": {"swift_fork": "inputs/forks/acme/FORK_MANIFEST.json"}})
    r = render(run.spec.task, RenderContext(identity="r-g1-a1", python=None, bundle=tmp_path))
    assert 'PYTHONPATH="$RECONCILER_BUNDLE/inputs/forks/acme/src${PYTHONPATH:+:$PYTHONPATH}"' in r.entrypoint


def test_precheck_reads_its_arguments_from_the_args_file(tmp_path):
    """The reconciler's own python has no swift: a declared version is a mismatch, exit 3, with a reason."""
    (tmp_path / "precheck.args").write_text("--expect-swift-version\n4.6.0\n")
    p = subprocess.run([sys.executable, str(PRECHECK), "--json", str(tmp_path / "pre.json"),
                        f"@{tmp_path / 'precheck.args'}"], capture_output=True, text=True, timeout=120)
    report = json.loads((tmp_path / "pre.json").read_text())
    if report["swift"].get("present"):
        pytest.skip("swift is importable by the test python")
    assert p.returncode == 3 and report["ok"] is False
    assert report["checks"][0]["name"] == "swift_version" and "swift 4.6.0 expected" in report["reason"]
    (tmp_path / "empty.args").write_text("")
    p = subprocess.run([sys.executable, str(PRECHECK), "--json", str(tmp_path / "pre2.json"),
                        f"@{tmp_path / 'empty.args'}"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and json.loads((tmp_path / "pre2.json").read_text())["checks"] == []


# ---------------------------------------------------------------- bundles and code pins


def git_repo(path: Path, files: dict[str, str]) -> git.Repo:
    path.mkdir(parents=True)
    repo = git.Repo.init(path, initial_branch="main")
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "T")
        cw.set_value("user", "email", "t@example.invalid")
    for rel, text in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    repo.git.add("-A")
    repo.git.commit("-m", "c1")
    return repo


def build_bundle(tmp_path: Path, run: Run, identity: str = "r-g1-a1", machine: str = "local",
                 python: str | None = "/opt/swift-venv/bin/python") -> Path:
    t = template(python)
    req = bundles.BundleRequest(repo_root=tmp_path / "repo", identity=identity, run=run, spec_digest=run_digest(run),
                                repo_head="c" * 40, template=t, effective=effective(run, t), machine=machine,
                                python=python, spec_commit="d" * 40)
    return bundles.build(req, tmp_path / "bundles" / identity).path


def test_bundle_stages_inputs_code_and_python(tmp_path):
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    (repo / "data" / "sft.jsonl").write_text('{"messages": []}\n')
    code = git_repo(tmp_path / "upstream", {"train.py": "print('hi')\n", "pkg/__init__.py": ""})
    sha = code.head.commit.hexsha
    run = run_model({"model": "Qwen/Qwen2.5-0.5B"}, inputs=["data/sft.jsonl"],
                    code={"repo": str(tmp_path / "upstream"), "commit": sha, "path": "trainer"})
    b = build_bundle(tmp_path, run)
    assert (b / "inputs" / "data" / "sft.jsonl").is_file()
    assert (b / "inputs" / "trainer" / "train.py").read_text() == "print('hi')\n"
    assert not (b / "inputs" / "trainer" / ".git").exists()
    assert "export RECONCILER_PYTHON=/opt/swift-venv/bin/python" in (b / "scripts" / "env.sh").read_text()
    for name in ("precheck.py", "gpu_sampler.py", "launch.sh", "entrypoint.sh", "swift-config.yaml", "precheck.args"):
        assert (b / "scripts" / name).is_file(), name
    job = json.loads((b / "job.json").read_text())["payload"]
    assert job["code"]["commit"] == sha and job["code"]["path"] == "inputs/trainer" and job["code"]["files"] == 2
    assert job["inputs"][0]["path"] == "data/sft.jsonl" and len(job["inputs"][0]["sha256"]) == 64
    # Same spec, another identity and machine: the staged content is identical (the digest differs only by job.json).
    b2 = build_bundle(tmp_path, run, identity="r-g1-a2", machine="gpu-1")
    job2 = json.loads((b2 / "job.json").read_text())["payload"]
    assert job2["code"] == job["code"] and job2["inputs"] == job["inputs"]


def test_code_pin_refuses_dirty_tree_missing_commit_and_non_commit(tmp_path):
    upstream = tmp_path / "upstream"
    repo = git_repo(upstream, {"a.py": "x = 1\n"})
    sha = repo.head.commit.hexsha
    pin = type("Pin", (), {"repo": str(upstream), "commit": sha, "path": "code"})

    (upstream / "a.py").write_text("x = 2\n")  # uncommitted change
    with pytest.raises(PermanentError, match="dirty working tree.*a.py"):
        codepin.stage(pin, tmp_path / "s1")
    (upstream / "a.py").write_text("x = 1\n")
    (upstream / "notes.txt").write_text("untracked\n")
    with pytest.raises(PermanentError, match="dirty working tree.*notes.txt"):
        codepin.stage(pin, tmp_path / "s2")
    (upstream / "notes.txt").unlink()

    pin.commit = "0" * 40
    with pytest.raises(PermanentError, match="does not exist"):
        codepin.stage(pin, tmp_path / "s3")
    pin.commit = repo.head.commit.tree.hexsha  # 40 hex, but a tree
    with pytest.raises(PermanentError, match="is a tree.*not a commit"):
        codepin.stage(pin, tmp_path / "s4")
    pin.commit = sha
    rec = codepin.stage(pin, tmp_path / "s5")
    assert rec["commit"] == sha and (tmp_path / "s5" / "a.py").read_text() == "x = 1\n"


def test_bundle_build_failure_leaves_no_half_bundle(tmp_path):
    (tmp_path / "repo").mkdir()
    run = run_model({"model": "m"}, code={"repo": str(tmp_path / "nope"), "commit": "a" * 40})
    with pytest.raises(PermanentError):
        build_bundle(tmp_path, run)
    assert not (tmp_path / "bundles" / "r-g1-a1").exists()
    assert not list((tmp_path / "bundles").glob(".*building"))


# ---------------------------------------------------------------- validation


TEMPLATE = """\
apiVersion: reconciler/v1
kind: ExecutionTemplate
id: local-swift
placement: {kind: local}
launch_mode: {kind: host_process}
defaults: {python: /opt/swift-venv/bin/python}
"""


def validate(tmp_path: Path, task: str, spec_extra: str = "") -> list[str]:
    root = tmp_path / "repo"
    (root / "execution_templates").mkdir(parents=True)
    (root / "execution_templates" / "local-swift.yaml").write_text(TEMPLATE)
    (root / "data").mkdir()
    (root / "data" / "sft.jsonl").write_text("{}\n")
    (root / "specs").mkdir()
    body = textwrap.dedent("""\
        apiVersion: reconciler/v1
        kind: Run
        metadata: {name: r}
        spec:
          template: local-swift
        """) + spec_extra + "  task:\n" + textwrap.indent(textwrap.dedent(task), "    ")
    (root / "specs" / "r.yaml").write_text(body)
    return [d.text() for d in load_tree(root).diagnostics]


def test_valid_swift_spec(tmp_path):
    assert validate(tmp_path, """\
        type: swift-sft
        model: Qwen/Qwen2.5-0.5B
        dataset: [inputs/data/sft.jsonl#10]
        requires: {swift_version: "4.6.0"}
        """, "  inputs: [data]\n") == []


@pytest.mark.parametrize("task,extra,expected", [
    ("type: swift-sft\nmodel: m\ndataset: [d]\ntrain_type: full\n", "",
     "spec.task.train_type: 'train_type' was renamed to 'tuner_type' in ms-swift 4"),
    ("type: swift-sft\nmodel: m\ndataset: [d]\nargs: {warmup_ratio: five percent}\n", "",
     "specs/r.yaml:10:12: spec.task.args.warmup_ratio: 'five percent' is not a number (float): ms-swift reads "
     "warmup_ratio as float"),
    ("type: swift-sft\nmodel: m\ndataset: [d]\nargs: {lr_scheduler_type: cosinee}\n", "",
     "specs/r.yaml:10:12: spec.task.args.lr_scheduler_type: 'cosinee' is not one of lr_scheduler_type's values "
     "(linear, cosine,"),
    ("type: swift-sft\nmodel: m\ndataset: [d]\nargs: {lr_scheduler_type: cosinee}\n", "", "(did you mean 'cosine'?)"),
    ("type: swift-sft\nmodel: m\ndataset: [d]\ntorch_dtype: bf16\n", "",
     "specs/r.yaml:10:5: spec.task.torch_dtype: 'bf16' is not one of torch_dtype's choices (bfloat16, float16, "
     "float32, null) (did you mean 'bfloat16'?)"),
    ("type: swift-sft\nmodel: m\ndataset: [d]\nmax_steps: 1.5\n", "",
     "spec.task.max_steps: '1.5' is not an integer: ms-swift reads max_steps as int"),
    ("type: swift-sft\nmodel: m\ndataset: [d]\nargs: {lora_dropuot: 0.1}\n", "",
     "'lora_dropuot' is not an argument of ms-swift's 'swift sft' (did you mean 'lora_dropout'?)"),
    ("type: swift-sft\nmodel: m\ndataset: [d]\nargs: {gradient_checkpointing: maybe}\n", "",
     "'maybe' is not a boolean (true/false, yes/no, 1/0)"),
    ("type: swift-sft\nmodel: m\ndataset: [d]\nargs: {target_modules: []}\n", "",
     "target_modules needs a value"),
    ("type: swift-sft\nmodel: m\ndataset: [d]\nargs: {lora_dropout: [0.1, 0.2]}\n", "",
     "lora_dropout takes one value, not a list of 2"),
    ("type: swift-sft\nmodel: m\n", "", "spec.task: no training data: set dataset or args.cached_dataset"),
    ("type: swift-sft\nmodel: m\ndataset: [inputs/data/sft.jsonl]\n", "",
     "specs/r.yaml:9:15: spec.task.dataset[0]: 'inputs/data/sft.jsonl' is not staged: add 'data/sft.jsonl' (or a folder holding it) "
     "to spec.inputs (listed: none)"),
    ("type: swift-sft\nmodel: m\ndataset: [inputs/data/other.jsonl]\n", "  inputs: [data]\n",
     "'inputs/data/other.jsonl': 'data/other.jsonl' does not exist in the repository"),
    ("type: swift-sft\nmodel: inputs/models/tiny\ndataset: [d]\n", "  inputs: [data]\n",
     "specs/r.yaml:9:5: spec.task.model: 'inputs/models/tiny' is not staged"),
    ("type: swift-sft\nmodel: m\ndataset: [data/sft.jsonl]\n", "  inputs: [data/sft.jsonl]\n",
     "'data/sft.jsonl' is a repository file; the run sees staged files under inputs/: use inputs/data/sft.jsonl"),
    ("type: swift-sft\nmodel: m\ndataset: [d]\nrequires: {swift_fork: inputs/forks/FORK_MANIFEST.json}\n", "",
     "'inputs/forks/FORK_MANIFEST.json' is not staged"),
    ("type: swift-sft\nmodel: m\ndataset: [d]\nrequires: {swift_fork: forks/FORK_MANIFEST.json}\n", "",
     "spec.task.requires.swift_fork: 'forks/FORK_MANIFEST.json' must be a staged JSON file"),
    ("type: swift-sft\nmodel: m\ndataset: [d]\nargs: {output_dir: /tmp/x}\n", "",
     "'output_dir' is managed by the reconciler"),
])
def test_validation_messages(tmp_path, task, extra, expected):
    diags = validate(tmp_path, task, extra)
    assert any(expected in d for d in diags), diags


def test_dirty_code_pin_fails_the_run_with_the_reason_and_is_not_retried(tmp_path):
    from tests.repo_helpers import make_repo, reconciler, run_spec, status_of

    upstream = git_repo(tmp_path / "upstream", {"a.py": "x = 1\n"})
    (tmp_path / "upstream" / "a.py").write_text("x = 2\n")
    extra = f"  code: {{repo: {tmp_path / 'upstream'}, commit: {upstream.head.commit.hexsha}}}\n"
    repo = make_repo(tmp_path / "repo", {"pinned": run_spec("pinned", ["true"], max_retries=3, extra=extra)})
    rec = reconciler(repo, tmp_path / "ws", local_gpus=0)
    rec.run_pass()
    st = status_of(repo, "pinned")
    assert st.phase == "Failed" and "dirty working tree (a.py)" in st.message
    assert st.condition("Ready").reason == "LaunchFailed"
    again = rec.run_pass()
    assert [c.action for c in again.plan.changes] == ["none"]
    assert not (tmp_path / "ws" / "test" / "pinned-g1-a1" / "runtime").exists()


# ---------------------------------------------------------------- the config file: emitted, never formatted by hand

TRICKY = {
    "on": "no",              # keys YAML 1.1 (ms-swift's yaml.safe_load) reads as booleans
    "yes": "off",
    "y": "n",
    "x #y": "a #b",          # a comment, when written as a plain scalar
    "null": "null",
    "1": "1e3",              # a float in YAML 1.2, a string in YAML 1.1
    "k: v": "- item",
    "~": "~",
    "text": "first line\nsecond: line\n  indented\n",
    "trailing": "ends with a space ",
    "quotes": "it's \"quoted\" \\ and tabbed\t",
    "unicode": "résumé ✓",
    "empty": "",
    "numbers": [0, -3, 1e-5, 2.5e300, 1.0, float("inf"), True, False, None, "0x1F", "0o17", "+1", ".5", "1_000"],
    "mapping": {"on": 1, "no": "yes", "nested #": ["2024-01-01", "12:30"]},
}


def _ruamel_load(text: str, typ: str):
    from ruamel.yaml import YAML

    return YAML(typ=typ, pure=True).load(text)


def test_config_round_trips_through_yaml_1_1_and_1_2():
    text = config_text(TRICKY)
    assert text.startswith("# Rendered by the reconciler")
    assert yaml.safe_load(text) == TRICKY  # YAML 1.1, as ms-swift's parse_yaml_args reads it
    assert yaml.load(text, Loader=yaml.CSafeLoader) == TRICKY
    assert _ruamel_load(text, "safe") == TRICKY  # YAML 1.2
    assert _ruamel_load(text, "rt") == TRICKY
    assert read_core(text) == TRICKY  # the reconciler's own strict loader


def read_core(text: str):
    from reconciler.core.yamlsafe import fast_load

    return fast_load(text)


def test_rendered_config_round_trips_and_keeps_its_order():
    run = run_model({"learning_rate": 1e-5, "max_steps": 10, "template": "null", "model_type": "yes",
                     "args": {"warmup_ratio": 1e-3, "report_to": "on", "lr_scheduler_type": "no",
                              "max_grad_norm": 1e6, "system": "You are\na model # not a comment\n"}})
    cfg = swift_config(run.spec.task, RenderContext(identity="r-g1-a1", python=None))
    text = render(run.spec.task, RenderContext(identity="r-g1-a1", python=None)).files[CONFIG_PATH].decode()
    for loaded in (yaml.safe_load(text), _ruamel_load(text, "safe")):
        assert loaded == cfg and list(loaded) == list(cfg)
        assert loaded["learning_rate"] == 1e-5 and loaded["warmup_ratio"] == 1e-3 and loaded["max_grad_norm"] == 1e6
    # What the docs show: booleans and numbers plain, strings double-quoted.
    assert "check_model: false\n" in text and 'report_to: "on"\n' in text and "max_steps: 10\n" in text


def test_config_keys_are_plain_only_when_unambiguous():
    lines = config_text({"learning_rate": 1e-4, "on": 1, "x #y": 2, "1e3": 3, "y": 4}).splitlines()[1:]
    assert lines == ["learning_rate: 0.0001", "'on': 1", "'x #y': 2", "'1e3': 3", "'y': 4"]


# ---------------------------------------------------------------- ms-swift's argument names


def test_argument_lists_hold_what_the_reconciler_writes():
    sft, rlhf = swift_arguments("sft"), swift_arguments("rlhf")
    assert sft <= rlhf and "rlhf_type" in rlhf - sft
    skip = TYPED_SKIP
    assert set(SwiftSftTask.model_fields) - skip <= sft
    assert set(SwiftRlhfTask.model_fields) - skip <= rlhf
    assert set(DEFAULTS) <= sft and set(SWIFT_MANAGED) <= sft
    assert "train_type" not in rlhf and "ENV" not in rlhf  # renamed; and ms-swift's env-setting config key
    assert swift_arguments_version() == "4.6.0"


def test_argument_list_ships_with_the_package():
    """The list is read from the installed package, so the wheel must carry it (pyproject package-data)."""
    import tomllib

    meta = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert "*.json" in meta["tool"]["setuptools"]["package-data"]["reconciler.tasks"]


@pytest.mark.parametrize("args, expected", [
    ("{lora_rnk: 8}", "specs/r.yaml:10:12: spec.task.args.lora_rnk: 'lora_rnk' is not an argument of ms-swift's "
                      "'swift sft' (did you mean 'lora_rank'?)"),
    ("{beta: 0.1}", "specs/r.yaml:10:12: spec.task.args.beta: 'beta' is not an argument of ms-swift's 'swift sft' "
                    "(it is one of 'swift rlhf'; this task runs 'swift sft')"),
    ("{output-dir: /x}", "specs/r.yaml:10:12: spec.task.args.output-dir: 'output-dir' is not an argument of "
                         "ms-swift's 'swift sft' (did you mean 'output_dir'?)"),
    ("{ENV: {A: b}}", "specs/r.yaml:10:12: spec.task.args.ENV: 'ENV' is not an argument of ms-swift's 'swift sft'"),
])
def test_unknown_args_are_located_with_a_hint(tmp_path, args, expected):
    diags = validate(tmp_path, f"type: swift-sft\nmodel: m\ndataset: [d]\nargs: {args}\n")
    assert diags == [expected]


def test_unknown_and_managed_args_are_reported_together(tmp_path):
    """The managed key keeps its own message; the unknown one beside it is not hidden by it."""
    ok = "type: swift-rlhf\nrlhf_type: dpo\nmodel: m\ndataset: [d]\nargs: {rpo_alpha: 0.1, warmup_ratio: 0.05}\n"
    assert validate(tmp_path / "a", ok) == []
    diags = validate(tmp_path / "b", "type: swift-sft\nmodel: m\ndataset: [d]\nargs: {add_version: true, lora_rnk: 8}\n")
    assert diags == ["specs/r.yaml:10:12: spec.task.args.add_version: 'add_version' is managed by the reconciler "
                     "(artifacts and resume)",
                     "specs/r.yaml:10:31: spec.task.args.lora_rnk: 'lora_rnk' is not an argument of ms-swift's "
                     "'swift sft' (did you mean 'lora_rank'?)"]


# ---------------------------------------------------------------- data parallel on one machine


def gpu_template(runtime_env: dict | None = None) -> ExecutionTemplate:
    return ExecutionTemplate.model_validate({
        "apiVersion": "reconciler/v1", "kind": "ExecutionTemplate", "id": "local-swift",
        "placement": {"kind": "local"}, "launch_mode": {"kind": "host_process"},
        "defaults": {"resources": {"gpu_count": 2}, "runtime_env": runtime_env or {}}})


def build_on_gpus(tmp_path: Path, run: Run, gpus: list[int], t: ExecutionTemplate) -> Path:
    req = bundles.BundleRequest(repo_root=tmp_path / "repo", identity="r-g1-a1", run=run, spec_digest=run_digest(run),
                                repo_head=None, template=t, effective=effective(run, t), machine="local", gpus=gpus)
    return bundles.build(req, tmp_path / "bundles" / "r-g1-a1").path


def env_file(bundle: Path) -> dict[str, str]:
    out = {}
    for line in (bundle / "scripts" / "env.sh").read_text().splitlines():
        if line.startswith("export "):
            k, v = line[len("export "):].split("=", 1)
            out[k] = v
    return out


def test_two_gpu_swift_run_renders_data_parallel_settings(tmp_path):
    (tmp_path / "repo").mkdir()
    env = env_file(build_on_gpus(tmp_path, run_model({}), [2, 3], gpu_template()))
    assert env["NPROC_PER_NODE"] == "2" and env["NNODES"] == "1" and env["NODE_RANK"] == "0"
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert "MASTER_PORT" not in env  # chosen free on the machine at launch


def test_one_gpu_run_gets_no_torchrun_settings_and_runtime_env_wins(tmp_path):
    (tmp_path / "repo").mkdir()
    one = build_on_gpus(tmp_path / "a", run_model({}), [0], gpu_template())
    assert "NPROC_PER_NODE" not in env_file(one)
    mine = build_on_gpus(tmp_path / "b", run_model({}), [0, 1], gpu_template({"NPROC_PER_NODE": "1"}))
    assert env_file(mine)["NPROC_PER_NODE"] == "1"


def test_command_run_on_two_gpus_gets_the_variables_and_a_free_master_port(tmp_path):
    (tmp_path / "repo").mkdir()
    run = Run.model_validate({"apiVersion": "reconciler/v1", "kind": "Run", "metadata": {"name": "r"},
                              "spec": {"template": "local-swift", "task": {"type": "command", "argv": [
                                  "sh", "-c", "echo $NPROC_PER_NODE $NNODES $NODE_RANK $MASTER_ADDR $MASTER_PORT"]}}})
    b = build_on_gpus(tmp_path, run, [0, 1], gpu_template())
    p = subprocess.run(["sh", "scripts/launch.sh", "r-g1-a1"], cwd=b, env={"PATH": "/usr/bin:/bin",
                       "RECONCILER_GPU_SAMPLER": "0", "RECONCILER_PYTHON": sys.executable}, timeout=30)
    assert p.returncode == 0
    nproc, nnodes, rank, addr, port = (b / "artifacts" / "stdout.log").read_text().split()
    assert (nproc, nnodes, rank, addr) == ("2", "1", "0", "127.0.0.1")
    assert 1024 < int(port) < 65536


# ---------------------------------------------------------------- several machines


def multi_node_template(kind: str) -> ExecutionTemplate:
    placement = {"kind": kind}
    if kind == "slurm":
        placement["slurm"] = {"workspace_root": "/shared"}
    return ExecutionTemplate.model_validate({
        "apiVersion": "reconciler/v1", "kind": "ExecutionTemplate", "id": "local-swift",
        "placement": placement, "launch_mode": {"kind": "host_process"},
        "defaults": {"resources": {"gpu_count": 2, "nodes": 2}}})


def test_a_node_of_a_two_machine_swift_run_renders_its_share_and_learns_its_rank_at_launch(tmp_path):
    (tmp_path / "repo").mkdir()
    t = multi_node_template("ssh")
    run = run_model({})
    req = bundles.BundleRequest(repo_root=tmp_path / "repo", identity="r-g1-a1-n1", run=run, spec_digest=run_digest(run),
                                repo_head=None, template=t, effective=effective(run, t), machine="m2", gpus=[0, 1],
                                gang={"rank": 1, "of": 2, "machines": ["m1", "m2"]})
    bundle = bundles.build(req, tmp_path / "bundles" / "r-g1-a1-n1").path
    env = env_file(bundle)
    assert env["NPROC_PER_NODE"] == "2" and env["NNODES"] == "2" and env["CUDA_VISIBLE_DEVICES"] == "0,1"
    # Rank and rendezvous come with the launch (runtime/launch.env), not with the bundle.
    assert not {"NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "RECONCILER_NODES"} & set(env)
    payload = json.loads((bundle / "job.json").read_text())["payload"]
    assert payload["gang"] == {"rank": 1, "of": 2, "machines": ["m1", "m2"]}


def test_a_two_node_slurm_run_is_one_bundle_that_srun_starts_on_each_node(tmp_path):
    (tmp_path / "repo").mkdir()
    t = multi_node_template("slurm")
    env = env_file(build_on_gpus(tmp_path, run_model({}), [], t))
    assert env["RECONCILER_NODES"] == "2" and env["NNODES"] == "2" and env["NPROC_PER_NODE"] == "2"
    assert "CUDA_VISIBLE_DEVICES" not in env  # Slurm's to set: it chose the GPUs


@pytest.mark.parametrize("task", [
    "type: swift-rlhf\nrlhf_type: grpo\nmodel: m\ndataset: [d]\nbeta: 0\n",
    "type: swift-rlhf\nrlhf_type: grpo\nmodel: m\ndataset: [d]\nargs: {teacher_model: t}\n",
    "type: swift-sft\nmodel: m\nargs: {cached_dataset: [c]}\n",
    "type: swift-sft\nmodel: m\ndataset: [d]\ntuner_type: lora_llm\n",
    "type: swift-sft\nmodel: m\ndataset: [d]\ntuner_type: my_plugin_tuner\n",
    "type: swift-sft\nmodel: m\ndataset: [d]\ntuner_type: full\nlora_rank: 8\n",
    "type: swift-sft\nmodel: m\ndataset: [d]\nsave_total_limit: -1\nmax_steps: -1\nlearning_rate: 2\n",
    "type: swift-rlhf\nmodel: m\ndataset: [d]\nreward_funcs: [accuracy]\n",
    "type: swift-sft\nmodel: m\ndataset: [d]\nargs: {lr_scheduler_type: cosine_with_min_lr, warmup_ratio: 0.05, "
    "gradient_checkpointing: yes, quant_bits: 4, lora_dtype: null, lr_scheduler_kwargs: {min_lr: 1.0e-6}}\n",
])
def test_what_ms_swift_accepts_validates(tmp_path, task):
    """Each of these parses with ms-swift 4.6 (tests/tasks/test_swift_oracle.py runs the like through it)."""
    assert validate(tmp_path, task) == []


def test_typed_fields_render_as_ms_swift_parses_them():
    run = run_model({"max_steps": "10", "beta": 0, "rlhf_type": "grpo", "type": "swift-rlhf"})
    cfg = yaml.safe_load(config_text(swift_config(run.spec.task, RenderContext(identity="r-g1-a1", python=None))))
    assert cfg["max_steps"] == 10 and cfg["beta"] == 0.0 and "reward_funcs" not in cfg
