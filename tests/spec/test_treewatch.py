"""The watched spec tree (spec/treewatch.py): a walk that found nothing changed reuses the last
listing, yet every kind of change to a spec file, a .gitignore or a folder is seen by the next
walk, an in-place write (which moves no folder's mtime) included."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reconciler.spec import load, tree, treewatch
from reconciler.spec.load import load_tree
from reconciler.spec.specfile import SpecCache
from tests.repo_helpers import Listings

pytestmark = pytest.mark.skipif(not Path("/proc/self").exists(), reason="inotify is Linux's")

TEMPLATE = ("apiVersion: reconciler/v1\nkind: ExecutionTemplate\nid: t\nplacement: {kind: local}\n"
            "launch_mode: {kind: host_process}\n")


def _run(name: str, arg: str = "1") -> str:
    return (f"apiVersion: reconciler/v1\nkind: Run\nmetadata: {{name: {name}}}\nspec:\n  template: t\n"
            f"  task: {{type: command, argv: [echo, '{arg}']}}\n")


@pytest.fixture
def repo(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setattr(treewatch, "WATCH_FROM", 3)
    monkeypatch.setattr(load, "WATCH_FROM", 3)
    (tmp_path / "specs" / "runs").mkdir(parents=True)
    (tmp_path / "execution_templates").mkdir()
    (tmp_path / "execution_templates" / "t.yaml").write_text(TEMPLATE)
    for n in ("a", "b", "c"):
        (tmp_path / "specs" / "runs" / f"{n}.yaml").write_text(_run(n))
    return tmp_path


def _settled(repo: Path, cache: SpecCache, listings: Listings):
    """Loads until the watch vouches for the tree (armed on the second load, trusted on the third)."""
    for _ in range(3):
        desired = load_tree(repo, cache)
    listings.count = 0
    again = load_tree(repo, cache)
    assert listings.count == 0, "a quiet tree is listed again"
    assert set(again.runs) == set(desired.runs)
    return again


def _argv(desired, name: str) -> list[str]:
    return desired.runs[name].run.spec.task.argv


def test_an_in_place_edit_is_seen_though_no_folder_moves(repo: Path, monkeypatch) -> None:
    cache, listings = SpecCache(), Listings(monkeypatch, tree)
    _settled(repo, cache, listings)
    folder = repo / "specs" / "runs"
    before = os.stat(folder).st_mtime_ns
    with open(folder / "b.yaml", "r+") as fh:  # the same inode, written over: the folder's mtime stays
        fh.write(_run("b", "2"))
    assert os.stat(folder).st_mtime_ns == before
    desired = load_tree(repo, cache)
    assert listings.count > 0
    assert _argv(desired, "b") == ["echo", "2"]


@pytest.mark.parametrize("change", ["new", "removed", "renamed", "touched", "folder", "gitignore", "template"])
def test_every_change_to_the_tree_is_seen(repo: Path, monkeypatch, change: str) -> None:
    cache, listings = SpecCache(), Listings(monkeypatch, tree)
    _settled(repo, cache, listings)
    runs = repo / "specs" / "runs"
    if change == "new":
        (runs / "d.yaml").write_text(_run("d"))
    elif change == "removed":
        (runs / "c.yaml").unlink()
    elif change == "renamed":
        (runs / "c.yaml").rename(runs / "e.yaml")
        (runs / "e.yaml").write_text(_run("e"))
    elif change == "touched":
        os.utime(runs / "a.yaml", ns=(1, 1))
    elif change == "folder":
        (runs / "deep").mkdir()
        (runs / "deep" / "f.yaml").write_text(_run("f"))
    elif change == "gitignore":
        (runs / ".gitignore").write_text("x\n")
    else:
        (repo / "execution_templates" / "t.yaml").write_text(TEMPLATE.replace("id: t", "id: u"))
    desired = load_tree(repo, cache)
    assert listings.count > 0
    fresh = load_tree(repo)  # no cache: what the tree holds now
    assert set(desired.runs) == set(fresh.runs)
    assert set(desired.templates) == set(fresh.templates)
    assert [p for p, _ in cache.ignores or []] == ([str(runs)] if change == "gitignore" else [])


def test_a_change_in_a_folder_made_during_the_walk_shows_next_time(repo: Path, monkeypatch) -> None:
    cache, listings = SpecCache(), Listings(monkeypatch, tree)
    _settled(repo, cache, listings)
    (repo / "specs" / "runs" / "d.yaml").write_text(_run("d"))
    real_add = treewatch.TreeWatch.add
    done = []

    def add_then_write(self, folder):
        real_add(self, folder)
        if folder.endswith("runs") and not done:  # watched, not yet listed
            done.append(1)
            (repo / "specs" / "runs" / "d.yaml").write_text(_run("d", "3"))

    monkeypatch.setattr(treewatch.TreeWatch, "add", add_then_write)
    load_tree(repo, cache)
    listings.count = 0
    desired = load_tree(repo, cache)
    assert listings.count > 0 and _argv(desired, "d") == ["echo", "3"]


def test_a_linked_spec_file_keeps_the_tree_walked(repo: Path, monkeypatch, tmp_path_factory) -> None:
    outside = tmp_path_factory.mktemp("outside") / "z.yaml"
    outside.write_text(_run("z"))
    (repo / "specs" / "runs" / "z.yaml").symlink_to(outside)
    cache, listings = SpecCache(), Listings(monkeypatch, tree)
    for _ in range(3):
        load_tree(repo, cache)
    listings.count = 0
    outside.write_text(_run("z", "4"))  # raises its event in another folder
    desired = load_tree(repo, cache)
    assert listings.count > 0 and _argv(desired, "z") == ["echo", "4"]


def test_a_tree_on_a_file_system_without_events_here_is_walked(repo: Path, monkeypatch) -> None:
    monkeypatch.setattr(treewatch.inotify, "fs_type", lambda path: 0x6969)  # NFS
    cache, listings = SpecCache(), Listings(monkeypatch, tree)
    for _ in range(3):
        load_tree(repo, cache)
    listings.count = 0
    load_tree(repo, cache)
    assert listings.count > 0


def test_a_small_tree_is_not_watched(repo: Path, monkeypatch) -> None:
    monkeypatch.setattr(load, "WATCH_FROM", 100)
    cache = SpecCache()
    for _ in range(3):
        load_tree(repo, cache)
    assert cache.watch is None
