"""The Storage kind and a run's outputs: the model, the schema, and the checks across files, each
reported at file:line:col."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import jsonschema
import pytest
from pydantic import ValidationError

from reconciler.spec import schema
from reconciler.spec.load import load_tree, run_digest
from reconciler.spec.models.run import Run
from reconciler.spec.models.storage import Storage, is_secret_option

REPO = Path(__file__).resolve().parents[2]

STORAGE = """\
apiVersion: reconciler/v1
kind: Storage
metadata:
  name: s3-out
spec:
  backend: s3
  options:
    provider: Rclone
    endpoint: http://127.0.0.1:9000
  credentials:
    access_key_id: OUT_KEY_ID
    secret_access_key: OUT_SECRET
  bucket: bucket1
  prefix: team/nlp
"""

RUN = """\
apiVersion: reconciler/v1
kind: Run
metadata:
  name: r1
  labels: {team: nlp}
spec:
  template: local-host
  task: {type: command, argv: ["true"]}
"""


def storage(**spec) -> dict:
    base = {"backend": "s3", "bucket": "b", "credentials": {"access_key_id": "K"}}
    return {"apiVersion": "reconciler/v1", "kind": "Storage", "metadata": {"name": "s"}, "spec": {**base, **spec}}


def repo(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "repo"
    (root / "execution_templates").mkdir(parents=True)
    shutil.copy2(REPO / "execution_templates" / "local-host.yaml", root / "execution_templates")
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def diags(root: Path) -> list[str]:
    return [d.text() for d in load_tree(root).diagnostics]


def test_a_storage_loads_with_its_defaults() -> None:
    s = Storage.model_validate(storage())
    assert (s.spec.keep_checkpoints, s.spec.interval_s, s.spec.bwlimit, s.spec.prefix) == (2, 30, "", "")


@pytest.mark.parametrize("option", ["secret_access_key", "access_key_id", "session_token", "password", "pass",
                                    "service_account_credentials", "key", "sas_url", "client_secret"])
def test_secret_options_are_refused_with_a_pointer_to_credentials(option: str) -> None:
    with pytest.raises(ValidationError) as e:
        Storage.model_validate(storage(options={option: "x"}))
    assert "credentials" in str(e.value) and option in str(e.value)
    assert is_secret_option(option)


@pytest.mark.parametrize("option", ["provider", "endpoint", "region", "force_path_style", "key_file", "host"])
def test_plain_options_pass(option: str) -> None:
    assert Storage.model_validate(storage(options={option: "v"})).spec.options == {option: "v"}


@pytest.mark.parametrize("spec", [
    {"backend": "ftp"}, {"bucket": "a/../b"}, {"bucket": "a b"}, {"prefix": "/abs"}, {"prefix": "x/./y"},
    {"keep_checkpoints": 0}, {"interval_s": 1}, {"bwlimit": "1M; rm -rf"}, {"credentials": {"k": "not a name"}},
    {"options": {"region": 3}}, {"colour": "blue"}, {"options": {"Bad-Name": "x"}},
    {"options": {"access_key_id": "x"}},  # also in credentials: one or the other
])
def test_bad_storages_are_refused(spec: dict) -> None:
    with pytest.raises(ValidationError):
        Storage.model_validate(storage(**spec))


def test_the_schema_refuses_what_the_model_refuses() -> None:
    doc = json.loads(schema.generate()["storage.schema.json"])
    jsonschema.validate(storage(), doc)
    for bad in ({"options": {"secret_access_key": "x"}}, {"backend": "ftp"}, {"colour": 1}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(storage(**bad), doc)


def test_outputs_are_left_out_of_the_digest_while_unset() -> None:
    """Adding spec.outputs to the language must not start every existing run anew."""
    data = {"apiVersion": "reconciler/v1", "kind": "Run", "metadata": {"name": "r"},
            "spec": {"template": "t", "task": {"type": "command", "argv": ["true"]}}}
    plain = run_digest(Run.model_validate(data))
    data["spec"]["outputs"] = {"storage": "s3-out"}
    assert run_digest(Run.model_validate(data)) != plain
    assert "outputs" not in Run.model_validate({**data, "spec": {k: v for k, v in data["spec"].items()
                                                                 if k != "outputs"}}).spec.model_dump(exclude_none=True)


def test_a_repository_with_a_storage_and_a_run_that_uses_it_is_valid(tmp_path: Path) -> None:
    root = repo(tmp_path, {"specs/storage/s3-out.yaml": STORAGE,
                           "specs/runs/r1.yaml": RUN + "  outputs: {storage: s3-out, keep_checkpoints: 3}\n"})
    assert diags(root) == []
    d = load_tree(root)
    assert d.storages["s3-out"].spec.bucket == "bucket1"
    assert d.runs["r1"].run.spec.outputs.keep_checkpoints == 3


def test_the_credentials_are_names_not_literal_secrets(tmp_path: Path) -> None:
    """secret_access_key: OUT_SECRET names a secret; a value that looks like a key is still refused."""
    leaked = STORAGE.replace("access_key_id: OUT_KEY_ID", "access_key_id: AKIAABCDEFGHIJKLMNOP")
    root = repo(tmp_path, {"specs/storage/s3-out.yaml": leaked})
    assert any("looks like a credential" in m and "s3-out.yaml:11:" in m for m in diags(root))


def test_a_run_naming_a_missing_storage_is_located(tmp_path: Path) -> None:
    root = repo(tmp_path, {"specs/runs/r1.yaml": RUN + "  outputs: {storage: nowhere}\n"})
    assert diags(root) == ["specs/runs/r1.yaml:9:13: spec.outputs.storage: Storage 'nowhere' does not exist "
                           "(no file of kind Storage named nowhere)"]
    assert "r1" in load_tree(root).invalid


def test_a_run_naming_an_invalid_storage_is_invalid_too(tmp_path: Path) -> None:
    root = repo(tmp_path, {"specs/storage/s3-out.yaml": STORAGE.replace("backend: s3", "backend: ftp"),
                           "specs/runs/r1.yaml": RUN + "  outputs: {storage: s3-out}\n"})
    found = diags(root)
    assert any(m.startswith("specs/runs/r1.yaml:9:13:") and "is invalid" in m for m in found), found
    assert any(m.startswith("specs/storage/s3-out.yaml:6:3: spec.backend:") for m in found), found


def test_the_policy_default_must_exist(tmp_path: Path) -> None:
    policy = "apiVersion: reconciler/v1\nkind: Policy\nmetadata: {name: policy}\nspec:\n  defaultStorage: gone\n"
    root = repo(tmp_path, {"specs/policy.yaml": policy})
    assert diags(root) == ["specs/policy.yaml:5:3: spec.defaultStorage: Storage 'gone' does not exist (no file "
                           "of kind Storage named gone)"]


def test_a_credential_the_policy_does_not_grant_refuses_the_run(tmp_path: Path) -> None:
    """The credentials go to the run's machine: with secret grants, the run must be granted them."""
    policy = textwrap.dedent("""\
        apiVersion: reconciler/v1
        kind: Policy
        metadata: {name: policy}
        spec:
          defaultStorage: s3-out
          secrets:
            - {names: [OUT_KEY_ID], teams: [nlp]}
        """)
    root = repo(tmp_path, {"specs/policy.yaml": policy, "specs/storage/s3-out.yaml": STORAGE,
                           "specs/runs/r1.yaml": RUN})
    found = diags(root)
    assert len(found) == 1 and found[0].startswith("specs/runs/r1.yaml:6:1: ")
    assert "credential secret_access_key" in found[0] and "OUT_SECRET" in found[0]
    (root / "specs/policy.yaml").write_text(policy.replace("[OUT_KEY_ID]", "[OUT_KEY_ID, OUT_SECRET]"))
    assert diags(root) == []


