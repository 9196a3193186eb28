"""The daemon gives back a large pass's memory as soon as the pass is over (engine/rehome.py called
from Daemon.run_pass), not a resync later; benchmarks/daemon_memory.py measures what that is worth."""

from __future__ import annotations

import os
import time
from pathlib import Path

from reconciler.core import config as configs
from reconciler.daemon.service import Daemon
from reconciler.engine import rehome
from tests.repo_helpers import make_repo, run_spec


def _daemon(tmp_path: Path, ws_root: Path) -> Daemon:
    runs = {f"r{i}": run_spec(f"r{i}", ["echo", str(i)], desired="Stopped") for i in range(8)}
    repo = make_repo(tmp_path / "repo", runs)
    then = time.time() - 10  # outside the racy-clean window: a stat vouches for every file
    for d, _, names in os.walk(repo / "specs"):
        for n in names:
            os.utime(os.path.join(d, n), (then, then))
    cfg = configs.load(str(repo), flags={"workspace_root": str(ws_root), "namespace": "test"})
    return Daemon(cfg)  # no remote: run_pass's push does nothing


def test_a_large_first_pass_is_read_back_before_the_daemon_waits(tmp_path, ws_root, monkeypatch):
    monkeypatch.setattr(rehome, "REHOME_AFTER", 5)
    d = _daemon(tmp_path, ws_root)
    seen = []
    real = d.rec.run_pass

    def run_pass(*a, **k):
        res = real(*a, **k)
        seen.append(d.rec.cache)
        return res

    d.rec.run_pass = run_pass
    d.run_pass("test")
    assert d.rec.cache is not seen[0] and not d.rec._rehome  # read back already, once
    assert {f.rel for f in d.rec.cache.files() if f.ok} == {f.rel for f in seen[0].files() if f.ok}
    assert d.metrics.last_pass == d.metrics.last_good_pass
    d.run_pass("test")  # the next pass starts from what was read back: nothing parsed again
    assert d.rec.cache is seen[1] and d.rec.cache.parsed == 0
    assert set(d.rec.settled) == {f"r{i}" for i in range(8)}
    d.rec.close()


def test_a_small_pass_keeps_its_records(tmp_path, ws_root):
    d = _daemon(tmp_path, ws_root)  # 8 files: below REHOME_AFTER
    d.run_pass("test")
    cache = d.rec.cache
    d.run_pass("test")
    assert d.rec.cache is cache
    d.rec.close()
