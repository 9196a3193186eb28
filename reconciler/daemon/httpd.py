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

Anyone who can reach the port can open connections, so a server here (this one and the live
page's) bounds what a client can hold: at most ``MAX_CONNECTIONS`` at once (over that, a new one
gets a 503 and is closed at once, so idle connections can never use up the process's file
descriptors); a request's line and headers must arrive within ``HEADER_TIMEOUT`` seconds in all
(a slow sender is cut off, not just a silent one), a body within ``BODY_TIMEOUT``, an answer be
taken within ``ANSWER_TIMEOUT``. When the process is out of descriptors anyway, accepting backs
off and logs instead of spinning; the server keeps serving.

The webhook reads at most ``WEBHOOK_MAX_BODY`` bytes: a larger ``Content-Length`` is refused
before any of the body is read, and so is a request without a well-formed signature header. A
correctly signed request without a delivery id (``X-GitHub-Delivery``, which GitHub sends with
every delivery) is refused too. A signed body is accepted once: the delivery id and the body's
signature are remembered for ``REPLAY_WINDOW`` seconds (at most ``REPLAY_KEEP`` keys in all), and
a push whose signed ``repository.pushed_at`` is older than that window is refused as stale. The
delivery id is not covered by the signature, so the signature itself is what a replay cannot
change.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import logging
import re
import socket
import sys
import threading
import time
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from reconciler.core import display

log = logging.getLogger("reconciler.http")

# GitHub caps payloads at 25 MB, but a push event (the one this webhook acts on) is a few KB. The
# body is read before its signature can be checked, so this is what an unauthenticated client can
# make the daemon read and hold. A rare larger push is refused (413) and the poll picks it up.
WEBHOOK_MAX_BODY = 1024 * 1024
MAX_CONNECTIONS = 64  # per server: a page, a scraper and a webhook need a handful
HEADER_TIMEOUT = 10.0  # seconds for a request line and its headers, in all
BODY_TIMEOUT = 10.0  # seconds for the body, in all
ANSWER_TIMEOUT = 60.0  # seconds to compute an answer and for the client to take it
REPLAY_WINDOW = 3600.0  # seconds a delivery is remembered (and the age past which a push is stale)
REPLAY_KEEP = 4096  # deliveries remembered at most
# A delivery id as GitHub writes it (a GUID), or any short plain token: never empty, never free text.
_DELIVERY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,99}")
_OUT_OF_FDS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


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


class Replays:
    """Signed deliveries seen in the last ``window`` seconds, by delivery id and by signature:
    bounded in count and in time, in memory (a restart forgets them, and the window is short)."""

    def __init__(self, window: float = REPLAY_WINDOW, keep: int = REPLAY_KEEP):
        self.window, self.keep = window, keep
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def first_time(self, keys: list[str], now: float | None = None) -> bool:
        """True, and remembers ``keys``, unless one of them was seen within the window."""
        now = time.monotonic() if now is None else now
        with self._lock:
            while self._seen and (len(self._seen) > self.keep or next(iter(self._seen.values())) < now - self.window):
                self._seen.popitem(last=False)
            if any(k in self._seen for k in keys):
                return False
            for k in keys:
                self._seen[k] = now
            while len(self._seen) > self.keep:
                self._seen.popitem(last=False)
            return True


