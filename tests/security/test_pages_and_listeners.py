"""What the control plane shows and serves, against hostile values and hostile clients.

The page and the webhook are real servers in a real process of their own (``SERVER`` below: the
daemon's ``httpd.make_server`` and ``dashboard.make_server``, as ``reconcile`` starts them), so
its environment, its file descriptors and its threads are its own and can be checked from here:
the environment holds a sentinel that no answer may contain. The ledger and the plan comment are
the real writers on a real git repository; the provider adapters talk to the fakes of their APIs
(tests/fakes/: no provider can be reached from a test machine). Every wait polls a condition with a
deadline; every connection goes to 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from reconciler.core import display
from reconciler.status import ledger
from reconciler.cli import prcomment
from reconciler.core.errors import PermanentError
from reconciler.rentals.providers.base import AdapterContext, adapter_for
from reconciler.spec.models.provider import Provider
from reconciler.core.runstatus import Handle, RunStatus, Transition
from reconciler.status.store import dump, load_all
from tests.repo_helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
SECRET = "rcpage-webhook-secret"
SENTINEL = "RC_SENTINEL_SECRET"

# The servers, as the daemon builds them, in a process of their own. Timeouts and the cap come in
# as the JSON argument (the daemon's defaults otherwise); events come back as JSON lines on stdout.
SERVER = r"""
import json, logging, resource, sys
from pathlib import Path
from reconciler.daemon import dashboard, httpd

cfg = json.loads(sys.argv[1])
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(name)s %(message)s")
out = lambda **kw: print(json.dumps(kw), flush=True)
views = dashboard.Views(Path(cfg["repo"]), Path(cfg["state"]), cfg["roots"])
page = dashboard.make_server("127.0.0.1:0", views)
ep = httpd.Endpoints(lambda: (True, {"ok": True}), lambda accept: (b"up 1\n", "text/plain"),
                     lambda info: out(push=info), lambda: cfg.get("secret"), lambda why: out(refused=why))
api = httpd.make_server("127.0.0.1:0", ep)
for s in (page, api):
    for k in ("header_timeout", "body_timeout", "max_connections"):
        if k in cfg:
            setattr(s, k, cfg[k])
    httpd.serve_in_thread(s)
