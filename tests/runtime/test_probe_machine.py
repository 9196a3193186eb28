"""What the probe says about the machine itself: its drain flag, and GPUs used outside the reconciler."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from reconciler.agent import tunnel as agent
from reconciler.machines.remote_agent import agent_program
from reconciler.runtime import probe


def test_drain_flag_round_trip(tmp_path):
    flag = str(tmp_path / ".reconciler" / "drain")
    assert probe.drain_state(flag) is None
    agent.drain("GPU swap", home=str(tmp_path), now=1000.0)
    assert probe.drain_state(flag) == {"reason": "GPU swap", "since": 1000.0}
    assert agent.resume(str(tmp_path)) is True and probe.drain_state(flag) is None
    assert agent.resume(str(tmp_path)) is False


def test_a_hand_written_flag_still_drains(tmp_path):
    flag = tmp_path / "drain"
    flag.write_text("reboot at noon\n")  # touched by hand, not JSON
    assert probe.drain_state(str(flag)) == {"reason": "reboot at noon", "since": None}


FAKE_SMI = """#!/bin/sh
# A fake nvidia-smi (this machine has no GPU): two GPUs, and the compute processes named in $FAKE_APPS.
case "$1" in
  --query-gpu=index,uuid) printf '0, GPU-aaa\\n1, GPU-bbb\\n' ;;
  --query-compute-apps=gpu_uuid,pid) printf "$FAKE_APPS" ;;
  *) exit 2 ;;
esac
"""


def test_foreign_gpus_are_those_held_by_processes_not_started_by_a_launch_wrapper(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    sleep = [sys.executable, "-c", "import time; time.sleep(30)"]
    ours = subprocess.Popen(sleep, env={**os.environ, "RECONCILER_IDENTITY": "r-g1-a1"})
    theirs = subprocess.Popen(sleep, env={k: v for k, v in os.environ.items() if k != "RECONCILER_IDENTITY"})
    try:
        monkeypatch.setenv("FAKE_APPS", f"GPU-aaa, {ours.pid}\\nGPU-bbb, {theirs.pid}\\n")
        assert probe.foreign_gpus(str(smi)) == {"gpus": [1]}
        monkeypatch.setenv("FAKE_APPS", f"GPU-aaa, {ours.pid}\\n")
        assert probe.foreign_gpus(str(smi)) == {"gpus": []}
    finally:
        for p in (ours, theirs):
            p.kill()
            p.wait()


def test_no_nvidia_smi_is_an_error_not_a_crash(tmp_path):
    out = probe.foreign_gpus(str(tmp_path / "absent"))
    assert set(out) == {"error"} and "cannot read the GPUs' processes" in out["error"]


def test_the_probe_reports_both_through_its_command_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    agent.drain("maintenance")
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi: said, not fatal
    # As it runs on a machine: the agent's program on stdin, its arguments as argv.
    program, argv = agent_program({"op": "probe", "root": str(tmp_path / "ws"), "gpu_processes": True})
    p = subprocess.run([sys.executable, "-", *argv], input=program, capture_output=True, text=True,
                       env=dict(os.environ), timeout=30)
    report = json.loads(p.stdout)
    assert report["drain"]["reason"] == "maintenance"
    assert "error" in report["foreign_gpus"]
