"""Loading a repository: every error of every file, located; cross-file checks; the parse cache."""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from reconciler.spec import load
from reconciler.spec.checks.fleets import host_key_problem
from reconciler.spec.checks.inputs import input_problem
from reconciler.spec.checks.secrets import MAYBE_SECRET, secret_values
from reconciler.spec.load import Locator, SpecCache, dotted, load_file, load_tree, run_digest
from reconciler.spec.models.common import DNS_LABEL
from tests.spec.helpers import TEMPLATE, run_text, write

FLEET = """\
apiVersion: reconciler/v1
kind: Fleet
metadata:
  name: lab
spec:
  known_hosts: /etc/ssh/known_hosts
  machines:
    - name: m1
      ssh: {host: 127.0.0.1, user: u, identity_file: ~/.ssh/key}
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    write(tmp_path, "execution_templates/local-host.yaml", TEMPLATE)
    write(tmp_path, "specs/runs/a.yaml", run_text("a"))
    write(tmp_path, "specs/team/b.yaml", run_text("b"))
    write(tmp_path, "specs/fleets/lab.yaml", FLEET)
    return tmp_path


def test_valid_tree(repo: Path) -> None:
    d = load_tree(repo)
    assert d.diagnostics == []
    assert set(d.runs) == {"a", "b"} and set(d.templates) == {"local-host"} and set(d.fleets) == {"lab"}
    assert d.runs["b"].rel == os.path.join("specs", "team", "b.yaml")
    assert d.runs["a"].digest.startswith("sha256:")
    assert d.invalid == {}


def test_every_file_is_checked_and_one_bad_file_hides_nothing(repo: Path) -> None:
    write(repo, "specs/runs/a.yaml", run_text("a") + "  bogus: 1\n")
    write(repo, "specs/runs/c.yaml", "kind: [\n")
    write(repo, "specs/runs/d.yaml", run_text("d", template="nope"))
    d = load_tree(repo)
    by_file = {x.path: x for x in d.diagnostics}
    assert set(by_file) == {"specs/runs/a.yaml", "specs/runs/c.yaml", "specs/runs/d.yaml"}
    assert "unknown key 'bogus'" in by_file["specs/runs/a.yaml"].message
    assert (by_file["specs/runs/a.yaml"].line, by_file["specs/runs/a.yaml"].col) == (10, 3)
    assert "template 'nope' not found" in by_file["specs/runs/d.yaml"].message
    assert set(d.runs) == {"b"}
    # Invalid runs keep a name (for their status file) and their first message.
    assert set(d.invalid) == {"a", "c", "d"}
    assert "bogus" in d.invalid["a"]
    assert d.diagnostics == sorted(d.diagnostics)


def test_invalid_template_invalidates_its_runs_not_others(repo: Path) -> None:
    write(repo, "execution_templates/other.yaml", TEMPLATE.replace("local-host", "other").replace("host_process", "vm"))
    write(repo, "specs/runs/c.yaml", run_text("c", template="other"))
    d = load_tree(repo)
    assert {x.path for x in d.diagnostics} == {"execution_templates/other.yaml", "specs/runs/c.yaml"}
    assert set(d.runs) == {"a", "b"}
    assert "local-host" in d.templates and "other" not in d.templates


def test_only_limits_reports_but_not_checks(repo: Path) -> None:
    write(repo, "specs/runs/bad.yaml", run_text("bad", template="nope"))
    a = repo / "specs/runs/a.yaml"
    assert load_tree(repo, only={a}).diagnostics == []
    write(repo, "execution_templates/local-host.yaml", TEMPLATE.replace("id: local-host", "id: renamed"))
    d = load_tree(repo, only={a})
    # a.yaml's template is now invalid elsewhere; the report names only a.yaml, and its reference dangles.
    assert [x.path for x in d.diagnostics] == ["specs/runs/a.yaml"]
    assert "template 'local-host' is invalid" in d.diagnostics[0].message


def test_only_empty_reports_nothing(repo: Path) -> None:
    write(repo, "specs/runs/bad.yaml", run_text("bad", template="nope"))
    assert load_tree(repo, only=set()).diagnostics == []


def test_only_a_file_outside_the_tree(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    elsewhere = write(tmp_path_factory.mktemp("x"), "loose.yaml", run_text("loose", template="nope"))
    d = load_tree(repo, only={elsewhere})
    assert len(d.diagnostics) == 1
    assert "template 'nope' not found" in d.diagnostics[0].message


def test_cache_parses_unchanged_files_once(repo: Path) -> None:
    cache = SpecCache()
    load_tree(repo, cache=cache)
    assert cache.hits == 0
    load_tree(repo, cache=cache)
    assert cache.hits == 4
    write(repo, "specs/runs/a.yaml", run_text("a") + "  desiredState: Stopped\n")
    d = load_tree(repo, cache=cache)
    assert cache.hits == 7
    assert d.runs["a"].run.spec.desiredState == "Stopped"


def test_cache_holds_one_entry_per_file_of_the_tree(repo: Path) -> None:
    cache = SpecCache()
    load_tree(repo, cache=cache)
    files = len(cache)
    for i in range(3):  # the same file changed again and again: replaced, never piled up
        write(repo, "specs/runs/a.yaml", run_text("a") + f"  # edit {i}\n")
        load_tree(repo, cache=cache)
    assert len(cache) == files
    (repo / "specs/runs/a.yaml").unlink()  # a file that leaves the tree leaves the cache
    load_tree(repo, cache=cache)
    assert len(cache) == files - 1


def test_valid_files_never_reach_the_located_path(repo: Path) -> None:
    locator = Locator()
    f = load_file(repo / "specs/runs/a.yaml", repo, locator)
    assert f.ok
    assert locator._docs == {}  # ruamel.yaml was not needed
    bad = write(repo, "specs/runs/x.yaml", run_text("x") + "  bogus: 1\n")
    f = load_file(bad, repo, locator)
    assert not f.ok and bad in locator._docs


def test_expect_kind(repo: Path) -> None:
    p = write(repo, "execution_templates/r.yaml", run_text("r"))
    f = load_file(p, repo, Locator(), expect_kind="ExecutionTemplate")
    assert f.obj is None
    assert "must be ExecutionTemplate, not Run" in f.diags[0].message


def test_run_digest_follows_the_spec_only(repo: Path) -> None:
    d1 = load_tree(repo).runs["a"].digest
    write(repo, "specs/runs/a.yaml", run_text("a").replace("metadata:\n  name: a\n",
                                                          "metadata:\n  name: a\n  labels: {x: y}\n"))
    assert load_tree(repo).runs["a"].digest == d1
    write(repo, "specs/runs/a.yaml", "# a comment changes nothing\n" + run_text("a"))
    assert load_tree(repo).runs["a"].digest == d1
    write(repo, "specs/runs/a.yaml", run_text("a") + "  desiredState: Stopped\n")
    assert load_tree(repo).runs["a"].digest != d1
    assert run_digest(load_tree(repo).runs["a"].run) == load_tree(repo).runs["a"].digest


def test_discover_skips_hidden_and_other_extensions(repo: Path) -> None:
    write(repo, "specs/.hidden/x.yaml", "garbage: [")
    write(repo, "specs/runs/.x.yaml", "garbage: [")
    write(repo, "specs/runs/notes.md", "# notes")
    write(repo, "specs/runs/e.yml", run_text("e"))
    names = [os.path.basename(p) for p, _ in load.discover(repo)]
    assert "x.yaml" not in names and ".x.yaml" not in names and "notes.md" not in names and "e.yml" in names


def test_dotted() -> None:
    data = {"spec": {"task": {"type": "swift-sft", "args": {"k": 1}}, "inputs": ["a"]}}
    assert dotted(("spec", "task", "swift-sft", "args", "k"), data) == "spec.task.args.k"
    assert dotted(("spec", "inputs", 0), data) == "spec.inputs[0]"
    assert dotted(("spec", "missing"), data) == "spec.missing"


# ---------------------------------------------------------------- checks


@pytest.mark.parametrize("item,problem", [
    ("data/x.txt", None),
    ("data", None),
    ("", "empty"),
    (" data", "spaces"),
    ("/etc/passwd", "not absolute"),
    ("data/../data/x.txt", "'..'"),
    ("data\\x.txt", "'/' separators"),
    ("status/r.yaml", "status/"),
    (".git/config", ".git/"),
    (".reconciler/cache", ".reconciler/"),
    ("data/nothing", "does not exist"),
])
def test_input_problem(tmp_path: Path, item: str, problem: str | None) -> None:
    write(tmp_path, "data/x.txt", "x")
    write(tmp_path, "status/r.yaml", "phase: Running\n")
    got = input_problem(tmp_path, item)
    assert (got is None) if problem is None else (got is not None and problem in got), got


def test_input_symlinks(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    write(root, "data/x.txt", "x")
    outside = write(tmp_path, "outside/secret.txt", "s")
    (root / "data" / "inside-link").symlink_to(root / "data" / "x.txt")
    assert input_problem(root, "data/inside-link") is None
    (root / "escape").symlink_to(outside)
    assert "escapes the repository" in input_problem(root, "escape")
    (root / "broken").symlink_to(root / "nowhere")
    assert "broken or looping" in input_problem(root, "broken")
    (root / "data" / "nested").symlink_to(outside.parent)
    assert "contains a symlink that escapes" in input_problem(root, "data")


def test_secret_values() -> None:
    data = {
        "metadata": {"annotations": {"note": "hf_" + "a" * 30}},
        "spec": {
            "task": {"env": {"HF_TOKEN": "abc", "TOKENIZERS_PARALLELISM": "false", "MY_API_KEY": "k", "PATH": "/bin"}},
            "secrets": ["HF_TOKEN"],
            "machines": [{"ssh": {"host_key": "ssh-ed25519 AAAA", "identity_file": "~/.ssh/key"}}],
        },
    }
    found = dict(secret_values(data))
    assert set(found) == {("metadata", "annotations", "note"), ("spec", "task", "env", "HF_TOKEN"),
                          ("spec", "task", "env", "MY_API_KEY")}
    assert "looks like a credential" in found[("metadata", "annotations", "note")]
    assert "list 'HF_TOKEN' under spec.secrets" in found[("spec", "task", "env", "HF_TOKEN")]


@pytest.mark.parametrize("value", ["sk-" + "a" * 24, "ghp_" + "a" * 36, "hf_" + "b" * 30, "AKIA" + "A" * 16,
                                   "github_pat_" + "x" * 40, "glpat-" + "y" * 20, "xoxb-1234567890-abc"])
def test_credential_lookalikes_anywhere(value: str) -> None:
    assert secret_values({"a": [{"b": value}]}, text=f"a: [{{b: {value}}}]")


def test_secret_prefilter_skips_clean_text() -> None:
    assert secret_values({"a": "b"}, text="a: b\n") == []


def test_secret_prefilter_skips_secret_names() -> None:
    """Naming a secret is the fix, not a leak: the walk is skipped for it, in any case of the key."""
    assert MAYBE_SECRET.search("spec:\n  secrets: [HF_TOKEN, WANDB_API_KEY]\n") is None
    assert MAYBE_SECRET.search("env: {HF_TOKEN: x}") and MAYBE_SECRET.search("env: {hf_token: x}")
    assert MAYBE_SECRET.search("note: hf_abc") and not MAYBE_SECRET.search("note: HF_abc")


# ---------------------------------------------------------------- invalid runs: the name of their status file

CORPUS = Path(__file__).parent / "corpus"


@pytest.mark.parametrize("case, keys", [
    ("dns-name-path-traversal", {"traversal"}),  # metadata.name '../specs/runs/ok': the file stem instead
    ("dns-name-absolute-path", set()),           # '/etc/x' in Abs_Name.yaml: neither is a DNS label
    ("dns-name-non-ascii", {"resume"}),          # 'résumé' in resume.yaml
    ("dns-name-over-63", {"long-name"}),         # 64 characters in long-name.yaml
    ("dns-name-too-long", set()),                # 64 characters, and the file is named so too
    ("dns-name-uppercase", set()),               # 'MyRun' in MyRun.yaml
])
def test_invalid_run_keys_are_dns_labels(case: str, keys: set[str]) -> None:
    """desired.invalid's keys become status/<key>.yaml: a raw metadata.name there wrote outside status/."""
    d = load_tree(CORPUS / case)
    assert set(d.invalid) == keys
    for key in d.invalid:
        assert re.fullmatch(DNS_LABEL, key) and len(key) <= 63, key
    assert d.diagnostics  # the file is still reported, status or not


