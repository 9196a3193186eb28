"""Checks a schema cannot express: they look across files, at the repository, or for leaked secrets.

Each check returns located diagnostics for the file at fault, so a pull request that breaks a
reference (a run naming a template that was renamed) is pointed at the line that now dangles.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

from ..diagnostics import Diagnostic
from .models import OVERRIDABLE, ExecutionTemplate, Fleet, Run

SECRET_KEY = re.compile(r"(?:^|[_\-.])(TOKEN|KEY|SECRET|PASSWORD|PASSWD|APIKEY|CREDENTIALS?)$", re.IGNORECASE)
CREDENTIAL = re.compile(
    r"^(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_\-]{20,}|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}"
    r"|AKIA[0-9A-Z]{16}|xox[abpr]-[A-Za-z0-9\-]{10,}|glpat-[A-Za-z0-9_\-]{20,})"
)
# Keys whose values are public or are references, never secrets.
NOT_SECRET_PATHS = {("spec", "machines", "*", "ssh", "host_key"), ("spec", "machines", "*", "ssh", "identity_file")}


def _walk(data: Any, loc: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _walk(v, loc + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _walk(v, loc + (i,))
    else:
        yield loc, data


def _generic(loc: tuple) -> tuple:
    return tuple("*" if isinstance(p, int) else p for p in loc)


# A cheap look at the raw text decides whether the walk below is needed at all. Key names are
# matched in any case (as SECRET_KEY is); credential prefixes in their case (as CREDENTIAL is), so
# that naming a secret (``secrets: [HF_TOKEN]``) does not look like holding one.
MAYBE_SECRET = re.compile(
    r"(?i:token|key|secret|passw(?:or)?d|apikey|credentials?)[\"']?\s*:|hf_|sk-|gh[pousr]_|github_pat_|AKIA|xox|glpat-"
)


def secret_values(data: Any, text: str | None = None) -> list[tuple[tuple, str]]:
    """Literal values that are, or look like, credentials. The fix is always a name under secrets:."""
    if text is not None and not MAYBE_SECRET.search(text):
        return []
    found = []
    for loc, value in _walk(data):
        if not isinstance(value, str) or not value or _generic(loc) in NOT_SECRET_PATHS:
            continue
        key = next((p for p in reversed(loc) if isinstance(p, str)), "")
        if CREDENTIAL.match(value.strip()):
            found.append((loc, "this value looks like a credential; never commit one: list its name under "
                               "spec.secrets and set it on the reconciler host"))
        elif isinstance(loc[-1], str) and SECRET_KEY.search(key) and "secrets" not in loc:
            name = key if re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key) else "NAME"
            found.append((loc, f"'{key}' holds a literal secret; remove the value, list '{name}' under "
                               "spec.secrets and set it on the reconciler host"))
    return found


def cross_checks(root: Path, files: list, locator) -> dict[str, list[Diagnostic]]:
    out: dict[str, list[Diagnostic]] = defaultdict(list)

    def add(f, loc: tuple, message: str) -> None:
        out[f.rel].append(locator.diag(f, loc, message))

    runs = [f for f in files if f.ok and isinstance(f.obj, Run)]
    templates_all = {}
    template_files = [f for f in files if f.kind == "ExecutionTemplate"]
    # Files whose name matches their id first: when an id is defined twice, the misnamed copy is at fault.
    for f in sorted(template_files, key=lambda f: f.obj is None or f.path.stem != f.obj.id):
        tid = f.obj.id if f.obj is not None else f.path.stem
        if f.obj is not None and f.path.stem != f.obj.id:
            add(f, ("id",), f"id '{f.obj.id}' must equal the file name '{f.path.stem}'")
        if tid in templates_all and f.obj is not None:
            add(f, ("id",), f"template id '{tid}' is also defined in {templates_all[tid].rel}")
        templates_all.setdefault(tid, f)
        templates_all.setdefault(f.path.stem, f)  # a run naming the file still finds it (and sees it is invalid)
    for f in template_files:
        if isinstance(f.obj, ExecutionTemplate):
            _check_template(f, add)

    by_name: dict[tuple[str, str], Any] = {}
    for f in files:
        if f.obj is None or f.kind not in ("Run", "Fleet"):
            continue
        name = f.obj.metadata.name
        if f.path.stem != name:
            add(f, ("metadata", "name"), f"name '{name}' must equal the file name '{f.path.stem}'")
        other = by_name.get((f.kind, name))
        if other is not None:
            add(f, ("metadata", "name"), f"{f.kind} '{name}' is also defined in {other.rel}")
        else:
            by_name[(f.kind, name)] = f

    # A template with a cross-file error (id != file name, id defined twice) is as invalid as one
    # that failed its schema: the runs that use it must not pass.
    invalid_templates = {f.rel for f in template_files if out.get(f.rel)}
    for f in runs:
        _check_run(root, f, templates_all, add, invalid_templates)

    machines: dict[str, Any] = {}
    for f in files:
        if not isinstance(f.obj, Fleet):
            continue
        for i, m in enumerate(f.obj.spec.machines):
            if m.name in machines:
                where = machines[m.name]
                add(f, ("spec", "machines", i, "name"),
                    f"machine '{m.name}' is already declared " + ("in this fleet" if where is f else f"in {where.rel}"))
            else:
                machines[m.name] = f
            if not m.ssh.host_key and not f.obj.spec.known_hosts:
                add(f, ("spec", "machines", i, "ssh"),
                    "no host key: set ssh.host_key or the fleet's known_hosts (keys are never accepted blindly)")
            _check_resources_machine(f, i, m, add)
    return out


def _check_template(f, add) -> None:
    t: ExecutionTemplate = f.obj
    if t.launch_mode.kind == "docker" and not t.defaults.image and "image" not in t.allow_overrides:
        add(f, ("launch_mode",), "docker launches need defaults.image (or allow_overrides: [image])")
    if t.launch_mode.kind == "host_process" and t.defaults.image:
        add(f, ("defaults", "image"), "an image only applies to docker launches")
    if t.placement.kind == "local" and t.defaults.target:
        add(f, ("defaults", "target"), "local placement runs on this machine; target is for ssh placement")
    if len(set(t.allow_overrides)) != len(t.allow_overrides):
        add(f, ("allow_overrides",), "lists a key twice")
    _check_resources(f, ("defaults", "resources"), t.defaults.resources, add)


def _check_resources(f, loc: tuple, r, add) -> None:
    if r is None:
        return
    if r.gpu_type and not r.gpu_count:
        add(f, loc + ("gpu_type",), "gpu_type is set but gpu_count is 0")


def _check_resources_machine(f, i: int, m, add) -> None:
    types = [g.type for g in m.resources.gpus]
    if len(set(types)) != len(types):
        add(f, ("spec", "machines", i, "resources", "gpus"), "a GPU type is listed twice; add the counts")


def _check_run(root: Path, f, templates: dict, add, invalid_templates: set[str]) -> None:
    run: Run = f.obj
    spec = run.spec
    tf = templates.get(spec.template)
    if tf is None:
        hint = f" (known: {', '.join(sorted(templates)[:8])})" if templates else " (execution_templates/ is empty)"
        add(f, ("spec", "template"), f"template '{spec.template}' not found{hint}")
    elif not tf.ok or tf.rel in invalid_templates:
        add(f, ("spec", "template"), f"template '{spec.template}' is invalid (see {tf.rel})")
    else:
        template: ExecutionTemplate = tf.obj
        for key in OVERRIDABLE:
            if getattr(spec.overrides, key) is not None and key not in template.allow_overrides:
                allowed = ", ".join(template.allow_overrides) or "nothing"
                add(f, ("spec", "overrides", key), f"template '{template.id}' does not allow overriding '{key}' (allowed: {allowed})")
        if spec.overrides.image and template.launch_mode.kind != "docker":
            add(f, ("spec", "overrides", "image"), "an image only applies to docker launches")
    if spec.overrides.resources is not None:
        r = spec.overrides.resources
        if r.gpu_type and r.gpu_count == 0:
            add(f, ("spec", "overrides", "resources", "gpu_type"), "gpu_type is set but gpu_count is 0")
    seen = set()
    for i, item in enumerate(spec.inputs):
        problem = input_problem(root, item)
        if problem:
            add(f, ("spec", "inputs", i), problem)
        elif item in seen:
            add(f, ("spec", "inputs", i), f"input '{item}' is listed twice")
        seen.add(item)
    if len(set(spec.secrets)) != len(spec.secrets):
        add(f, ("spec", "secrets"), "a secret is named twice")
    _check_staged_paths(root, f, add)
    env_keys = set(getattr(spec.task, "env", {}) or {})
    for name in spec.secrets:
        if name in env_keys:
            add(f, ("spec", "task", "env", name), f"'{name}' is a secret; remove it from env")


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
    if real.is_dir():
        for dirpath, dirnames, filenames in os.walk(full):
            for name in dirnames + filenames:
                child = Path(dirpath) / name
                if child.is_symlink():
                    target = child.resolve()
                    if not target.is_relative_to(real_root):
                        return f"input '{item}' contains a symlink that escapes the repository: {child.relative_to(root)}"
    return None


def _check_staged_paths(root: Path, f, add) -> None:
    """Task values that name staged files (``inputs/...``) must be covered by spec.inputs (or the code pin).

    The entrypoint runs from the bundle's root, where ``inputs/<path>`` holds the repository's
    ``<path>`` for each listed input. A value naming a repository file without the ``inputs/`` prefix
    would be looked up on the execution plane's own disk (or the hub), so it gets a hint too.
    """
    from ..tasks.swift import bundle_paths

    spec = f.obj.spec
    task = spec.task
    if task.type not in ("swift-sft", "swift-rlhf"):
        return
    code_dir = spec.code.path if spec.code is not None else None
    if code_dir is not None:
        for i, item in enumerate(spec.inputs):
            if item == code_dir or item.startswith(code_dir + "/") or code_dir.startswith(item + "/"):
                add(f, ("spec", "code", "path"), f"code.path '{code_dir}' overlaps input '{item}' (both go under inputs/)")
    named = bundle_paths(task)
    for loc, value in named:
        rel = value[len("inputs/"):].rstrip("/")
        covering = [i for i in spec.inputs if rel == i.rstrip("/") or rel.startswith(i.rstrip("/") + "/")]
        if code_dir is not None and (rel == code_dir or rel.startswith(code_dir + "/")):
            continue
        if not covering:
            listed = ", ".join(spec.inputs) if spec.inputs else "none"
            add(f, ("spec", "task") + loc, f"'{value}' is not staged: add '{rel}' (or a folder holding it) to "
                                           f"spec.inputs (listed: {listed})")
        elif not os.path.lexists(root / rel):
            add(f, ("spec", "task") + loc, f"'{value}': '{rel}' does not exist in the repository "
                                           f"(input '{covering[0]}' does not hold it)")
    staged = {loc for loc, _ in named}
    for key in ("dataset", "val_dataset"):
        for i, value in enumerate(getattr(task, key, []) or []):
            path = value.split("#", 1)[0]
            if (key, i) in staged or not path or path.startswith("/"):
                continue
            if input_problem(root, path) is None and (root / path).is_file():
                hint = (f"inputs/{path}" if any(path == x or path.startswith(x.rstrip("/") + "/") for x in spec.inputs)
                        else f"inputs/{path} and list '{path}' in spec.inputs")
                add(f, ("spec", "task", key, i), f"'{value}' is a repository file; the run sees staged files under "
                                                 f"inputs/: use {hint}")
