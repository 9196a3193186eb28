"""The daemon's small HTTP endpoint: ``/healthz``, ``/metrics`` and ``POST /hooks/git``.

Standard library only (``ThreadingHTTPServer`` on a thread). The webhook is authenticated like
GitHub's: ``X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the raw body>`` with the shared secret,
compared in constant time. A bad or missing signature gets 401 and triggers nothing; without a
configured secret the webhook is off (403). A good one asks the loop for an immediate fetch and
pass and returns 202 at once: the pass runs on the loop's thread, never on the request's.

``/healthz`` answers 200 or 503 with a JSON body (the daemon decides: what fails, since when);
``/metrics`` the Prometheus exposition, written by prometheus-client in the format the scraper's
``Accept`` header asks for (OpenMetrics for Prometheus itself, the text format 0.0.4 otherwise). Nothing here writes to stderr itself: request lines and
handler errors go to the ``reconciler.http`` logger, so JSON logs stay one object per line.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

log = logging.getLogger("reconciler.http")

MAX_BODY = 25 * 1024 * 1024  # GitHub caps payloads at 25 MB


def signature_ok(secret: str, body: bytes, header: str | None) -> bool:
    if not secret or not header or not header.startswith("sha256="):
        return False
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), header.strip().encode())


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"listen: expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


class Endpoints:
    """What the server needs from the daemon: callables, so this module knows nothing of the loop."""

    def __init__(self, health: Callable[[], tuple[bool, dict]], metrics: Callable[[str], tuple[bytes, str]],
                 on_push: Callable[[dict], None], secret: Callable[[], str | None],
                 on_refused: Callable[[str], None] = lambda why: None):
        self.health, self.metrics, self.on_push, self.secret, self.on_refused = health, metrics, on_push, secret, on_refused


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:  # noqa: ARG002
        # socketserver prints the traceback straight to stderr; log it instead. A client that
        # hangs up mid-answer is routine, not an error.
        exc = sys.exc_info()[1]
        client = client_address[0] if isinstance(client_address, tuple) and client_address else str(client_address)
        if isinstance(exc, (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)):
            log.debug("http: client went away", extra={"fields": {"client": client, "error": str(exc)}})
            return
        log.error("http: error while answering a request", exc_info=True, extra={"fields": {"client": client}})


def make_server(listen: str, ep: Endpoints) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        server_version = "reconciler"
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args) -> None:  # route to our logger, quietly
            log.debug("http %s", fmt % args)

        def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, code: int, data: dict) -> None:
            self._send(code, (json.dumps(data, sort_keys=True) + "\n").encode())

        def do_GET(self) -> None:  # noqa: N802
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                ok, data = ep.health()
                self._json(200 if ok else 503, data)
            elif path == "/metrics":
                body, ctype = ep.metrics(self.headers.get("Accept") or "")  # (body, content type)
                self._send(200, body, ctype)
            else:
                self._json(404, {"error": "not found", "endpoints": ["/healthz", "/metrics", "POST /hooks/git"]})

        do_HEAD = do_GET

        def do_POST(self) -> None:  # noqa: N802
            path = self.path.split("?", 1)[0]
            if path != "/hooks/git":
                self._json(404, {"error": "not found"})
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length < 0 or length > MAX_BODY:
                self.close_connection = True
                self._json(413 if length > MAX_BODY else 400, {"error": "bad Content-Length"})
                return
            body = self.rfile.read(length) if length else b""
            secret = ep.secret()
            if not secret:
                ep.on_refused("no webhook_secret configured")
                self._json(403, {"error": "webhook disabled: no webhook_secret is configured"})
                return
            if not signature_ok(secret, body, self.headers.get("X-Hub-Signature-256")):
                ep.on_refused("bad or missing X-Hub-Signature-256")
                self._json(401, {"error": "bad or missing X-Hub-Signature-256"})
                return
            info = {"event": self.headers.get("X-GitHub-Event", ""), "delivery": self.headers.get("X-GitHub-Delivery", "")}
            try:
                payload = json.loads(body) if body else {}
                if isinstance(payload, dict):
                    info["ref"] = payload.get("ref", "")
            except ValueError:
                pass
            ep.on_push(info)
            self._json(202, {"accepted": True})

    host, port = parse_listen(listen)
    return _Server((host, port), Handler)


def serve_in_thread(server: ThreadingHTTPServer) -> threading.Thread:
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="reconciler-http",
                         daemon=True)
    t.start()
    return t
