"""Files → validated objects, with every problem located.

A repository is read in one go and every error of every file is reported: one malformed file never
stops the others from being checked. Parsed files are cached by the SHA-256 of their bytes, so a
reconcile pass where nothing changed reads the tree and hashes it but parses nothing.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from reconciler.core.diagnostics import Diagnostic, relpath
from reconciler.core import yamlsafe
from .checks.secrets import secret_values
from .models import KINDS
from .models.common import DNS_LABEL, is_dns_label
from .models.fleet import Fleet
from .models.policy import Policy
from .models.provider import Provider
from .models.run import Run
from .models.storage import Storage
from .models.template import ExecutionTemplate
from .specfile import RACY_NS, RunEntry, SpecCache, SpecChanged, SpecFile
from .tree import SPEC_DIRS, discover, walk, yaml_files
from .treewatch import WATCH_FROM, TreeWatch

__all__ = ["DesiredState", "Locator", "RunEntry", "SpecCache", "SpecChanged", "SpecFile", "discover",
           "is_spec_repo", "load_file", "load_tree", "run_digest", "yaml_files"]



class Locator:
    """Finds where a path inside a document was written; re-reads files with ruamel.yaml on demand."""

    def __init__(self) -> None:
        self._docs: dict[Path, yamlsafe.Located | None] = {}

    def remember(self, path: Path, doc: yamlsafe.Located) -> None:
        """Keep a document the loader already read on the located path."""
        self._docs[path] = doc

    def _doc(self, f: SpecFile) -> yamlsafe.Located | None:
        if f.path not in self._docs:
            try:
                self._docs[f.path] = yamlsafe.located_load(yamlsafe.decode(f.path.read_bytes()))
            except (OSError, yamlsafe.YamlProblem):
                self._docs[f.path] = None
        return self._docs[f.path]

    def diag(self, f: SpecFile, loc: tuple, message: str) -> Diagnostic:
        doc = self._doc(f)
        line, col = doc.locate(loc) if doc else (1, 1)
        field_path = dotted(loc, doc.data if doc else None)
        return Diagnostic(f.rel, line, col, f"{field_path}: {message}" if field_path else message)


def dotted(loc: tuple, data: Any) -> str:
    """('spec', 'task', 'swift-sft', 'args', 0) → 'spec.task.args[0]', dropping parts not in the data."""
    out: list[str] = []
    node = data
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, dict) and node.get("type") == part:
            continue  # a tagged union's tag, not a key
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif not last or not isinstance(part, (str, int)):
            continue
        else:
            node = None
        out.append(f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part))
    return "".join(out)


def _message(err: dict[str, Any], model: type[BaseModel]) -> str:
    kind, msg, loc = err["type"], err["msg"], err["loc"]
    if kind == "extra_forbidden":
        key = loc[-1]
        hint = ""
        if isinstance(key, str):
            close = difflib.get_close_matches(key, _known_keys(model), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
        return f"unknown key '{key}'{hint}"
    if kind == "missing":
        return f"missing required key '{loc[-1]}'"
    if kind == "union_tag_invalid":
        ctx = err.get("ctx", {})
        return f"unknown type {ctx.get('tag')!r}; expected one of {ctx.get('expected_tags')}"
    if kind == "union_tag_not_found":
        return "missing 'type' (one of 'command', 'swift-sft', 'swift-rlhf')"
    if kind == "string_pattern_mismatch":
        pattern = err.get("ctx", {}).get("pattern", "")
        if pattern == DNS_LABEL:
            return f"{err['input']!r} is not a DNS label: lowercase letters, digits and '-', starting and ending with a letter or digit"
        return f"{err['input']!r} is not a valid name (letters, digits and '_', not starting with a digit)"
    if kind == "too_short":
        return f"must have at least {err.get('ctx', {}).get('min_length', 1)} item(s)"
    if kind == "value_error":
        return msg.removeprefix("Value error, ")
    if kind in ("model_type", "model_attributes_type", "dict_type") and "input" in err:
        return f"expected a mapping (key: value lines), got {type(err['input']).__name__} {err['input']!r}"[:300]
    if kind.endswith("_type") and "input" in err:
        return f"{msg[0].lower()}{msg[1:]}, got {type(err['input']).__name__} {err['input']!r}"[:300]
    return msg[0].lower() + msg[1:]


def _error_loc(err: dict[str, Any], model: type[BaseModel]) -> tuple:
    """Where an error should point: a missing key at its parent, a refused key inside a map at that key."""
    loc = tuple(err["loc"])
    if err["type"] == "missing":
        return loc[:-1]
    if err["type"] == "value_error" and isinstance(err.get("input"), dict):
        # A validator that refuses one key of a map names it first: 'output_dir' is managed ...
        m = re.match(r"'([^']+)'", _message(err, model))
        if m and m.group(1) in err["input"]:
            return loc + (m.group(1),)
    return loc


@functools.cache
def _known_keys(model: type[BaseModel]) -> list[str]:
    """Every field name in the model tree, for 'did you mean' hints."""
    names: set[str] = set()

    def walk(m: Any, seen: set) -> None:
        if not (isinstance(m, type) and issubclass(m, BaseModel)) or m in seen:
            return
        seen.add(m)
        for name, f in m.model_fields.items():
            names.add(name)
            for t in _types_in(f.annotation):
                walk(t, seen)

    walk(model, set())
    return sorted(names)


def _types_in(annotation: Any) -> list[Any]:
    args = getattr(annotation, "__args__", None) or ()
    out = [annotation]
    for a in args:
        out.extend(_types_in(a))
    if hasattr(annotation, "__metadata__"):
        out.extend(_types_in(annotation.__origin__))
    return out


# ---------------------------------------------------------------- one file


def load_file(path: Path | str, root: Path | None, locator: Locator, cache: SpecCache | None = None,
              expect_kind: str | None = None, rel: str | None = None,
              stat: tuple[int, int, int, int] | None = None) -> SpecFile:
    """``stat``: the file's, taken by the caller just before (``walk``)."""
    rel = rel or relpath(Path(path), root)
    try:
        # Stat before reading: a change after it shows as a new stat next time, never the reverse.
        if stat is None:
            st = os.stat(path)
            stat = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if cache is not None:
            hit = cache.by_stat(rel, stat)
            if hit is not None:
                return hit
            cache.opened += 1
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as e:
        return SpecFile(path, rel, "", diags=[Diagnostic(rel, 0, 0, f"cannot read: {e.strerror}")])
    now = time.time_ns()
    sha = hashlib.sha256(raw).hexdigest()
    if cache is not None:
        hit = cache.get(rel, sha)
        if hit is not None:
            hit.stat, hit.verified_ns = stat, now
            return hit
    path = Path(path)
    f = SpecFile(path, rel, sha, name_hint=path.stem if is_dns_label(path.stem) else None)
    f.expect, f.stat, f.verified_ns = expect_kind, stat, now
    _parse_into(f, raw, locator, expect_kind)
    _facts(f)
    if cache is not None:
        cache.parsed += 1
        cache.put(f)
    return f


