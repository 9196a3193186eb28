"""The pass cache: a new process reads and parses only what changed, and plans exactly what a
process without it plans; a damaged or foreign cache is ignored; a no-change pass opens no spec
file and asks git nothing, yet sees every edit."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from reconciler.engine import passcache
from reconciler.planner.render import dumps
from reconciler.spec.load import SpecCache, load_tree
from reconciler.spec.specfile import RACY_NS
from tests.repo_helpers import LOCAL_HOST, commit_all, make_repo, reconciler, run_spec, wait_for

TEMPLATE_B = """\
apiVersion: reconciler/v1
kind: ExecutionTemplate
id: other-host
placement: {kind: local}
launch_mode: {kind: host_process}
allow_overrides: []
"""


def _tree(tmp_path: Path) -> Path:
    """Runs of every sort a plan treats apart: stopped, running, invalid, a name defined twice, a
    missing template, a missing secret, an override the template refuses."""
    runs = {f"stop-{i}": run_spec(f"stop-{i}", ["echo", str(i)], desired="Stopped") for i in range(6)}
    runs["bad-key"] = run_spec("bad-key", ["true"], desired="Stopped", extra="  colour: red\n")
    runs["twin-1"] = run_spec("twin", ["true"], desired="Stopped")
    runs["twin-2"] = run_spec("twin", ["false"], desired="Stopped")
    runs["lost"] = run_spec("lost", ["true"], template="nowhere", desired="Stopped")
    runs["secret"] = run_spec("secret", ["true"], desired="Stopped", extra="  secrets: [NOT_SET_ANYWHERE]\n")
    runs["refused"] = run_spec("refused", ["true"], template="other-host", desired="Stopped",
                               extra="  overrides:\n    resources: {cpu_count: 2}\n")
    return make_repo(tmp_path / "repo", runs, {"local-host": LOCAL_HOST, "other-host": TEMPLATE_B})


def _age(repo: Path, seconds: float = 10.0) -> None:
    """Date every spec file back, as files are in a tree nobody touched for a while (the racy-clean
    window would otherwise have the next pass read them again)."""
    then = time.time() - seconds
    for top in ("specs", "execution_templates"):
        for d, _, names in os.walk(repo / top):
            for n in names:
                os.utime(os.path.join(d, n), (then, then))


def _plan(repo: Path, ws_root: Path, cached: bool) -> tuple[str, list[str]]:
    """The plan (JSON) and diagnostics of a new process, with the saved cache or without it."""
    cache = passcache.cache_path(repo / ".reconciler")
    saved = cache.read_bytes() if cache.exists() else None
    if not cached and saved is not None:
        cache.unlink()
    try:
        rec = reconciler(repo, ws_root)
        if cached:
            assert len(rec.cache) > 0, "the saved cache should have been restored"
        res = rec.run_pass(dry_run=True, now=2_000_000_000.0)
        return _acting(dumps(res.plan)), [d.text() for d in res.desired.diagnostics]
    finally:
        if saved is not None:
            cache.write_bytes(saved)


def _acting(plan_json: str) -> str:
    """The plan without its no-op entries: a process that knows a run is settled plans nothing for
    it, where one that does not lists it as "none" (the daemon's steady passes do the same)."""
    plan = json.loads(plan_json)
    plan["changes"] = [c for c in plan["changes"] if c["action"] != "none"]
    plan["summary"].pop("none", None)
    return json.dumps(plan, indent=1, sort_keys=True)


def _settle(repo: Path, ws_root: Path) -> None:
    rec = reconciler(repo, ws_root)
    rec.run_pass()
    rec.run_pass()
    assert passcache.cache_path(repo / ".reconciler").exists()


def test_a_new_process_with_the_cache_plans_what_one_without_it_plans(tmp_path, ws_root):
    repo = _tree(tmp_path)
    _age(repo)
    _settle(repo, ws_root)
    with_cache, without = _plan(repo, ws_root, True), _plan(repo, ws_root, False)
    assert with_cache == without
    assert any("twin" in d for d in without[1]) and any("colour" in d for d in without[1])
    assert json.loads(with_cache[0])["changes"] is not None

    # Changes of every kind, each seen by a process started on the old cache.
    runs = repo / "specs" / "runs"
    (runs / "twin-2.yaml").write_text(run_spec("twin-2", ["false"], desired="Stopped"))  # no longer a twin
    (runs / "stop-0.yaml").write_text(run_spec("stop-1", ["echo", "0"], desired="Stopped"))  # now one
    (runs / "stop-5.yaml").unlink()
    (runs / "new.yaml").write_text(run_spec("new", ["true"], desired="Stopped"))
    commit_all(repo, "edits")
    assert _plan(repo, ws_root, True) == _plan(repo, ws_root, False)
    (repo / "execution_templates" / "other-host.yaml").write_text(TEMPLATE_B.replace("[]", "[resources]"))
    commit_all(repo, "allow resources")
    with_cache, without = _plan(repo, ws_root, True), _plan(repo, ws_root, False)
    assert with_cache == without
    assert not any("refused" in d for d in without[1])


def test_an_edit_of_the_same_size_and_mtime_is_seen(tmp_path, ws_root):
    repo = _tree(tmp_path)
    _age(repo)
    _settle(repo, ws_root)
    path = repo / "specs" / "runs" / "stop-2.yaml"
    st = path.stat()
    text = path.read_text()
    edited = text.replace('"echo", "2"', '"echo", "7"')
    assert len(edited) == len(text) and edited != text
    path.write_text(edited)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    # git's own stat cache misses such an edit: have it hash the file again to commit it.
    subprocess.run(["git", "-C", str(repo), "rm", "-q", "--cached", str(path)], check=True)
    commit_all(repo, "same size")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _plan(repo, ws_root, True) == _plan(repo, ws_root, False)
    rec = reconciler(repo, ws_root)
    assert "stop-2" in rec.settled  # as far as the saved cache knows
    res = rec.run_pass(dry_run=True)
    assert res.desired.runs["stop-2"].digest == load_tree(repo).runs["stop-2"].digest
    assert res.desired.runs["stop-2"].digest != rec.settled["stop-2"].digest
    assert "stop-2" in [c.name for c in res.plan.changes]  # no longer settled: planned again


def test_a_stat_does_not_vouch_for_a_file_changed_just_before_it_was_read(tmp_path):
    repo = make_repo(tmp_path / "repo", {"a": run_spec("a", ["true"])})
    cache = SpecCache()
    load_tree(repo, cache)
    f = cache.entry("specs/runs/a.yaml")
    assert f is not None and f.stat is not None
    # Read within the racy window of its last change: the same stat proves nothing.
    f.verified_ns = max(f.stat[2], f.stat[3]) + RACY_NS // 2
    assert cache.by_stat(f.rel, f.stat) is None
    f.verified_ns = max(f.stat[2], f.stat[3]) + RACY_NS + 1
    assert cache.by_stat(f.rel, f.stat) is f


def test_a_damaged_or_foreign_cache_is_ignored(tmp_path, ws_root):
    repo = _tree(tmp_path)
    _age(repo)
    _settle(repo, ws_root)
    path = passcache.cache_path(repo / ".reconciler")
    good = path.read_bytes()
    expected = _plan(repo, ws_root, False)
    head, _, body = good.partition(b"\n")
    header = json.loads(head)
    forged_body = body.replace(b'"stop-3"', b'"stop-9"')
    damaged = {
        "truncated": good[: len(good) // 2],
        "garbage": b"\x00\xff not json",
        "empty": b"",
        "other code": json.dumps({**header, "code": "0" * 64}).encode() + b"\n" + body,
        "other format": json.dumps({**header, "format": 999}).encode() + b"\n" + body,
        "edited body": head + b"\n" + forged_body,
        "wrong types": (json.dumps({**header, "sha256": __import__("hashlib").sha256(b'{"files":[[1]]}').hexdigest()})
                        .encode() + b'\n{"files":[[1]]}'),
    }
    for what, raw in damaged.items():
        path.write_bytes(raw)
        rec = reconciler(repo, ws_root)
        assert len(rec.cache) == 0 and rec.settled == {}, what
        res = rec.run_pass(dry_run=True, now=2_000_000_000.0)
        assert (_acting(dumps(res.plan)), [d.text() for d in res.desired.diagnostics]) == expected, what
    path.write_bytes(good)
    assert len(reconciler(repo, ws_root).cache) > 0


def test_a_no_change_pass_opens_no_spec_file_and_asks_git_nothing(tmp_path, ws_root):
    repo = _tree(tmp_path)
    _age(repo)
    rec = reconciler(repo, ws_root, allow_dirty=False)
    rec.run_pass()
    # Dating the files back changed their ctime: they are read again until that is older than the
    # racy-clean window, then never.
    wait_for(lambda: rec.run_pass() and rec.cache.opened == 0, timeout=15, what="a pass that opens no spec file")
    asked = rec.dirty.asked
    quiet = rec.run_pass()
    assert rec.cache.opened == 0 and rec.cache.stat_hits > 0 and not quiet.written
    assert rec.dirty.asked == asked

    # An untracked spec file: git is asked again, and the run is held.
    (repo / "specs" / "runs" / "fresh.yaml").write_text(run_spec("fresh", ["true"]))
    held = rec.run_pass(dry_run=True)
    assert rec.dirty.asked == asked + 1
    assert [c.code for c in held.plan.changes if c.name == "fresh"] == ["UncommittedSpec"], rec._dirty
    commit_all(repo, "fresh")
    rec.run_pass(dry_run=True)
    assert rec.dirty.asked == asked + 2  # a new commit

    # Taken out of the index with nothing else changed: git is asked, the run held again.
    asked = rec.dirty.asked
    subprocess.run(["git", "-C", str(repo), "rm", "-q", "--cached", "specs/runs/fresh.yaml"], check=True)
    held = rec.run_pass(dry_run=True)
    assert rec.dirty.asked == asked + 1
    assert "specs/runs/fresh.yaml" in rec._dirty


def test_the_commit_step_asks_git_only_when_status_can_differ(tmp_path, ws_root, monkeypatch):
    from reconciler.gitops import repo as gitops

    asked: list[int] = []
    real = gitops.dirty_paths
    monkeypatch.setattr(gitops, "dirty_paths", lambda root: asked.append(1) or real(root))  # a spy on real git
    repo = _tree(tmp_path)
    rec = reconciler(repo, ws_root)
    rec.run_pass()

    def quiet_pass() -> bool:  # git status may refresh its index once more (a new stat of the index)
        n = len(asked)
        rec.run_pass()
        return len(asked) == n

    wait_for(quiet_pass, timeout=15, what="a pass whose commit step asks git nothing")
    n = len(asked)
    quiet = rec.run_pass()
    assert len(asked) == n and quiet.commit is None

    # A status file changed from outside: asked again, and the change committed.
    status = repo / "status" / "stop-1.yaml"
    status.write_text(status.read_text().replace("never launched", "never launched!"))
    back = rec.run_pass()
    assert len(asked) == n + 1 and back.commit is not None

    # Written by a pass that does not commit (HEAD stays): the next committing pass still commits it.
    wait_for(quiet_pass, timeout=15, what="a pass whose commit step asks git nothing")
    (repo / "specs" / "runs" / "stop-2.yaml").write_text(run_spec("stop-2", ["echo", "2"], desired="Stopped",
                                                                   extra="  colour: blue\n"))
    held = rec.run_pass(commit=False)
    assert "stop-2" in held.written and held.commit is None
    rec.run_pass(commit=False)
    later = rec.run_pass()
    assert later.commit is not None and "stop-2" in later.committed


def test_the_quick_section_is_written_only_for_a_tree_that_plans_nothing(tmp_path, ws_root):
    repo = _tree(tmp_path)  # invalid files and twins: planned on every pass
    _age(repo)
    _settle(repo, ws_root)
    assert passcache.read_quick(repo / ".reconciler") is None
    simple = make_repo(tmp_path / "simple", {f"s-{i}": run_spec(f"s-{i}", ["true"], desired="Stopped")
                                             for i in range(3)})
    _age(simple)
    rec = reconciler(simple, ws_root)
    # Dating the files back changed their ctime: a file read within its racy window is read again
    # by the next pass, and only then is the section written.
    wait_for(lambda: rec.run_pass() and passcache.read_quick(simple / ".reconciler"), timeout=15,
             what="a quick section")
    quick = passcache.read_quick(simple / ".reconciler")
    keys = {n: tuple(s.key) for n, s in reconciler(simple, ws_root).settled.items()}
    assert quick is not None and sorted(keys) == ["s-0", "s-1", "s-2"]
    assert quick["status"] == passcache.stats_digest((n, *keys[n]) for n in sorted(keys))
    files = [f"specs/runs/s-{i}.yaml" for i in range(3)] + ["execution_templates/local-host.yaml"]
    stats = [(f, *(lambda s: (s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns))(os.stat(simple / f))) for f in files]
    assert quick["specs"] == passcache.stats_digest(stats)  # in the loader's walk order
    assert quick["specs"] != passcache.stats_digest(stats[1:])
