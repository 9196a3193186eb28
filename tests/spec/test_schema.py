"""The JSON Schemas: generated from the models, committed, checked for drift, and usable on their own
(an editor or CI with only jsonschema must accept the repository's examples and refuse bad specs)."""

from __future__ import annotations

import base64
import copy
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from pydantic import ValidationError

from reconciler.spec import schema
from reconciler.spec.checks import fleets, inputs, secrets
from reconciler.spec.models import KINDS
from reconciler.spec.models.common import INPUT_PATH
from reconciler.core.yamlsafe import fast_load
from tests.spec.editor_corpus import docs_examples
from tests.spec.helpers import REPO, read_yaml, reconcile

EXAMPLES = sorted((REPO / "specs").rglob("*.yaml")) + sorted((REPO / "execution_templates").glob("*.yaml"))


def _load(name: str) -> dict:
    return json.loads((REPO / "schemas" / name).read_text(encoding="utf-8"))


def validator(kind: str) -> Draft202012Validator:
    """The kind's own schema, or the combined one for ``kind='*'``."""
    return Draft202012Validator(_load(schema.COMBINED if kind == "*" else f"{schema.FILE_NAMES[kind]}.schema.json"))


def test_generation_is_stable() -> None:
    assert schema.generate() == schema.generate()
    assert set(schema.generate()) == {f"{n}.schema.json" for n in schema.FILE_NAMES.values()} | {schema.COMBINED}


def test_committed_schemas_match_the_models() -> None:
    assert schema.drift(REPO / "schemas") == []


@pytest.mark.parametrize("name", sorted(schema.generate()))
def test_schemas_are_valid_draft_2020_12(name: str) -> None:
    doc = json.loads(schema.generate()[name])
    assert doc["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert doc["$id"].endswith(name)
    Draft202012Validator.check_schema(doc)


def test_schema_check_cli_on_the_repository() -> None:
    r = reconcile("schema", "--check", cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok" in r.stdout


@pytest.fixture
def schema_copy(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "schemas", tmp_path / "schemas")
    return tmp_path


def test_schema_check_fails_after_a_hand_edit(schema_copy: Path) -> None:
    p = schema_copy / "schemas" / "run.schema.json"
    doc = json.loads(p.read_text())
    doc["description"] = "edited by hand"
    p.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    r = reconcile("schema", "--check", "--repo", str(schema_copy), cwd=schema_copy)
    assert r.returncode == 1
    assert "schemas/run.schema.json: differs from the models" in r.stdout
    assert "fleet.schema.json" not in r.stdout
    # Whitespace counts too: the files are byte-for-byte what the models generate.
    p.write_text(schema.generate()["run.schema.json"] + "\n")
    assert reconcile("schema", "--check", "--repo", str(schema_copy), cwd=schema_copy).returncode == 1
    # Regenerating repairs it.
    r = reconcile("schema", "--repo", str(schema_copy), cwd=schema_copy)
    assert r.returncode == 0 and "wrote schemas/run.schema.json" in r.stdout
    assert reconcile("schema", "--check", "--repo", str(schema_copy), cwd=schema_copy).returncode == 0


def test_schema_check_fails_when_a_file_is_missing(schema_copy: Path) -> None:
    (schema_copy / "schemas" / "fleet.schema.json").unlink()
    r = reconcile("schema", "--check", "--repo", str(schema_copy), cwd=schema_copy)
    assert r.returncode == 1 and "fleet.schema.json" in r.stdout


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(REPO)))
def test_examples_validate_against_the_committed_schemas(path: Path) -> None:
    doc = read_yaml(path)
    for kind in (doc["kind"], "*"):
        errors = sorted(validator(kind).iter_errors(doc), key=str)
        assert errors == [], [e.message for e in errors]


@pytest.mark.parametrize("text", docs_examples(), ids=lambda t: t.split("kind: ")[1].split()[0])
def test_the_docs_examples_are_valid(text: str) -> None:
    """docs/specs.md shows valid objects: the models and both schemas accept them."""
    doc = fast_load(text)
    KINDS[doc["kind"]].model_validate(doc)
    for kind in (doc["kind"], "*"):
        assert sorted(validator(kind).iter_errors(doc), key=str) == []


def test_docs_show_every_kind() -> None:
    assert {fast_load(t)["kind"] for t in docs_examples()} == set(KINDS)


def test_examples_cover_every_kind() -> None:
    assert {read_yaml(p)["kind"] for p in EXAMPLES} == set(schema.FILE_NAMES)