def _facts(f: SpecFile) -> None:
    """What a pass needs of a file without its model: names, a Run's digest and secret names, and
    whether its checks look at other repository files."""
    data = f.data
    meta = data.get("metadata") if isinstance(data, dict) else None
    if isinstance(meta, dict) and is_dns_label(meta.get("name")):
        f.meta_name = meta["name"]
    if f.kind == "Run" and isinstance(data, dict):
        spec = data.get("spec")
        spec = spec if isinstance(spec, dict) else {}
        task = spec.get("task")
        f.repo_refs = bool(spec.get("inputs")) or (isinstance(task, dict) and task.get("type") != "command")
    f.validated()
    if f.ok and isinstance(f.obj, Run):
        f.digest = run_digest(f.obj)
        f.secrets = tuple(f.obj.spec.secrets)


def _reparse(f: SpecFile, raw: bytes) -> None:
    _parse_into(f, raw, Locator(), f.expect)


SpecFile.parser = _reparse


def _parse_into(f: SpecFile, raw: bytes, locator: Locator, expect_kind: str | None) -> None:
    try:
        text = yamlsafe.decode(raw)
    except yamlsafe.YamlProblem as p:
        f.diags.append(Diagnostic(f.rel, p.line, p.col, p.message))
        return
    fast = True
    try:
        data = yamlsafe.fast_load(text)
    except Exception:  # noqa: BLE001 - any refusal is re-read on the located path for its message
        try:
            located = yamlsafe.located_load(text)
        except yamlsafe.YamlProblem as p:
            f.diags.append(Diagnostic(f.rel, p.line, p.col, p.message))
            return
        locator.remember(f.path, located)
        data = located.data
        fast = False
    # Secrets first and whatever else is wrong: a leaked token must be reported even in a file of an
    # unknown kind, or one the schema refuses.
    for loc, message in secret_values(data, text if fast else None):
        f.diags.append(locator.diag(f, loc, message))
    if not isinstance(data, dict):
        found = {type(None): "an empty document (null)", str: "a string", list: "a list"}.get(type(data), type(data).__name__)
        f.diags.append(Diagnostic(f.rel, 1, 1, f"expected a mapping with apiVersion and kind, found {found}"))
        return
    kind = data.get("kind")
    meta = data.get("metadata")
    if isinstance(meta, dict) and is_dns_label(meta.get("name")):
        f.name_hint = meta["name"]
    if not isinstance(kind, str) or kind not in KINDS:
        f.diags.append(locator.diag(f, ("kind",), f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}"
                                    if kind is not None else "missing 'kind' (one of " + ", ".join(KINDS) + ")"))
        return
    f.kind = kind
    if expect_kind and kind != expect_kind:
        f.diags.append(locator.diag(f, ("kind",), f"files under execution_templates/ must be {expect_kind}, not {kind}"))
        return
    f.data = data
    model = KINDS[kind]
    try:
        obj = model.model_validate(data)
    except ValidationError as e:
        obj = None
        for err in e.errors():
            f.diags.append(locator.diag(f, _error_loc(err, model), _message(err, model)))
    if not f.diags:
        f.obj = obj


