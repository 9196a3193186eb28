"""The spec tree's walk (spec/tree.py): the files ``discover`` finds, in its order, each with the
stat ``os.stat`` gives, and the ignore files on the way."""

from __future__ import annotations

import os
from pathlib import Path

from reconciler.spec.tree import discover, walk


def test_the_walk_finds_what_discover_finds_with_each_stat(tmp_path: Path) -> None:
    for rel in ["specs/runs/b.yaml", "specs/runs/a.yml", "specs/z.yaml", "specs/runs/deep/c.yaml",
                "specs/.hidden/x.yaml", "specs/runs/.x.yaml", "specs/runs/notes.txt",
                "execution_templates/t.yaml", "specs/runs/.gitignore", "specs/Z/d.yaml"]:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("x: 1\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "e.yaml").write_text("x: 1\n")
    (tmp_path / "specs" / "linked").symlink_to(tmp_path / "outside")  # as os.walk: not followed
    (tmp_path / "specs" / "link.yaml").symlink_to(tmp_path / "outside" / "e.yaml")
    (tmp_path / "specs" / "broken.yaml").symlink_to(tmp_path / "nowhere.yaml")
    ignores_d: list = []
    ignores_w: list = []
    found = discover(tmp_path, ignores_d)
    walked = walk(tmp_path, ignores_w)
    assert [(p, e) for p, e, _ in walked] == found
    assert ignores_w == ignores_d and len(ignores_w) == 1
    for p, _, stat in walked:
        if p.endswith("broken.yaml"):
            assert stat is None  # load_file reports it, as before
            continue
        s = os.stat(p)
        assert stat == (s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns)
    assert not any("hidden" in p or "outside" in p or "linked" in p for p, _ in found)


def test_a_missing_folder_holds_no_file(tmp_path: Path) -> None:
    assert walk(tmp_path) == [] == discover(tmp_path)
