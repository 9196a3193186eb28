"""The launch journal's writes (engine/inflight.py): never a rename over an existing file (ext4
writes the new file's data out on one, and the launch waited for it), and still atomic for a
process killed at any step of the write. Real files in a real folder."""

from __future__ import annotations

import os
import time

import pytest

from reconciler.core import config
from reconciler.engine import inflight
from reconciler.engine.inflight import FILE, PREVIOUS, Journal

FAST = {"launch_ttl": 30.0, "launch_clock_margin": 0.5}


def test_no_write_renames_over_an_existing_file(tmp_path, monkeypatch):
    cfg = config.load(str(tmp_path), flags=FAST)
    j = Journal(cfg)
    j.begin(time.time(), history=False)
    over: list[str] = []
    real = os.rename

    def rename(src, dst):
        if os.path.exists(dst):
            over.append(str(dst))
        return real(src, dst)

    monkeypatch.setattr(inflight.os, "rename", rename)
    monkeypatch.setattr(inflight.os, "replace", lambda *a: pytest.fail("os.replace replaces an existing file"))
    for k in range(3):
        j.issue(f"r{k}", "local", f"r{k}-g1-a1")
    assert over == []
    assert {e.identity for e in Journal(cfg).entries.values()} == {"r0-g1-a1", "r1-g1-a1", "r2-g1-a1"}
    assert not (tmp_path / ".reconciler" / PREVIOUS).exists()  # the old one is removed once the new is in


@pytest.mark.parametrize("killed_at", ["into place", "tidy"])
def test_a_writer_killed_between_its_renames_leaves_a_journal_that_holds_its_launches(tmp_path, monkeypatch,
                                                                                        killed_at):
    """Killed after the journal was moved aside: before the new one is renamed into place, or
    before the one aside is removed. The next process reads every launch issued before the kill."""
    cfg = config.load(str(tmp_path), flags=FAST)
    j = Journal(cfg)
    j.begin(time.time(), history=False)
    j.issue("a", "local", "a-g1-a1")

    class Killed(BaseException):
        pass

    real_rename, real_unlink = os.rename, inflight._unlink
    unlinks: list[str] = []

    def rename(src, dst):
        if killed_at == "into place" and str(src).endswith(".tmp"):
            raise Killed
        return real_rename(src, dst)

    def unlink(path):
        unlinks.append(path)
        if killed_at == "tidy" and len(unlinks) == 2:  # (the first removes a stale one, before the renames)
            raise Killed
        return real_unlink(path)

    monkeypatch.setattr(inflight.os, "rename", rename)
    monkeypatch.setattr(inflight, "_unlink", unlink)
    with pytest.raises(Killed):
        j.issue("b", "local", "b-g1-a1")  # the kill, inside the write that records b
    monkeypatch.undo()
    state = tmp_path / ".reconciler"
    assert (state / PREVIOUS).exists() and (state / FILE).exists() == (killed_at == "tidy")
    after = Journal(cfg)
    assert after.proven  # a journal was read: no blanket hold of every new identity
    seen = {e.identity for e in after.entries.values()}
    # a was on disk before the kill; b's launch was never issued (its write did not return), so
    # holding it or not is equally safe. Nothing that was on disk is lost.
    assert "a-g1-a1" in seen and (killed_at == "into place" or "b-g1-a1" in seen)
    after.issue("c", "local", "c-g1-a1")  # the next write tidies up
    assert not (state / PREVIOUS).exists() and "c-g1-a1" in {e.identity for e in Journal(cfg).entries.values()}
