"""`reconcile validate` as users and CI run it: exit codes, PATH arguments, output formats."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.spec.helpers import REPO, TEMPLATE, reconcile, run_text, write

@pytest.fixture
def repo(tmp_path: Path) -> Path:
    write(tmp_path, "execution_templates/local-host.yaml", TEMPLATE)
    write(tmp_path, "specs/runs/good.yaml", run_text("good"))
    write(tmp_path, "specs/runs/dangling.yaml", run_text("dangling", template="gone"))
    write(tmp_path, "specs/other/broken.yaml", "apiVersion: reconciler/v1\nkind: Run\nmetadata: {name: broken\n")
    return tmp_path


# ---------------------------------------------------------------- the repository's own examples


def test_repository_examples_validate_in_place() -> None:
    """What CI runs on the repository itself."""
    r = reconcile("validate", cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("ok: ")


def test_repository_examples_validate_in_isolation(tmp_path: Path) -> None:
    for part in ("specs", "execution_templates", "schemas", "examples"):
        if (REPO / part).exists():
            shutil.copytree(REPO / part, tmp_path / part)
    r = reconcile("validate", "--repo", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    n = len(list((tmp_path / "specs").rglob("*.yaml"))) + len(list((tmp_path / "execution_templates").glob("*.yaml")))
    assert r.stdout.strip() == f"ok: {n} file(s) valid"
    r = reconcile("validate", "--repo", str(tmp_path), "--format", "json", cwd=tmp_path)
    assert json.loads(r.stdout) == {"valid": True, "files_checked": n, "errors": []}
    r = reconcile("validate", "--repo", str(tmp_path), "--format", "github", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == ""


# ---------------------------------------------------------------- exit codes


def test_whole_repository_from_cwd(repo: Path) -> None:
    r = reconcile("validate", cwd=repo)
    assert r.returncode == 1
    assert "specs/runs/dangling.yaml:6:3: spec.template: template 'gone' not found" in r.stdout
    assert "specs/other/broken.yaml:3:11: invalid YAML" in r.stdout
    assert r.stdout.splitlines()[-1] == "2 error(s) in 2 file(s); 4 file(s) checked"


def test_repo_found_from_a_subfolder(repo: Path) -> None:
    r = reconcile("validate", cwd=repo / "specs" / "runs")
    assert r.returncode == 1 and "dangling.yaml" in r.stdout


def test_missing_path_is_exit_2(repo: Path) -> None:
    r = reconcile("validate", "specs/runs/nope.yaml", cwd=repo)
    assert r.returncode == 2
    assert "no such file or directory" in r.stderr and r.stdout == ""


def test_missing_repo_is_exit_2(tmp_path: Path) -> None:
    r = reconcile("validate", "--repo", str(tmp_path / "nope"), cwd=tmp_path)
    assert r.returncode == 2 and "reconcile validate:" in r.stderr


def test_directory_without_specs_is_exit_2(tmp_path: Path) -> None:
    r = reconcile("validate", "--repo", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2
    assert "no specs/ or execution_templates/" in r.stderr
    r = reconcile("validate", cwd=tmp_path)
    assert r.returncode == 2


def test_path_without_spec_files_is_exit_2(repo: Path) -> None:
    (repo / "specs" / "empty").mkdir()
    r = reconcile("validate", "specs/empty", cwd=repo)
    assert r.returncode == 2
    assert "no .yaml files under specs/empty" in r.stderr


def test_path_without_spec_files_reports_nothing_else(repo: Path) -> None:
    """An empty PATH must not report the rest of the repository."""
    (repo / "specs" / "empty").mkdir()
    r = reconcile("validate", "specs/empty", cwd=repo)
    assert "dangling" not in r.stdout and "broken" not in r.stdout


def test_unknown_flag_is_exit_2(repo: Path) -> None:
    r = reconcile("validate", "--formt", "json", cwd=repo)
    assert r.returncode == 2
    r = reconcile("validate", "--format", "xml", cwd=repo)
    assert r.returncode == 2


# ---------------------------------------------------------------- PATH arguments


def test_one_file_reports_only_its_errors(repo: Path) -> None:
    r = reconcile("validate", "specs/runs/good.yaml", cwd=repo)
    assert r.returncode == 0, r.stdout
    assert r.stdout.strip() == "ok: 1 file(s) valid"
    r = reconcile("validate", "specs/runs/dangling.yaml", cwd=repo)
    assert r.returncode == 1
    assert "dangling.yaml" in r.stdout and "broken" not in r.stdout
    assert r.stdout.splitlines()[-1] == "1 error(s) in 1 file(s); 1 file(s) checked"


def test_one_file_is_still_checked_against_the_repository(repo: Path) -> None:
    """A file's template reference is resolved against the repository's templates, not just the file."""
    write(repo, "execution_templates/gone.yaml", TEMPLATE.replace("local-host", "gone").replace("host_process", "vm"))
    r = reconcile("validate", "specs/runs/dangling.yaml", cwd=repo)
    assert r.returncode == 1
    assert "template 'gone' is invalid (see execution_templates/gone.yaml)" in r.stdout
    assert "launch_mode.kind" not in r.stdout  # the template's own error belongs to the template's file
    write(repo, "execution_templates/gone.yaml", TEMPLATE.replace("local-host", "gone"))
    r = reconcile("validate", str(repo / "specs/runs/dangling.yaml"), cwd=REPO)  # absolute path, other cwd
    assert r.returncode == 0, r.stdout


def test_one_file_renaming_a_template_breaks_its_users(repo: Path) -> None:
    write(repo, "execution_templates/local-host.yaml", TEMPLATE.replace("id: local-host", "id: local"))
    r = reconcile("validate", "specs/runs/good.yaml", cwd=repo)
    assert r.returncode == 1 and "specs/runs/good.yaml:6:3:" in r.stdout


def test_a_folder_path(repo: Path) -> None:
    r = reconcile("validate", "specs/other", cwd=repo)
    assert r.returncode == 1
    assert "broken.yaml" in r.stdout and "dangling" not in r.stdout


def test_several_paths(repo: Path) -> None:
    r = reconcile("validate", "specs/runs/good.yaml", "specs/other/broken.yaml", cwd=repo)
    assert r.returncode == 1
    assert r.stdout.splitlines()[-1] == "1 error(s) in 1 file(s); 2 file(s) checked"


def test_a_file_outside_specs_is_checked(repo: Path) -> None:
    write(repo, "drafts/new.yaml", run_text("new", template="gone"))
    r = reconcile("validate", "drafts/new.yaml", cwd=repo)
    assert r.returncode == 1 and "drafts/new.yaml:6:3: spec.template: template 'gone' not found" in r.stdout


# ---------------------------------------------------------------- formats


def test_github_format(repo: Path) -> None:
    r = reconcile("validate", "--format", "github", cwd=repo)
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert lines == sorted(lines) and len(lines) == 2
    assert lines[1].startswith("::error file=specs/runs/dangling.yaml,line=6,col=3::spec.template: template 'gone'")
    assert all(line.startswith("::error file=") for line in lines)


def test_json_format(repo: Path) -> None:
    r = reconcile("validate", "--format", "json", cwd=repo)
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["valid"] is False and doc["files_checked"] == 4
    assert [(e["path"], e["line"], e["col"]) for e in doc["errors"]] == [
        ("specs/other/broken.yaml", 3, 11), ("specs/runs/dangling.yaml", 6, 3)]


def test_schema_check_on_a_missing_directory_is_exit_2(tmp_path: Path) -> None:
    r = reconcile("schema", "--check", "--repo", str(tmp_path / "nope"), cwd=tmp_path)
    assert r.returncode == 2 and "no such directory" in r.stderr and "Traceback" not in r.stderr


def test_a_folder_path_finds_files_as_the_whole_repository_does(repo: Path) -> None:
    """Hidden files and folders named *.yaml are skipped, whether the folder is a PATH or the repository."""
    (repo / "specs" / "runs" / "folder.yaml").mkdir()
    write(repo, "specs/runs/.draft.yaml", "kind: [\n")
    write(repo, "specs/runs/.hidden/x.yaml", "kind: [\n")
    r = reconcile("validate", "specs/runs", cwd=repo)
    assert r.returncode == 1
    assert r.stdout.splitlines()[-1] == "1 error(s) in 1 file(s); 2 file(s) checked", r.stdout


# ---------------------------------------------------------------- I/O errors: a message and exit 2


def test_schema_into_an_unwritable_place_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "schemas").write_text("a file where the folder should be\n")
    r = reconcile("schema", "--repo", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith(f"reconcile: {tmp_path / 'schemas'}: ")


def test_schema_check_on_an_unreadable_schema_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "schemas" / "run.schema.json").mkdir(parents=True)
    r = reconcile("schema", "--check", "--repo", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and "run.schema.json: Is a directory" in r.stderr


def test_status_table_of_a_handle_without_a_machine(repo: Path) -> None:
    write(repo, "status/good.yaml", "name: good\nphase: Running\nhandle:\n  backend: local_host_process\n")
    r = reconcile("status", "--repo", str(repo), cwd=repo)
    assert r.returncode == 0 and r.stdout.splitlines()[1].split()[:4] == ["good", "Running", "0/0", "-"]


# ---------------------------------------------------------------- duplicates across files, when files are given


def test_a_given_file_is_reported_for_a_duplicate_run_name(repo: Path) -> None:
    """In the tree's order the other file comes second; naming this one must still show the clash."""
    write(repo, "specs/runs/a/same.yaml", run_text("same"))
    write(repo, "specs/runs/b/same.yaml", run_text("same"))
    r = reconcile("validate", "specs/runs/a/same.yaml", cwd=repo)
    assert r.returncode == 1, r.stdout
    assert r.stdout.splitlines() == [
        "specs/runs/a/same.yaml:4:3: metadata.name: Run 'same' is also defined in specs/runs/b/same.yaml",
        "1 error(s) in 1 file(s); 1 file(s) checked"]
    r = reconcile("validate", "specs/runs/b/same.yaml", cwd=repo)
    assert r.stdout.splitlines()[0] == (
        "specs/runs/b/same.yaml:4:3: metadata.name: Run 'same' is also defined in specs/runs/a/same.yaml")
    r = reconcile("validate", cwd=repo)  # the whole tree: reported once, against the second file
    assert "specs/runs/b/same.yaml:4:3: metadata.name: Run 'same' is also defined" in r.stdout
    assert "specs/runs/a/same.yaml:" not in r.stdout


