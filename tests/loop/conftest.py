"""Fixtures for the loop tests: a workspace root whose processes are all killed afterwards."""

from __future__ import annotations

import os
import signal

import pytest

from tests.repo_helpers import processes_with


@pytest.fixture
def ws_root(tmp_path):
    root = tmp_path / "ws"
    yield root
    for pid in processes_with(str(root)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
