"""Promises kept under faults and odd input, on real processes and real git repositories.

Each test reproduces a way the reconciler used to break a promise: a stale instance adopted under
a newer spec after a lost status, an invalid spec killing its running job, a missing secret
burning retries, status commits that said nothing, a finished run recorded as stopped, fenced
leftovers piling up, a path built from an invalid name.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import git
import pytest

from reconciler.artifacts import bundle as bundles
from reconciler.status import store as statuses
from reconciler.machines import launchers
from reconciler.machines.base import LaunchSpec, MachineInfo
from reconciler.machines.local import LocalTransport
from reconciler.core.errors import TemporaryError
from tests.repo_helpers import (
    commit_all, kill_group, make_repo, pgid_of, processes_with, reconcile_cli, reconciler, result_of, run_spec,
    status_of, wait_for, workspace,
)

LONG = ["sh", "-c", "sleep 300 & sleep 300; wait"]


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout


def _origin_with(tmp_path: Path, runs: dict[str, str]) -> Path:
    """A bare origin holding ``runs``, the way the daemon's remote would."""
    seed = make_repo(tmp_path / "seed", runs)
    origin = tmp_path / "origin.git"
    _git(tmp_path, "clone", "-q", "--bare", str(seed), str(origin))
    return origin


def _clone(origin: Path, dest: Path) -> Path:
    _git(origin.parent, "clone", "-q", str(origin), str(dest))
    _git(dest, "config", "user.name", "Test User")
    _git(dest, "config", "user.email", "user@example.invalid")
    return dest


def _user_push(origin: Path, tmp_path: Path, edit) -> None:
    """A user's pull request, merged: clone, edit, commit, push."""
    user = _clone(origin, tmp_path / f"user-{len(list(tmp_path.glob('user-*')))}")
    edit(user)
    commit_all(user, "user change")
    _git(user, "push", "-q", "origin", "HEAD:main")


def _leaders(identity: str, ws_root: Path) -> set[int]:
    """Process groups whose members carry ``identity``, launched under this test's ``ws_root``."""
    out = set()
    for pid in processes_with(f"RECONCILER_IDENTITY={identity}", within=ws_root):
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        out.add(int(stat[stat.rfind(")") + 2:].split()[2]))
    return out


def _job_digest(ws_root: Path, identity: str) -> str:
    return json.loads((workspace(ws_root, identity) / "job.json").read_text())["payload"]["spec_digest"]


# ---------------------------------------------------------------- a stale instance under a newer spec


def test_instance_of_an_older_spec_is_fenced_never_adopted_after_status_was_lost(tmp_path, ws_root):
    origin = _origin_with(tmp_path, {"x": run_spec("x", LONG)})
    first = _clone(origin, tmp_path / "vm-1")
    # The first VM launches x-g1-a1 and dies before its status reaches the remote.
    reconciler(first, ws_root).run_pass(commit=False)
    wait_for(lambda: _leaders("x-g1-a1", ws_root), what="x-g1-a1 running")
    old_digest = _job_digest(ws_root, "x-g1-a1")
    _user_push(origin, tmp_path, lambda u: (u / "specs/runs/x.yaml").write_text(run_spec("x", LONG + ["v2"])))

    fresh = _clone(origin, tmp_path / "vm-2")
    result = reconciler(fresh, ws_root).run_pass()
    change = result.plan.for_run("x")
    assert (change.action, change.identity) == ("relaunch", "x-g2-a1")
    assert [k.identity for k in change.kill] == ["x-g1-a1"]
    assert not _leaders("x-g1-a1", ws_root), "the old spec's instance still runs"
    assert wait_for(lambda: _leaders("x-g2-a1", ws_root), what="x-g2-a1 running")
    st = status_of(fresh, "x")
    new_digest = _job_digest(ws_root, "x-g2-a1")
    assert new_digest != old_digest and st.spec.digest == new_digest
    assert (st.generation, st.attempt, st.handle.identity) == (2, 1, "x-g2-a1")
    # Level-triggered: the next pass changes nothing and adopts nothing else.
    again = reconciler(fresh, ws_root).run_pass()
    assert again.plan.for_run("x").action == "none" and not again.written


