"""Fixtures shared by every test folder: the real sshd and dockerd (tests/infra), and a workspace
root on this machine whose processes are all killed when the test ends."""

from __future__ import annotations

import os
import signal

import pytest

from tests.repo_helpers import processes_with

pytest_plugins = ["tests.infra.fixtures"]


@pytest.fixture
def ws_root(tmp_path):
    root = tmp_path / "ws"
    yield root
    for pid in processes_with(str(root)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
