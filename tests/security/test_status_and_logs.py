"""What a job writes reaches the operator as text, never as commands: status files that always
write and parse back, and ``reconcile logs`` that a terminal shows without acting on."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest

from tests.repo_helpers import make_repo, pass_until, reconciler as make_reconciler, run_spec, workspace

ROOT = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------- reconcile logs

# An OSC 52 clipboard write, a window title, a carriage return overwriting the line, a cursor move
# up (which hides the lines above), a C1 CSI, a bidirectional override, bytes that are not UTF-8.
HOSTILE_LOG = (b"before\n"
               b"\x1b]52;c;cm0gLXJmIH4=\x07\x1b]0;pwned\x07visible\rhidden\x1b[2A\xc2\x9b31m\xe2\x80\xaeevil\xff\xfe\n"
               b"tab\there\n")
ESCAPED_LOG = ("before\n"
               "\\x1b]52;c;cm0gLXJmIH4=\\x07\\x1b]0;pwned\\x07visible\\rhidden\\x1b[2A\\x9b31m\\u202eevil\\xff\\xfe\n"
               "tab\there\n")


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """A run that succeeded on this machine; the test then writes what its logs hold."""
    tmp = tmp_path_factory.mktemp("logs")
    repo = make_repo(tmp / "repo", {"noisy": run_spec("noisy", ["sh", "-c", "echo hi"])})
    ws_root = tmp / "ws"
    pass_until(make_reconciler(repo, ws_root), "noisy", "Succeeded")
    ws = workspace(ws_root, "noisy-g1-a1")
    env = dict(os.environ, PYTHONPATH=str(ROOT), RECONCILER_WORKSPACE_ROOT=str(ws_root), RECONCILER_NAMESPACE="test")
    return repo, ws, env, tmp


def _logs(repo: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "reconciler", "logs", "noisy", *args, "--repo", str(repo)],
                       capture_output=True, env=env, cwd=ROOT, timeout=60)
    assert b"Traceback" not in r.stdout + r.stderr, r.stderr
    return r


def _logs_on_terminal(repo: Path, env: dict, *args: str) -> bytes:
    """The command's stdout when it is a terminal (a pseudo-terminal; output processing off, so
    the bytes read are the bytes written)."""
    import termios
    import tty

    master, slave = pty.openpty()
    tty.setraw(slave)
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.OPOST
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    p = subprocess.Popen([sys.executable, "-m", "reconciler", "logs", "noisy", *args, "--repo", str(repo)],
                         stdout=slave, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    os.close(slave)
    out = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 30)
            assert ready, "no output from the command"
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the command closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
        err = p.stderr.read()
        p.stderr.close()
        assert p.wait(timeout=30) == 0, err
    assert b"Traceback" not in err, err
    return out


def test_logs_on_a_terminal_show_escape_sequences_as_text(logged):
    repo, ws, env, _ = logged
    (ws / "artifacts" / "stdout.log").write_bytes(HOSTILE_LOG)
    (ws / "artifacts" / "stderr.log").write_bytes(b"err\x1b[8m\n")
    shown = _logs_on_terminal(repo, env)
    # A terminal labels each line with its stream (the run keeps a log index: docs/cli.md).
    labelled = "".join("out | " + line for line in ESCAPED_LOG.splitlines(keepends=True))
    assert shown == (labelled + "err | err\\x1b[8m\n").encode(), shown
    assert b"\x1b" not in shown and b"\r" not in shown and b"\x07" not in shown
    # --raw: the bytes as the job wrote them, even on a terminal.
    assert _logs_on_terminal(repo, env, "--raw") == HOSTILE_LOG + b"err\x1b[8m\n"
    # A pipe (or a file) always gets the exact log.
    r = _logs(repo, env, "--stream", "stdout")
    assert r.returncode == 0 and r.stdout == HOSTILE_LOG, r.stdout


def test_logs_never_follow_a_link_in_a_local_workspace(logged):
    repo, ws, env, tmp = logged
    secret = tmp / "operator-secret"
    secret.write_text("RCLOG-SENTINEL\n")
    log = ws / "artifacts" / "stdout.log"
    log.unlink()
    log.symlink_to(secret)
    (ws / "artifacts" / "stderr.log").write_bytes(b"fine\n")
    try:
        r = _logs(repo, env)
        assert r.returncode == 0, r.stderr
        assert b"RCLOG-SENTINEL" not in r.stdout and r.stdout == b"fine\n"
        assert b"stdout.log is not a regular file reached without a link" in r.stderr
        # A link higher up (the artifacts folder itself) is refused the same way.
        (ws / "artifacts").rename(ws / "artifacts.real")
        (ws / "artifacts").symlink_to(tmp)
        (tmp / "stdout.log").write_text("RCLOG-SENTINEL\n")
        r = _logs(repo, env)
        assert r.returncode == 0 and b"RCLOG-SENTINEL" not in r.stdout, r.stdout
    finally:
        if (ws / "artifacts").is_symlink():
            (ws / "artifacts").unlink()
            (ws / "artifacts.real").rename(ws / "artifacts")
        log.unlink()
        log.write_bytes(b"")


def test_logs_read_a_huge_log_in_bounded_pieces(logged):
    from reconciler.cli.logs import READ_BYTES

    repo, ws, env, _ = logged
    line = b"x" * 99 + b"\n"
    big = line * (3 * READ_BYTES // len(line) + 7) + b"last line without newline"
    (ws / "artifacts" / "stdout.log").write_bytes(big)
    (ws / "artifacts" / "stderr.log").write_bytes(b"")
    # All of it: read in pieces, exactly the bytes (plus the newline a finished last line gets).
    r = _logs(repo, env, "--lines", "0", "--stream", "stdout")
    assert r.returncode == 0 and r.stdout == big + b"\n" and r.stderr == b""
    # More lines than the last piece holds: what that piece holds, and a notice that says so.
    r = _logs(repo, env, "--lines", "1000000000", "--stream", "stdout")
    assert r.returncode == 0
    assert 0 < len(r.stdout) <= READ_BYTES + 1 and big.endswith(r.stdout[:-1]) and r.stdout.startswith(line)
    assert b"as many as its last 4 MiB hold" in r.stderr, r.stderr


# ---------------------------------------------------------------- status files

# Everything a machine or a job can put into text: a lone surrogate (what json.loads makes of
# "\ud800"), NUL, escapes, line breaks, bidirectional and zero-width characters, a byte order
# mark, an unassigned code point, and a string of two million characters.
HOSTILE_TEXTS = ["\ud800", "x\udcffy", "nul\x00", "\x1b]52;c;aGk=\x07", "a\r\nb\x85c\u2028d", "\u202eevil\u2066",
                 "zero\u200bwidth\ufeff", "\U000e0001tag", "\uffff", "x" * 2_000_000]


def hostile_everywhere(name: str) -> "RunStatus":
    from reconciler.core.runstatus import Condition, Handle, RunStatus, Transition

    texts = HOSTILE_TEXTS
    return RunStatus(
        name=name, phase="Failed", generation=1, attempt=1, exit_code=1, message="".join(texts[:-1]) + texts[-1],
        handle=Handle(machine="lab-1", identity=f"{name}-g1-a1", workspace="/ws/\udcff\x1b[2J"),
        conditions=[Condition(type="Ready", status="False", reason=t[:50], message=t) for t in texts],
        history=[Transition(time="2026-11-25T10:00:00Z", phase="Failed", generation=1, attempt=1, reason=t)
                 for t in texts],
        artifacts=[{"path": f"artifacts/{t}", "size": 1} for t in texts],
        progress={**{t: t for t in texts}, "step": 10 ** 5000, "loss": float("nan"), "deep": _nested(200)},
        placement={"action": "wait", "considered": list(texts)})


def _nested(depth: int):
    value: object = "bottom"
    for _ in range(depth):
        value = {"d": [value]}
    return value


def test_a_status_with_any_text_writes_and_reads_back():
    from reconciler.status.store import KEY_LIMIT, TEXT_LIMIT, dump, parse_text

    text = dump(hostile_everywhere("wild"))
    raw = text.encode("utf-8")  # a lone surrogate would raise here
    assert b"\x1b" not in raw and b"\x00" not in raw and b"\r" not in raw and "\u202e" not in text
    back = parse_text(text, "wild")
    assert back is not None and back.phase == "Failed" and back.exit_code == 1
    assert dump(back) == text  # written out once, the same text ever after: no commit per pass
    assert back.conditions[0].message == "\\ud800" and back.conditions[2].message == "nul\\x00"
    assert back.artifacts[3]["path"] == "artifacts/\\x1b]52;c;aGk=\\x07"
    assert back.progress["step"] == ">1e308" and back.progress["loss"] is None  # no number, not a 5,000-digit one
    assert "\\u202eevil\\u2066" in back.progress and all(len(k) <= KEY_LIMIT for k in back.progress)
    assert len(back.message) <= TEXT_LIMIT and back.message.endswith("\u2026")
    assert max(len(line) for line in text.splitlines()) < TEXT_LIMIT + 200


def test_a_real_pass_commits_a_status_of_hostile_artifact_names(tmp_path):
    """A job names its artifacts with escapes and bytes that are not UTF-8 (a lone surrogate to
    Python): the pass collects them, writes the status and commits, as every pass after it does."""
    from reconciler.status.store import load_all
    from tests.world import World, git, run_spec

    job = ('printf x > "artifacts/$(printf "osc\\033]0;title\\007\\377\\376")"; '
           'printf y > "artifacts/$(printf "rtl\\342\\200\\256txt\\r")"; echo done')
    w = World(tmp_path / "w")
    try:
        w.add_run(run_spec("names", "local-host", ["sh", "-c", job]))
        w.run_pass()
        st = w.until("names", lambda s: s.phase == "Succeeded" and s.artifacts)
        text = (w.repo / "status" / "names.yaml").read_bytes()
        assert b"\x1b" not in text and b"\r" not in text and b"\xe2\x80\xae" not in text
        paths = [a["path"] for a in load_all(w.repo / "status")["names"].artifacts]
        assert "artifacts/osc\\x1b]0;title\\x07\\udcff\\udcfe" in paths, paths  # bytes not UTF-8: surrogates
        assert "artifacts/rtl\\u202etxt\\x0d" in paths, paths
        assert st.phase == "Succeeded"
        # Committed: the file in HEAD is the one on disk.
        assert git(w.repo, "show", "HEAD:status/names.yaml").encode() == text
    finally:
        w.cleanup()
