"""Spec texts, a file writer and the real command line, shared by the validation tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from reconciler.core.yamlsafe import decode, fast_load

REPO = Path(__file__).resolve().parents[2]

TEMPLATE = """\
apiVersion: reconciler/v1
kind: ExecutionTemplate
id: local-host
placement:
  kind: local
launch_mode:
  kind: host_process
allow_overrides: [resources]
"""


def run_text(name: str, template: str = "local-host", extra: str = "") -> str:
    """A valid Run of 9 lines (spec.template on line 6), plus ``extra`` lines under spec."""
    return (f"apiVersion: reconciler/v1\nkind: Run\nmetadata:\n  name: {name}\nspec:\n  template: {template}\n"
            f"  task:\n    type: command\n    argv: [echo, {name}]\n{extra}")


def write(root: Path, rel: str, text: str | bytes) -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(text.encode() if isinstance(text, str) else text)
    return p


def read_yaml(path: Path) -> Any:
    """A YAML file as the reconciler reads it (YAML 1.2 core schema)."""
    return fast_load(decode(path.read_bytes()))


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m reconciler ARGS`` from this checkout."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=60)


def reconcile(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``run_cli``, where a traceback fails the test whatever the exit code."""
    r = run_cli(*args, cwd=cwd)
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    return r
