"""The soak harness itself (``benchmarks/soak.py``): it runs, and its referee catches what it looks for.

Not a soak: 15 s of faults with 1-3 s runs, against the real daemon, with three violations planted
on purpose (two instances of one run alive together, an instance of a spec nobody asked for, a
commit by the reconciler's author outside ``status/``). Whatever else the run finds is the long
soak's business (docs/benchmarks.md); here the planted kinds must be counted, the figures must show
that the faults and the daemon really ran, and nothing the harness started may be left behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
PLANTED = ("double_run", "stale_generation", "outside_status")


def processes_mentioning(text: str) -> list[int]:
    """Live pids whose command line or environment names ``text``."""
    needle = text.encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
            if stat[stat.rfind(")") + 2:].split()[0] in ("Z", "X"):
                continue
            for part in ("cmdline", "environ"):
                with open(f"/proc/{entry}/{part}", "rb") as fh:
                    if needle in fh.read():
                        out.append(int(entry))
                        break
        except OSError:
            continue
    return out


def test_soak_runs_and_its_referee_catches_planted_violations(tmp_path):
    work = tmp_path / "soak"
    args = [sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--seconds", "15", "--seed", "7", "--sleep", "1-3",
            "--workdir", str(work), "--json", "--quiet", "--converge-timeout", "90"]
    for kind in PLANTED:
        args += ["--plant", kind]
    p = subprocess.run(args, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert p.returncode in (0, 1), f"the harness failed (exit {p.returncode}):\n{p.stderr[-3000:]}"
    report = json.loads(p.stdout)

    # Planted violations are never a clean exit, and each is counted under its kind.
    assert p.returncode == 1
    assert report["planted"] == {kind: 1 for kind in PLANTED}
    for kind in PLANTED:
        assert report["violations"][kind] >= 1, report["details"]

    # The real daemon ran passes and pushed status; the user pushed; runs were launched and ended.
    assert report["daemon"]["passes"] >= 5
    assert report["status_commits"]["total"] >= 1 and report["pushes"]["daemon"] >= 1
    assert report["pushes"]["user"] >= 2
    assert report["job_ends"]["launches_seen"] >= 3
    assert report["final"]["runs"] >= 3 and report["final"]["daemon_exit"] == 0

    # Nothing it started is left: daemons (their --repo is under the workdir) and runs (their
    # environment names their workspace under it).
    deadline = time.monotonic() + 10
    while processes_mentioning(str(work)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_mentioning(str(work)) == []
