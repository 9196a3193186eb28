"""Which files make the tree of specs: the walk every pass starts with.

A module of its own because a pass that reads nothing spends most of its time per file here:
listing the folders and taking each file's stat, which decides whether the file is read at all
(``specfile.py``).
"""

from __future__ import annotations

import os
from operator import attrgetter
from pathlib import Path

SPEC_DIRS = ("specs", "execution_templates")
_NAME = attrgetter("name")


def yaml_files(base: Path) -> list[Path]:
    """The *.yaml and *.yml files under a folder, hidden ones left out, in a stable order."""
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        # PurePath parsing costs more than reading a small file: join strings, make the Path once.
        out.extend(Path(os.path.join(dirpath, name)) for name in sorted(filenames)
                   if name.endswith((".yaml", ".yml")) and not name.startswith("."))
    return out


def discover(root: Path, ignores: list | None = None) -> list[tuple[str, str | None]]:
    """All spec files under specs/ and execution_templates/ (paths as strings), in a stable order.
    Strings, not Paths: making a Path costs more than reading a small file, and a pass looks at
    every file; load_file makes one only for a file it parses. ``ignores`` gets the path and stat
    of each .gitignore on the way (what git says of an untracked spec file depends on them)."""
    out = []
    for top, expect in zip(SPEC_DIRS, (None, "ExecutionTemplate")):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            if ignores is not None and ".gitignore" in filenames:
                try:
                    st = os.stat(os.path.join(dirpath, ".gitignore"))
                    ignores.append([dirpath, [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]])
                except OSError:
                    ignores.append([dirpath, None])
            base = os.path.join(dirpath, "")
            out.extend((base + name, expect) for name in sorted(filenames)
                       if name.endswith((".yaml", ".yml")) and not name.startswith("."))
    return out


def walk(root: Path, ignores: list | None = None, watch=None) -> list[tuple[str, str | None, tuple | None]]:
    """``discover``'s files, in its order, each with its stat (inode, size, mtime, ctime; None
    where it could not be taken) from the directory walk itself: one system call per file and no
    path built in Python, which is most of what a pass that reads nothing spends per file.
    ``watch``: a ``treewatch.TreeWatch`` to reuse the last walk's listing from while it vouches
    for it, and to watch this walk's folders otherwise."""
    if watch is not None:
        kept = watch.reuse()
        if kept is not None:
            if ignores is not None:
                ignores.extend(list(x) for x in kept[1])
            return kept[0]
        watch.begin()
    out: list[tuple[str, str | None, tuple | None]] = []
    seen: list = [] if ignores is None and watch is not None else ignores
    plain = [True]
    for top, expect in zip(SPEC_DIRS, (None, "ExecutionTemplate")):
        _walk_into(os.path.join(root, top), expect, seen, out, watch, plain)
    if watch is not None:
        watch.finish(out, seen, plain[0])
    return out


def _walk_into(folder: str, expect: str | None, ignores: list | None, out: list, watch=None,
               plain: list | None = None) -> None:
    if watch is not None:
        watch.add(folder)  # before the listing: what changes from now on raises an event
    try:
        with os.scandir(folder) as it:
            entries = sorted(it, key=_NAME)
    except OSError:  # as os.walk: a folder that cannot be listed holds no spec file
        return
    dirs = []
    for e in entries:
        name = e.name
        if e.is_dir():
            if not name.startswith("."):
                dirs.append(e)
            continue
        if name == ".gitignore" and ignores is not None:
            try:
                st = e.stat()
                ignores.append([folder, [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]])
                if watch is not None and (st.st_nlink != 1 or e.is_symlink()):
                    plain[0] = False
            except OSError:
                ignores.append([folder, None])
        if name.endswith((".yaml", ".yml")) and not name.startswith("."):
            try:
                st = e.stat()
                out.append((e.path, expect, (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)))
                if watch is not None and (st.st_nlink != 1 or e.is_symlink()):
                    plain[0] = False  # a change through another link or the target raises no event here
            except OSError:
                out.append((e.path, expect, None))
    for d in dirs:
        if not d.is_symlink():  # as os.walk: links to folders are not followed
            _walk_into(d.path, expect, ignores, out, watch, plain)