def test_a_finished_instance_of_another_spec_never_lends_its_result(tmp_path, ws_root):
    origin = _origin_with(tmp_path, {"x": run_spec("x", ["sh", "-c", "exit 7"])})
    first = _clone(origin, tmp_path / "vm-1")
    reconciler(first, ws_root).run_pass(commit=False)
    wait_for(lambda: result_of(ws_root, "x-g1-a1"), what="x-g1-a1 to finish")
    _user_push(origin, tmp_path, lambda u: (u / "specs/runs/x.yaml").write_text(run_spec("x", ["true"])))
    fresh = _clone(origin, tmp_path / "vm-2")
    rec = reconciler(fresh, ws_root)
    first_pass = rec.run_pass()
    assert first_pass.plan.for_run("x").identity == "x-g2-a1"
    wait_for(lambda: result_of(ws_root, "x-g2-a1"), what="x-g2-a1 to finish")
    rec.run_pass()
    st = status_of(fresh, "x")
    assert (st.phase, st.exit_code, st.generation) == ("Succeeded", 0, 2)


def test_an_unrecorded_attempt_found_ended_is_the_one_the_status_names(tmp_path, ws_root):
    origin = _origin_with(tmp_path, {"x": run_spec("x", ["true"])})
    first = _clone(origin, tmp_path / "vm-1")
    rec = reconciler(first, ws_root)
    rec.run_pass()
    wait_for(lambda: result_of(ws_root, "x-g1-a1"), what="x-g1-a1 to finish")
    rec.run_pass()
    _git(first, "push", "-q", "origin", "HEAD:main")  # g1 Succeeded is on the remote
    _user_push(origin, tmp_path, lambda u: (u / "specs/runs/x.yaml").write_text(run_spec("x", ["sh", "-c", "exit 7"])))
    _git(first, "pull", "-q", "--rebase", "origin", "main")
    rec.run_pass(commit=False)  # launches x-g2-a1; this status never reaches the remote
    wait_for(lambda: result_of(ws_root, "x-g2-a1"), what="x-g2-a1 to fail")
    fresh = _clone(origin, tmp_path / "vm-2")
    reconciler(fresh, ws_root).run_pass()
    st = status_of(fresh, "x")
    assert (st.phase, st.exit_code, st.generation) == ("Failed", 7, 2)
    assert st.handle.identity == "x-g2-a1" and st.spec.digest == _job_digest(ws_root, "x-g2-a1")


def test_launch_refuses_to_start_or_adopt_a_workspace_built_for_another_spec(tmp_path):
    t = LocalTransport(MachineInfo("local", str(tmp_path / "ws")))
    ws = Path(t.workspace("x-g1-a1"))
    (ws / "scripts").mkdir(parents=True)
    (ws / "scripts" / "launch.sh").write_text("echo should-not-run > ran\n")
    (ws / "job.json").write_text(json.dumps({"payload": {"spec_digest": "sha256:old"}}, indent=2, sort_keys=True))
    spec = LaunchSpec(identity="x-g1-a1", run_name="x", workspace=str(ws), launch_mode="host_process",
                      spec_digest="sha256:new")
    with pytest.raises(TemporaryError, match="built for another spec"):
        launchers.launch(t, spec)
    assert not (ws / "runtime" / "launched_at").exists() and not (ws / "ran").exists()
    (ws / "runtime").mkdir()
    (ws / "runtime" / "launched_at").write_text("1\n")  # started once: still never adopted under "new"
    with pytest.raises(TemporaryError, match="built for another spec"):
        launchers.launch(t, spec)


def test_bundle_of_another_spec_is_rebuilt_not_reused(tmp_path):
    repo = make_repo(tmp_path / "repo", {"x": run_spec("x", ["true"])})
    from reconciler.spec.load import load_tree
    from reconciler.spec.resolve import effective

    desired = load_tree(repo)
    entry = desired.runs["x"]
    template = desired.templates["local-host"]

    def request(digest: str) -> bundles.BundleRequest:
        return bundles.BundleRequest(repo_root=repo, identity="x-g1-a1", run=entry.run, spec_digest=digest,
                                     repo_head=None, template=template, effective=effective(entry.run, template),
                                     machine="local")

    dest = tmp_path / "b" / "x-g1-a1"
    bundles.build(request("sha256:one"), dest)
    (dest / "runtime").mkdir()
    (dest / "runtime" / "result.json").write_text("{}")  # it ran: a record to keep, aside
    bundles.build(request("sha256:two"), dest)
    assert bundles.built_digest(dest) == "sha256:two"
    assert not (dest / "runtime").exists()
    aside = list(dest.parent.glob(".x-g1-a1.superseded-*"))
    assert len(aside) == 1 and bundles.built_digest(aside[0]) == "sha256:one"
    bundles.build(request("sha256:two"), dest)  # same spec: reused
    assert len(list(dest.parent.glob(".x-g1-a1.superseded-*"))) == 1