if cfg.get("nofile"):
    resource.setrlimit(resource.RLIMIT_NOFILE, (cfg["nofile"], resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
out(page=page.server_address[1], api=api.server_address[1])
sys.stdin.read()
"""


class Served:
    """The server process: its ports, its pid, what it printed."""

    def __init__(self, tmp: Path, **cfg):
        cfg.setdefault("repo", str(tmp / "repo"))
        cfg.setdefault("state", str(tmp / "repo" / ".reconciler"))
        cfg.setdefault("roots", [str(tmp / "ws")])
        cfg.setdefault("secret", SECRET)
        (Path(cfg["repo"]) / "status").mkdir(parents=True, exist_ok=True)
        self.sentinel = f"rcpage-sentinel-{os.getpid()}-{time.monotonic_ns()}"
        env = dict(os.environ, PYTHONPATH=str(ROOT), **{SENTINEL: self.sentinel})
        self.err = open(tmp / "server.err", "w+")
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, json.dumps(cfg)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.err, text=True, env=env, cwd=ROOT)
        self.events: list[dict] = []
        first = json.loads(self.proc.stdout.readline() or "{}")
        assert "page" in first, self.stderr()
        self.page, self.api = first["page"], first["api"]
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.events.append(json.loads(line))

    def stderr(self) -> str:
        self.err.flush()
        return Path(self.err.name).read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self.err.close()


@pytest.fixture
def served(tmp_path):
    made: list[Served] = []

    def start(**cfg) -> Served:
        made.append(Served(tmp_path, **cfg))
        return made[-1]

    yield start
    for s in made:
        s.close()


def request(port: int, raw: bytes, timeout: float = 5.0) -> bytes:
    """Send ``raw`` as it is, read the answer until the server closes (or the timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(raw)
        chunks = []
        try:
            while True:
                b = s.recv(65536)
                if not b:
                    break
                chunks.append(b)
        except (TimeoutError, ConnectionResetError):
            pass
        return b"".join(chunks)


def get(port: int, path: str) -> tuple[int, bytes]:
    answer = request(port, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]) if head.startswith(b"HTTP/") else 0, body


def write_status(repo: Path, st: RunStatus) -> None:
    (repo / "status" / f"{st.name}.yaml").write_text(dump(st))


# ---------------------------------------------------------------- the page reads only the store


def test_the_page_never_serves_a_link_or_a_file_outside_the_store(served, tmp_path):
    repo, ws = tmp_path / "repo", tmp_path / "ws"
    bundles = repo / ".reconciler" / "bundles"
    outside = tmp_path / "outside"
    (outside / "artifacts").mkdir(parents=True)
    (outside / "artifacts" / "stdout.log").write_text("OUTSIDE-THE-STORE\n")

    def workspace(path: Path) -> Path:
        (path / "artifacts").mkdir(parents=True, exist_ok=True)
        return path

    # The reported attack: a local run's stdout.log is a link to the daemon's own environment.
    os.symlink("/proc/self/environ", workspace(ws / "environ-g1-a1") / "artifacts" / "stdout.log")
    # The same in the collected copy, for a run on a remote machine.
    os.symlink("/proc/self/environ", workspace(bundles / "remote-g1-a1") / "artifacts" / "stdout.log")
    # A folder on the way that is a link out of the store.
    (ws / "dirlink-g1-a1").mkdir(parents=True)
    os.symlink(outside / "artifacts", ws / "dirlink-g1-a1" / "artifacts")
    # A FIFO: opening it for reading would wait for a writer for ever.
    os.mkfifo(workspace(ws / "fifo-g1-a1") / "artifacts" / "stdout.log")
    # And a run that is fine.
    (workspace(ws / "good-g1-a1") / "artifacts" / "stdout.log").write_text("step 1 loss 2.0\n")
    cases = {"environ": str(ws / "environ-g1-a1"), "remote": None, "dirlink": str(ws / "dirlink-g1-a1"),
             "fifo": str(ws / "fifo-g1-a1"), "outside": str(outside), "dotdot": f"{ws}/../outside",
             "proc": "/proc/self", "good": str(ws / "good-g1-a1")}
    (repo / "status").mkdir(parents=True)
    for name, where in cases.items():
        machine = "local" if where is not None else "lab-1"
        write_status(repo, RunStatus(name=name, phase="Running" if where else "Failed", generation=1, attempt=1,
                                     handle=Handle(machine=machine, identity=f"{name}-g1-a1", workspace=where)))
    s = served()
    # The link does lead to the server's environment: this is what the page must not show.
    assert s.sentinel in Path(f"/proc/{s.proc.pid}/environ").read_bytes().decode(errors="replace")

    for name in cases:
        for path in (f"/runs/{name}/log", f"/runs/{name}"):
            t0 = time.monotonic()
            code, body = get(s.page, path)
            assert time.monotonic() - t0 < 4, f"{path}: the page waited"  # the FIFO is never opened for long
            text = body.decode(errors="replace")
            assert code == 200, (path, code, text[:300])
            assert s.sentinel not in text and SENTINEL not in text and "PYTHONPATH" not in text, path
            assert "OUTSIDE-THE-STORE" not in text, path
            if name == "good":
                assert "step 1 loss 2.0" in text
            else:
                assert "not available" in text, (path, text[:300])
    assert s.proc.poll() is None


# ---------------------------------------------------------------- hostile values everywhere they show

HOSTILE_MESSAGE = ("diverged | cell\r\n# Heading [click](https://evil.example/x) ![img](https://evil.example/i.png) "
                   "@org/team <script>alert(1)</script> <img src=x onerror=alert(2)> \x1b[31mred\x00 "
                   "\u202eevil `code` *bold* ~~gone~~ $x$ &amp;")
HOSTILE_CURVE = [(1, 2.5), (2, float("nan")), (3, float("inf")), (4, float("-inf")), (5, 1e308), (6, -1e308),
                 (7, 1.25), (8, 0.75)]


def hostile_status(name: str) -> RunStatus:
    return RunStatus(
        name=name, phase="Running", generation=1, attempt=1, message=HOSTILE_MESSAGE,
        handle=Handle(machine="lab-1 <b>x</b>", identity=f"{name}-g1-a1"),
        progress={"step": 10 ** 400, "max_steps": "<i>many</i>", "loss": float("nan")},
        loss_curve=HOSTILE_CURVE, cost={"price_per_hour": "1e999", "so_far": float("inf"), "since": "nonsense"},
        history=[Transition(time="2026-11-25T10:00:00Z", phase="Running", generation=1, attempt=1,
                            reason="[x](https://evil.example)")])


def _no_live_markdown(text: str) -> None:
    """No link, image, mention or raw HTML that GitHub would render, and no control character."""
    for bad in ("](", "![", "<script", "<img", "\r", "\x1b", "\x00", "\u202e", "@org"):
        assert bad not in text, (bad, text)


@pytest.mark.parametrize("loss", [float("nan"), float("inf"), float("-inf"), 1e308, 10 ** 400, -3, "0.5", None])
def test_display_survives_any_loss(loss):
    st = hostile_status("one")
    st.progress = {"step": 5, "max_steps": 10, "loss": loss}
    r = ledger.row(st)
    if isinstance(loss, (int, float)):
        assert r.loss == display.number(loss) and r.loss in ("nan", "inf", "-inf", "1e+308", ">1e308", "-3")
    else:  # not a number: the curve's last finite point is shown
        assert r.loss == "0.75"
    spark = ledger.sparkline([loss, 1.0, 2.0])
    assert set(spark) <= set(ledger.SPARK) and len(spark) == 2 + (display.finite(loss) is not None)
    svg = ledger.svg("one", [(1, loss), (2, 1.0), (3, 2.0)] if isinstance(loss, (int, float)) else [(1, 1.0)])
    assert "nan" not in svg.split("<polyline", 1)[1].split("/>", 1)[0]


def test_hostile_values_render_everywhere_and_status_commits_go_on(tmp_path, served):
    import git

    from reconciler.gitops import repo as gitops

    repo = tmp_path / "repo"
    (repo / "status").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    for k, v in (("user.name", "test"), ("user.email", "test@localhost")):
        subprocess.run(["git", "-C", str(repo), "config", k, v], check=True)
    (repo / ".gitignore").write_text(".reconciler/\n")
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", "initial"], check=True)

    # The writer as a pass runs it: status files, then the ledger over them, then one commit.
    led = ledger.Ledger(svg_interval=0)
    author = gitops.Author("reconciler", "reconciler@localhost")
    st = hostile_status("wild")
    write_status(repo, st)
    wrote = led.refresh(repo / "status", {}, {"wild": st}, time.time())
    assert wrote == ["README.md", "wild.svg"]
    first = gitops.commit_status(git.Repo(repo), lambda paths: "status", author)
    assert first is not None

    def committed(sha: str) -> set[str]:
        return set(subprocess.run(["git", "-C", str(repo), "ls-tree", "-r", "--name-only", sha], check=True,
                                  capture_output=True, text=True).stdout.split())

    assert {"status/wild.yaml", "status/README.md", "status/wild.svg"} <= committed(first.sha)

    readme = (repo / "status" / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| [wild]"))
    _no_live_markdown(row.replace("| [wild](wild.yaml) |", "").replace("](wild.svg)", ""))  # the ledger's own links
    assert row.count(" | ") == 6 and "diverged \\| cell" in row, row  # the message's pipe adds no column
    assert "\\[click\\]\\(https://evil.example/x\\)" in row and "lab-1 &lt;b&gt;x" in row and "@\u200borg" in row
    assert "| &gt;1e308/&lt;i&gt;many&lt;/i&gt; |" in row and " nan](wild.svg)" in row
    svg = (repo / "status" / "wild.svg").read_text()
    points = svg.split('points="', 1)[1].split('"', 1)[0].split()
    assert len(points) == 5 and all(float(c) == float(c) for p in points for c in p.split(","))  # finite points only
    assert "<script" not in svg and "nan" not in svg.lower().replace("font-family", "")

    # The next pass changes the run again: another commit (one bad value stops nothing).
    st2 = st.model_copy(update={"loss_curve": HOSTILE_CURVE + [(9, float("nan"))], "message": "still \x07 here"})
    write_status(repo, st2)
    assert "README.md" in led.refresh(repo / "status", {}, {"wild": st2}, time.time())
    second = gitops.commit_status(git.Repo(repo), lambda paths: "status", author)
    assert second is not None and second.sha != first.sha
    # The status keeps what was said, its control characters written out as text.
    assert load_all(repo / "status")["wild"].message == "still \\x07 here"

    # The plan comment: names and reasons as literal text.
    class Change:
        name, action, identity, machine, kill, code = "wild", "launch", "wild-g1-a1", "lab-1", [], "Waiting"
        reason = HOSTILE_MESSAGE

    class Plan:
        changes, warnings = [Change()], [HOSTILE_MESSAGE]

        def summary(self):
            return {"launch": 1}

        def new_rentals(self):
            return 1, float("nan")

    body = prcomment.markdown(Plan(), diagnostics=[HOSTILE_MESSAGE])
    for line in body.splitlines()[1:]:  # the first is the marker, the only HTML it holds
        _no_live_markdown(line)
    table = [line for line in body.splitlines() if line.startswith("| `+`")][0]
    assert table.count(" | ") == 4, table
    posted = prcomment.untrusted_body("[x](y) @someone\x1b\n" + prcomment.MARKER + "\n| a |\n")
    assert posted.startswith(prcomment.MARKER + "\n") and posted.count(prcomment.MARKER) == 1
    assert "@someone" not in posted and "\x1b" not in posted

    # The page: the index, the run (with its curve) and the machines, escaped, no error.
    write_status(repo, hostile_status("wild"))
    s = served(repo=str(repo))
    for path in ("/", "/runs/wild", "/machines", "/runs/wild/log"):
        code, raw = get(s.page, path)
        text = raw.decode()
        assert code == 200, (path, code, text[:500])
        assert "<script>alert" not in text and "<img src=x" not in text and "\x1b" not in text, path
    code, raw = get(s.page, "/")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in raw.decode() and "&gt;1e308/&lt;i&gt;many" in raw.decode()
    code, raw = get(s.page, "/runs/wild")
    assert "<polyline" in raw.decode() and "nan," not in raw.decode()


def test_a_real_pass_over_a_hostile_status_writes_and_commits(tmp_path):
    """A status file pushed with NaN and Infinity in its curve: the pass draws the ledger over it
    and commits, as every pass after it does."""
    from tests.world import World, git, run_spec

    w = World(tmp_path / "w")
    try:
        (w.repo / "status").mkdir()
        write_status(w.repo, hostile_status("wild"))
        git(w.repo, "add", "status")
        git(w.repo, "commit", "-q", "-m", "a pushed status")
        w.add_run(run_spec("ok", "local-host", ["sh", "-c", "echo hi"]))
        first = w.run_pass()
        assert first.commit is not None and "ok" in first.committed, first
        readme = (w.repo / "status" / "README.md").read_text()
        assert "| [wild](wild.yaml) |" in readme and "&gt;1e308/&lt;i&gt;many" in readme
        assert "| [ok](ok.yaml) |" in readme
        w.until("ok", lambda st: st.phase == "Succeeded")
        assert git(w.repo, "log", "-1", "--format=%H", "--", "status/ok.yaml") != first.commit  # more commits
    finally:
        w.cleanup()


# ---------------------------------------------------------------- the page's script and its CSP


def test_the_page_allows_no_inline_script(served, tmp_path):
    repo = tmp_path / "repo"
    (repo / "status").mkdir(parents=True)
    write_status(repo, RunStatus(name="one", phase="Running", handle=Handle(machine="lab-1", identity="one-g1-a1")))
    s = served()
    answer = request(s.page, b"GET /runs/one HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").decode()
    head, _, body = answer.partition("\r\n\r\n")
    csp = next(line.split(":", 1)[1] for line in head.splitlines() if line.lower().startswith("content-security-policy"))
    directives = {d.split()[0]: d.split()[1:] for d in csp.strip().split(";") if d.strip()}
    assert directives["script-src"] == ["'self'"] and "'unsafe-inline'" not in csp, csp
    assert "<script>" not in body and '<script src="/static/page.js"' in body
    code, js = get(s.page, "/static/page.js")
    assert code == 200 and b"textContent" in js and b"innerHTML" not in js


# ---------------------------------------------------------------- connections: a cap and deadlines


def _drain_closed(socks: list[socket.socket], timeout: float) -> int:
    """How many of ``socks`` the server closed (EOF or reset) within ``timeout``."""
    sel = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    closed, deadline = 0, time.monotonic() + timeout
    while closed < len(socks) and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.2):
            try:
                data = key.fileobj.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                sel.unregister(key.fileobj)
                closed += 1
    sel.close()
    return closed


def _open_many(port: int, n: int, timeout: float) -> list[socket.socket]:
    """``n`` connections, connected in parallel (non-blocking), those that connected within ``timeout``."""
    pending = []
    for _ in range(n):
        c = socket.socket()
        c.setblocking(False)
        c.connect_ex(("127.0.0.1", port))
        pending.append(c)
    sel = selectors.DefaultSelector()
    for c in pending:
        sel.register(c, selectors.EVENT_WRITE)
    done, deadline = [], time.monotonic() + timeout
    while len(done) < n and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.2):
            sel.unregister(key.fileobj)
            if key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                done.append(key.fileobj)
            else:
                key.fileobj.close()
    for key in list(sel.get_map().values()):
        key.fileobj.close()
    sel.close()
    return done


def test_a_thousand_idle_connections_neither_stop_nor_block_the_server(served):
    # 200 descriptors: without the cap, a thread and a socket per idle connection would run out.
    s = served(header_timeout=1.0, nofile=200)
    for port in (s.api, s.page):
        idle = []
        try:
            idle = _open_many(port, 1000, timeout=10)
            assert len(idle) >= 900
            # While they are all open, a real request is answered (polled: the cap may be full for
            # up to the header timeout).
            wait_for(lambda: get(port, "/healthz" if port == s.api else "/")[0] == 200, timeout=10,
                     what="an answer while 1,000 connections are open")
            # Every idle connection is closed by the server, over the cap at once, the rest after
            # the header timeout: none is held for ever.
            assert _drain_closed(idle, timeout=15) == len(idle)
        finally:
            for c in idle:
                c.close()
        assert s.proc.poll() is None, s.stderr()
    assert get(s.api, "/healthz")[0] == 200


def test_a_slow_sender_is_cut_off_after_the_header_timeout(served):
    s = served(header_timeout=1.0)
    with socket.create_connection(("127.0.0.1", s.api), timeout=5) as c:
        c.sendall(b"GET /healthz HTTP/1.1\r\n")
        t0, closed_at = time.monotonic(), None
        c.settimeout(0.05)
        while time.monotonic() - t0 < 6:
            try:
                c.sendall(b"X")  # a byte of a header now and then: each read is quick, the whole is not
                if c.recv(1) == b"":
                    closed_at = time.monotonic() - t0
                    break
            except TimeoutError:
                pass
            except OSError:
                closed_at = time.monotonic() - t0
                break
            time.sleep(0.2)
    assert closed_at is not None, "a slow sender kept its connection"
    assert 0.8 <= closed_at < 3.0, closed_at
    assert get(s.api, "/healthz")[0] == 200


def test_out_of_descriptors_the_server_backs_off_and_serves_again(served):
    # The cap above what the descriptors allow: accept itself fails with EMFILE.
    s = served(header_timeout=1.0, max_connections=1000, nofile=40)
    idle = []
    try:
        for _ in range(80):
            c = socket.socket()
            c.settimeout(2)
            try:
                c.connect(("127.0.0.1", s.api))
                idle.append(c)
            except OSError:
                c.close()
        wait_for(lambda: "cannot accept a connection" in s.stderr(), timeout=10, what="the back-off's log line")
        assert s.proc.poll() is None
    finally:
        for c in idle:
            c.close()
    wait_for(lambda: get(s.api, "/healthz")[0] == 200, timeout=15, what="an answer once descriptors are free")
    assert s.stderr().count("cannot accept a connection") < 10  # logged now and then, not per attempt


# ---------------------------------------------------------------- the webhook


def _sign(body: bytes) -> str:
    return "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()


def _post(port: int, body: bytes, headers: dict[str, str], send: bytes | None = None,
          timeout: float = 5.0) -> tuple[int, float]:
    head = "".join(f"{k}: {v}\r\n" for k, v in {"Host": "x", "Connection": "close", "Content-Length": str(len(body)),
                                                 **headers}.items())
    t0 = time.monotonic()
    answer = request(port, f"POST /hooks/git HTTP/1.1\r\n{head}\r\n".encode() + (body if send is None else send),
                     timeout=timeout)
    return (int(answer.split()[1]) if answer.startswith(b"HTTP/") else 0), time.monotonic() - t0


def test_a_huge_body_is_refused_before_it_is_read(served):
    s = served(body_timeout=1.0)
    huge = 25 * 1024 * 1024
    # 25 MB announced, a bad signature, and only the first 64 KiB ever sent: the answer comes at once.
    code, took = _post(s.api, b"", {"Content-Length": str(huge), "X-Hub-Signature-256": "sha256=" + "0" * 64},
                       send=b"{" * 65536)
    assert code == 413 and took < 2, (code, took)
    # Under the limit but no signature header: refused before the body, which is never sent.
    code, took = _post(s.api, b"", {"Content-Length": str(512 * 1024)}, send=b"")
    assert code == 401 and took < 2, (code, took)
    # Under the limit, a well-formed header, a body that never comes: cut off after the body timeout
    # (closed, with or without a 400: the request is over either way).
    code, took = _post(s.api, b"", {"Content-Length": "1000", "X-Hub-Signature-256": "sha256=" + "0" * 64,
                                    "X-GitHub-Delivery": "d-slow"}, send=b"{", timeout=8)
    assert code in (0, 400) and 0.8 <= took < 4, (code, took)
    # The limit itself, fully sent, a bad signature: read, checked, refused.
    limit = 1024 * 1024
    code, _ = _post(s.api, b"x" * limit, {"X-Hub-Signature-256": "sha256=" + "0" * 64, "X-GitHub-Delivery": "d-big"})
    assert code == 401
    assert not [e for e in s.events if "push" in e]
    assert {"refused": "body over 1048576 bytes"} in s.events


def test_a_replayed_delivery_is_refused(served):
    s = served()
    body = json.dumps({"ref": "refs/heads/main", "after": "a" * 40}).encode()
    headers = {"X-Hub-Signature-256": _sign(body), "X-GitHub-Event": "push", "X-GitHub-Delivery": "d-1"}
    assert _post(s.api, body, headers)[0] == 202
    assert _post(s.api, body, headers)[0] == 409  # the same delivery again
    assert _post(s.api, body, dict(headers, **{"X-GitHub-Delivery": "d-2"}))[0] == 409  # same signed body, new id
    other = json.dumps({"ref": "refs/heads/main", "after": "b" * 40}).encode()
    assert _post(s.api, other, dict(headers, **{"X-Hub-Signature-256": _sign(other)}))[0] == 409  # id d-1 again
    assert _post(s.api, other, dict(headers, **{"X-Hub-Signature-256": _sign(other),
                                                "X-GitHub-Delivery": "d-3"}))[0] == 202
    # Correctly signed, but no delivery id (GitHub sends one with every delivery), an empty one or
    # free text: refused, and nothing is remembered or pushed.
    fresh = json.dumps({"ref": "refs/heads/main", "after": "c" * 40}).encode()
    for delivery in (None, "", "  ", "a b", "\x1b[31m", "x" * 101):
        extra = {} if delivery is None else {"X-GitHub-Delivery": delivery}
        assert _post(s.api, fresh, {"X-Hub-Signature-256": _sign(fresh), **extra})[0] == 400, delivery
    assert _post(s.api, fresh, {"X-Hub-Signature-256": _sign(fresh), "X-GitHub-Delivery": "d-5"})[0] == 202
    stale = json.dumps({"ref": "refs/heads/main", "repository": {"pushed_at": int(time.time()) - 7200}}).encode()
    assert _post(s.api, stale, {"X-Hub-Signature-256": _sign(stale), "X-GitHub-Delivery": "d-4"})[0] == 409
    wait_for(lambda: len([e for e in s.events if "push" in e]) == 3
             and len([e for e in s.events if e.get("refused") == "replayed or stale delivery"]) == 4
             and len([e for e in s.events if e.get("refused") == "bad or missing X-GitHub-Delivery"]) == 6,
             timeout=5, what="three pushes, four replays and six requests without a delivery id")


# ---------------------------------------------------------------- provider ids

HOSTILE_IDS = ["../../x", "a b", "x" * 500, "-leading-dash", "id/with/slash", "\x1b[31m"]


def _provider(kind: str, url: str) -> Provider:
    return Provider.model_validate({
        "apiVersion": "reconciler/v1", "kind": "Provider", "metadata": {"name": kind},
        "spec": {"type": kind, "endpoint": url, "credentials": "API_KEY",
                 "rateLimit": {"requestsPerSecond": 100, "burst": 50},
                 "offers": [{"id": "a10", "resource": "gpu_1x_a10", "gpu_count": 0, "price_per_hour": 1.0}],
                 "ssh": {"user": "rcpage", "image": "img"}}})


def test_hostile_rental_ids_are_dropped_with_a_reason(tmp_path, caplog):
    from tests.fakes.lambdacloud import FakeLambda
    from tests.fakes.targon import FakeTargon

    ctx = AdapterContext(secret_source={"API_KEY": "k"}.get, state_dir=tmp_path)
    lam = FakeLambda(tmp_path / "lambda", token="k", delay=3600, ssh_port=22).start()
    tar = FakeTargon(tmp_path / "targon", token="k", delay=3600).start()
    try:
        for iid in HOSTILE_IDS + ["good-1"]:
            lam.machines[iid] = {"id": iid, "name": "rc-x", "status": "booting", "ip": "127.0.0.9", "created": time.time(),
                                 "ssh_key_names": [], "instance_type": {"name": "gpu_1x_a10", "price_cents_per_hour": 1},
                                 "region": {"name": "us-east-1"}, "tags": []}
            tar.machines[iid] = {"id": iid, "uid": iid, "name": "rc-x", "status": "running", "ports": [],
                                 "resource_name": "gpu_1x_a10", "created": time.time(), "ssh_keys": [],
                                 "created_at": "2026-11-25T10:00:00Z", "project_id": None, "envs": {}}
        for fake, url in ((lam, lam.url + "/api/v1"), (tar, tar.url + "/tha/v2")):
            kind = "lambda" if fake is lam else "targon"
            adapter = adapter_for(_provider(kind, url), ctx)
            with caplog.at_level("WARNING", logger="reconciler.providers"):
                got = adapter.inventory()
            assert [r.id for r in got] == ["good-1"], kind
            assert len(adapter.dropped) == len(HOSTILE_IDS), adapter.dropped
            assert all("is ignored" in why and "not 1-128 letters" in why for why in adapter.dropped)
            assert any("'../../x'" in why for why in adapter.dropped)
            # Nothing was asked of the provider about them (Targon asks each running rental's endpoint).
            assert not [p for _, p in fake.requests if ".." in p or "x" * 50 in p or "slash" in p]
            # A status file's id (anyone can push one) never reaches a URL either.
            with pytest.raises(PermanentError, match="terminate"):
                adapter.terminate("../../workloads")
        assert "is ignored" in caplog.text
    finally:
        lam.close()
        tar.close()


# ---------------------------------------------------------------- the plan workflow's trusted half


def test_the_comment_job_posts_an_untrusted_plan_as_bounded_text(tmp_path):
    """``python -m reconciler.cli.prcomment PLAN.md`` as the workflow's comment job runs it: the file was
    made by the pull request's code; what is posted is bounded, marked once, mentions defused, and
    the job summary is left alone (the plan job wrote it)."""
    from tests.cli.test_prcomment import TOKEN, FakeGitHub, event

    github = FakeGitHub()
    try:
        plan = tmp_path / "plan.md"
        plan.write_text(f"{prcomment.MARKER}\n### Reconcile plan\n@org/admins please merge\x1b[2J\n"
                        + f"{prcomment.MARKER}\n" + "| x |\n" * 40000)
        summary = tmp_path / "summary.md"
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "GITHUB_API_URL": github.url,
               "GITHUB_REPOSITORY": "org/specs", "GITHUB_TOKEN": TOKEN, "GITHUB_EVENT_PATH": str(event(tmp_path)),
               "GITHUB_STEP_SUMMARY": str(summary)}
        for what in ("created", "unchanged"):
            p = subprocess.run([sys.executable, "-m", "reconciler.cli.prcomment", str(plan)], cwd=tmp_path,
                               capture_output=True, text=True, timeout=60, env=env)
            assert p.returncode == 0 and f"comment: {what}" in p.stdout, p.stdout + p.stderr
        assert len(github.comments) == 1
        body = github.comments[0]["body"]
        assert body.startswith(prcomment.MARKER + "\n") and body.count(prcomment.MARKER) == 1
        assert "@org" not in body and "\x1b" not in body and len(body) <= prcomment.MAX_BODY + 100
        assert not summary.exists()
    finally:
        github.close()