def test_invalid_run_key_is_never_a_path_or_a_line(repo: Path) -> None:
    for i, name in enumerate(['"../specs/runs/a"', "/etc/passwd", '"ok\\n"', '"a/b"', "..", "-x", "x" * 64, "Ω"]):
        write(repo, f"specs/runs/bad{i}.yaml", run_text("x").replace("name: x", f"name: {name}"))
    write(repo, "specs/runs/Not_A_Label.yaml", run_text("x").replace("name: x", 'name: "../../etc/x"'))
    write(repo, "specs/runs/stem ok.yaml", "kind: Run\nmetadata: {name: [1]}\n")
    d = load_tree(repo)
    assert set(d.invalid) == {f"bad{i}" for i in range(8)}
    assert set(d.runs) == {"a", "b"}
    assert {x.path for x in d.diagnostics} >= {"specs/runs/Not_A_Label.yaml", "specs/runs/stem ok.yaml"}


# ---------------------------------------------------------------- a schema error hides nothing else


def test_a_template_the_schema_refuses_still_gets_its_checks(repo: Path) -> None:
    write(repo, "execution_templates/box.yaml", TEMPLATE.replace("id: local-host", "id: boxx")
          .replace("host_process", "docker") + "bogus: 1\n")
    d = load_tree(repo)
    got = sorted((x.line, x.col, x.message) for x in d.diagnostics)
    assert got == [(3, 1, "id: id 'boxx' must equal the file name 'box'"),
                   (6, 1, "launch_mode: docker launches need defaults.image (or allow_overrides: [image])"),
                   (9, 1, "bogus: unknown key 'bogus'")]


