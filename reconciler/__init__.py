"""A declarative, GitOps-style reconciler for training runs on GPUs you rent or own.

Desired state lives in a git repository (``specs/``, ``execution_templates/``); observed state
is read from the machines; the reconciler converges the two and commits what it saw to ``status/``.
"""

__version__ = "0.1.0"  # the one place: pyproject.toml reads it (dynamic), `reconcile --version` prints it
API_VERSION = "reconciler/v1"