# ---------------------------------------------------------------- the tree


def is_spec_repo(root: Path) -> bool:
    return any((root / top).is_dir() for top in SPEC_DIRS)


@dataclass
class DesiredState:
    """Everything the repository asks for, after validation."""

    runs: dict[str, RunEntry] = field(default_factory=dict)
    templates: dict[str, ExecutionTemplate] = field(default_factory=dict)
    fleets: dict[str, Fleet] = field(default_factory=dict)
    providers: dict[str, Provider] = field(default_factory=dict)
    policy: Policy | None = None
    storages: dict[str, Storage] = field(default_factory=dict)  # by name, the valid ones
    # Providers whose file is there but invalid: their rentals are left alone until it is fixed.
    invalid_providers: dict[str, str] = field(default_factory=dict)
    invalid: dict[str, str] = field(default_factory=dict)  # run name (a DNS label, always) → first message
    diagnostics: list[Diagnostic] = field(default_factory=list)
    files: list[SpecFile] = field(default_factory=list)


# Fields added to RunSpec after runs were launched under it: left out of the digest while unset,
# so that upgrading the reconciler does not relaunch every run as a new generation.
ADDED_LATER = ("maxCost", "priority", "affinity", "antiAffinity", "restartedAt", "outputs", "slurm")


# The same for fields added inside overrides: (path) left out while None.
ADDED_LATER_NESTED = (("overrides", "selector"), ("overrides", "resources", "gpu_types"),
                      ("overrides", "resources", "gpu_memory_gb"))


