"""Fixtures of the machines' tests."""

from __future__ import annotations

import os
import signal

import pytest

from reconciler.machines import local_launch
from reconciler.machines.base import MachineInfo
from reconciler.machines.local import LocalTransport


@pytest.fixture
def transport(tmp_path):
    """This machine as a transport, its workspaces under ``tmp_path``; every process group a test
    launched there is killed and reaped after it."""
    t = LocalTransport(MachineInfo("local", str(tmp_path / "ws")))
    yield t
    for pid_file in (tmp_path / "ws").glob("*/runtime/pid"):
        try:
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass
    local_launch.reap()