def test_a_run_the_schema_refuses_still_gets_its_checks(repo: Path) -> None:
    write(repo, "specs/runs/c.yaml", run_text("c", template="nope").replace("name: c", "name: cc")
          + "  inputs: [missing.txt, missing.txt]\n  secrets: [A, A]\n  bogus: 1\n")
    d = load_tree(repo)
    got = sorted((x.line, x.col, x.message) for x in d.diagnostics)
    assert got == [(4, 3, "metadata.name: name 'cc' must equal the file name 'c'"),
                   (6, 3, "spec.template: template 'nope' not found (known: local-host)"),
                   (10, 12, "spec.inputs[0]: input 'missing.txt' does not exist in the repository"),
                   (10, 25, "spec.inputs[1]: input 'missing.txt' does not exist in the repository"),
                   (11, 3, "spec.secrets: a secret is named twice"),
                   (12, 3, "spec.bogus: unknown key 'bogus'")]
    assert set(d.invalid) == {"cc"}


def test_a_file_of_unknown_kind_is_still_searched_for_secrets(repo: Path) -> None:
    write(repo, "specs/misc/job.yaml", "kind: Job\nenv:\n  note: ghp_" + "a" * 36 + "\n")
    write(repo, "specs/misc/list.yaml", "- hf_" + "b" * 30 + "\n")
    write(repo, "specs/misc/scalar.yaml", "hf_short: no, a string\n".replace(":", ""))
    d = load_tree(repo)
    assert [(x.path, x.line, x.col, x.message.split(";")[0]) for x in d.diagnostics] == [
        ("specs/misc/job.yaml", 1, 1, "kind: unknown kind 'Job'"),
        ("specs/misc/job.yaml", 3, 3, "env.note: this value looks like a credential"),
        ("specs/misc/list.yaml", 1, 1, "expected a mapping with apiVersion and kind, found a list"),
        ("specs/misc/list.yaml", 1, 3, "[0]: this value looks like a credential"),
        ("specs/misc/scalar.yaml", 1, 1, "expected a mapping with apiVersion and kind, found a string")]


