"""What the fake provider APIs share: a JSON HTTP server on loopback, machines that are real sshd
servers, and levers for the bad days (429 and 5xx storms, slow provisioning).

These are fakes, named so: no rental provider's API can be reached from the machines the tests run
on. They speak the subset of each API that the adapters call (see docs/rentals.md for the real
endpoints), and every machine they hand out is a real OpenSSH server on a loopback address, so the
adapter's real HTTP calls and the reconciler's real SSH path both run end to end.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

from tests.infra.sshd import SshServer


class Chaos:
    """Answers to force on the next requests: [(status, headers, body)], consumed in order."""

    def __init__(self):
        self.queue: list[tuple[int, dict, str]] = []
        self.lock = threading.Lock()

    def storm(self, status: int, count: int, headers: dict | None = None, body: str = "") -> None:
        with self.lock:
            self.queue.extend([(status, headers or {}, body)] * count)

    def next(self):
        with self.lock:
            return self.queue.pop(0) if self.queue else None


class Limiter:
    """A provider's documented request rate as a token bucket on the fake's side: a client that
    calls faster gets the provider's 429."""

    def __init__(self, rate: float, burst: int):
        self.rate, self.burst = rate, burst
        self.tokens, self.at = float(burst), time.monotonic()
        self.lock = threading.Lock()

    def allow(self) -> bool:
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
            self.at = now
            if self.tokens >= 1:
                self.tokens -= 1
                return True
            return False


class FakeCloud:
    """Base of the fakes: routes (method, path) to handlers; records every request."""

    # The provider's 429, when its rate limit is enforced: (headers, body)
    throttle_answer: tuple[dict, str] = ({}, "rate limited")

    def __init__(self, scratch: Path, token: str = "test-token", delay: float = 0.0, boot_machines: bool = True):
        self.scratch = scratch
        # False: machines reach "running" with an endpoint nobody listens on (API-only benchmarks).
        self.boot_machines = boot_machines
        self.token = token
        self.delay = delay  # seconds from "create" to "running"
        self.chaos = Chaos()
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.machines: dict[str, dict] = {}  # id → record (with "server": SshServer once booted)
        self.servers: list[SshServer] = []
        self._httpd: ThreadingHTTPServer | None = None
        self._next_ip = 2
        self.limiters: list[tuple[str | None, str, Limiter]] = []  # (method, path prefix, bucket)
        self.throttled = 0
        # A create that is carried out but whose answer never arrives: [(method, path, how)],
        # how = "drop" (the connection closes: a timeout to the client) or a 5xx status
        self.lose: list[tuple[str, str, str | int]] = []
        self.ssh_user: str | None = None  # the machines' login (None: the tests' own, TEST_USER)

    def limit(self, rate: float, burst: int, method: str | None = None, prefix: str = "") -> None:
        self.limiters.append((method, prefix, Limiter(rate, burst)))

    def lose_answer(self, method: str, path: str, how: str | int = "drop") -> None:
        self.lose.append((method, path, how))

    def _throttled(self, method: str, path: str) -> bool:
        for m, prefix, bucket in self.limiters:
            if (m is None or m == method) and path.startswith(prefix) and not bucket.allow():
                with self.lock:
                    self.throttled += 1
                return True
        return False

    def _lost(self, method: str, path: str):
        with self.lock:
            for i, (m, p, how) in enumerate(self.lose):
                if m == method and path == p:
                    del self.lose[i]
                    return how
        return None

    # ------------------------------------------------------------------ the server

    def route(self, method: str, path: str, query: dict, body: Any) -> tuple[int, Any]:
        raise NotImplementedError

    def start(self) -> "FakeCloud":
        cloud = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _serve(self, method: str) -> None:
                from urllib.parse import parse_qs, urlparse

                url = urlparse(self.path)
                with cloud.lock:
                    cloud.requests.append((method, url.path))
                forced = cloud.chaos.next()
                if forced is not None:
                    status, headers, text = forced
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(text.encode())
                    return
                if cloud._throttled(method, url.path):
                    headers, text = cloud.throttle_answer
                    self.send_response(429)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(text.encode())
                    return
                if not cloud.authorized(self.headers.get("Authorization", "")):
                    return self._json(401, {"error": "unauthorized", "reason": "INVALID_TOKEN"})
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    return self._json(400, {"error": "Failed to decode request body", "reason": "INVALID_JSON_BODY"})
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                try:
                    status, doc = cloud.route(method, url.path, query, body)
                except KeyError:
                    status, doc = 404, {"error": "not found"}
                lost = cloud._lost(method, url.path) if status < 300 else None
                if lost == "drop":
                    self.close_connection = True  # done at the provider; the answer never leaves
                    return
                if lost is not None:
                    return self._json(int(lost), {"error": "upstream timeout", "reason": "INTERNAL"})
                self._json(status, doc)

            def _json(self, status: int, doc: Any) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._serve("GET")

            def do_POST(self):
                self._serve("POST")

            def do_DELETE(self):
                self._serve("DELETE")

            def do_PUT(self):
                self._serve("PUT")

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def authorized(self, header: str) -> bool:
        return header == f"Bearer {self.token}"

    def calls(self, method: str | None = None, prefix: str = "") -> int:
        with self.lock:
            return sum(1 for m, p in self.requests if (method is None or m == method) and p.startswith(prefix))

    # ------------------------------------------------------------------ machines

    def boot(self, record: dict, public_key: str, port: int | None = None, host: str = "127.0.0.1") -> SshServer:
        """A real sshd for a machine that reached "running", accepting the registered key."""
        if not self.boot_machines:
            record["server"], record["port"] = None, 9  # the discard port: nothing answers there
            return None
        kw = {"user": self.ssh_user} if self.ssh_user else {}
        server = SshServer(self.scratch / f"m-{record['id']}", host=host, port=port, **kw)
        with open(server.authorized_keys, "a") as fh:
            fh.write(public_key.strip() + "\n")
        server.start()
        record["server"], record["port"] = server, server.port
        self.servers.append(server)
        return server

    def ready(self, record: dict) -> bool:
        return time.time() >= record["created"] + self.delay

    def evaporate(self, machine_id: str) -> None:
        record = self.machines.pop(machine_id)
        if record.get("server") is not None:
            record["server"].stop(kill_processes=True)

    def close(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        for s in self.servers:
            s.close()


Route = Callable[[str, dict, Any], tuple[int, Any]]
