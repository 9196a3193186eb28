"""The command line's shared fixture: one repository whose run has succeeded, per test module."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_cli import JOB
from tests.repo_helpers import make_repo, pass_until, reconciler as make_reconciler, run_spec


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> tuple[Path, dict]:
    """A repository whose run ``hello`` has succeeded on this machine, and the environment to read it."""
    tmp = tmp_path_factory.mktemp("cli")
    repo = make_repo(tmp / "repo", {"hello": run_spec("hello", JOB)})
    ws = tmp / "ws"
    pass_until(make_reconciler(repo, ws), "hello", "Succeeded")
    return repo, {"RECONCILER_WORKSPACE_ROOT": str(ws), "RECONCILER_NAMESPACE": "test"}