# ---------------------------------------------------------------- pinned host keys


def _keygen(tmp: Path, *args: str) -> str:
    key = tmp / f"k{len(list(tmp.iterdir()))}"
    subprocess.run(["ssh-keygen", "-q", "-N", "", "-C", "someone@host", "-f", str(key), *args], check=True,
                   capture_output=True)
    return key.with_suffix(".pub").read_text().strip()


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs ssh-keygen (openssh-client)")
def test_host_keys_from_ssh_keygen_pass(tmp_path: Path) -> None:
    lines = [_keygen(tmp_path, "-t", "ed25519"), _keygen(tmp_path, "-t", "rsa", "-b", "2048"),
             _keygen(tmp_path, "-t", "ecdsa", "-b", "256"), _keygen(tmp_path, "-t", "ecdsa", "-b", "384"),
             _keygen(tmp_path, "-t", "ecdsa", "-b", "521")]
    for line in lines:
        kind, data = line.split()[:2]
        assert host_key_problem(line) is None, line  # with the .pub comment
        assert host_key_problem(f"{kind} {data}") is None
        assert "not an SSH public key (truncated?)" in host_key_problem(f"{kind} {data[:-8]}")
        assert "not valid base64" in host_key_problem(f"{kind} {data[:-1]}")
    ed_data = lines[0].split()[1]
    assert host_key_problem(f"ssh-rsa {ed_data}") == "the key data holds a 'ssh-ed25519' key, but the line says 'ssh-rsa'"
    ec256 = lines[2].split()[1]
    assert "holds a 'ecdsa-sha2-nistp256' key" in host_key_problem(f"ecdsa-sha2-nistp384 {ec256}")


