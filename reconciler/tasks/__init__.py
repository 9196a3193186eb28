"""Task plugins: each turns a typed task into the bundle's entrypoint and supporting files.

A plugin is a function ``render(task, ctx) -> Rendered`` registered under the task's ``type``.
The entrypoint is a POSIX shell script run by the launch wrapper from the bundle's root, so
``inputs/...`` paths are the same on every machine and in every container.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


NOTE = "# Rendered by the reconciler from the run's task; do not edit."


@dataclass
class RenderContext:
    identity: str
    python: str | None  # the execution plane's python, when the task needs one
    resume_from: str | None = None  # bundle-relative checkpoint path from a previous attempt
    gpus: list[int] = field(default_factory=list)
    bundle: Path | None = None  # the bundle being built, inputs/ already staged (read-only for renderers)


@dataclass
class Rendered:
    entrypoint: str
    files: dict[str, bytes] = field(default_factory=dict)  # bundle-relative path → content
    env: dict[str, str] = field(default_factory=dict)  # plain (non-secret) environment
    helpers: tuple[str, ...] = ()  # shipped runtime files the entrypoint runs (artifacts/shipped.py)


def quote_argv(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def env_lines(env: dict[str, str]) -> str:
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items()))


_RENDERERS: dict[str, Callable] = {}


def register(type_: str):
    def deco(fn):
        _RENDERERS[type_] = fn
        return fn

    return deco


def render(task, ctx: RenderContext) -> Rendered:
    from . import command, swift  # noqa: F401 - registration

    return _RENDERERS[task.type](task, ctx)