def test_a_given_file_is_reported_for_a_duplicate_template_id(repo: Path) -> None:
    write(repo, "execution_templates/local-host-copy.yaml", TEMPLATE)
    r = reconcile("validate", "execution_templates/local-host.yaml", cwd=repo)
    assert r.returncode == 1, r.stdout
    assert r.stdout.splitlines() == [
        "execution_templates/local-host.yaml:3:1: id: template id 'local-host' is also defined in "
        "execution_templates/local-host-copy.yaml",
        "1 error(s) in 1 file(s); 1 file(s) checked"]
    # The run using the id still resolves it to the file named after it, and passes.
    r = reconcile("validate", "specs/runs/good.yaml", cwd=repo)
    assert r.returncode == 0, r.stdout


def test_a_given_fleet_is_reported_for_a_duplicate_machine(repo: Path) -> None:
    fleet = ("apiVersion: reconciler/v1\nkind: Fleet\nmetadata:\n  name: {name}\nspec:\n  known_hosts: /etc/ssh/known_hosts\n"
             "  machines:\n    - name: node-1\n      ssh: {{host: 127.0.0.1, user: u}}\n")
    write(repo, "specs/fleets/dc.yaml", fleet.format(name="dc"))
    write(repo, "specs/fleets/lab.yaml", fleet.format(name="lab"))
    r = reconcile("validate", "specs/fleets/dc.yaml", cwd=repo)
    assert r.returncode == 1, r.stdout
    assert r.stdout.splitlines()[0] == (
        "specs/fleets/dc.yaml:8:7: spec.machines[0].name: machine 'node-1' is already declared in specs/fleets/lab.yaml")


