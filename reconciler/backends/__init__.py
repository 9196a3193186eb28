"""Backends by key ``<placement>_<launch_mode>``: the only thing that selects one."""

from __future__ import annotations

BACKEND_KEYS = ("local_host_process", "local_docker", "ssh_host_process", "ssh_docker")


def split(key: str) -> tuple[str, str]:
    placement, _, mode = key.partition("_")
    return placement, mode
