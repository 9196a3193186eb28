"""One spec file as a pass keeps it, and the cache that lets a pass skip reading it.

A pass looks at every spec file of the tree, yet almost none changes between passes. What the
pass needs of an unchanged file (its kind, names, validity, a Run's digest and secret names) is
small; its parsed mapping and validated model are large and needed only for the runs the plan
works on. So a file keeps those two lazily: ``obj`` and ``data`` parse the file again when asked
(after checking that its bytes still hash to what was validated), and ``release`` lets them go.

Whether a file is unchanged is first decided by its stat (inode, size, mtime, ctime), under git's
racy-clean rule (Documentation/technical/racy-git.txt in git's sources): a stat only vouches for
content that was read at least ``RACY_NS`` after the file's last change, since a rewrite within
the same timestamp tick and of the same size leaves the stat as it was.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Callable

from reconciler.core.diagnostics import Diagnostic

# Timestamps of common file systems tick at 1 ns to 2 s (FAT); a file changed within this long
# before its content was read is read again next time, whatever its stat says.
RACY_NS = 2_000_000_000


class SpecChanged(RuntimeError):
    """A file's bytes no longer hash to what the pass validated: the pass stops rather than plan a
    run from content it did not check (the next pass sees the change through the file's stat)."""


class SpecFile:
    """One file of the tree after loading: its object when valid, its diagnostics otherwise."""

    __slots__ = ("_path", "rel", "sha", "kind", "diags", "name_hint", "meta_name", "digest", "secrets",
                 "repo_refs", "expect", "stat", "verified_ns", "_obj", "_data", "_valid", "_stand_in", "entry",
                 "__weakref__")

    # Set by reconciler.spec.load: (file, raw bytes) → fills _data and _obj.
    parser: Callable[["SpecFile", bytes], None] | None = None

    def __init__(self, path: Path | str, rel: str, sha: str, kind: str | None = None, obj: Any = None,
                 diags: list[Diagnostic] | None = None, name_hint: str | None = None) -> None:
        self._path = os.fspath(path)
        self.rel = rel
        self.sha = sha
        self.kind = kind
        self.diags: list[Diagnostic] = diags if diags is not None else []
        # The name an invalid Run's status file gets: metadata.name, else the file stem, whichever is
        # a DNS label first, else None (no status at all). Never the raw metadata.name: the
        # reconciler writes status/<name>.yaml, and a name like '../x' would write outside status/.
        self.name_hint = name_hint
        self.meta_name: str | None = None  # metadata.name when a DNS label: the cross-file name checks
        self.digest: str | None = None  # a Run's spec digest, computed once per content
        self.secrets: tuple[str, ...] = ()  # a Run's secret names
        # Whether the cross-file checks of this file look at other repository files (inputs).
        self.repo_refs = False
        self.expect: str | None = None  # the kind the file's folder requires
        self.stat: tuple[int, int, int, int] | None = None  # inode, size, mtime_ns, ctime_ns before reading
        self.verified_ns = 0  # when the content was last read and hashed (the clock, in ns)
        self._obj = obj
        # The parsed mapping, once its kind is known and allowed where the file is: the cross-file
        # checks read it even when the schema refused the file, so one `validate` shows every problem.
        self._data: dict | None = None
        self._valid = False  # validated once: obj and data can be parsed again from the file
        self._stand_in: LazyModel | None = None
        self.entry: RunEntry | None = None  # a valid Run's entry in the desired state, made once

    def __repr__(self) -> str:
        return f"SpecFile({self.rel!r}, kind={self.kind!r}, ok={self.ok})"

    @property
    def path(self) -> Path:
        return Path(self._path)

    @property
    def ok(self) -> bool:
        return not self.diags and (self._obj is not None or self._valid)

    @property
    def obj(self) -> Any:
        if self._obj is None and self._valid:
            if self.kind == "Run":  # stands in until something reads it: most runs are never planned
                if self._stand_in is None:
                    self._stand_in = LazyModel(self)
                return self._stand_in
            self.load()
        return self._obj

    @obj.setter
    def obj(self, value: Any) -> None:
        self._obj = value

    @property
    def data(self) -> dict | None:
        if self._data is None and self._valid:
            self.load()
        return self._data

    @data.setter
    def data(self, value: dict | None) -> None:
        self._data = value

    def model(self) -> Any:
        """The validated model itself (parsed again if it was let go)."""
        if self._obj is None and self._valid:
            self.load()
        return self._obj

    def load(self) -> None:
        """Parse the file again, as validated before: refuse content that changed since."""
        try:
            with open(self._path, "rb") as fh:
                raw = fh.read()
        except OSError as e:
            raise SpecChanged(f"{self.rel}: cannot read it again: {e.strerror}") from None
        if hashlib.sha256(raw).hexdigest() != self.sha:
            raise SpecChanged(f"{self.rel} changed during the pass; the next pass reads the new content")
        diags = self.diags
        self.diags = []
        assert SpecFile.parser is not None
        SpecFile.parser(self, raw)
        if self.diags or self._obj is None:  # the same bytes validated before: only a new code could
            raise SpecChanged(f"{self.rel}: no longer validates as it did")
        self.diags = diags

    def validated(self) -> None:
        """Mark a valid file: from now on its model and mapping may be let go and parsed again."""
        self._valid = not self.diags and self._obj is not None

    def release(self, data_only: bool = False) -> None:
        """Let the parsed mapping (and the model) go, where they can be parsed again."""
        if self._valid:
            self._data = None
            if not data_only:
                self._obj = None


class LazyModel:
    """A Run file's model before anything needed it: attribute reads parse the file. Code that
    wants the model's type or identity asks ``RunEntry.run`` (the model itself)."""

    __slots__ = ("_file",)

    def __init__(self, file: SpecFile) -> None:
        self._file = file

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file.model(), name)