def test_start_from_must_lie_in_the_storage(tmp_path: Path) -> None:
    sha = "ab" * 32
    good = "s3_out:bucket1/team/nlp/r-x/other/g1/checkpoints/checkpoint-10"
    run = RUN + f"  outputs:\n    storage: s3-out\n    start_from: {{checkpoint: checkpoint-10, uri: '{good}', " \
                f"manifest_sha256: {sha}}}\n"
    root = repo(tmp_path, {"specs/storage/s3-out.yaml": STORAGE, "specs/runs/r1.yaml": run})
    assert diags(root) == []
    for uri, why in (("other:bucket1/team/nlp/x/checkpoint-10", "is not in Storage"),
                     ("s3_out:bucket2/x/checkpoint-10", "is outside Storage")):
        (root / "specs/runs/r1.yaml").write_text(run.replace(good, uri))
        found = diags(root)
        assert len(found) == 1 and found[0].startswith("specs/runs/r1.yaml:11:45:") and why in found[0], found
    (root / "specs/runs/r1.yaml").write_text(run.replace(good, "s3_out:bucket1/team/../x/checkpoint-10"))
    assert any("'.' or '..'" in m for m in diags(root))


def test_two_storages_of_one_name_are_reported(tmp_path: Path) -> None:
    root = repo(tmp_path, {"specs/storage/s3-out.yaml": STORAGE, "specs/more/s3-out.yaml": STORAGE})
    assert any("Storage 's3-out' is also defined in" in m for m in diags(root))
