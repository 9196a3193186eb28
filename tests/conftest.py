"""Fixtures shared by every test folder: the real sshd and dockerd (tests/infra), and a workspace
root on this machine whose processes are all killed when the test ends; and how the suite is spread
over pytest-xdist's workers (pyproject.toml: ``-n 4 --dist loadfile``)."""

from __future__ import annotations

import os
import signal

import pytest

from tests.repo_helpers import processes_with

pytest_plugins = ["tests.infra.fixtures"]

# Most tests write a spec and run a pass without committing it (they test the pass, not git), so
# the suite's reconcilers, in this process and in the ``reconcile`` processes it starts, launch
# uncommitted specs; tests/engine/test_uncommitted.py sets it back to the default, false.
os.environ.setdefault("RECONCILER_ALLOW_DIRTY", "true")

# Files whose tests start processes as root under run names other files use too, and those that
# need the Slurm cluster: on one worker, one after the other, so that a process count of one never
# sees the other's jobs, and one cluster serves them all.
SHARED_GROUPS = {
    "tests/engine/test_local_e2e.py": "root-processes",
    "tests/engine/test_faults.py": "root-processes",
    "tests/e2e/test_multinode.py": "root-processes",
    "tests/machines/test_slurm.py": "root-processes",
    "tests/e2e/test_slurm_e2e.py": "root-processes",
    "tests/infra/test_infra.py": "root-processes",
}

# The slowest files apart from the e2e scenarios (each 10 s or more on one core): handed out first
# with those, so that no worker is left running one of them alone at the end.
HEAVY = (
    "tests/test_packaging.py",
    "tests/tasks/test_swift_args.py",
    "tests/test_workflows.py",
    "tests/spec/test_editor.py",
    "tests/rentals/test_targon.py",
    "tests/rentals/test_lifecycle.py",
    "tests/security/test_probe_boundary.py",
    "tests/security/test_status_and_logs.py",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadfile``, with the files of SHARED_GROUPS as one unit of work (``--dist loadgroup``
    cannot do it here: pytest-xdist 3.8 marks a test's group in an attribute pytest 9 no longer reads)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return SHARED_GROUPS.get(path, path)

    return FileScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On pytest-xdist's workers the slow files come first (with ``--no-loadscope-reorder`` they
    are handed out in this order), so that none is left to run alone at the end."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return

    def slow(item: pytest.Item) -> bool:
        path = item.nodeid.split("::", 1)[0]
        return (item.get_closest_marker("e2e") is not None or path in HEAVY
                or path in SHARED_GROUPS)

    # A stable sort: the same order on every worker, as xdist requires.
    items.sort(key=lambda item: not slow(item))


@pytest.fixture
def ws_root(tmp_path):
    root = tmp_path / "ws"
    yield root
    for pid in processes_with(str(root)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