# ---------------------------------------------------------------- an invalid spec touches nothing


def test_invalid_spec_keeps_the_job_running_and_a_fix_continues_it(tmp_path, ws_root):
    repo_dir = make_repo(tmp_path / "repo", {"x": run_spec("x", LONG)})
    rec = reconciler(repo_dir, ws_root)
    rec.run_pass()
    pgid = wait_for(lambda: pgid_of(ws_root, "x-g1-a1"), what="x-g1-a1 pid")
    good = (repo_dir / "specs/runs/x.yaml").read_text()
    (repo_dir / "specs/runs/x.yaml").write_text(good.replace("spec:\n", "spec:\n  : [\n", 1))
    commit_all(repo_dir, "break x")
    broken = rec.run_pass()
    assert [c.action for c in broken.plan.changes] == ["mark_invalid"]
    assert _leaders("x-g1-a1", ws_root) == {pgid}, "the invalid spec stopped the job"
    assert result_of(ws_root, "x-g1-a1") is None
    st = status_of(repo_dir, "x")
    assert st.phase == "Invalid" and "specs/runs/x.yaml:" in st.message
    assert "keeps running as x-g1-a1" in st.message
    assert (st.generation, st.handle.identity) == (1, "x-g1-a1")
    assert rec.run_pass().commit is None  # still invalid: nothing new to say
    (repo_dir / "specs/runs/x.yaml").write_text(good)
    commit_all(repo_dir, "fix x")
    fixed = rec.run_pass()
    change = fixed.plan.for_run("x")
    assert (change.action, change.code, change.identity) == ("adopt", "SpecValid", "x-g1-a1")
    st = status_of(repo_dir, "x")
    assert (st.phase, st.generation, st.attempt, st.handle.identity) == ("Running", 1, 1, "x-g1-a1")
    assert st.condition("SpecValid").status == "True"
    assert _leaders("x-g1-a1", ws_root) == {pgid} and not workspace(ws_root, "x-g1-a2").exists()


# ---------------------------------------------------------------- a missing secret waits


def test_missing_secret_waits_pending_without_staging_then_launches_when_set(tmp_path, ws_root):
    spec = run_spec("x", ["sh", "-c", 'test -n "$RC_TEST_TOKEN"'], extra="  secrets: [RC_TEST_TOKEN]\n")
    repo_dir = make_repo(tmp_path / "repo", {"x": spec})
    env = {"RECONCILER_WORKSPACE_ROOT": str(ws_root), "RECONCILER_NAMESPACE": "test"}
    plan = reconcile_cli(repo_dir, "plan", env=env)
    assert "Warning: x: secret(s) RC_TEST_TOKEN not set on the reconciler host" in plan.stdout
    secrets: dict[str, str] = {}
    rec = reconciler(repo_dir, ws_root)
    rec.secret_source = secrets.get
    for _ in range(3):  # no attempt is spent however many passes go by
        result = rec.run_pass()
        assert result.plan.for_run("x").code == "SecretMissing"
        assert not (ws_root / "test").exists() or not any((ws_root / "test").iterdir()), "something was staged"
    st = status_of(repo_dir, "x")
    assert (st.phase, st.attempt) == ("Pending", 1)
    cond = st.condition("SecretsAvailable")
    assert cond.status == "False" and "RC_TEST_TOKEN" in cond.message
    assert len(git.Repo(repo_dir).git.log("--oneline").splitlines()) == 2  # one status commit, not three
    secrets["RC_TEST_TOKEN"] = "s3cr3t-value"
    assert rec.run_pass().plan.for_run("x").action == "launch"
    wait_for(lambda: result_of(ws_root, "x-g1-a1"), what="x-g1-a1 to finish")
    rec.run_pass()
    st = status_of(repo_dir, "x")
    assert (st.phase, st.exit_code, st.attempt) == ("Succeeded", 0, 1)
    assert st.condition("SecretsAvailable").status == "True"