def test_examples_point_editors_at_existing_schemas() -> None:
    for p in EXAMPLES:
        first = p.read_text().splitlines()[0]
        if first.startswith("# yaml-language-server: $schema="):
            target = (p.parent / first.split("=", 1)[1]).resolve()
            assert target.is_file(), f"{p}: {target}"


def _example(kind: str) -> dict:
    return next(read_yaml(p) for p in EXAMPLES if read_yaml(p)["kind"] == kind)


def _mutations() -> list[tuple[str, str, callable]]:
    def at(path, value):
        def f(doc):
            node = doc
            for part in path[:-1]:
                node = node[part]
            node[path[-1]] = value
        return f

    def drop(path):
        def f(doc):
            node = doc
            for part in path[:-1]:
                node = node[part]
            del node[path[-1]]
        return f

    return [
        ("Run", "unknown top-level key", at(("spce",), {})),
        ("Run", "unknown key in spec", at(("spec", "tempalte"), "x")),
        ("Run", "unknown key in task", at(("spec", "task", "argvv"), ["x"])),
        ("Run", "string for an int", at(("spec", "restartPolicy", "maxRetries"), "2")),
        ("Run", "bad name", at(("metadata", "name"), "Hello")),
        ("Run", "name too long", at(("metadata", "name"), "a" * 64)),
        ("Run", "missing task", drop(("spec", "task"))),
        ("Run", "unknown task type", at(("spec", "task", "type"), "shell")),
        ("Run", "empty argv", at(("spec", "task", "argv"), [])),
        ("Run", "bad desiredState", at(("spec", "desiredState"), "Paused")),
        ("Run", "bad apiVersion", at(("apiVersion",), "reconciler/v2")),
        ("Run", "bad secret name", at(("spec", "secrets"), ["hf-token"])),
        ("ExecutionTemplate", "unknown key", at(("defaults", "imagee"), "x")),
        ("ExecutionTemplate", "unknown placement", at(("placement", "kind"), "slurm")),
        ("ExecutionTemplate", "unknown override key", at(("allow_overrides",), ["command"])),
        ("ExecutionTemplate", "gpu_count too big", at(("defaults", "resources"), {"gpu_count": 65})),
        ("Fleet", "unknown machine key", lambda d: d["spec"]["machines"][0].update(hostname="x")),
        ("Fleet", "port out of range", lambda d: d["spec"]["machines"][0]["ssh"].update(port=70000)),
        ("Fleet", "no machines", at(("spec", "machines"), [])),
        # Rules that are validators in the models, and patterns or if/then in the schemas.
        ("Run", "commit is a branch", at(("spec", "code"), {"repo": "r", "commit": "main"})),
        ("Run", "code.path with ..", at(("spec", "code"), {"repo": "r", "commit": "0" * 40, "path": "a/../b"})),
        ("Run", "env name", at(("spec", "task", "env"), {"1X": "a"})),
        ("Run", "train_type in swift args", at(("spec", "task"), _sft(args={"train_type": "lora"}))),
        ("Run", "typed field in swift args", at(("spec", "task"), _sft(args={"max_steps": 3}))),
        ("Run", "managed key in swift args", at(("spec", "task"), _sft(args={"output_dir": "x"}))),
        ("Run", "swift args nested 5 deep", at(("spec", "task"), _sft(args={"a": {"b": {"c": {"d": {"e": 1}}}}}))),
        ("Run", "train_type", at(("spec", "task"), _sft(train_type="lora"))),
        ("Run", "rlhf_type not ms-swift's", at(("spec", "task"), _rlhf("dpoo"))),
        ("Run", "fork manifest outside inputs/", at(("spec", "task"), _sft(requires={"swift_fork": "forks/F.json"}))),
        ("Run", "fork manifest with ..", at(("spec", "task"), _sft(requires={"swift_fork": "inputs/../F.json"}))),
    ]


def _sft(**extra) -> dict:
    return {"type": "swift-sft", "model": "m", "dataset": ["d"], **extra}


def _rlhf(rlhf_type: str, **extra) -> dict:
    return {"type": "swift-rlhf", "model": "m", "dataset": ["d"], "rlhf_type": rlhf_type, **extra}


@pytest.mark.parametrize("kind,what,mutate", _mutations(), ids=[f"{k}: {w}" for k, w, _ in _mutations()])
def test_schemas_refuse_bad_specs(kind: str, what: str, mutate) -> None:
    doc = copy.deepcopy(_example(kind))
    assert validator(kind).is_valid(doc) and validator("*").is_valid(doc)
    mutate(doc)
    assert not validator(kind).is_valid(doc), what
    assert not validator("*").is_valid(doc), what
    with pytest.raises(ValidationError):  # the models refuse it too
        KINDS[kind].model_validate(doc)


