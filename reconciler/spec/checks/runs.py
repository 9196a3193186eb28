"""A run against its template: the template exists and is valid, overrides are allowed, GPUs and
nodes make sense, inputs and secrets are listed once, its priority class is defined."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..models.template import OVERRIDABLE, ExecutionTemplate
from .inputs import _check_staged_paths, input_problem
from .raw import _at, _dict, _list, _text
from .rental import _check_rental
from .swift_args import _check_swift_args
from .templates import MULTI_NODE_PLACEMENT, MULTI_NODE_PLACEMENTS


def check_runs(root: Path, checked: list, lookup: dict[str, Any], add, invalid_templates: set[str],
               providers: dict, policy) -> None:
    """Every run, and the priority class it names (one of the Policy's)."""
    classes = None
    if policy is not None:
        classes = {c.get("name") for c in _list(_at(policy.data, "spec", "priorityClasses")) if isinstance(c, dict)}
    for f in checked:
        if f.kind == "Run":
            _check_run(root, f, lookup, add, invalid_templates, providers)
            prio = _at(f.data, "spec", "priority")
            if isinstance(prio, str) and prio not in (classes or set()):
                known = ", ".join(sorted(c for c in classes or () if isinstance(c, str))) or "none: no Policy defines any"
                add(f, ("spec", "priority"), f"priority class '{prio}' is not defined (known: {known})")


def _check_run(root: Path, f, templates: dict, add, invalid_templates: set[str], providers: dict) -> None:
    spec = f.data.get("spec")
    if not isinstance(spec, dict):
        return
    overrides = _dict(spec.get("overrides"))
    template: ExecutionTemplate | None = None
    name = spec.get("template")
    if isinstance(name, str):
        tf = templates.get(name)
        if tf is None:
            hint = f" (known: {', '.join(sorted(templates)[:8])})" if templates else " (execution_templates/ is empty)"
            add(f, ("spec", "template"), f"template '{name}' not found{hint}")
        elif not tf.ok or tf.rel in invalid_templates:
            add(f, ("spec", "template"), f"template '{name}' is invalid (see {tf.rel})")
        else:
            template = tf.obj
    if template is not None:
        for key in OVERRIDABLE:
            if overrides.get(key) is not None and key not in template.allow_overrides:
                allowed = ", ".join(template.allow_overrides) or "nothing"
                add(f, ("spec", "overrides", key), f"template '{template.id}' does not allow overriding '{key}' (allowed: {allowed})")
        if _text(overrides.get("image")) and template.launch_mode.kind != "docker":
            add(f, ("spec", "overrides", "image"), "an image only applies to docker launches")
        if spec.get("slurm") is not None and template.placement.kind != "slurm":
            add(f, ("spec", "slurm"), f"spec.slurm only applies to slurm placement (template '{template.id}' "
                                      f"places runs by {template.placement.kind})")
    _check_gpus(f, overrides, template, add)
    _check_nodes(f, overrides, template, add)
    if template is not None and template.placement.kind == "rental":
        _check_rental(f, overrides, template, providers, add)
    seen = set()
    for i, item in enumerate(_list(spec.get("inputs"))):
        if not isinstance(item, str):
            continue
        problem = input_problem(root, item)
        if problem:
            add(f, ("spec", "inputs", i), problem)
        elif item in seen:
            add(f, ("spec", "inputs", i), f"input '{item}' is listed twice")
        seen.add(item)
    secrets = [s for s in _list(spec.get("secrets")) if isinstance(s, str)]
    if len(set(secrets)) != len(secrets):
        add(f, ("spec", "secrets"), "a secret is named twice")
    task = spec.get("task")
    if not isinstance(task, dict):
        return
    _check_staged_paths(root, f, spec, task, add)
    _check_swift_args(f, task, add)
    env = task.get("env") if task.get("type") == "command" else None
    for name in secrets:
        if isinstance(env, dict) and name in env:
            add(f, ("spec", "task", "env", name), f"'{name}' is a secret; remove it from env")


def _check_nodes(f, overrides: dict, template: ExecutionTemplate | None, add) -> None:
    res = _dict(overrides.get("resources"))
    nodes = res.get("nodes")
    if template is None or type(nodes) is not int or nodes <= 1 or "resources" not in template.allow_overrides:
        return
    if template.placement.kind not in MULTI_NODE_PLACEMENTS:
        add(f, ("spec", "overrides", "resources", "nodes"), f"{MULTI_NODE_PLACEMENT}; template '{template.id}' "
                                                            f"has {template.placement.kind} placement")


def _check_gpus(f, overrides: dict, template: ExecutionTemplate | None, add) -> None:
    """A GPU type with no GPU, whether the run or its template sets which half.

    The template's own defaults are checked with the template; here the run's override, alone and
    applied to the template's defaults (what ``resolve.effective`` computes and the planner places).
    """
    res = overrides.get("resources")
    if not isinstance(res, dict):
        return
    loc = ("spec", "overrides", "resources")
    gpu_type, gpu_count = res.get("gpu_type"), res.get("gpu_count")
    if not isinstance(gpu_type, (str, type(None))) or not (gpu_count is None or type(gpu_count) is int):
        return  # the schema reports the value
    if gpu_type and gpu_count == 0:
        add(f, loc + ("gpu_type",), "gpu_type is set but gpu_count is 0")
        return
    if template is None or "resources" not in template.allow_overrides:
        return  # no template to apply it to, or the override is refused (and reported) already
    base = template.defaults.resources
    if gpu_type and gpu_count is None and base.gpu_count == 0:
        add(f, loc + ("gpu_type",), f"gpu_type is set but the effective gpu_count is 0 (template '{template.id}' "
                                    "defaults to 0 GPUs): set overrides.resources.gpu_count")
    elif gpu_type is None and gpu_count == 0 and base.gpu_type:
        add(f, loc + ("gpu_count",), f"gpu_count is 0 but template '{template.id}' sets gpu_type "
                                     f"'{base.gpu_type}': a GPU type needs a GPU (override gpu_type too, or use a "
                                     "template without one)")
