"""Inputs: what a run stages must stay inside the repository and be user content (links included),
and task values that name staged files must be covered by spec.inputs."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from .raw import _list, _text


def input_problem(root: Path, item: str) -> str | None:
    """Why an input path cannot be staged, or None. Inputs never leave the repository."""
    if not item or item.strip() != item:
        return "input path is empty or has surrounding spaces"
    if "\\" in item or "\x00" in item:
        return f"input '{item}' must use '/' separators"
    p = PurePosixPath(item)
    if p.is_absolute():
        return f"input '{item}' must be relative to the repository, not absolute"
    if ".." in p.parts:
        return f"input '{item}' must not contain '..'"
    if p.parts and p.parts[0] in ("status", ".git", ".reconciler"):
        return f"input '{item}' points into {p.parts[0]}/, which is not user content"
    full = root / item
    if not os.path.lexists(full):
        return f"input '{item}' does not exist in the repository"
    try:
        real = full.resolve(strict=True)
    except (OSError, RuntimeError):
        return f"input '{item}' is a broken or looping symlink"
    real_root = root.resolve()
    if not real.is_relative_to(real_root):
        return f"input '{item}' is a symlink that escapes the repository"
    into = not_user_content(real_root, real)
    if into:  # a committed link must not bring the reconciler's own state into a bundle
        return f"input '{item}' is or goes through a symlink to {into}, which is not user content"
    if real.is_dir():
        return _tree_problem(real_root, real, PurePosixPath(item), item, (real,))
    return None


def _tree_problem(real_root: Path, folder: Path, shown: PurePosixPath, item: str,
                  holding: tuple[Path, ...]) -> str | None:
    """The first link under ``folder`` that staging would refuse, or None. Staging follows links
    into folders (bundle._copy_input), so this walk does too, under the same rules: a link inside
    a linked folder is judged here, in the pull request, not first at launch. ``shown`` is the
    folder as the spec names it; ``holding`` the resolved folders above, to catch loops."""
    for name in sorted(os.listdir(folder)):
        child, where = folder / name, shown / name
        target = child
        if child.is_symlink():
            try:
                target = child.resolve(strict=True)
            except (OSError, RuntimeError):
                return f"input '{item}' contains a broken or looping symlink: {where}"
            if not target.is_relative_to(real_root):
                return f"input '{item}' contains a symlink that escapes the repository: {where}"
            into = not_user_content(real_root, target)
            if into:
                return f"input '{item}' contains a symlink to {into}: {where}"
            if target.is_dir() and (target in holding or holding[0].is_relative_to(target)):
                return f"input '{item}' contains a symlink to a folder that holds it (a loop): {where}"
        if target.is_dir():
            problem = _tree_problem(real_root, target, where, item, holding + (target,))
            if problem:
                return problem
    return None


def not_user_content(real_root: Path, real: Path) -> str | None:
    """What a resolved path inside the repository is when it is not user content (the repository
    itself, which holds .git/ and .reconciler/; .git/, .reconciler/ or status/), else None."""
    parts = real.relative_to(real_root).parts
    if not parts:
        return "the repository's root"
    return f"{parts[0]}/" if parts[0] in ("status", ".git", ".reconciler") else None


def _check_staged_paths(root: Path, f, spec: dict, task: dict, add) -> None:
    """Task values that name staged files (``inputs/...``) must be covered by spec.inputs (or the code pin).

    The entrypoint runs from the bundle's root, where ``inputs/<path>`` holds the repository's
    ``<path>`` for each listed input. A value naming a repository file without the ``inputs/`` prefix
    would be looked up on the execution plane's own disk (or the hub), so it gets a hint too.
    """
    from reconciler.tasks.swift import bundle_paths

    if task.get("type") not in ("swift-sft", "swift-rlhf"):
        return
    inputs = [i for i in _list(spec.get("inputs")) if isinstance(i, str)]
    code = spec.get("code")
    code_dir = _text(code.get("path", "code")) if isinstance(code, dict) else None
    if code_dir is not None:
        for item in inputs:
            if item == code_dir or item.startswith(code_dir + "/") or code_dir.startswith(item + "/"):
                add(f, ("spec", "code", "path"), f"code.path '{code_dir}' overlaps input '{item}' (both go under inputs/)")
    named = bundle_paths(task)
    for loc, value in named:
        rel = value[len("inputs/"):].rstrip("/")
        covering = [i for i in inputs if rel == i.rstrip("/") or rel.startswith(i.rstrip("/") + "/")]
        if code_dir is not None and (rel == code_dir or rel.startswith(code_dir + "/")):
            continue
        if not covering:
            listed = ", ".join(inputs) if inputs else "none"
            add(f, ("spec", "task") + loc, f"'{value}' is not staged: add '{rel}' (or a folder holding it) to "
                                           f"spec.inputs (listed: {listed})")
        elif not os.path.lexists(root / rel):
            add(f, ("spec", "task") + loc, f"'{value}': '{rel}' does not exist in the repository "
                                           f"(input '{covering[0]}' does not hold it)")
    staged = {loc for loc, _ in named}
    for key in ("dataset", "val_dataset"):
        for i, value in enumerate(_list(task.get(key))):
            if not isinstance(value, str):
                continue
            path = value.split("#", 1)[0]
            if (key, i) in staged or not path or path.startswith("/"):
                continue
            if input_problem(root, path) is None and (root / path).is_file():
                hint = (f"inputs/{path}" if any(path == x or path.startswith(x.rstrip("/") + "/") for x in inputs)
                        else f"inputs/{path} and list '{path}' in spec.inputs")
                add(f, ("spec", "task", key, i), f"'{value}' is a repository file; the run sees staged files under "
                                                 f"inputs/: use {hint}")