def test_crash_between_staging_and_starting_is_finished_not_lost(tmp_path, ws_root):
    repo_dir = make_repo(tmp_path / "repo", {"x": run_spec("x", ["true"], max_retries=0)})
    env = {"RECONCILER_WORKSPACE_ROOT": str(ws_root), "RECONCILER_NAMESPACE": "test"}
    crashed = reconcile_cli(repo_dir, "--once", env=env, crash_after="stage")
    assert crashed.returncode == 137
    assert (workspace(ws_root, "x-g1-a1") / "job.json").is_file()
    assert not (workspace(ws_root, "x-g1-a1") / "runtime" / "launched_at").exists()
    plan = reconcile_cli(repo_dir, "plan", env=env)
    assert "+ launch       x  x-g1-a1" in plan.stdout and "was staged but never started" in plan.stdout
    rec = reconciler(repo_dir, ws_root)
    rec.run_pass()
    wait_for(lambda: result_of(ws_root, "x-g1-a1"), what="x-g1-a1 to finish")
    rec.run_pass()
    st = status_of(repo_dir, "x")
    assert (st.phase, st.exit_code, st.attempt) == ("Succeeded", 0, 1)
    assert [c.action for c in rec.run_pass().plan.changes] == ["none"]


def test_staged_leftover_of_a_removed_run_is_removed_and_the_plan_settles(tmp_path, ws_root):
    repo_dir = make_repo(tmp_path / "repo", {"y": run_spec("y", ["true"])})
    env = {"RECONCILER_WORKSPACE_ROOT": str(ws_root), "RECONCILER_NAMESPACE": "test"}
    assert reconcile_cli(repo_dir, "--once", env=env, crash_after="stage").returncode == 137
    (repo_dir / "specs/runs/y.yaml").unlink()
    commit_all(repo_dir, "remove y")
    rec = reconciler(repo_dir, ws_root)
    first = rec.run_pass()
    assert [(c.action, c.code) for c in first.plan.changes] == [("collect", "Leftover")]
    assert not workspace(ws_root, "y-g1-a1").exists()
    assert rec.run_pass().plan.changes == []


# ---------------------------------------------------------------- commits that say something


def test_backoff_wait_is_byte_identical_and_makes_no_commit(tmp_path, ws_root):
    repo_dir = make_repo(tmp_path / "repo", {"flaky": run_spec("flaky", ["sh", "-c", "exit 3"], max_retries=2,
                                                                backoff=60)})
    rec = reconciler(repo_dir, ws_root)
    rec.run_pass()
    res = wait_for(lambda: result_of(ws_root, "flaky-g1-a1"), what="first attempt to fail")
    rec.run_pass(now=res["finished_ts"] + 5)
    text = (repo_dir / "status/flaky.yaml").read_bytes()
    head = git.Repo(repo_dir).head.commit.hexsha
    for later in (10, 20, 40):
        result = rec.run_pass(now=res["finished_ts"] + later)
        assert result.plan.for_run("flaky").code == "BackOff"
        assert result.commit is None and not result.written
    assert (repo_dir / "status/flaky.yaml").read_bytes() == text
    assert git.Repo(repo_dir).head.commit.hexsha == head
    assert "retry 1/2 at " in status_of(repo_dir, "flaky").message


def test_commit_after_no_commit_keeps_its_transitions_and_counts_match(tmp_path, ws_root):
    repo_dir = make_repo(tmp_path / "repo", {"a": run_spec("a", LONG), "b": run_spec("b", LONG)})
    env = {"RECONCILER_WORKSPACE_ROOT": str(ws_root), "RECONCILER_NAMESPACE": "test"}
    first = reconcile_cli(repo_dir, "--once", "--no-commit", env=env)
    assert first.returncode == 0 and "Wrote 2 status file(s) (not committed)." in first.stdout
    second = reconcile_cli(repo_dir, "--once", env=env)
    assert second.returncode == 0, second.stderr
    assert "No changes." in second.stdout
    commit = git.Repo(repo_dir).head.commit
    files = git.Repo(repo_dir).git.show("--name-only", "--format=", commit.hexsha).split()
    assert files == ["status/README.md", "status/a.yaml", "status/b.yaml"]  # the ledger rides along
    assert f"Committed 2 status file(s) as {commit.hexsha[:10]}, 2 of them written by an earlier pass." in second.stdout
    assert "a: - → Running [a-g1-a1] new run" in commit.message
    assert "b: - → Running [b-g1-a1] new run" in commit.message
    assert commit.message.startswith("status: 2 transition(s)")


# ---------------------------------------------------------------- a run deleted after it finished


