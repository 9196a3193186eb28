"""A watched status folder: a pass whose watch saw nothing stats no status file, yet every kind
of change a user, git or another process makes is seen by the next load."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from reconciler.core.runstatus import RunStatus
from reconciler.status import dirwatch
from reconciler.status import store as st
from tests.repo_helpers import Listings

pytestmark = pytest.mark.skipif(not hasattr(os, "O_CLOEXEC") or not Path("/proc/self").exists(),
                                reason="inotify is Linux's")


def _write(folder: Path, name: str, message: str = "") -> None:
    assert st.write_if_changed(folder, RunStatus(name=name, phase="Succeeded", message=message))


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(st, "WATCH_FROM", 3)
    d = tmp_path / "status"
    for i in range(4):
        _write(d, f"r{i}", "first")
    return d


def _quiet(folder: Path, cache: st.StatusCache, scans: Listings) -> None:
    """Loads until one is served by the watch alone (the first scan makes it, the second is the
    first it vouches for)."""
    for _ in range(3):
        before = scans.count
        st.load_all(folder, cache, skip={})
        if scans.count == before:
            return
    raise AssertionError("the watch never vouched for the folder")


def test_a_quiet_folder_is_not_scanned_and_every_change_is_seen(folder, monkeypatch):
    scans = Listings(monkeypatch, st)
    cache = st.StatusCache()
    _quiet(folder, cache, scans)
    n = scans.count
    assert set(st.load_all(folder, cache, skip={})) == {"r0", "r1", "r2", "r3"}
    assert scans.count == n  # nothing changed: no scan, no stat

    def loaded() -> dict[str, RunStatus]:
        out = st.load_all(folder, cache, skip={})
        _quiet(folder, cache, scans)
        return out

    path = folder / "r1.yaml"
    # Written in place, same inode (an editor without a rename, `>>`).
    with open(path, "r+") as fh:
        text = fh.read()
        fh.seek(0)
        fh.write(text.replace("message: first", "message: again"))
    assert loaded()["r1"].message == "again"
    # In place and of the same size, a moment later (the mtime moves).
    s = path.stat()
    with open(path, "r+") as fh:
        text = fh.read()
        fh.seek(0)
        fh.write(text.replace("message: again", "message: AGAIN"))
    os.utime(path, ns=(s.st_atime_ns, s.st_mtime_ns + 1))
    assert path.stat().st_size == s.st_size and path.stat().st_ino == s.st_ino
    assert loaded()["r1"].message == "AGAIN"
    # Replaced by a rename (git checkout, the reconciler's own writes).
    _write(folder, "r2", "renamed over")
    assert loaded()["r2"].message == "renamed over"
    # A new file, a removed one.
    _write(folder, "r9")
    (folder / "r0.yaml").unlink()
    assert set(loaded()) == {"r1", "r2", "r3", "r9"}
    # Only the mtime (touch): the key moves, the file is read again.
    os.utime(folder / "r3.yaml", ns=(1, 1))
    cache_before = cache._items["r3.yaml"][0]
    loaded()
    assert cache._items["r3.yaml"][0] != cache_before


def test_a_folder_replaced_or_moved_is_scanned_again(folder, monkeypatch):
    scans = Listings(monkeypatch, st)
    cache = st.StatusCache()
    _quiet(folder, cache, scans)
    other = folder.parent / "other"
    shutil.copytree(folder, other)
    _write(other, "r1", "from the other folder")
    folder.rename(folder.parent / "old")
    other.rename(folder)
    assert st.load_all(folder, cache, skip={})["r1"].message == "from the other folder"
    _quiet(folder, cache, scans)  # watched again, the new folder
    _write(folder, "r2", "seen in the new folder")
    assert st.load_all(folder, cache, skip={})["r2"].message == "seen in the new folder"


def test_a_linked_status_file_keeps_the_folder_scanned(folder, monkeypatch, tmp_path):
    scans = Listings(monkeypatch, st)
    cache = st.StatusCache()
    target = tmp_path / "elsewhere"
    _write(target, "r5", "first")
    (folder / "r5.yaml").symlink_to(target / "r5.yaml")
    for _ in range(4):
        st.load_all(folder, cache, skip={})
    before = scans.count
    _write(target, "r5", "changed where the link points")  # no event in status/
    assert st.load_all(folder, cache, skip={})["r5"].message == "changed where the link points"
    assert scans.count == before + 1


def test_a_folder_on_a_network_file_system_is_scanned_every_time(folder, monkeypatch):
    monkeypatch.setattr(dirwatch, "fs_type", lambda path: 0x6969)  # NFS: changes from other hosts raise no event
    scans = Listings(monkeypatch, st)
    cache = st.StatusCache()
    for i in range(4):
        st.load_all(folder, cache, skip={})
        assert scans.count == i + 1
    assert cache.watch is not None and not cache.watch.armed


def test_the_local_file_system_is_recognised():
    assert dirwatch.fs_type("/proc") == 0x9FA0  # PROC_SUPER_MAGIC: the call reads f_type right
    assert dirwatch.fs_type("/nonexistent/x") is None


def test_settled_files_are_skipped_with_their_last_key(folder, monkeypatch):
    scans = Listings(monkeypatch, st)
    cache = st.StatusCache()
    _quiet(folder, cache, scans)
    keys = {n[:-5]: k for n, (k, _) in cache._items.items()}
    skipped: set[str] = set()
    out = st.load_all(folder, cache, skip={"r0": keys["r0"], "r1": (0, 0, 0)}, skipped=skipped)
    assert skipped == {"r0"} and set(out) == {"r1", "r2", "r3"}