@pytest.mark.parametrize("task", [_sft(), _sft(tuner_type="full", args={"warmup_ratio": 0.1}),
                                  _rlhf("grpo", reward_funcs=["accuracy"]), _rlhf("grpo", args={"reward_model": "rm"}),
                                  _rlhf("dpo", beta=0.1), _rlhf("rm"), _sft(args={"deepspeed": {"zero": {"a": [1]}}}),
                                  _sft(requires={"swift_fork": "inputs/forks/x/FORK_MANIFEST.json"})])
def test_schemas_accept_what_the_models_accept(task: dict) -> None:
    doc = copy.deepcopy(_example("Run"))
    doc["spec"]["task"] = task
    KINDS["Run"].model_validate(doc)
    assert validator("Run").is_valid(doc) and validator("*").is_valid(doc)


def test_swift_task_schema() -> None:
    doc = _example("Run")
    doc = copy.deepcopy(doc)
    doc["spec"]["task"] = {"type": "swift-rlhf", "model": "m", "dataset": ["d"], "rlhf_type": "dpo", "learning_rate": 1e-4}
    assert validator("Run").is_valid(doc)
    doc["spec"]["task"]["rlhf_type"] = "dppo"
    assert not validator("Run").is_valid(doc)


# ---------------------------------------------------------------- what editors show


def _properties(node, where: str = "") -> list[tuple[str, dict]]:
    """Every (location, schema) of a property, leaving out if/then/else/not: conditions and the
    constraints they add, not fields (the field they constrain is described where it is defined)."""
    out = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("if", "then", "else", "not"):
                continue
            if key == "properties" and isinstance(value, dict):
                for name, sub in value.items():
                    out.append((f"{where}/properties/{name}", sub))
                    out += _properties(sub, f"{where}/properties/{name}")
            else:
                out += _properties(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += _properties(value, f"{where}/{i}")
    return out


@pytest.mark.parametrize("name", sorted(schema.generate()))
def test_every_property_is_described(name: str) -> None:
    """Hover and completion in an editor show a property's description: none goes without one."""
    props = _properties(json.loads(schema.generate()[name]))
    assert len(props) > 10  # the walk found the properties (the smallest schema, Policy, has 16)
    missing = [where for where, sub in props if not sub.get("description")]
    assert missing == [], f"{len(missing)} of {len(props)} properties have no description: {missing}"


def test_the_combined_schema_chooses_by_kind() -> None:
    combined = _load(schema.COMBINED)
    assert combined["properties"]["kind"]["enum"] == list(KINDS)
    branches = {b["if"]["properties"]["kind"]["const"]: b["then"]["$ref"] for b in combined["allOf"]}
    assert branches == {k: f"#/$defs/{k}" for k in KINDS}
    v = validator("*")
    errors = list(v.iter_errors({"apiVersion": "reconciler/v1", "kind": "Job"}))
    assert [e.json_path for e in errors] == ["$.kind"]


def test_the_task_union_is_chosen_by_type() -> None:
    """A bad swift task is judged against the swift branch only: no 'command' error for it."""
    task = _load("run.schema.json")["$defs"]["RunSpec"]["properties"]["task"]
    assert "oneOf" not in task and task["properties"]["type"]["enum"] == ["command", "swift-sft", "swift-rlhf"]
    doc = copy.deepcopy(_example("Run"))
    doc["spec"]["task"] = {"type": "swift-sft", "modle": "m", "dataset": ["d"]}
    messages = [e.message for e in validator("*").iter_errors(doc)]
    for e in validator("Run").iter_errors(doc):
        messages += [c.message for c in e.context] + [e.message]
    text = "\n".join(messages)
    assert "'modle' was unexpected" in text and "'model' is a required property" in text, text
    assert "command" not in text and "argv" not in text, text


def _synthetic_key(kind: str, tamper: str = "") -> str:
    """A public key line of ``kind`` built field by field (no ssh-keygen makes sk- keys without a device)."""
    def s(b: bytes) -> bytes:
        return len(b).to_bytes(4, "big") + b

    fields = fleets.HOST_KEY_FIELDS[kind]
    curve = kind.removeprefix("sk-").split("@")[0].removeprefix("ecdsa-sha2-").encode()
    point = {b"nistp256": 65, b"nistp384": 97, b"nistp521": 133}.get(curve, 0)
    values = {"key": b"k" * 32, "curve": curve, "point": b"\x04" + b"p" * (point - 1), "e": b"\x01\x00\x01",
              "n": b"\x00" + b"n" * 256, "application": b"ssh:"}
    blob = s(kind.encode()) + b"".join(s(values[f]) for f in fields)
    return f"{kind} {base64.b64encode(blob).decode()}"


def _host_keys() -> list[str]:
    keys = [_synthetic_key(k) for k in fleets.HOST_KEY_FIELDS]
    if shutil.which("ssh-keygen"):
        with tempfile.TemporaryDirectory() as tmp:
            for kind, bits in (("ed25519", None), ("ecdsa", "256"), ("ecdsa", "384"), ("ecdsa", "521"), ("rsa", "2048")):
                path = Path(tmp) / f"{kind}{bits}"
                subprocess.run(["ssh-keygen", "-q", "-t", kind, *(["-b", bits] if bits else []), "-N", "", "-C",
                                "root@gpu1", "-f", str(path)], check=True, timeout=60)
                keys.append(path.with_suffix(".pub").read_text().strip())
    return keys


def test_the_host_key_pattern_agrees_with_the_check() -> None:
    """Every key the check accepts matches the schema's pattern; what the corpus gets wrong (a
    known_hosts line, no data, not base64, cut short, the wrong type, an unknown type) does not."""
    pattern = re.compile(schema.HOST_KEY)
    keys = _host_keys()
    assert len(keys) >= len(fleets.HOST_KEY_FIELDS)
    for key in keys + [f"  {keys[0]}  ", f"{keys[0]} a comment", ""]:
        assert key == "" or fleets.host_key_problem(key) is None, key
        assert pattern.search(key), key
    ed25519 = keys[0]
    kind, data = ed25519.split()[:2]
    bad = [f"gpu1.lab.example {ed25519}", kind, f"{kind} not*base64", f"{kind} {data[:-8]}", f"{kind} {data[:-4]}",
           f"ssh-rsa {data}", f"ecdsa-sha2-nistp256 {data}", f"ssh-dss {data}", f"{kind}{data}"]
    for key in bad:
        assert fleets.host_key_problem(key) is not None, key
        assert not pattern.search(key), key


@pytest.mark.parametrize("item,ok", [
    ("data/train.jsonl", True), ("data", True), ("./data/x", True), ("a..b/c", True), ("statusx/y", True),
    ("/etc/passwd", False), ("../x", False), ("data/../../x", False), ("data/..", False), ("..", False),
    ("status/other.yaml", False), ("./status/x", False), (".git/config", False), (".reconciler/b", False),
    (" data/x", False), ("data/x ", False), ("data\\x", False), ("", False),
])
def test_the_input_pattern_agrees_with_the_check(item: str, ok: bool, tmp_path: Path) -> None:
    if ok:  # what the check accepts must exist; the pattern knows nothing of the disk
        (tmp_path / item).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / item).touch()
    assert (inputs.input_problem(tmp_path, item) is None) is ok
    assert (re.search(INPUT_PATH, item) is not None) is ok


