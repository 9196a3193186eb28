"""An execution template's own consistency beyond its schema, and the Slurm login hosts templates
name (a Fleet machine, one workspace root each)."""

from __future__ import annotations

from typing import Any

from .raw import _at, _count, _dict, _list, _text

MULTI_NODE_PLACEMENTS = ("ssh", "slurm")
MULTI_NODE_PLACEMENT = "a run across several machines (nodes > 1) needs ssh or slurm placement"


def _check_template(f, add) -> None:
    t = f.data
    mode = _at(t, "launch_mode", "kind")
    defaults = _dict(t.get("defaults"))
    allow = [k for k in _list(t.get("allow_overrides")) if isinstance(k, str)]
    image = _text(defaults.get("image"))
    if mode == "docker" and not image and "image" not in allow:
        add(f, ("launch_mode",), "docker launches need defaults.image (or allow_overrides: [image])")
    if mode == "host_process" and image:
        add(f, ("defaults", "image"), "an image only applies to docker launches")
    if _at(t, "placement", "kind") == "local" and _text(defaults.get("target")):
        add(f, ("defaults", "target"), "local placement runs on this machine; target is for ssh placement")
    if len(set(allow)) != len(allow):
        add(f, ("allow_overrides",), "lists a key twice")
    resources = defaults.get("resources")
    if isinstance(resources, dict) and _text(resources.get("gpu_type")) and _count(resources.get("gpu_count")) == 0:
        add(f, ("defaults", "resources", "gpu_type"), "gpu_type is set but gpu_count is 0")
    if isinstance(resources, dict) and type(resources.get("nodes")) is int and resources["nodes"] > 1 \
            and _at(t, "placement", "kind") not in MULTI_NODE_PLACEMENTS:
        add(f, ("defaults", "resources", "nodes"), MULTI_NODE_PLACEMENT)


def _check_slurm_logins(template_files: list, machines: dict[str, Any], add) -> None:
    """A Slurm template's login host is this machine or a Fleet machine, and one login host has
    one workspace root (the cluster is observed as one machine, under that root)."""
    roots: dict[str, tuple[str, Any]] = {}  # login host → its workspace root, and the file naming it
    for f in sorted(template_files, key=lambda f: f.rel):
        if _at(f.data, "placement", "kind") != "slurm":
            continue
        login = _at(f.data, "placement", "slurm", "login")
        login = login if isinstance(login, str) else "local"
        if login != "local" and login not in machines:
            known = ", ".join(sorted(machines)[:8]) or "no Fleet declares any"
            add(f, ("placement", "slurm", "login"), f"login host '{login}' is not a Fleet machine (known: {known}); "
                                                    "use local for this machine")
        root_dir = _at(f.data, "placement", "slurm", "workspace_root")
        if not isinstance(root_dir, str):
            continue
        first = roots.setdefault(login, (root_dir, f))
        if first[0] != root_dir:
            add(f, ("placement", "slurm", "workspace_root"), f"login host '{login}' has workspace_root "
                f"'{first[0]}' in {first[1].rel}: one cluster, one root")
