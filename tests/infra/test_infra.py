"""Prove the real-part fixtures work: SSH logins, a machine going away and coming back, containers.

These tests guard the infrastructure every e2e test relies on; if one fails, fix the fixture first.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time

import paramiko
import pytest

from tests.infra._proc import alive, wait_until


def test_fabric_runs_a_command(sshd):
    with sshd.connection() as conn:
        result = conn.run("echo hi", hide=True, timeout=10)
    assert result.stdout == "hi\n"
    assert result.exited == 0


def test_fabric_with_plain_connect_kwargs(sshd):
    """The minimal fabric set-up a reconciler transport would use, without the helper."""
    import fabric

    conn = fabric.Connection(
        sshd.host,
        user=sshd.user,
        port=sshd.port,
        connect_timeout=5,
        connect_kwargs={"key_filename": str(sshd.identity_file), "look_for_keys": False, "allow_agent": False},
    )
    with conn:
        # in_stream=False: invoke would otherwise read the test's stdin, which pytest forbids.
        assert conn.run("id -un; pwd", hide=True, in_stream=False).stdout.split() == [sshd.user, sshd.home]


def test_ssh_cli_run_as_test_user(sshd):
    result = sshd.run("id -un && echo $HOME && touch $HOME/.rc-probe && rm $HOME/.rc-probe")
    assert result.stdout.split() == [sshd.user, sshd.home]
    assert sshd.run("exit 3", check=False).returncode == 3


def test_host_key_lines(sshd):
    assert sshd.host_key.startswith("ssh-ed25519 AAAA")
    assert sshd.known_hosts_line == f"[127.0.0.1]:{sshd.port} {sshd.host_key}"
    other = sshd.other_host_key()
    assert other.startswith("ssh-ed25519 AAAA") and other != sshd.host_key


def test_server_presents_the_advertised_host_key(sshd):
    with socket.create_connection((sshd.host, sshd.port), timeout=5) as sock:
        transport = paramiko.Transport(sock)
        try:
            transport.start_client(timeout=5)
            key = transport.get_remote_server_key()
        finally:
            transport.close()
    assert f"{key.get_name()} {key.get_base64()}" == sshd.host_key


def test_wrong_host_key_is_rejected(sshd, tmp_path):
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(sshd.known_hosts_entry(sshd.other_host_key()) + "\n")
    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.BadHostKeyException):
        client.connect(sshd.host, sshd.port, sshd.user, timeout=5, **sshd.connect_kwargs())
    client.close()


def test_machine_goes_away_and_comes_back(sshd_factory):
    server = sshd_factory()
    port, host_key = server.port, server.host_key
    with server.connection() as conn:
        assert conn.run("echo before", hide=True).stdout == "before\n"

    server.stop()
    started = time.monotonic()
    with pytest.raises((OSError, paramiko.SSHException)):
        with server.connection(connect_timeout=2) as conn:
            conn.open()
    assert time.monotonic() - started < 2, "a stopped machine must be refused quickly, not time out"

    server.start()
    assert server.port == port
    # Strict host key checking against the original known_hosts: the identity is unchanged.
    with server.connection() as conn:
        assert conn.run("echo after", hide=True).stdout == "after\n"
        assert f"{conn.client.get_transport().get_remote_server_key().get_base64()}" == host_key.split()[1]


def _start_remote_sleep(server) -> tuple[subprocess.Popen, int]:
    """Run ``sleep 30`` over ssh; return the local ssh client and the remote shell's pid."""
    proc = subprocess.Popen([*server.ssh_command(), "echo $$; exec sleep 30"], stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


@pytest.mark.parametrize("kill_processes", [False, True])
def test_stop_drops_open_sessions(sshd_factory, kill_processes):
    server = sshd_factory()
    proc, remote_pid = _start_remote_sleep(server)
    try:
        server.stop(kill_processes=kill_processes)
        proc.wait(timeout=5)  # the session ends with the server, it does not hang
        assert proc.returncode != 0
        # Network-loss semantics leave the command running; reboot semantics end it.
        assert alive(remote_pid) is not kill_processes
        server.close()
        assert not alive(remote_pid), "close() must end the commands its sessions left running"
    finally:
        proc.kill()
        proc.wait()


def test_extra_server_on_another_loopback_address(sshd, sshd_factory):
    other = sshd_factory(host="127.0.0.2")
    assert other.host == "127.0.0.2"
    assert other.known_hosts_line.startswith(f"[127.0.0.2]:{other.port} ssh-ed25519 ")
    assert other.host_key != sshd.host_key
    assert other.run("echo two").stdout == "two\n"


def test_docker_runs_busybox(dockerd):
    result = dockerd.docker(
        "run", "--rm", "--pull=never", "--network", "none", dockerd.image, "echo", "ok", timeout=60
    )
    assert result.stdout == "ok\n"


def test_docker_image_has_a_usable_shell(dockerd):
    script = 'trap "echo trapped" TERM; mkdir -p /tmp/x && cd /tmp/x && printf "%s\\n" "$(id -u)" && /usr/bin/env true'
    result = dockerd.docker("run", "--rm", "--pull=never", "--network", "none", dockerd.image, "sh", "-c", script)
    assert result.stdout == "0\n"


def test_docker_missing_image_fails_clearly(dockerd):
    result = dockerd.docker(
        "run", "--rm", "--pull=never", "--network", "none", "reconciler-test/absent:latest", "true", check=False
    )
    assert result.returncode != 0
    assert "No such image" in result.stderr


def test_detached_container_is_stopped_and_removed(dockerd):
    cid = dockerd.docker(
        "run", "-d", "--pull=never", "--network", "none", dockerd.image, "sleep", "300"
    ).stdout.strip()
    try:
        assert dockerd.docker("inspect", "-f", "{{.State.Running}}", cid).stdout.strip() == "true"
        dockerd.docker("kill", cid)
        wait_until(
            lambda: dockerd.docker("inspect", "-f", "{{.State.Running}}", cid).stdout.strip() == "false",
            10,
            what="container to stop",
        )
    finally:
        dockerd.docker("rm", "-f", cid, check=False)
    assert cid not in dockerd.docker("ps", "-aq", "--no-trunc").stdout


def test_docker_through_ssh_as_test_user(sshd, dockerd):
    result = sshd.run(f"docker -H {dockerd.host} ps --format '{{{{.ID}}}}' && echo reachable")
    assert result.stdout.strip().endswith("reachable")
    result = sshd.run(
        f"docker -H {dockerd.host} run --rm --pull=never --network none {dockerd.image} sh -c 'echo via-ssh'"
    )
    assert result.stdout == "via-ssh\n"


def test_dockerd_env(dockerd):
    assert dockerd.env() == {"DOCKER_HOST": dockerd.host}
    assert dockerd.host.startswith("unix:///tmp/") and len(dockerd.host) < 100


def test_slurm_runs_jobs_on_two_nodes_with_fake_gpus(slurm, tmp_path):
    out = tmp_path / "out"
    job = slurm.command("sbatch", "--parsable", "-N", "2", "--ntasks-per-node=1", "--gres=gpu:1",
                        "-o", str(out), "--wrap", "srun sh -c 'echo $SLURM_NODEID:$CUDA_VISIBLE_DEVICES'").strip()
    wait_until(lambda: "COMPLETED" in slurm.command("scontrol", "show", "job", job), 30, what="the job to complete")
    assert sorted(out.read_text().split()) == ["0:0", "1:0"]
    # More GPUs than a node has is refused at submission.
    r = subprocess.run(["sbatch", "--gres=gpu:3", "--wrap", "true"], capture_output=True, text=True,
                       env={**os.environ, **slurm.env})
    assert r.returncode != 0 and "not available" in r.stderr


def test_an_sshd_whose_port_was_taken_before_it_started_listens_on_another(tmp_path):
    """Two test runs side by side may be handed the same free port: the second sshd must not take
    the first one's listener for its own (its host key would not be the one it advertises)."""
    from tests.infra.sshd import SshServer

    server = SshServer(tmp_path / "sshd")
    taken = server.port
    with socket.socket() as other:  # another process, listening on the port first
        other.bind((server.host, taken))
        other.listen()
        try:
            server.start()
            assert server.port != taken and server.running
            assert server.known_hosts_line.startswith(f"[{server.host}]:{server.port} ")
            assert server.run("id -un").stdout.strip() == server.user  # its own key, its own port
        finally:
            server.close()
