"""``type: command``: run an argv as is, no shell, from the bundle's root."""

from __future__ import annotations

from . import NOTE, RenderContext, Rendered, quote_argv, register

HEADER = f"#!/bin/sh\n{NOTE}\nset -e\n"


@register("command")
def render(task, ctx: RenderContext) -> Rendered:
    body = HEADER + f"cd \"$RECONCILER_BUNDLE\"\nexec {quote_argv(task.argv)}\n"
    return Rendered(entrypoint=body, env=dict(task.env))