# ---------------------------------------------------------------- one run shows every problem


def test_schema_errors_do_not_hide_the_others(repo: Path) -> None:
    write(repo, "specs/runs/dangling.yaml", run_text("dangling", template="gone") + "  bogus: 1\n")
    r = reconcile("validate", "specs/runs/dangling.yaml", cwd=repo)
    assert r.stdout.splitlines() == [
        "specs/runs/dangling.yaml:6:3: spec.template: template 'gone' not found (known: local-host)",
        "specs/runs/dangling.yaml:10:3: spec.bogus: unknown key 'bogus'",
        "2 error(s) in 1 file(s); 1 file(s) checked"]


SLURM_TEMPLATE = """\
apiVersion: reconciler/v1
kind: ExecutionTemplate
id: {id}
placement:
  kind: slurm
  slurm:
    workspace_root: {root}
launch_mode:
  kind: {mode}
allow_overrides: [resources]
"""


def test_slurm_templates_and_multi_node_runs_are_checked(tmp_path: Path) -> None:
    write(tmp_path, "execution_templates/local-host.yaml", TEMPLATE)
    write(tmp_path, "execution_templates/c1.yaml", SLURM_TEMPLATE.format(id="c1", root="/shared/a", mode="host_process"))
    write(tmp_path, "execution_templates/c2.yaml", SLURM_TEMPLATE.format(id="c2", root="/shared/b", mode="host_process"))
    write(tmp_path, "execution_templates/c3.yaml", SLURM_TEMPLATE.format(id="c3", root="/shared/a", mode="docker")
          .replace("allow_overrides", "defaults: {image: x}\nallow_overrides"))
    write(tmp_path, "execution_templates/c4.yaml", SLURM_TEMPLATE.format(id="c4", root="/shared/c", mode="host_process")
          .replace("  slurm:\n", "  slurm:\n    login: head\n"))
    write(tmp_path, "specs/runs/wide.yaml", run_text("wide", extra="  overrides:\n    resources: {nodes: 2}\n"))
    write(tmp_path, "specs/runs/ok.yaml", run_text("ok", template="c1", extra="  overrides:\n    resources: {nodes: 4}\n"))
    r = reconcile("validate", cwd=tmp_path)
    assert r.returncode == 1
    out = r.stdout + r.stderr
    assert "execution_templates/c2.yaml:7:5: placement.slurm.workspace_root: login host 'local' has workspace_root '/shared/a' in " \
           "execution_templates/c1.yaml: one cluster, one root" in out
    assert "execution_templates/c3.yaml" in out and "host_process" in out
    assert "specs/runs/wide.yaml:11:" in out and "needs ssh or slurm placement; template 'local-host' has local placement" in out
    assert "specs/runs/ok.yaml" not in out
    assert ("execution_templates/c4.yaml:7:5: placement.slurm.login: login host 'head' is not a Fleet machine "
            "(known: no Fleet declares any); use local for this machine") in out