@pytest.mark.parametrize("code,phase", [(0, "Succeeded"), (5, "Failed")])
def test_deleting_a_finished_uncollected_run_keeps_its_end(tmp_path, ws_root, code, phase):
    repo_dir = make_repo(tmp_path / "repo", {"x": run_spec("x", ["sh", "-c", f"exit {code}"], max_retries=3)})
    rec = reconciler(repo_dir, ws_root)
    rec.run_pass()
    wait_for(lambda: result_of(ws_root, "x-g1-a1"), what="x-g1-a1 to finish")
    (repo_dir / "specs/runs/x.yaml").unlink()
    commit_all(repo_dir, "remove x")
    result = rec.run_pass()
    assert result.plan.for_run("x").action == "collect"
    st = status_of(repo_dir, "x")
    assert (st.phase, st.exit_code) == (phase, code)
    assert (workspace(ws_root, "x-g1-a1") / "artifacts" / "manifest.json").is_file()
    assert [c.action for c in rec.run_pass().plan.changes] == ["none"]


def test_stop_flip_after_an_unseen_failure_ends_as_if_the_failure_had_been_seen(tmp_path, ws_root):
    argv = ["sh", "-c", "exit 1"]
    repo_dir = make_repo(tmp_path / "repo", {"x": run_spec("x", argv)})
    rec = reconciler(repo_dir, ws_root)
    rec.run_pass()
    wait_for(lambda: result_of(ws_root, "x-g1-a1"), what="x-g1-a1 to fail")  # no pass sees it fail
    (repo_dir / "specs/runs/x.yaml").write_text(run_spec("x", argv, desired="Stopped"))
    commit_all(repo_dir, "stop x")
    rec.run_pass()
    assert (status_of(repo_dir, "x").phase, status_of(repo_dir, "x").exit_code) == ("Failed", 1)
    (repo_dir / "specs/runs/x.yaml").write_text(run_spec("x", argv))
    commit_all(repo_dir, "run x again, unchanged")
    assert [c.action for c in rec.run_pass().plan.changes] == ["none"]
    st = status_of(repo_dir, "x")
    assert (st.phase, st.generation, st.attempt) == ("Failed", 1, 1)


# ---------------------------------------------------------------- fenced leftovers


def test_fenced_instance_of_an_unknown_run_is_collected_and_removed(tmp_path, ws_root):
    origin = _origin_with(tmp_path, {"ghost": run_spec("ghost", LONG)})
    first = _clone(origin, tmp_path / "vm-1")
    reconciler(first, ws_root).run_pass(commit=False)  # its status never reaches the remote
    wait_for(lambda: _leaders("ghost-g1-a1", ws_root), what="ghost running")
    _user_push(origin, tmp_path, lambda u: (u / "specs/runs/ghost.yaml").unlink())
    fresh = _clone(origin, tmp_path / "vm-2")
    # Within orphan_grace of its start it is only warned about: it may be a newer checkout's.
    young = reconciler(fresh, ws_root).run_pass()
    assert young.plan.changes == [] and _leaders("ghost-g1-a1", ws_root)
    assert any("ghost-g1-a1 runs on local but no spec or status names ghost" in w for w in young.plan.warnings)
    rec = reconciler(fresh, ws_root, orphan_grace=0.0)
    fence = rec.run_pass()
    assert [(c.action, c.code) for c in fence.plan.changes] == [("terminate", "Fenced")]
    assert "no spec or status names ghost" in fence.plan.changes[0].reason
    assert not _leaders("ghost-g1-a1", ws_root)
    clean = rec.run_pass()
    assert [(c.action, c.code) for c in clean.plan.changes] == [("collect", "Leftover")]
    assert not workspace(ws_root, "ghost-g1-a1").exists()
    assert rec.run_pass().plan.changes == []
    assert not (fresh / "status").exists()  # a run nobody asked for gets no status


def test_stale_attempt_killed_from_outside_is_collected_once(tmp_path, ws_root):
    repo_dir = make_repo(tmp_path / "repo", {"x": run_spec("x", LONG)})
    rec = reconciler(repo_dir, ws_root)
    rec.run_pass()
    wait_for(lambda: pgid_of(ws_root, "x-g1-a1"), what="x-g1-a1 pid")
    (repo_dir / "specs/runs/x.yaml").write_text(run_spec("x", LONG + ["v2"]))
    commit_all(repo_dir, "edit x")
    rec.run_pass()  # g1 stopped, g2 launched
    wait_for(lambda: pgid_of(ws_root, "x-g2-a1"), what="x-g2-a1 pid")
    leftover = rec.run_pass()
    assert [(c.action, c.identity) for c in leftover.plan.changes if c.code == "Leftover"] == [("collect", "x-g1-a1")]
    # On this machine the workspace is the attempt's record: kept, marked collected, never again planned.
    assert (workspace(ws_root, "x-g1-a1") / "runtime" / "collected").exists()
    assert [c.action for c in rec.run_pass().plan.changes] == ["none"]
    kill_group(pgid_of(ws_root, "x-g2-a1"), signal.SIGKILL)