def run_digest(run: Run) -> str:
    unset = {k for k in ADDED_LATER if getattr(run.spec, k) is None}
    data = run.spec.model_dump(mode="json", exclude=unset)
    for path in ADDED_LATER_NESTED:
        node = data
        for part in path[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and node.get(path[-1], 0) is None:
            del node[path[-1]]
    body = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


def load_tree(root: Path, cache: SpecCache | None = None, only: set[Path] | None = None,
              tree_version: str | None = None) -> DesiredState:
    """Load and check the whole repository.

    ``only`` limits the reported diagnostics to some files (``reconcile validate FILE...``); a name
    or id one of them shares with another file is then reported against it (see ``cross_checks``).
    ``cache``: a long-lived caller's (the daemon's, or one restored from the pass cache): unchanged
    files are neither read nor parsed, and the cross-file checks run again only for what changed.
    ``tree_version``: the commit checked out: the checks of runs that stage repository files run
    again when it moves.
    """
    from .checks import cross_checks

    locator = Locator()
    prefix = len(str(root)) + 1
    ignores: list | None = None
    unchanged = False  # every file of the tree vouched for by its stat, and no other in the cache
    if cache is not None:
        cache.tree_changed, cache.opened, cache.parsed, ignores = False, 0, 0, []
        files, hits = _load_cached(root, locator, cache, ignores)
        cache.ignores = ignores
        unchanged = hits == len(files) == len(cache)
    else:
        files = [load_file(p, root, locator, None, expect, p[prefix:]) for p, expect in discover(root)]
    if cache is not None and only is None and not unchanged:
        cache.retain({f.rel for f in files})
    if only is not None:  # an empty set means "report on no file", not "on every file"
        known = {f.path.resolve() for f in files}
        for p in sorted(only):
            if p.resolve() not in known:
                files.append(load_file(p, root, locator, cache, None))
    desired = DesiredState(files=files)
    wanted = {relpath(p, root) for p in only} if only is not None else None
    if cache is not None and only is None:
        cross = _cross_cached(root, files, locator, cache, tree_version)
        for f in files:
            if f._data is not None and f.kind == "Run":
                f.release(data_only=True)  # the checks are done: a run's mapping is parsed again if needed
    else:
        cross = cross_checks(root, files, locator, given=wanted)
    for f in files:
        found = cross.get(f.rel)
        diags = f.diags + found if found else f.diags
        if diags:
            desired.diagnostics.extend(diags)
        elif f.entry is not None and f.meta_name:  # a valid run seen before: the common case, kept cheap
            desired.runs[f.meta_name] = f.entry
            continue
        if diags or not f.ok:
            # Keyed by a DNS label only (see SpecFile.name_hint): the key becomes status/<key>.yaml.
            if f.kind in (None, "Run") and f.rel.startswith("specs" + os.sep) and is_dns_label(f.name_hint):
                desired.invalid.setdefault(f.name_hint, diags[0].text() if diags else "invalid")
            elif f.kind == "Provider" and is_dns_label(f.name_hint):
                desired.invalid_providers.setdefault(f.name_hint, diags[0].text() if diags else "invalid")
            continue
        _desire(desired, f)
    if wanted is not None:
        desired.diagnostics = [d for d in desired.diagnostics if d.path in wanted]
    desired.diagnostics.sort()
    return desired


def _load_cached(root: Path, locator: Locator, cache: SpecCache, ignores: list) -> tuple[list[SpecFile], int]:
    """Every file of the tree, each taken from ``cache`` when its stat vouches for it (the
    check of ``SpecCache.by_stat``, here without a call per file) and loaded otherwise; and how
    many were taken so."""
    prefix = len(str(root)) + 1
    items, hits, files = cache._items, 0, []
    if cache.watch is None and len(items) >= WATCH_FROM:
        cache.watch = TreeWatch()  # a large tree: its folders watched instead of a stat per file (treewatch.py)
    for p, expect, stat in walk(root, ignores, cache.watch):
        rel = p[prefix:]
        f = items.get(rel)
        if f is not None and stat is not None and f.stat == stat and max(stat[2], stat[3]) < f.verified_ns - RACY_NS:
            hits += 1
        else:
            f = load_file(p, root, locator, cache, expect, rel, stat)
        files.append(f)
    cache.stat_hits += hits
    return files, hits


def _desire(desired: DesiredState, f: SpecFile) -> None:
    """A valid file's object into the desired state; a run by its entry (its model stays lazy)."""
    if f.kind == "Run":
        if f.entry is None:
            f.entry = RunEntry(None, f.rel, f.digest or "", f)
        desired.runs[f.meta_name or f.model().metadata.name] = f.entry
        return
    obj = f.obj
    if isinstance(obj, ExecutionTemplate):
        desired.templates[obj.id] = obj
    elif isinstance(obj, Fleet):
        desired.fleets[obj.metadata.name] = obj
    elif isinstance(obj, Provider):
        desired.providers[obj.metadata.name] = obj
    elif isinstance(obj, Policy):
        desired.policy = obj
    elif isinstance(obj, Storage):
        desired.storages[obj.metadata.name] = obj


def _cross_cached(root: Path, files: list[SpecFile], locator: Locator, cache: SpecCache,
                  tree_version: str | None) -> dict[str, list[Diagnostic]]:
    """The cross-file checks, run again only where a change can have moved their result.

    A run's result depends on its own mapping, on the files of the other kinds (templates,
    Policy, Providers, Storages, Fleets), on the runs that share its name, and for a run that stages
    repository files on the checkout. So a change to a file of another kind checks everything
    again; otherwise the changed runs, the runs named as they are or were, and (after a new commit)
    the runs that stage files are checked again with every file of the other kinds, and every other
    run keeps its result."""
    from .checks import cross_checks

    refs = [f.rel for f in files if f.repo_refs]
    prev = cache.cross
    rels: set[str] | None = None
    if prev is not None and not cache.context_touched:
        rels = set(cache.changed)
        if refs and (tree_version is None or tree_version != cache.cross_head):
            rels.update(refs)
        if cache.names_touched:
            rels.update(f.rel for f in files if f.kind == "Run" and f.meta_name in cache.names_touched)
    if rels is None:
        cross = dict(cross_checks(root, files, locator))
    elif not rels:
        cross = prev
    else:
        subset = [f for f in files if f.kind not in ("Run", None) or f.rel in rels]
        present = {f.rel for f in files if f.kind == "Run"}
        cross = {r: d for r, d in prev.items() if r in present and r not in rels}
        cross.update(cross_checks(root, subset, locator))
    cache.cross, cache.cross_head = cross, tree_version if refs else None
    cache.changed.clear()
    cache.names_touched.clear()
    cache.context_touched = False
    return cross
