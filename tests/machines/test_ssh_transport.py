"""SshTransport against a real sshd: one round trip per operation, host keys, error mapping."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import time
from pathlib import Path

import pytest

from reconciler.machines.base import MachineInfo
from reconciler.machines.remote_agent import ARGV_LIMIT, agent_hash, agent_program
from reconciler.machines.ssh import SshTransport
from reconciler.core.errors import PermanentError, TemporaryError
from reconciler.spec.models.fleet import Machine
from tests.world import remote_root


def info(server, root: str, **ssh) -> MachineInfo:
    endpoint = {"host": server.host, "port": server.port, "user": server.user,
                "identity_file": str(server.identity_file), "host_key": server.host_key}
    endpoint.update(ssh)
    endpoint = {k: v for k, v in endpoint.items() if v is not None}
    m = Machine.model_validate({"name": "lab-1", "ssh": endpoint, "workspace_root": root})
    return MachineInfo("lab-1", root, fleet_machine=m, source="specs/fleets/lab.yaml")


@pytest.fixture
def root():
    r = remote_root()
    yield r
    shutil.rmtree(r, ignore_errors=True)


@pytest.fixture
def bundle_dir(tmp_path) -> Path:
    b = tmp_path / "bundle"
    (b / "scripts").mkdir(parents=True)
    (b / "inputs").mkdir()
    (b / "scripts" / "entrypoint.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(b / "scripts" / "entrypoint.sh", 0o755)
    (b / "job.json").write_text('{"schema_version": "v1", "payload": {"gpus": []}}\n')
    (b / "runtime").mkdir()
    (b / "runtime" / "stale").write_text("not shipped")
    return b


def test_one_connection_and_one_round_trip_per_operation(sshd, root):
    t = SshTransport(info(sshd, root))
    try:
        report = t.agent({"op": "probe", "names": []})
        assert report["root"] == root and report["runs"] == {}
        assert t.round_trips == 1
        transport = t._client.get_transport()
        r = t.sh("echo out; echo err >&2; exit 3")
        assert (r.rc, r.out, r.err) == (3, "out\n", "err\n")
        assert t.round_trips == 2
        assert t._client.get_transport() is transport  # reused
    finally:
        t.close()


def test_a_command_that_ends_without_reading_its_input_is_not_a_lost_session(sshd, root):
    # Staging a workspace that exists reads none of the bundle it is sent: the machine closes the
    # channel while the input is still on its way, which must read as the command's own result.
    t = SshTransport(info(sshd, root))
    try:
        for code in (0, 3):
            rc, out, _ = t._exec(f"echo done; exit {code}", os.urandom(8 << 20), 30)
            assert (rc, out) == (code, b"done\n")
        assert t.sh("echo still").out == "still\n"  # the connection was kept
    finally:
        t.close()


def test_stage_put_secret_fetch(sshd, root, bundle_dir, tmp_path):
    t = SshTransport(info(sshd, root))
    try:
        ws = t.stage(bundle_dir, "demo-g1-a1")
        assert ws == f"{root}/demo-g1-a1"
        assert Path(ws, "scripts", "entrypoint.sh").read_text() == "#!/bin/sh\necho hi\n"
        assert os.access(Path(ws, "scripts", "entrypoint.sh"), os.X_OK)
        assert not Path(ws, "runtime", "stale").exists()  # runtime/ is not shipped
        assert Path(ws).stat().st_uid == sshd_uid(sshd)
        # idempotent: an existing workspace with job.json is kept as is
        Path(ws, "runtime", "marker").write_text("x")
        assert t.stage(bundle_dir, "demo-g1-a1") == ws
        assert Path(ws, "runtime", "marker").exists()
        t.put_secret_file(ws, b"export CANARY='v'\n")
        p = Path(ws, "runtime", "secrets.env")
        assert stat.S_IMODE(p.stat().st_mode) == 0o600 and p.read_bytes() == b"export CANARY='v'\n"
        Path(ws, "artifacts", "stdout.log").write_text("hello\n")
        dest = tmp_path / "local"
        t.fetch("demo-g1-a1", dest)
        assert (dest / "artifacts" / "stdout.log").read_text() == "hello\n"
        assert (dest / "runtime" / "marker").exists()
        assert not (dest / "runtime" / "secrets.env").exists()  # never brought back
        assert t.round_trips == 4
    finally:
        t.close()


def sshd_uid(server) -> int:
    import pwd

    return pwd.getpwnam(server.user).pw_uid


def test_relative_root_resolves_under_the_login_home(sshd):
    rel = f"rc-test-{os.getpid()}-{time.monotonic_ns()}/test"
    t = SshTransport(info(sshd, rel))
    try:
        assert t.workspace("x-g1-a1") == f"{sshd.home}/{rel}/x-g1-a1"
        t2 = SshTransport(info(sshd, "~/" + rel))
        assert t2.agent({"op": "probe", "names": []})["root"] == f"{sshd.home}/{rel}"
        assert t2.workspace("x-g1-a1") == f"{sshd.home}/{rel}/x-g1-a1"
        assert t2.round_trips == 1  # the probe told it where home is
        t2.close()
    finally:
        t.close()
        shutil.rmtree(f"{sshd.home}/{rel.split('/')[0]}", ignore_errors=True)


def test_large_arguments_go_on_stdin_to_the_staged_agent(sshd, root):
    names = [f"run-{i:06d}" for i in range(ARGV_LIMIT // 8)]  # a probe watching thousands of runs
    program, argv = agent_program({"op": "probe", "names": names})
    assert argv == [] and "sys.exit(main(" in program  # too long for a command line
    t = SshTransport(info(sshd, root))
    try:
        assert t.agent({"op": "probe", "names": names})["runs"] == {}
        assert t.round_trips == 2  # first contact: the agent staged, then run with the arguments on stdin
        assert t.agent({"op": "probe", "names": names})["runs"] == {} and t.round_trips == 3
        t._staged = False  # a machine where nothing can be kept: the program carries them
        assert t.agent({"op": "probe", "names": names})["runs"] == {} and t.round_trips == 4
        t._staged = True  # an operation that fails in the agent's loop is a failure, with its reason
        with pytest.raises(TemporaryError, match="KeyError"):
            t.agent({"op": "probe", "names_ref": "nothing kept", "padding": names})
    finally:
        t.close()


def test_wrong_pinned_host_key_is_refused_before_login(sshd_factory, root):
    server = sshd_factory()
    t = SshTransport(info(server, root, host_key=server.other_host_key()))
    with pytest.raises(PermanentError) as e:
        t.agent({"op": "probe"})
    msg = str(e.value)
    assert f"host key for lab-1 (127.0.0.1:{server.port}) does not match the pinned key in specs/fleets/lab.yaml" in msg
    assert "refusing to connect" in msg
    assert "Accepted" not in server.log_text()  # never authenticated


def test_unknown_host_key_is_refused(sshd, root, tmp_path):
    t = SshTransport(info(sshd, root, host_key=None))
    with pytest.raises(PermanentError, match="is unknown .*refusing to connect"):
        t.agent({"op": "probe"})
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    i = info(sshd, root, host_key=None)
    i.known_hosts = str(empty)
    with pytest.raises(PermanentError, match=f"not in {empty}"):
        SshTransport(i).agent({"op": "probe"})


def test_known_hosts_file_is_accepted(sshd, root):
    i = info(sshd, root, host_key=None)
    i.known_hosts = str(sshd.known_hosts_file)
    t = SshTransport(i)
    try:
        assert t.agent({"op": "probe"})["root"] == root
    finally:
        t.close()


def test_refused_silent_and_bad_login_are_temporary(sshd_factory, root):
    server = sshd_factory()
    # a key the server does not accept: authentication fails, the machine is unknown, not dead
    with pytest.raises(TemporaryError, match=f"authentication as {server.user} failed"):
        SshTransport(info(server, root, identity_file=str(server.host_key_file))).agent({"op": "probe"})
    server.stop()
    with pytest.raises(TemporaryError, match="connection refused"):
        SshTransport(info(server, root)).agent({"op": "probe"})
    # a port that accepts TCP but never speaks SSH: the connect timeout applies
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        i = info(server, root, port=silent.getsockname()[1])
        t0 = time.monotonic()
        with pytest.raises(TemporaryError):
            SshTransport(i, connect_timeout=0.5).agent({"op": "probe"})
        assert time.monotonic() - t0 < 3


def test_command_timeout(sshd, root):
    t = SshTransport(info(sshd, root), command_timeout=1)
    try:
        t0 = time.monotonic()
        r = t.sh("sleep 5", timeout=0.5)
        assert r.rc == 124 and time.monotonic() - t0 < 3
    finally:
        t.close()


def test_agent_json_args_reach_the_agent(sshd, root):
    program, argv = agent_program({"op": "probe", "names": ["a"]})
    assert json.loads(argv[0]) == {"names": ["a"], "op": "probe"}


def test_stage_keeps_a_workspace_only_for_the_same_spec(sshd, root, bundle_dir):
    (bundle_dir / "job.json").write_text(json.dumps({"schema_version": "v1", "payload": {
        "gpus": [], "spec_digest": "sha256:one"}}, indent=2, sort_keys=True) + "\n")
    t = SshTransport(info(sshd, root))
    try:
        ws = t.stage(bundle_dir, "demo-g1-a1", "sha256:one")
        Path(ws, "runtime", "marker").write_text("x")
        assert t.stage(bundle_dir, "demo-g1-a1", "sha256:one") == ws  # same spec: kept as is
        assert Path(ws, "runtime", "marker").exists()
        for _ in range(3):  # a session lost under a loaded machine is a temporary error too: ask again
            with pytest.raises(TemporaryError) as refused:
                t.stage(bundle_dir, "demo-g1-a1", "sha256:two")
            if "session lost" not in str(refused.value):
                break
        assert "built for another spec" in str(refused.value)
        assert Path(ws, "runtime", "marker").exists()  # refused, and left untouched
    finally:
        t.close()


def test_the_probe_is_staged_once_then_invoked_by_path(sshd, root):
    from reconciler.machines.remote_agent import agent_hash

    staged = Path(sshd.home) / ".cache" / "reconciler" / f"agent-{agent_hash()}.py"
    if staged.exists():
        staged.unlink()
    t = SshTransport(info(sshd, root))
    sent = []
    real = t._exec
    t._exec = lambda command, stdin, timeout, sink=None: (sent.append(len(stdin or b"")), real(command, stdin, timeout, sink))[1]
    try:
        assert t.agent({"op": "probe", "names": []})["runs"] == {}
        assert staged.is_file() and sent[0] > 10_000  # first contact: the source, once
        assert t.agent({"op": "probe", "names": []})["runs"] == {}
        assert sent[1] == 0 and t.round_trips == 2  # then by path: nothing sent, one round trip
        staged.unlink()  # removed behind its back (a cleaned home): sent and staged again
        assert t.agent({"op": "probe", "names": []})["runs"] == {}
        assert staged.is_file() and t.agent({"op": "probe", "names": []})["runs"] == {}
    finally:
        t.close()


def test_a_kept_connection_probes_through_a_resident_helper(sshd, root, bundle_dir):
    """A long-lived reconciler's probes: the same report, no interpreter started per probe; a helper
    that died is replaced; closing the connection ends it."""
    from tests.repo_helpers import processes_with

    # Only this sshd's sessions: another suite beside this one may run the same agent as the same login.
    kept, fresh = SshTransport(info(sshd, root)), SshTransport(info(sshd, root))
    kept.kept = True
    marker = f"agent-{agent_hash()}.py\0--serve"  # its command line (arguments NUL-separated)
    try:
        kept.stage(bundle_dir, "r-g1-a1")
        first = kept.agent({"op": "probe", "names": ["r"]})  # stages the probe; no helper yet
        assert not processes_with(marker, under=sshd.pid)
        second = kept.agent({"op": "probe", "names": ["r"]})
        [helper] = processes_with(marker, under=sshd.pid)
        third = kept.agent({"op": "probe", "names": ["r"]})
        assert processes_with(marker, under=sshd.pid) == [helper]  # the same helper answered again
        expected = fresh.agent({"op": "probe", "names": ["r"]})
        for report in (first, second, third):
            assert {k: v for k, v in report.items() if k != "now"} == {k: v for k, v in expected.items() if k != "now"}
        assert expected["runs"]["r-g1-a1"]["state"] == "staged"
        os.kill(helper, 9)  # a helper that died: that probe still answers, and a new helper follows
        assert kept.agent({"op": "probe", "names": ["r"]})["runs"].keys() == {"r-g1-a1"}
        kept.agent({"op": "probe", "names": ["r"]})
        [again] = processes_with(marker, under=sshd.pid)
        assert again != helper
        kept.close()
        deadline = time.monotonic() + 10
        while processes_with(marker, under=sshd.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not processes_with(marker, under=sshd.pid)
    finally:
        kept.close()
        fresh.close()


def _kept_with_a_collected_attempt(sshd, root, bundle_dir) -> SshTransport:
    """A kept connection to a machine with a staged r-g1-a1 and old-g1-a1, an ended attempt whose
    outputs were collected: reported only while its run is watched."""
    kept = SshTransport(info(sshd, root))
    kept.kept = True
    kept.stage(bundle_dir, "r-g1-a1")
    done = Path(root) / "old-g1-a1" / "runtime"
    done.mkdir(parents=True)
    (done / "result.json").write_text('{"exit_code": 0, "finished_at": 1000.0}')
    (done / "collected").write_text("")
    return kept


def test_the_resident_helper_keeps_the_watched_names_and_gets_them_again_only_when_they_change(sshd, root,
                                                                                              bundle_dir):
    """The list of watched names (280 KB of JSON at 10,000 runs) goes to a machine's helper once and
    then by reference; what the probe reports still follows the list: a collected workspace is
    reported only while its run is watched."""
    kept = _kept_with_a_collected_attempt(sshd, root, bundle_dir)
    sent: list[bytes] = []
    try:
        watched = ["old", "r"]
        kept.agent({"op": "probe", "names": watched})  # stages the probe; the helper starts next
        for _ in range(3):
            report = kept.agent({"op": "probe", "names": watched})
            assert report["runs"].keys() == {"old-g1-a1", "r-g1-a1"}
            chan = kept._resident
            if not sent:  # what the helper is sent from now on
                real = chan.sendall
                chan.sendall = lambda data: (sent.append(bytes(data)), real(data))[1]
        assert len(sent) == 2 and all(b'"names"' not in line and b'"names_ref"' in line for line in sent)
        # A new list (old is no longer watched): sent whole, and the collected workspace is left out.
        report = kept.agent({"op": "probe", "names": ["r"]})
        assert b'"names":["r"]' in sent[-1] and report["runs"].keys() == {"r-g1-a1"}
        assert kept.agent({"op": "probe", "names": ["r"]})["runs"].keys() == {"r-g1-a1"}
        assert b'"names"' not in sent[-1]
    finally:
        kept.close()


def test_a_helper_is_sent_the_change_to_the_watched_names_not_the_list(sshd, root, bundle_dir):
    """A run that settles leaves the list of watched names: the helper gets that one name, over the
    real SSH channel, and its report follows the new list."""
    kept = _kept_with_a_collected_attempt(sshd, root, bundle_dir)
    sent: list[bytes] = []
    try:
        others = [f"w-{i:03d}" for i in range(300)]
        watched, settled = sorted(["old", "r", *others]), sorted(["r", *others])
        kept.agent({"op": "probe", "names": watched})  # stages the probe; the helper starts next
        assert kept.agent({"op": "probe", "names": watched})["runs"].keys() == {"old-g1-a1", "r-g1-a1"}
        real = kept._resident.sendall
        kept._resident.sendall = lambda data: (sent.append(bytes(data)), real(data))[1]
        assert kept.agent({"op": "probe", "names": settled})["runs"].keys() == {"r-g1-a1"}
        assert b'"names":' not in sent[-1] and b'"names_drop":["old"]' in sent[-1] and len(sent[-1]) < 400
        assert kept.agent({"op": "probe", "names": settled})["runs"].keys() == {"r-g1-a1"}
        assert b'"names' not in sent[-1].replace(b'"names_ref"', b"")  # the reference alone now
    finally:
        kept.close()


def test_private_keys_are_parsed_once_per_file_version(sshd, tmp_path):
    from reconciler.machines.ssh import private_key

    path = str(tmp_path / "id")
    shutil.copy(sshd.identity_file, path)
    first = private_key(path)
    assert first is not None and private_key(path) is first  # shared by every connection
    os.utime(path, (time.time() + 5, time.time() + 5))  # a new version of the file: read again
    assert private_key(path) is not first and private_key(path).get_base64() == first.get_base64()
    (tmp_path / "bad").write_text("not a key")
    assert private_key(str(tmp_path / "bad")) is None  # left to paramiko, which says what is wrong


def test_a_kept_connection_backs_off_between_reconnection_attempts(sshd_factory, root):
    server = sshd_factory(host="127.0.0.9", start=False)
    t = SshTransport(info(server, root))
    t.kept = True
    try:
        with pytest.raises(TemporaryError, match="connection refused") as first:
            t.agent({"op": "probe", "names": []})
        assert t._retry_at > time.monotonic()  # the next attempt waits (1 s after the first failure)
        with pytest.raises(TemporaryError) as second:
            t.agent({"op": "probe", "names": []})  # within the backoff
        assert str(second.value) == str(first.value)  # the same words: a status quoting it stays as it is
        server.start()
        deadline = time.monotonic() + 5  # the first backoff is 1 s
        while True:
            try:
                assert t.agent({"op": "probe", "names": []})["runs"] == {}
                break
            except TemporaryError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert t._failures == 0  # a success resets the backoff
    finally:
        t.close()
