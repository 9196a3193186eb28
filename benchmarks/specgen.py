"""The spec texts the benchmarks generate, written once: a local host template and Run specs."""

from __future__ import annotations

TEMPLATE = """apiVersion: reconciler/v1
kind: ExecutionTemplate
id: local-host
placement: {kind: local}
launch_mode: {kind: host_process}
allow_overrides: [resources, runtime_env]
"""


def run_spec(name: str, i: int, argv: str, env: dict[str, str], middle: str = "", tail: str = "",
             max_retries: int = 2, backoff: int = 30) -> str:
    """A ~20-line Run. ``middle`` goes after the template line, ``tail`` after restartPolicy."""
    env_lines = "".join(f"      {k}: {v}\n" for k, v in env.items())
    return (f"apiVersion: reconciler/v1\nkind: Run\nmetadata:\n  name: {name}\n  labels:\n    team: bench\n"
            f"    index: \"{i}\"\nspec:\n  template: local-host\n{middle}  task:\n    type: command\n"
            f"    argv: {argv}\n    env:\n{env_lines}  restartPolicy:\n    maxRetries: {max_retries}\n"
            f"    backoffSeconds: {backoff}\n{tail}")
