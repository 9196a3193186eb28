"""The ms-swift environment the ``swift``-marked tests run ms-swift's own code in.

The control plane never imports swift, so what it knows of ms-swift (argument names, types,
choices) is checked against the real thing in a separate interpreter: RECONCILER_SWIFT_PYTHON
(default /opt/swift-venv/bin/python). Without it those tests skip; with CI=true they fail instead,
as the e2e swift tests do.
"""

from __future__ import annotations

import os
import subprocess

import pytest

SWIFT_PYTHON = os.environ.get("RECONCILER_SWIFT_PYTHON", "/opt/swift-venv/bin/python")
INSTALL_HINT = "set RECONCILER_SWIFT_PYTHON or run .ci/install-swift.sh /opt/swift-venv"


@pytest.fixture(scope="session")
def swift_python() -> str:
    problem = None
    if not os.access(SWIFT_PYTHON, os.X_OK):
        problem = f"no ms-swift python at {SWIFT_PYTHON}"
    else:
        p = subprocess.run([SWIFT_PYTHON, "-c", "import swift"], capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            problem = f"{SWIFT_PYTHON} cannot import swift: {p.stderr.strip()[-300:]}"
    if problem:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{problem}: {INSTALL_HINT}", pytrace=False)
        pytest.skip(f"{problem}: {INSTALL_HINT}")
    return SWIFT_PYTHON