def test_host_key_security_key_types_and_refusals() -> None:
    def blob(*fields: bytes) -> str:
        return base64.b64encode(b"".join(len(x).to_bytes(4, "big") + x for x in fields)).decode()

    assert host_key_problem("sk-ssh-ed25519@openssh.com " + blob(b"sk-ssh-ed25519@openssh.com", b"k" * 32, b"ssh:")) is None
    sk_ec = "sk-ecdsa-sha2-nistp256@openssh.com"
    assert host_key_problem(f"{sk_ec} " + blob(sk_ec.encode(), b"nistp256", b"\x04" + b"p" * 64, b"ssh:")) is None
    assert "truncated or malformed" in host_key_problem(f"{sk_ec} " + blob(sk_ec.encode(), b"nistp384", b"q", b"ssh:"))
    assert "truncated or malformed" in host_key_problem("ssh-ed25519 " + blob(b"ssh-ed25519", b"k" * 31))
    assert "truncated or malformed" in host_key_problem("ssh-ed25519 " + blob(b"ssh-ed25519", b"k" * 32, b"extra"))
    assert host_key_problem("ssh-dss AAAA").startswith("unknown key type 'ssh-dss'")
    assert host_key_problem("ssh-ed25519").startswith("'ssh-ed25519' without its key data")
    assert host_key_problem("host.example ssh-ed25519 AAAA").startswith("starts with 'host.example', a known_hosts host field")