def stale_push(payload, now: float, window: float = REPLAY_WINDOW) -> bool:
    """A push whose signed ``repository.pushed_at`` (epoch seconds) is older than ``window``."""
    repo = payload.get("repository") if isinstance(payload, dict) else None
    pushed = repo.get("pushed_at") if isinstance(repo, dict) else None
    if isinstance(pushed, bool) or not isinstance(pushed, (int, float)):
        return False
    return pushed < now - window


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # a burst of connections waits in the kernel, not dropped; each is then capped
    max_connections = MAX_CONNECTIONS
    header_timeout = HEADER_TIMEOUT
    body_timeout = BODY_TIMEOUT
    answer_timeout = ANSWER_TIMEOUT

    def __init__(self, *args, **kwargs):
        self._slots: threading.BoundedSemaphore | None = None
        self._deadlines: dict[socket.socket, float] = {}
        self._deadlines_lock = threading.Lock()
        self._fd_backoff = 0.0
        self._fd_logged = 0.0
        self.refused_connections = 0  # over the cap, since the start
        super().__init__(*args, **kwargs)

    # ---- connections: a cap, and deadlines the serving thread enforces

    def process_request(self, request, client_address) -> None:
        if self._slots is None:
            self._slots = threading.BoundedSemaphore(self.max_connections)
        if not self._slots.acquire(blocking=False):
            self.refused_connections += 1
            _busy(request)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread to release the slot (can't start one: out of memory)
            self._slots.release()
            self.shutdown_request(request)
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.disarm(request)
            if self._slots is not None:
                self._slots.release()

    def arm(self, sock: socket.socket, seconds: float) -> None:
        """Cut ``sock`` off unless the current step is over within ``seconds``: a per-read
        timeout alone lets a client that sends a byte now and then hold the thread forever."""
        with self._deadlines_lock:
            self._deadlines[sock] = time.monotonic() + seconds

    def disarm(self, sock: socket.socket) -> None:
        with self._deadlines_lock:
            self._deadlines.pop(sock, None)

    def service_actions(self) -> None:
        # Called by serve_forever between polls (every poll interval at most).
        now = time.monotonic()
        with self._deadlines_lock:
            late = [s for s, t in self._deadlines.items() if t <= now]
            for s in late:
                del self._deadlines[s]
        for s in late:
            try:
                s.shutdown(socket.SHUT_RDWR)  # the handler's read or write returns; its thread ends
            except OSError:
                pass

    def get_request(self):
        try:
            got = super().get_request()
        except OSError as e:
            if e.errno in _OUT_OF_FDS:
                # socketserver drops an accept error and polls again at once: back off instead of
                # spinning, and say so (once in a while), until descriptors are free again.
                now = time.monotonic()
                self._fd_backoff = min(1.0, max(0.05, self._fd_backoff * 2))
                if now - self._fd_logged > 10:
                    self._fd_logged = now
                    log.warning("http: cannot accept a connection: %s; backing off", e.strerror,
                                extra={"fields": {"error": str(e), "address": str(self.server_address)}})
                time.sleep(self._fd_backoff)
            raise
        self._fd_backoff = 0.0
        return got

    def handle_error(self, request, client_address) -> None:  # noqa: ARG002
        # socketserver prints the traceback straight to stderr; log it instead. A client that
        # hangs up mid-answer is routine, not an error.
        exc = sys.exc_info()[1]
        client = client_address[0] if isinstance(client_address, tuple) and client_address else str(client_address)
        if isinstance(exc, (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)):
            log.debug("http: client went away", extra={"fields": {"client": client, "error": str(exc)}})
            return
        log.error("http: error while answering a request", exc_info=True, extra={"fields": {"client": client}})


def _busy(sock: socket.socket) -> None:
    """Tell a connection over the cap why it is closed, without ever waiting on it."""
    try:
        sock.setblocking(False)
        sock.send(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n"
                  b"Retry-After: 1\r\n\r\n")
    except OSError:
        pass


class BoundedHandler(BaseHTTPRequestHandler):
    """A request handler whose every step has a deadline (served by ``_Server`` only)."""

    server_version = "reconciler"
    protocol_version = "HTTP/1.1"
    timeout = HEADER_TIMEOUT  # each read, in case a deadline is missed between two polls

    def setup(self) -> None:
        self.timeout = self.server.header_timeout
        super().setup()

    def _deadline(self, seconds: float) -> None:
        self.server.arm(self.connection, seconds)

    def handle_one_request(self) -> None:
        self._deadline(self.server.header_timeout)
        super().handle_one_request()

    def parse_request(self) -> bool:
        ok = super().parse_request()  # the headers are in
        self._deadline(self.server.answer_timeout)
        return ok

    def read_body(self, length: int) -> bytes | None:
        """``length`` bytes of body within the body timeout, or None when they did not come."""
        self._deadline(self.server.body_timeout)
        try:
            body = self.rfile.read(length) if length else b""
        except OSError:
            body = None
        self._deadline(self.server.answer_timeout)
        if body is None or len(body) < length:
            self.close_connection = True
            return None
        return body


class _Handler(BoundedHandler):
    """The daemon's endpoints; ``make_server`` makes a subclass bound to its ``Endpoints`` and its
    own record of webhook deliveries."""

    ep: Endpoints
    replays: Replays

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
            ok, data = self.ep.health()
            self._json(200 if ok else 503, data)
        elif path == "/metrics":
            body, ctype = self.ep.metrics(self.headers.get("Accept") or "")  # (body, content type)
            self._send(200, body, ctype)
        else:
            self._json(404, {"error": "not found", "endpoints": ["/healthz", "/metrics", "POST /hooks/git"]})

    do_HEAD = do_GET

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        if path != "/hooks/git":
            self._json(404, {"error": "not found"})
            return
        # Everything that can be refused without the body is, before a byte of it is read.
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > WEBHOOK_MAX_BODY:
            self.close_connection = True
            if length > WEBHOOK_MAX_BODY:
                self.ep.on_refused(f"body over {WEBHOOK_MAX_BODY} bytes")
            self._json(413 if length > WEBHOOK_MAX_BODY else 400, {"error": "bad Content-Length"})
            return
        secret = self.ep.secret()
        if not secret:
            self.close_connection = True
            self.ep.on_refused("no webhook_secret configured")
            self._json(403, {"error": "webhook disabled: no webhook_secret is configured"})
            return
        header = (self.headers.get("X-Hub-Signature-256") or "").strip()
        if not header.startswith("sha256=") or len(header) != 71:
            self.close_connection = True
            self.ep.on_refused("bad or missing X-Hub-Signature-256")
            self._json(401, {"error": "bad or missing X-Hub-Signature-256"})
            return
        body = self.read_body(length)
        if body is None:
            self.ep.on_refused("body not received in time")
            self._json(400, {"error": "the body did not arrive"})
            return
        if not signature_ok(secret, body, header):
            self.ep.on_refused("bad or missing X-Hub-Signature-256")
            self._json(401, {"error": "bad or missing X-Hub-Signature-256"})
            return
        # GitHub sends a delivery id with every delivery ("X-GitHub-Delivery: A globally unique
        # identifier (GUID) to identify the event", docs.github.com/en/webhooks/webhook-events-and-payloads
        # #delivery-headers); replay protection keys on it, so a request without one is not GitHub's.
        delivery = (self.headers.get("X-GitHub-Delivery") or "").strip()
        if not _DELIVERY.fullmatch(delivery):
            self.ep.on_refused("bad or missing X-GitHub-Delivery")
            self._json(400, {"error": "bad or missing X-GitHub-Delivery"})
            return
        try:
            payload = json.loads(body) if body else {}
        except (ValueError, RecursionError):  # signed, but nested past what the decoder takes
            payload = {}
        keys = ["sig:" + header.lower(), "id:" + delivery]
        if stale_push(payload, time.time()) or not self.replays.first_time(keys):
            self.ep.on_refused("replayed or stale delivery")
            self._json(409, {"error": "this delivery was already received, or is too old"})
            return
        info = {"event": display.clean(self.headers.get("X-GitHub-Event", ""), 60), "delivery": delivery}
        if isinstance(payload, dict):
            info["ref"] = display.clean(payload.get("ref", ""), 255)
        self.ep.on_push(info)
        self._json(202, {"accepted": True})


def make_server(listen: str, ep: Endpoints) -> ThreadingHTTPServer:
    replays = Replays()
    handler = type("Handler", (_Handler,), {"ep": ep, "replays": replays})
    host, port = parse_listen(listen)
    return _Server((host, port), handler)


def serve_in_thread(server: ThreadingHTTPServer) -> threading.Thread:
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="reconciler-http",
                         daemon=True)
    t.start()
    return t
