"""The ledger's rows follow the status files when the folder's names come from the status cache's
watched listing (no listing of status/ of its own): a file removed from outside, even between
two quiet passes, drops its row at the next pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.core.runstatus import RunStatus
from reconciler.status import store as st
from reconciler.status.ledger import Ledger

pytestmark = pytest.mark.skipif(not Path("/proc/self").exists(), reason="inotify is Linux's")


def _pass(folder: Path, cache: st.StatusCache, ledger: Ledger) -> frozenset[str] | None:
    loaded = st.load_all(folder, cache)
    present = cache.present()
    ledger.refresh(folder, loaded, {}, 0.0, present)
    return present


def test_a_status_file_removed_between_quiet_passes_drops_its_row(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(st, "WATCH_FROM", 3)
    folder = tmp_path / "status"
    for name in ("a", "b", "c", "d"):
        assert st.write_if_changed(folder, RunStatus(name=name, phase="Succeeded"))
    cache, ledger = st.StatusCache(), Ledger()
    assert _pass(folder, cache, ledger) is None  # a full scan: the watch is set up after it
    _pass(folder, cache, ledger)  # scanned with the watch in place: the listing is kept from here
    assert _pass(folder, cache, ledger) == {"a", "b", "c", "d"}  # the kept listing, not the folder
    assert set(ledger.rows) == {"a", "b", "c", "d"}
    (folder / "b.yaml").unlink()
    assert _pass(folder, cache, ledger) is None  # the watch saw it: scanned again
    assert set(ledger.rows) == {"a", "c", "d"}
    assert "(b.yaml)" not in (folder / "README.md").read_text()


def test_a_run_written_this_pass_keeps_its_row_though_the_listing_predates_it(tmp_path: Path,
                                                                              monkeypatch) -> None:
    monkeypatch.setattr(st, "WATCH_FROM", 3)
    folder = tmp_path / "status"
    for name in ("a", "b", "c"):
        assert st.write_if_changed(folder, RunStatus(name=name, phase="Succeeded"))
    cache, ledger = st.StatusCache(), Ledger()
    for _ in range(3):
        loaded = st.load_all(folder, cache)
    present = cache.present()
    assert present == {"a", "b", "c"}
    new = RunStatus(name="e", phase="Running")
    assert st.write_if_changed(folder, new)
    ledger.refresh(folder, loaded, {"e": new}, 0.0, present)
    assert set(ledger.rows) == {"a", "b", "c", "e"}
