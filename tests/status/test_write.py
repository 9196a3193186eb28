"""Writing status files: a new file made in place, an existing one replaced, an unchanged one left."""

from __future__ import annotations

import os

from reconciler.core.runstatus import RunStatus
from reconciler.status import store


def test_new_small_file_is_made_in_place_and_a_rewrite_is_a_new_inode(tmp_path):
    path = tmp_path / "a.yaml"
    assert store.replace_if_changed(path, "phase: Running\n")
    assert path.read_text() == "phase: Running\n" and os.stat(path).st_mode & 0o777 == 0o644
    first = os.stat(path).st_ino
    assert not store.replace_if_changed(path, "phase: Running\n")  # the same bytes: nothing written
    assert os.stat(path).st_ino == first
    assert store.replace_if_changed(path, "phase: Succeeded\n")
    # Replaced by a rename (readers see the old or the new file whole); the cache's key moves.
    assert os.stat(path).st_ino != first and path.read_text() == "phase: Succeeded\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.yaml"]  # no temporary file left


def test_new_file_over_a_page_goes_through_a_temporary(tmp_path, monkeypatch):
    made = []
    real_open = os.open

    def recording_open(path, flags, *args, **kwargs):
        made.append((os.path.basename(path), bool(flags & os.O_EXCL)))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(store.os, "open", recording_open)
    big = "x" * (store._PAGE + 1)
    assert store.replace_if_changed(tmp_path / "big.yaml", big)
    assert made == [(".big.yaml.tmp", False)] and (tmp_path / "big.yaml").read_text() == big
    made.clear()
    assert store.replace_if_changed(tmp_path / "small.yaml", "x\n")
    assert made == [("small.yaml", True)]


def test_write_if_changed_makes_the_status_folder_once(tmp_path):
    status_dir = tmp_path / "status"
    st = RunStatus(name="a", phase="Running")
    assert store.write_if_changed(status_dir, st)
    assert not store.write_if_changed(status_dir, st)
    assert store.load_all(status_dir)["a"].phase == "Running"
    assert (status_dir / "a.yaml").read_text() == store.dump(st)
