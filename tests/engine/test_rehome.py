"""After a pass that parsed many files, the reconciler drops its long-lived records and reads them
back from the pass cache it just wrote (engine/rehome.py): same state, same plans, fresh objects."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from reconciler.engine import passcache, rehome
from reconciler.planner.render import dumps
from tests.repo_helpers import make_repo, reconciler, run_spec


def _tree(tmp_path: Path) -> Path:
    runs = {f"r{i}": run_spec(f"r{i}", ["echo", str(i)], desired="Stopped") for i in range(8)}
    runs["bad"] = run_spec("bad", ["true"], desired="Stopped", extra="  colour: red\n")
    repo = make_repo(tmp_path / "repo", runs)
    then = time.time() - 10  # outside the racy-clean window: a stat vouches for every file
    for d, _, names in os.walk(repo / "specs"):
        for n in names:
            os.utime(os.path.join(d, n), (then, then))
    return repo


def _acting(plan_json: str) -> list:
    return [c for c in json.loads(plan_json)["changes"] if c["action"] != "none"]


def test_records_are_read_back_after_a_large_pass_and_plan_the_same(tmp_path, ws_root, monkeypatch):
    monkeypatch.setattr(rehome, "REHOME_AFTER", 5)
    repo = _tree(tmp_path)
    rec = reconciler(repo, ws_root)
    rec.run_pass()  # parses every spec and writes every status: a large pass here
    assert rec._rehome
    settled, rows = dict(rec.settled), dict(rec.ledger.rows)
    files = {f.rel: (f.sha, f.digest, f.stat) for f in rec.cache.files() if f.ok}
    old_cache = rec.cache
    res = rec.run_pass(now=2_000_000_000.0)
    assert rec.cache is not old_cache and not rec._rehome  # read back once, then a quiet pass
    assert rec.settled == settled and set(rec.settled) == {f"r{i}" for i in range(8)}
    assert rec.ledger.rows == rows
    assert {f.rel: (f.sha, f.digest, f.stat) for f in rec.cache.files() if f.ok} == files
    assert rec.cache.parsed <= 1  # only the invalid file, whose parse is not kept
    assert not res.written and res.commit is None
    fresh = reconciler(repo, ws_root).run_pass(dry_run=True, now=2_000_000_000.0)
    assert _acting(dumps(res.plan)) == _acting(dumps(fresh.plan))
    assert [d.text() for d in res.desired.diagnostics] == [d.text() for d in fresh.desired.diagnostics]


def test_a_small_pass_or_an_unsaved_cache_reads_nothing_back(tmp_path, ws_root, monkeypatch):
    repo = _tree(tmp_path)
    rec = reconciler(repo, ws_root)
    rec.run_pass()
    assert not rec._rehome  # 9 files: below REHOME_AFTER
    monkeypatch.setattr(rehome, "REHOME_AFTER", 5)
    monkeypatch.setattr(passcache, "save", lambda *a, **k: False)  # a read-only working state, say
    passcache.cache_path(repo / ".reconciler").unlink()
    rec2 = reconciler(repo, ws_root)
    rec2.run_pass()
    assert not rec2._rehome  # the file does not hold this state: nothing to read back


def test_a_cache_gone_before_it_is_read_back_costs_a_full_pass_only(tmp_path, ws_root, monkeypatch):
    monkeypatch.setattr(rehome, "REHOME_AFTER", 5)
    repo = _tree(tmp_path)
    rec = reconciler(repo, ws_root)
    rec.run_pass()
    assert rec._rehome
    passcache.cache_path(repo / ".reconciler").unlink()
    res = rec.run_pass(now=2_000_000_000.0)
    assert rec.cache.parsed >= 8  # everything read and parsed again, as a new process would
    assert not res.written and res.commit is None and not rec._rehome  # and not tried again
    fresh = reconciler(repo, ws_root).run_pass(dry_run=True, now=2_000_000_000.0)
    assert _acting(dumps(res.plan)) == _acting(dumps(fresh.plan))


def test_nothing_of_the_large_pass_outlives_the_read_back(tmp_path, ws_root, monkeypatch):
    # A long-lived reconciler also keeps what the pass compares edits with (engine/focus.py): every
    # run's digest, the very strings of the first pass's records, which would pin their memory.
    from reconciler.core import config as configs
    from reconciler.engine.loop import Reconciler

    monkeypatch.setattr(rehome, "REHOME_AFTER", 5)
    repo = _tree(tmp_path)
    cfg = configs.load(str(repo), flags={"workspace_root": str(ws_root), "namespace": "test"})
    rec = Reconciler(cfg, keep_connections=True)
    try:
        rec.run_pass()
        held = [f.digest for f in rec.cache.files() if f.ok]  # held here: their ids stay theirs
        first = {id(d) for d in held}
        assert rec.focus.runs and {id(d) for d in rec.focus.runs.values()} & first
        rec.run_pass(now=2_000_000_000.0)  # read back, then compared again
        assert rec.focus.runs and not {id(d) for d in rec.focus.runs.values()} & first
        assert set(rec.focus.runs) == {f"r{i}" for i in range(8)} | {"bad"}
    finally:
        rec.close()


def test_the_read_back_lets_go_of_names_the_interpreter_cached_during_the_pass(tmp_path, ws_root, monkeypatch):
    # An attribute name built at run time (the HTTP handler's 'do_' + method) and looked up on a
    # type stays referenced by CPython's type attribute cache: one allocated during a large pass
    # kept an arena of it from going back. The read-back lets go of them.
    import sys

    class Handler:
        do_GET = None

    monkeypatch.setattr(rehome, "REHOME_AFTER", 5)
    rec = reconciler(_tree(tmp_path), ws_root)
    rec.run_pass()
    name = "".join(["do_", "GET"])  # not interned: a string of its own, as a request's is
    alone = sys.getrefcount(name)
    getattr(Handler, name)
    assert sys.getrefcount(name) > alone  # the cache holds it
    assert rehome.rehome_if_due(rec)
    assert sys.getrefcount(name) == alone
