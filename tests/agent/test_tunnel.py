"""``reconcile agent``: authorize's output and errors, drain and resume, and usage errors. The tunnel
itself runs end to end in tests/e2e/test_inhouse.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

FLEET = textwrap.dedent("""\
    apiVersion: reconciler/v1
    kind: Fleet
    metadata: {name: lab}
    spec:
      machines:
        - name: inhouse-1
          connect: tunnel
          tunnel_port: 30024
          ssh: {host: gpu-1.lab.example, user: train, host_key: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHabkw7ILXAgq2JQD8TN++zRtBACjuiUiEZ99iJmmjZl"}
        - name: direct-1
          ssh: {host: gpu-2.lab.example, user: train, host_key: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHabkw7ILXAgq2JQD8TN++zRtBACjuiUiEZ99iJmmjZl"}
    """)
PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHabkw7ILXAgq2JQD8TN++zRtBACjuiUiEZ99iJmmjZl agent@gpu-1\n"


def reconcile(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reconciler", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def repo(tmp_path):
    (tmp_path / "specs" / "fleets").mkdir(parents=True)
    (tmp_path / "specs" / "fleets" / "lab.yaml").write_text(FLEET)
    (tmp_path / "agent.pub").write_text(PUB)
    return tmp_path


def test_authorize_prints_the_key_line_and_the_match_block(repo):
    p = reconcile("agent", "authorize", "inhouse-1", "--key", "agent.pub", "--vm-user", "tun", cwd=repo)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    key = next(line for line in lines if line.startswith("restrict,"))
    assert key == ('restrict,port-forwarding,permitlisten="127.0.0.1:30024",command="/bin/false" '
                   "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHabkw7ILXAgq2JQD8TN++zRtBACjuiUiEZ99iJmmjZl "
                   "reconcile-agent@inhouse-1")
    block = lines[lines.index("Match User tun"):]
    assert [b.strip() for b in block] == ["Match User tun", "AllowTcpForwarding remote", "PermitOpen none",
                                          "PermitListen 127.0.0.1:30024", "GatewayPorts no", "X11Forwarding no",
                                          "AllowAgentForwarding no", "AllowStreamLocalForwarding no",
                                          "PermitTunnel no", "PermitTTY no", "ForceCommand /bin/false",
                                          "ClientAliveInterval 5", "ClientAliveCountMax 2"]
    assert "# 1. The login the agents use (once): useradd -m -s /usr/sbin/nologin tun && usermod -p '*' tun" in lines


def test_a_second_machine_prints_one_block_for_both(repo):
    # sshd keeps the first value of each keyword (sshd_config(5)): a second Match block for the
    # same login would never apply, so the block printed for any machine lists every port.
    fleet = FLEET.replace("    - name: direct-1\n", "    - name: inhouse-2\n      connect: tunnel\n      tunnel_port: 30031\n"
                          f"      ssh: {{host: gpu-3.lab.example, user: train, host_key: \"{PUB.split(' agent')[0]}\"}}\n"
                          "    - name: direct-1\n")
    assert "inhouse-2" in fleet
    (repo / "specs" / "fleets" / "lab.yaml").write_text(fleet)
    for name, port in (("inhouse-1", 30024), ("inhouse-2", 30031)):
        p = reconcile("agent", "authorize", name, "--key", "agent.pub", "--vm-user", "tun", cwd=repo)
        assert p.returncode == 0, p.stderr
        assert sum(line.startswith("Match ") for line in p.stdout.splitlines()) == 1 and "REPLACE any earlier 'Match User tun' block" in p.stdout
        assert "    PermitListen 127.0.0.1:30024 127.0.0.1:30031" in p.stdout.splitlines()
        assert f'permitlisten="127.0.0.1:{port}"' in p.stdout and f"reconcile-agent@{name}" in p.stdout
    # One VM login per machine instead: --only.
    p = reconcile("agent", "authorize", "inhouse-2", "--key", "agent.pub", "--vm-user", "tun2", "--only",
                  "--client-alive", "3", cwd=repo)
    assert "    PermitListen 127.0.0.1:30031" in p.stdout.splitlines() and "ClientAliveInterval 3" in p.stdout


@pytest.mark.parametrize("args, message", [
    (["nope", "--key", "agent.pub"], "no Fleet declares machine 'nope'"),
    (["direct-1", "--key", "agent.pub"], "machine 'direct-1' has connect: ssh; set connect: tunnel"),
    (["inhouse-1", "--key", "missing.pub"], "missing.pub: No such file or directory"),
    (["inhouse-1", "--key", "specs/fleets/lab.yaml"], "not a public key"),
])
def test_authorize_errors_are_one_line(repo, args, message):
    p = reconcile("agent", "authorize", *args, cwd=repo)
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr
    assert p.stdout == ""


def test_run_usage_errors(tmp_path):
    p = reconcile("agent", "run", "--vm", "host-only", "--listen-port", "30024", cwd=tmp_path)
    assert p.returncode == 2 and "--vm must be USER@HOST" in p.stderr
    p = reconcile("agent", "run", "--vm", "u@h", "--listen-port", "70000", cwd=tmp_path)
    assert p.returncode == 2 and "--listen-port must be a port" in p.stderr


def test_drain_and_resume_from_the_command_line(tmp_path):
    p = reconcile("agent", "drain", "--home", str(tmp_path), "--reason", "new PSU", cwd=tmp_path)
    assert p.returncode == 0 and (tmp_path / ".reconciler" / "drain").is_file()
    assert '"reason": "new PSU"' in (tmp_path / ".reconciler" / "drain").read_text()
    assert reconcile("agent", "resume", "--home", str(tmp_path), cwd=tmp_path).stdout.strip() == "resumed"
    assert reconcile("agent", "resume", "--home", str(tmp_path), cwd=tmp_path).stdout.strip() == "was not drained"


def test_a_tunnel_without_its_port_is_a_located_validation_error(repo):
    (repo / "specs" / "fleets" / "lab.yaml").write_text(FLEET.replace("      tunnel_port: 30024\n", ""))
    p = reconcile("validate", cwd=repo)
    assert p.returncode == 1
    assert "specs/fleets/lab.yaml:6:" in p.stdout + p.stderr
    assert "connect: tunnel needs tunnel_port" in p.stdout + p.stderr


def test_the_machine_wide_flag_comes_first_and_is_not_the_logins(tmp_path):
    # Jobs run in the login's home, so they could remove its flag; root's flag they cannot. The
    # real /etc/reconciler/drain would drain every test machine of this host: a path of our own.
    from reconciler.agent import tunnel as agent
    from reconciler.runtime import probe

    home, machine_wide = tmp_path / "home", tmp_path / "etc-reconciler" / "drain"
    agent.drain("disk swap", path=machine_wide)
    agent.drain("mine", home=str(home))
    assert probe.drain_state(str(home / ".reconciler" / "drain"), str(machine_wide))["reason"] == "disk swap"
    assert agent.resume(path=machine_wide) and not machine_wide.exists()
    assert probe.drain_state(str(home / ".reconciler" / "drain"), str(machine_wide))["reason"] == "mine"
    assert agent.drain_path(machine_wide=True) == Path("/etc/reconciler/drain")
    p = reconcile("agent", "drain", "--machine-wide", "--home", str(home), cwd=tmp_path)
    assert p.returncode == 2 and "--machine-wide and --home" in p.stderr