# ---------------------------------------------------------------- names and paths


def test_status_paths_are_never_built_from_unsafe_names(tmp_path):
    status_dir = tmp_path / "repo" / "status"
    for bad in ("../specs/runs/ok", "/etc/passwd", "résumé", "a/b", "", "x" * 64, "Upper"):
        with pytest.raises(statuses.UnsafeName):
            statuses.write_if_changed(status_dir, statuses.RunStatus(name=bad))
    assert not (tmp_path / "repo").exists()
    assert statuses.load_one(status_dir, "../x") is None


@pytest.mark.parametrize("name", ["../specs/runs/ok", "/tmp/evil-status", "résumé"])
def test_invalid_names_write_nothing_outside_status(tmp_path, ws_root, name):
    evil = run_spec("placeholder", ["true"]).replace("name: placeholder", f"name: {json.dumps(name)}")
    repo_dir = make_repo(tmp_path / "repo", {"ok": run_spec("ok", ["true"])})
    (repo_dir / "specs/runs/évil.yaml").write_text(evil)
    commit_all(repo_dir, "add a spec with a bad name")
    before = (repo_dir / "specs/runs/ok.yaml").read_bytes()
    env = {"RECONCILER_WORKSPACE_ROOT": str(ws_root), "RECONCILER_NAMESPACE": "test"}
    out = reconcile_cli(repo_dir, "--once", env=env)
    assert "Traceback" not in out.stderr
    assert "specs/runs/évil.yaml:" in out.stderr
    assert (repo_dir / "specs/runs/ok.yaml").read_bytes() == before
    assert not Path("/tmp/evil-status.yaml").exists()
    assert sorted(p.name for p in (repo_dir / "status").iterdir()) == ["README.md", "ok.yaml"]  # and the ledger
    assert _git(repo_dir, "status", "--porcelain") == ""  # everything written was committed


def test_dirty_status_paths_reads_unusual_file_names_exactly(tmp_path):
    from reconciler.gitops import repo as gitops

    repo_dir = make_repo(tmp_path / "repo")
    (repo_dir / "status").mkdir()
    for name in ("plain.yaml", "ünï.yaml", 'quo"te.yaml', "sp ace.yaml"):
        (repo_dir / "status" / name).write_text("x: 1\n")
    (repo_dir / "status" / "nested").mkdir()
    (repo_dir / "status" / "nested" / "deep.yaml").write_text("x: 1\n")
    paths = gitops.dirty_status_paths(git.Repo(repo_dir))
    assert paths == sorted(["status/plain.yaml", "status/ünï.yaml", 'status/quo"te.yaml', "status/sp ace.yaml"])


# ---------------------------------------------------------------- one meaning of "spec commit"


def test_status_spec_commit_is_the_last_commit_that_changed_the_spec_file(tmp_path, ws_root):
    repo_dir = make_repo(tmp_path / "repo", {"x": run_spec("x", ["true"])})
    spec_commit = _git(repo_dir, "rev-parse", "HEAD").strip()
    (repo_dir / "README.md").write_text("unrelated\n")
    commit_all(repo_dir, "an unrelated commit")
    assert _git(repo_dir, "rev-parse", "HEAD").strip() != spec_commit
    rec = reconciler(repo_dir, ws_root)
    rec.run_pass()
    assert status_of(repo_dir, "x").spec.commit == spec_commit
    job = json.loads((workspace(ws_root, "x-g1-a1") / "job.json").read_text())["payload"]
    assert job["spec_commit"] == spec_commit and job["repo_head"] != spec_commit  # the bundle says the same
    wait_for(lambda: result_of(ws_root, "x-g1-a1"), what="x-g1-a1 to finish")
    rec.run_pass()  # the reconciler's own status commits move HEAD, never the spec commit
    assert status_of(repo_dir, "x").spec.commit == spec_commit
    (repo_dir / "specs/runs/x.yaml").write_text(run_spec("x", ["true", "v2"]))
    commit_all(repo_dir, "edit x")
    edit = _git(repo_dir, "rev-parse", "HEAD").strip()
    rec.run_pass()
    st = status_of(repo_dir, "x")
    assert (st.generation, st.spec.commit) == (2, edit)
