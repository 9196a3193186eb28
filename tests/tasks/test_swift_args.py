"""The committed ms-swift argument data (names, types, choices) equals what the installed ms-swift declares.

``reconciler/tasks/swift_args.json`` is what ``reconcile validate`` checks ``args`` keys against; the
control plane never imports swift, so the list is generated (``scripts/swift_args.py``) with the
execution plane's python and committed. This test runs that script with the ms-swift environment
(RECONCILER_SWIFT_PYTHON, default /opt/swift-venv/bin/python) and fails when the two disagree, so an
ms-swift upgrade cannot leave validation refusing new arguments or accepting removed ones. Without
the environment it skips; with CI=true it fails instead, as the e2e swift tests do.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.swift

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "swift_args.py"
COMMITTED = ROOT / "reconciler" / "tasks" / "swift_args.json"


def test_committed_argument_lists_match_the_installed_ms_swift(swift_python: str) -> None:
    p = subprocess.run([swift_python, str(SCRIPT)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    generated, committed = json.loads(p.stdout), json.loads(COMMITTED.read_text(encoding="utf-8"))
    regenerate = f"regenerate: {swift_python} scripts/swift_args.py --write"
    for command in ("sft", "rlhf"):
        new, old = set(generated[command]), set(committed[command])
        changed = sorted(k for k in new & old if generated[command][k] != committed[command][k])
        assert not changed, f"swift {command}: types or choices changed for {changed[:20]}; " + regenerate
        assert new == old, (f"swift {command}: ms-swift {generated['ms_swift']} adds {sorted(new - old)[:20]} and "
                            f"removes {sorted(old - new)[:20]} against the list of ms-swift {committed['ms_swift']}; "
                            + regenerate)
    assert p.stdout == COMMITTED.read_text(encoding="utf-8"), regenerate  # the version and the layout too