@pytest.mark.parametrize("key", ["HF_TOKEN", "hf_token", "WANDB_API_KEY", "api-key", "x.secret", "PASSWORD",
                                 "aws_credentials", "TOKEN", "KEYS", "MONKEY", "TOKENIZERS_PARALLELISM", "HF_HOME",
                                 "secretary", "key_file"])
def test_the_secret_key_pattern_agrees_with_the_check(key: str) -> None:
    assert bool(re.search(schema.SECRET_KEY, key)) is bool(secrets.SECRET_KEY.search(key))


@pytest.mark.parametrize("value", ["hf_" + "a" * 30, "  sk-" + "b" * 24, "ghp_" + "c" * 36, "AKIA" + "D" * 16,
                                   "hf_short", "sk-learn", "hello", "xoxb-1234567890", ""])
def test_the_credential_pattern_agrees_with_the_check(value: str) -> None:
    assert bool(re.search(schema.NOT_CREDENTIAL, value)) is not bool(secrets.CREDENTIAL.match(value.strip()))


def test_the_schemas_speak_the_reconcilers_words() -> None:
    """Patterns carry a message for the editor (patternErrorMessage, a yaml-language-server keyword
    other validators ignore), so nobody reads a regular expression to learn what is wrong."""
    for name, text in schema.generate().items():
        for node in schema._walk(json.loads(text)):
            if "pattern" in node and node["pattern"] != "^$":
                assert node.get("patternErrorMessage") or node.get("errorMessage"), (name, node["pattern"][:60])
