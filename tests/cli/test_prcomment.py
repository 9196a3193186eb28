"""The plan on a pull request: the step summary in a real file, and the comment against a fake of
GitHub's REST API (the three calls the product makes; GitHub itself cannot be reached from tests)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from reconciler.cli.prcomment import MARKER
from tests.status.test_offline import record, repo, run  # noqa: F401 - the repository fixture

TOKEN = "ghs_fake_token_value"


class FakeGitHub:
    """A fake of GitHub's issue-comment API for one repository: list (paged), create, edit."""

    def __init__(self, repo: str = "org/specs"):
        self.repo, self.comments, self.calls, self.next_id = repo, [], [], 1000
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, code, doc):
                data = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _auth(self):
                fake.calls.append((self.command, self.path))
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self._send(401, {"message": "Bad credentials"})
                    return False
                return True

            def do_GET(self):
                if not self._auth():
                    return
                u = urlparse(self.path)
                q = parse_qs(u.query)
                per, page = int(q["per_page"][0]), int(q.get("page", ["1"])[0])
                if u.path != f"/repos/{fake.repo}/issues/7/comments":
                    return self._send(404, {"message": "Not Found"})
                self._send(200, fake.comments[(page - 1) * per: page * per])

            def do_POST(self):
                if not self._auth():
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.next_id += 1
                fake.comments.append({"id": fake.next_id, "body": body["body"], "user": {"login": "github-actions[bot]"}})
                self._send(201, fake.comments[-1])

            def do_PATCH(self):
                if not self._auth():
                    return
                cid = int(self.path.rsplit("/", 1)[1])
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                for c in fake.comments:
                    if c["id"] == cid:
                        c["body"] = body["body"]
                        return self._send(200, c)
                self._send(404, {"message": "Not Found"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def github():
    fake = FakeGitHub()
    yield fake
    fake.close()


def event(tmp_path: Path, head: str = "org/specs") -> Path:
    path = tmp_path / "event.json"
    path.write_text(json.dumps({"pull_request": {"number": 7, "head": {"repo": {"full_name": head}},
                                                 "base": {"repo": {"full_name": "org/specs"}}}}))
    return path


def plan_github(repo: Path, github: FakeGitHub, event_path: Path, summary: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "GITHUB_API_URL": github.url, "GITHUB_REPOSITORY": "org/specs",
           "GITHUB_TOKEN": TOKEN, "GITHUB_EVENT_PATH": str(event_path), "GITHUB_STEP_SUMMARY": str(summary)}
    return subprocess.run([sys.executable, "-m", "reconciler", "plan", "--offline", "--github"], cwd=repo,
                          capture_output=True, text=True, timeout=60, env=env)


def test_one_comment_created_then_updated_never_duplicated(repo, github, tmp_path):  # noqa: F811
    # Somebody else's comments fill the first page: the marked one must be found on the second.
    github.comments = [{"id": i, "body": f"review {i}", "user": {"login": "alice"}} for i in range(100)]
    (repo / "specs" / "runs" / "a.yaml").write_text(run("a"))
    summary = tmp_path / "summary.md"
    p = plan_github(repo, github, event(tmp_path), summary)
    assert p.returncode == 0, p.stderr
    ours = [c for c in github.comments if MARKER in c["body"]]
    assert len(ours) == 1 and "| `+` | a | launch | a-g1-a1 on gpu-1 |" in ours[0]["body"]
    assert "comment: created" in p.stderr
    # A second push that changes the plan: the same comment is edited.
    (repo / "specs" / "runs" / "b.yaml").write_text(run("b"))
    p = plan_github(repo, github, event(tmp_path), summary)
    ours = [c for c in github.comments if MARKER in c["body"]]
    assert len(ours) == 1 and "| b | wait |" in ours[0]["body"] and "comment: updated" in p.stderr
    assert ("PATCH", f"/repos/org/specs/issues/comments/{ours[0]['id']}") in github.calls
    # The same plan again: nothing is written.
    calls = len(github.calls)
    p = plan_github(repo, github, event(tmp_path), summary)
    assert "comment: unchanged" in p.stderr
    assert [m for m, _ in github.calls[calls:]] == ["GET", "GET"]
    assert len(github.comments) == 101
    # Each run appended its summary to the real file, and the token went nowhere but the header.
    text = summary.read_text()
    assert text.count("### Reconcile plan (offline") == 3
    assert TOKEN not in p.stdout + p.stderr + text


def test_a_fork_gets_the_summary_only(repo, github, tmp_path):  # noqa: F811
    (repo / "specs" / "runs" / "a.yaml").write_text(run("a"))
    summary = tmp_path / "summary.md"
    p = plan_github(repo, github, event(tmp_path, head="mallory/specs"), summary)
    assert p.returncode == 0 and "from a fork (mallory/specs)" in p.stderr
    assert github.calls == [] and "| a | launch |" in summary.read_text()


def test_a_refused_token_is_a_one_line_error(repo, github, tmp_path, monkeypatch):  # noqa: F811
    (repo / "specs" / "runs" / "a.yaml").write_text(run("a"))
    p = subprocess.run([sys.executable, "-m", "reconciler", "plan", "--offline", "--github"], cwd=repo,
                       capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "GITHUB_API_URL": github.url, "GITHUB_TOKEN": "wrong",
                            "GITHUB_EVENT_PATH": str(event(tmp_path)), "GITHUB_REPOSITORY": "org/specs"})
    assert p.returncode == 1 and "HTTP 401" in p.stderr and "Traceback" not in p.stderr
    assert "wrong" not in p.stderr


def test_hostile_names_and_reasons_cannot_break_the_table(tmp_path):
    from reconciler.core.plan import Change, Plan
    from reconciler.cli.prcomment import markdown

    plan = Plan(changes=[Change("a", "wait", "NoCapacity", "x | y <script>alert(1)</script>\nz", "Pending")])
    body = markdown(plan)
    row = [line for line in body.splitlines() if line.startswith("| `.`")][0]
    assert row.count(" | ") == 4 and "<script>" not in body and "\\|" in row


def test_a_malformed_event_is_a_one_line_error(tmp_path):
    from reconciler.core.errors import ReconcilerError
    from reconciler.cli.prcomment import report

    bad = tmp_path / "event.json"
    bad.write_text('{"pull_request": {"head": {"repo": {"full_name": "o/r"}}, "base": {"repo": {"full_name": "o/r"}}}}')
    with pytest.raises(ReconcilerError, match="has no number"):
        report("body", {"GITHUB_EVENT_PATH": str(bad), "GITHUB_TOKEN": "t"})
    bad.write_text("{not json")
    with pytest.raises(ReconcilerError, match="cannot read the GitHub event"):
        report("body", {"GITHUB_EVENT_PATH": str(bad)})