class RunEntry:
    """A valid run of the desired state: its spec digest and secret names at hand, its model when
    something asks for it."""

    __slots__ = ("_run", "rel", "digest", "file", "_secrets")

    def __init__(self, run: Any = None, rel: str = "", digest: str = "", file: SpecFile | None = None) -> None:
        self._run = run
        self.rel = rel
        self.digest = digest  # of the run's spec content: a change bumps the generation
        self.file = file
        self._secrets = file.secrets if file is not None else None

    def __repr__(self) -> str:
        return f"RunEntry({self.rel!r}, {self.digest!r})"

    @property
    def run(self) -> Any:
        if self._run is not None:
            return self._run
        assert self.file is not None
        return self.file.model()

    @run.setter
    def run(self, value: Any) -> None:
        self._run = value

    @property
    def secrets(self) -> tuple[str, ...]:
        """The secret names the run asks for, without parsing it."""
        if self._secrets is None:
            self._secrets = tuple(self.run.spec.secrets)
        return self._secrets

    def release(self) -> None:
        """Let the model go (a settled run): it is parsed again if anything asks."""
        if self.file is not None:
            self._run = None
            self.file.release()


class SpecCache:
    """Parsed files by path, each with the stat and content hash it was checked under: an unchanged
    file is never parsed twice in a process, and a file whose stat vouches for it is not even read.

    One entry per path, replaced when its content changes and dropped when the file leaves the
    tree (``retain``), so the cache holds what the tree holds and no more: no count limit, and no
    moment where it empties itself and a pass re-parses everything."""

    def __init__(self) -> None:
        self._items: dict[str, SpecFile] = {}
        self.hits = 0
        self.stat_hits = 0
        self.opened = 0  # files the last load read (the others' stat vouched for them)
        self.parsed = 0  # files the last load parsed (their content was new to the cache)
        # The cross-file checks of the last tree: by file, and the commit they looked at the
        # repository under (inputs are repository files: a new commit may have changed them).
        self.cross: dict | None = None
        self.cross_head: str | None = None
        # What changed since the cross-file checks last ran (paths, and the names they held), and
        # whether anything changed in the last load (the uncommitted-spec check reads it).
        self.changed: set[str] = set()
        self.names_touched: set[str] = set()
        self.context_touched = False  # a file of another kind than Run changed: every check again
        self.tree_changed = True
        self.ignores: list | None = None  # the .gitignore files inside the spec folders, with their stats
        self.watch = None  # treewatch.TreeWatch of a large tree: the last walk reused while nothing changed

    def __len__(self) -> int:
        return len(self._items)

    def files(self) -> list[SpecFile]:
        return list(self._items.values())

    def by_stat(self, rel: str, stat: tuple[int, int, int, int]) -> SpecFile | None:
        """The entry its stat vouches for: same stat, and read well after the file last changed."""
        f = self._items.get(rel)
        if f is not None and f.stat == stat and max(stat[2], stat[3]) < f.verified_ns - RACY_NS:
            self.stat_hits += 1
            return f
        return None

    def get(self, rel: str, sha: str) -> SpecFile | None:
        f = self._items.get(rel)
        if f is not None and f.sha == sha:
            self.hits += 1
            return f
        return None

    def put(self, f: SpecFile) -> None:
        old = self._items.get(f.rel)
        if old is not None and old.sha == f.sha and old.kind == f.kind:
            self._items[f.rel] = f
            return
        self._note(old)
        self._note(f)
        self._items[f.rel] = f

    def _note(self, f: SpecFile | None) -> None:
        if f is not None:
            self.changed.add(f.rel)
            if f.meta_name:
                self.names_touched.add(f.meta_name)
            if f.kind not in (None, "Run"):
                self.context_touched = True
            self.tree_changed = True

    def retain(self, rels: set[str]) -> None:
        """Forget every path not in ``rels`` (the files of the tree just loaded)."""
        for rel in [r for r in self._items if r not in rels]:
            self._note(self._items.pop(rel))

    def entry(self, rel: str) -> SpecFile | None:
        return self._items.get(rel)

    def adopt(self, f: SpecFile) -> None:
        """An entry restored from the saved pass cache (not a change)."""
        self._items[f.rel] = f
