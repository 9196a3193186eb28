"""``reconcile logs`` interleaves stdout and stderr by the run's log index (runtime/log_stamp.py).

A real run on this machine writes to both streams in turn; the logs stay byte-identical to what it
wrote, the index says when each grew, and the command prints the lines in that order, labelled
on a terminal, with times on ``-t``. The index is the machine's word: garbage in it is skipped."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.cli.logs_merge import Merger
from reconciler.core.logindex import LogIndex
from tests.repo_helpers import make_repo, pass_until, reconciler as make_reconciler, run_spec, wait_for, workspace

ROOT = Path(__file__).resolve().parents[2]
STAMP = ROOT / "reconciler" / "runtime" / "log_stamp.py"
# Each write waits until the watcher has recorded the previous one (its record is in the index),
# so the order is known without sleeping for a fixed time.
SEEN = ('seen() { while [ "$(grep -c " $1 " artifacts/logs.index)" -le "$2" ];'
        ' do sleep 0.01; done; }; ')
JOB = ["sh", "-c", 'cd "$RECONCILER_BUNDLE"; ' + SEEN +
       "echo out-1; seen o 0; echo err-1 >&2; seen e 0; echo out-2; seen o 1; printf 'err-2 no newline' >&2"]


@pytest.fixture(scope="module")
def chatty(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("interleaved")
    repo = make_repo(tmp / "repo", {"chatty": run_spec("chatty", JOB)})
    ws_root = tmp / "ws"
    pass_until(make_reconciler(repo, ws_root), "chatty", "Succeeded")
    env = dict(os.environ, PYTHONPATH=str(ROOT), RECONCILER_WORKSPACE_ROOT=str(ws_root), RECONCILER_NAMESPACE="test")
    return repo, workspace(ws_root, "chatty-g1-a1"), env


def logs(repo: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "reconciler", "logs", "chatty", *args, "--repo", str(repo)],
                       capture_output=True, env=env, cwd=ROOT, timeout=60, text=True)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def test_the_logs_stay_what_the_job_wrote_and_the_index_says_when(chatty) -> None:
    _, ws, _ = chatty
    assert (ws / "artifacts" / "stdout.log").read_bytes() == b"out-1\nout-2\n"
    assert (ws / "artifacts" / "stderr.log").read_bytes() == b"err-1\nerr-2 no newline"
    lines = (ws / "artifacts" / "logs.index").read_text().splitlines()
    assert lines[0] == "# reconciler log index v1"
    records = [line.split() for line in lines[1:]]
    assert [(s, int(n)) for _, s, n in records] == [("o", 6), ("e", 6), ("o", 12), ("e", 22)]
    times = [float(t) for t, _, _ in records]
    assert times == sorted(times)


def test_logs_interleave_both_streams_by_time(chatty) -> None:
    repo, _, env = chatty
    r = logs(repo, env)  # a pipe: the job's bytes, interleaved, no labels
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout == "out-1\nerr-1\nout-2\nerr-2 no newline\n"
    r = logs(repo, env, "--json", "-t")
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert [(x["stream"], x["line"]) for x in rows] == [
        ("stdout", "out-1"), ("stderr", "err-1"), ("stdout", "out-2"), ("stderr", "err-2 no newline")]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", x["time"]) for x in rows), rows
    r = logs(repo, env, "-t", "-n", "1")  # the last line of each stream, still in order, with times
    assert re.fullmatch(r"\S+Z out-2\n\S+Z err-2 no newline\n", r.stdout), r.stdout
    r = logs(repo, env, "--stream", "stderr")  # one stream: as before
    assert r.stdout == "err-1\nerr-2 no newline\n"


def test_a_terminal_gets_each_line_labelled_with_its_stream(chatty) -> None:
    import pty

    repo, _, env = chatty
    master, slave = pty.openpty()
    try:
        p = subprocess.Popen([sys.executable, "-m", "reconciler", "logs", "chatty", "--repo", str(repo)],
                             stdout=slave, stderr=subprocess.PIPE, env=env, cwd=ROOT)
        os.close(slave)
        out = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        assert p.wait(timeout=30) == 0
    finally:
        os.close(master)
    assert out.replace(b"\r\n", b"\n") == b"out | out-1\nerr | err-1\nout | out-2\nerr | err-2 no newline\n", out


def test_follow_prints_both_streams_in_order_as_they_come(tmp_path) -> None:
    import select

    job = ["sh", "-c", 'cd "$RECONCILER_BUNDLE"; ' + SEEN + "echo out-1; seen o 0; "
           "while [ ! -e go ]; do sleep 0.02; done; echo err-1 >&2; seen e 0; echo out-2"]
    repo = make_repo(tmp_path / "repo", {"live": run_spec("live", job)})
    ws_root = tmp_path / "ws"
    pass_until(make_reconciler(repo, ws_root), "live", "Running")
    ws = workspace(ws_root, "live-g1-a1")
    wait_for(lambda: b" o 6\n" in (ws / "artifacts" / "logs.index").read_bytes(), timeout=20, what="out-1's record")
    env = dict(os.environ, PYTHONPATH=str(ROOT), RECONCILER_WORKSPACE_ROOT=str(ws_root), RECONCILER_NAMESPACE="test")
    follower = subprocess.Popen([sys.executable, "-m", "reconciler", "logs", "live", "--follow", "--repo", str(repo)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        ready, _, _ = select.select([follower.stdout], [], [], 30)
        assert ready and follower.stdout.readline() == "out-1\n"  # printed, now following
        (ws / "go").write_text("")
        rec = make_reconciler(repo, ws_root)
        wait_for(lambda: (ws / "runtime" / "result.json").exists(), timeout=30, what="the run's end")
        out, err = follower.communicate(timeout=30)
    finally:
        follower.kill()
    assert follower.returncode == 0, err
    assert out == "err-1\nout-2\n"
    pass_until(rec, "live", "Succeeded")


def test_a_workspace_without_an_index_prints_as_before(chatty) -> None:
    repo, ws, env = chatty
    index = ws / "artifacts" / "logs.index"
    saved = index.read_bytes()
    index.unlink()
    try:
        r = logs(repo, env, "-t")
        assert r.stdout == "out-1\nout-2\nerr-1\nerr-2 no newline\n"
        assert "no times to show" in r.stderr
    finally:
        index.write_bytes(saved)


def test_garbage_in_the_index_is_skipped_never_a_crash(chatty) -> None:
    repo, ws, env = chatty
    index = ws / "artifacts" / "logs.index"
    saved = index.read_bytes()
    try:
        index.write_bytes(saved + b"9.5 o 99999999999\nnot a record\n1e9 e 3\n\xff\xfe\n" + b"7" * 100_000 + b"\n"
                          b"100.0 e 1\n99999999999999.0 o 50\n")
        r = logs(repo, env)
        assert r.returncode == 0
        assert r.stdout == "out-1\nerr-1\nout-2\nerr-2 no newline\n"
        index.write_bytes(b"# reconciler log index v1\n1000.000 e 99\n1000.000 o 99\n")  # past the logs' end
        r = logs(repo, env)
        assert r.returncode == 0 and r.stdout == "out-1\nout-2\nerr-1\nerr-2 no newline\n"
    finally:
        index.write_bytes(saved)


def test_the_index_parser_keeps_each_stream_going_forward() -> None:
    ix = LogIndex()
    ix.feed(b"# reconciler log index v1\n10.0 o 5\n9.0 o 9\n11.0 o 4\n12.0 o 9\n12.5 e 3")
    ix.feed(b"\n13.0 e 7\n")  # a record split between two reads
    assert ix.present and ix.sizes == {"stdout": [5, 9], "stderr": [3, 7]}
    assert (ix.time_of("stdout", 0), ix.time_of("stdout", 5), ix.time_of("stdout", 9)) == (10.0, 12.0, None)
    assert ix.time_of("stderr", 4, log_size=5) is None  # the record claims more than the log holds


def test_a_line_without_a_record_waits_while_following(capsys) -> None:
    from reconciler.cli.logs import _Raw

    ix = LogIndex()
    ix.feed(b"# reconciler log index v1\n10.0 e 4\n")
    m = Merger(_Raw(), ix, labels=False, timestamps=False)
    m.feed("stdout", 0, b"late\n", 5)
    m.feed("stderr", 0, b"err\n", 4)
    m.emit(False)
    assert capsys.readouterr().out == "err\n"  # stdout's line has no record yet
    ix.feed(b"9.0 o 5\n")  # ...and it turns out to be earlier than anything still to come
    m.feed("stderr", 4, b"next\n", 9)
    ix.feed(b"11.0 e 9\n")
    m.emit(False)
    assert capsys.readouterr().out == "late\nnext\n"


def test_the_stamper_never_stands_between_the_job_and_its_logs(tmp_path) -> None:
    """The watcher only reads sizes: killing it leaves the job and its files alone; it ends by
    itself when the process it watches is gone, after a last look."""
    out, err, index = tmp_path / "o.log", tmp_path / "e.log", tmp_path / "logs.index"
    out.write_bytes(b"")
    err.write_bytes(b"")
    index.write_bytes(b"# reconciler log index v1\n")
    job = subprocess.Popen(["sh", "-c", f"while [ ! -e {tmp_path}/go ]; do sleep 0.01; done; "
                            f"head -c 3000000 /dev/zero >> {out}; echo done >> {err}"])
    w = subprocess.Popen([sys.executable, str(STAMP), "--index", str(index), "--stdout", str(out), "--stderr",
                          str(err), "--watch-pid", str(job.pid)])
    (tmp_path / "go").write_text("")
    wait_for(lambda: b" e 5\n" in index.read_bytes(), timeout=20, what="the stderr record")
    assert job.wait(timeout=20) == 0
    assert w.wait(timeout=20) == 0  # the watched process is gone: it exits
    assert out.stat().st_size == 3_000_000 and b" o 3000000\n" in index.read_bytes()
    # A watcher killed mid-run: the job writes on, unharmed.
    job = subprocess.Popen(["sh", "-c", f"while [ ! -e {tmp_path}/go2 ]; do sleep 0.01; done; echo after >> {out}"])
    w = subprocess.Popen([sys.executable, str(STAMP), "--index", str(index), "--stdout", str(out), "--stderr",
                          str(err), "--watch-pid", str(job.pid)])
    w.send_signal(signal.SIGKILL)
    w.wait(timeout=10)
    (tmp_path / "go2").write_text("")
    assert job.wait(timeout=20) == 0 and out.read_bytes().endswith(b"after\n")
