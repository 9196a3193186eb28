"""The models on their own: strict on write, no coercion, and the rules that live in validators."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from pydantic import ValidationError

from reconciler.spec.models import KINDS
from reconciler.spec.models.common import Resources
from reconciler.spec.models.fleet import Fleet
from reconciler.spec.models.run import CodePin, Overrides, Run
from reconciler.spec.models.template import OVERRIDABLE, ExecutionTemplate

SHA = "0123456789abcdef0123456789abcdef01234567"


def run_doc(**spec) -> dict:
    base = {"template": "local-host", "task": {"type": "command", "argv": ["echo", "hi"]}}
    base.update(spec)
    return {"apiVersion": "reconciler/v1", "kind": "Run", "metadata": {"name": "r"}, "spec": base}


def sft(**task) -> dict:
    t = {"type": "swift-sft", "model": "Qwen/Qwen2.5-0.5B", "dataset": ["d"]}
    t.update(task)
    return run_doc(task=t)


def errors(model, doc) -> list[dict]:
    with pytest.raises(ValidationError) as e:
        model.model_validate(doc)
    return e.value.errors()


def test_minimal_run_and_defaults() -> None:
    run = Run.model_validate(run_doc())
    assert run.spec.desiredState == "Running"
    assert run.spec.restartPolicy.maxRetries == 0
    assert run.spec.inputs == [] and run.spec.secrets == [] and run.spec.code is None
    assert run.spec.overrides == Overrides()


@pytest.mark.parametrize(
    "field,value",
    [("maxRetries", "2"), ("maxRetries", 2.0), ("maxRetries", True), ("backoffSeconds", "10")],
)
def test_no_coercion(field: str, value) -> None:
    errs = errors(Run, run_doc(restartPolicy={field: value}))
    assert errs[0]["loc"] == ("spec", "restartPolicy", field)


def test_int_is_accepted_for_float() -> None:
    assert Run.model_validate(run_doc(restartPolicy={"backoffSeconds": 5})).spec.restartPolicy.backoffSeconds == 5


@pytest.mark.parametrize("where", [(), ("spec",), ("metadata",), ("spec", "task"), ("spec", "restartPolicy")])
def test_unknown_keys_are_errors_everywhere(where: tuple) -> None:
    doc = run_doc(restartPolicy={})
    node = doc
    for part in where:
        node = node[part]
    node["surprise"] = 1
    errs = errors(Run, doc)
    assert [e["type"] for e in errs] == ["extra_forbidden"]
    assert errs[0]["loc"][-1] == "surprise"


@pytest.mark.parametrize("name,ok", [("a", True), ("a" * 63, True), ("a" * 64, False), ("run-1", True), ("Run", False),
                                     ("-run", False), ("run-", False), ("run_1", False), ("1run", True), ("", False)])
def test_metadata_name_is_a_dns_label(name: str, ok: bool) -> None:
    doc = run_doc()
    doc["metadata"]["name"] = name
    if ok:
        Run.model_validate(doc)
    else:
        errors(Run, doc)


def test_task_union_on_type() -> None:
    assert Run.model_validate(sft()).spec.task.type == "swift-sft"
    errs = errors(Run, run_doc(task={"type": "shell", "argv": ["x"]}))
    assert errs[0]["type"] == "union_tag_invalid"
    errs = errors(Run, run_doc(task={"argv": ["x"]}))
    assert errs[0]["type"] == "union_tag_not_found"


def test_command_needs_argv() -> None:
    errs = errors(Run, run_doc(task={"type": "command", "argv": []}))
    assert errs[0]["type"] == "too_short"


def test_env_names() -> None:
    Run.model_validate(run_doc(task={"type": "command", "argv": ["x"], "env": {"A_1": "v", "_B": "w"}}))
    errors(Run, run_doc(task={"type": "command", "argv": ["x"], "env": {"1A": "v"}}))
    errors(Run, run_doc(task={"type": "command", "argv": ["x"], "env": {"A": 1}}))


def test_tuner_type_default_and_rename() -> None:
    assert Run.model_validate(sft()).spec.task.tuner_type == "lora"
    errs = errors(Run, sft(train_type="lora"))
    assert "renamed to 'tuner_type'" in errs[0]["msg"]
    errs = errors(Run, sft(args={"train_type": "lora"}))
    assert "renamed to 'tuner_type'" in errs[0]["msg"]


@pytest.mark.parametrize("key", ["learning_rate", "max_steps", "model", "tuner_type", "args"])
def test_typed_fields_refused_in_args(key: str) -> None:
    errs = errors(Run, sft(args={key: 1}))
    assert f"'{key}' is a typed field" in errs[0]["msg"]


@pytest.mark.parametrize("key", ["output_dir", "resume_from_checkpoint", "add_version"])
def test_managed_args_refused(key: str) -> None:
    errs = errors(Run, sft(args={key: "x"}))
    assert "managed by the reconciler" in errs[0]["msg"]


def test_args_pass_through_plain_values() -> None:
    args = {"warmup_ratio": 0.05, "gradient_checkpointing": True, "target_modules": ["q", "v"], "x": None,
            "deepspeed": {"zero": 2}}
    assert Run.model_validate(sft(args=args)).spec.task.args == args
    errs = errors(Run, sft(args={"deep": {"a": {"b": {"c": {"d": 1}}}}}))
    assert "'deep' is not a scalar" in errs[0]["msg"]


def test_rlhf_needs_a_known_type() -> None:
    doc = sft(type="swift-rlhf")
    assert Run.model_validate(doc).spec.task.rlhf_type == "dpo"  # ms-swift's default
    doc["spec"]["task"]["rlhf_type"] = "dppo"
    assert "not one of rlhf_type's choices" in errors(Run, doc)[0]["msg"]
    doc["spec"]["task"]["rlhf_type"] = "dpo"
    assert Run.model_validate(doc).spec.task.rlhf_type == "dpo"


@pytest.mark.parametrize("commit,ok", [(SHA, True), ("main", False), (SHA[:7], False), (SHA.upper(), False),
                                       (SHA + "0", False), ("v1.2.3", False)])
def test_code_commit_is_40_hex(commit: str, ok: bool) -> None:
    doc = {"repo": "https://example.com/x.git", "commit": commit}
    if ok:
        assert CodePin.model_validate(doc).path == "code"
    else:
        errors(CodePin, doc)


@pytest.mark.parametrize("name,ok", [("HF_TOKEN", True), ("hf_token", True), ("hf-token", False), ("1TOKEN", False)])
def test_secret_names(name: str, ok: bool) -> None:
    if ok:
        Run.model_validate(run_doc(secrets=[name]))
    else:
        errors(Run, run_doc(secrets=[name]))


@pytest.mark.parametrize("resources,ok", [
    ({"gpu_count": 0}, True), ({"gpu_count": 64}, True), ({"gpu_count": 65}, False), ({"gpu_count": -1}, False),
    ({"cpu_count": 0}, False), ({"memory_gb": 0}, False), ({"memory_gb": 0.5}, True), ({"memory_gb": 20000}, False),
    ({"gpu_count": "2"}, False), ({"gpu_count": 1.0}, False),
])
def test_resources_bounds(resources: dict, ok: bool) -> None:
    if ok:
        Resources.model_validate(resources)
    else:
        errors(Resources, resources)


def test_overrides_are_exactly_the_overridable_keys() -> None:
    assert set(Overrides.model_fields) == set(OVERRIDABLE)


def template_doc(**extra) -> dict:
    doc = {"apiVersion": "reconciler/v1", "kind": "ExecutionTemplate", "id": "t",
           "placement": {"kind": "ssh"}, "launch_mode": {"kind": "docker"}}
    doc.update(extra)
    return doc


def test_template_backend_key_and_defaults() -> None:
    t = ExecutionTemplate.model_validate(template_doc())
    assert t.backend_key == "ssh_docker"
    assert t.launch_mode.network == "none" and t.launch_mode.pull is False and t.defaults.detach is True
    errors(ExecutionTemplate, template_doc(placement={"kind": "slurm"}))
    assert ExecutionTemplate.model_validate(template_doc(placement={"kind": "rental"})).backend_key == "rental_docker"
    errors(ExecutionTemplate, template_doc(allow_overrides=["command"]))


def fleet_doc(**machine) -> dict:
    m = {"name": "m1", "ssh": {"host": "h", "user": "u"}}
    m.update(machine)
    return {"apiVersion": "reconciler/v1", "kind": "Fleet", "metadata": {"name": "f"}, "spec": {"machines": [m]}}


def test_fleet_rules() -> None:
    f = Fleet.model_validate(fleet_doc())
    assert f.spec.machines[0].ssh.port == 22 and f.spec.machines[0].max_tasks == 1
    assert Fleet.model_validate(fleet_doc(max_tasks=0)).spec.machines[0].max_tasks == 0  # drained
    errors(Fleet, fleet_doc(max_tasks=-1))
    errors(Fleet, fleet_doc(ssh={"host": "h", "user": "u", "port": 0}))
    errors(Fleet, fleet_doc(ssh={"host": "h", "user": "u", "port": 65536}))
    errors(Fleet, fleet_doc(resources={"gpus": [{"type": "H100", "count": 0}]}))
    doc = fleet_doc()
    doc["spec"]["machines"] = []
    errors(Fleet, doc)


def test_kinds() -> None:
    assert set(KINDS) == {"Run", "ExecutionTemplate", "Fleet", "Provider", "Policy", "Storage"}
    for kind, model in KINDS.items():
        assert model.model_fields["kind"].annotation.__args__ == (kind,)
        assert model.model_fields["apiVersion"].annotation.__args__ == ("reconciler/v1",)


def test_models_import_no_fabric_git_or_subprocess() -> None:
    """Layering: the models (and the spec package) import nothing that talks to the world."""
    code = textwrap.dedent("""
        import sys
        import reconciler.spec.models, reconciler.spec.load, reconciler.spec.checks, reconciler.spec.schema
        bad = sorted(m for m in sys.modules if m.split('.')[0] in {'fabric', 'paramiko', 'git', 'invoke', 'docker'}
                     or m == 'subprocess')
        print(','.join(bad))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""
