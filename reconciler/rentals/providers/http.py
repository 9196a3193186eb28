"""A provider API client that keeps to the provider's rate limit and survives its bad moments.

One token bucket per provider, shared by every thread of the process (the reconciler observes and
applies in parallel; the provider counts calls per account, not per thread). A 429 is honoured:
``Retry-After`` when the provider sends it, exponential backoff when it does not (Vast.ai and
Lambda send none). 5xx and connection errors are retried with backoff too, but only for calls
that can be repeated safely (GET, PUT, DELETE): a POST that timed out or got a 5xx may have been
carried out (a machine made, its answer lost), so it is never sent again here; it ends in
``AnswerLost`` and the adapter looks for what it may have made. After ``retries`` a call is a
``TemporaryError`` and the pass moves on. Any other 4xx is a ``PermanentError`` with the
provider's own message. The standard library's urllib is enough here: one JSON request at a time,
no session state worth a dependency.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable

from reconciler.core.errors import PermanentError, TemporaryError

IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE"})


class AnswerLost(TemporaryError):
    """A call that may have taken effect at the provider had no answer (a timeout, a dropped
    connection, a 5xx): retrying it blindly could do it twice."""


class ApiError(PermanentError):
    """A 4xx other than 429, with the provider's error code when it gives one (Lambda's
    ``error.code``, Targon's ``reason``): adapters decide on the code, never on the message."""

    def __init__(self, message: str, status: int, code: str | None):
        super().__init__(message)
        self.status, self.code = status, code


class TokenBucket:
    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.rate, self.burst = rate, max(1, burst)
        self._tokens = float(self.burst)
        self._clock, self._sleep = clock, sleep
        self._at = clock()
        self._lock = threading.Lock()

    def take(self) -> float:
        """Wait for a token; returns the seconds waited."""
        waited = 0.0
        while True:
            with self._lock:
                now = self._clock()
                self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
                self._at = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return waited
                need = (1 - self._tokens) / self.rate
            self._sleep(need)
            waited += need

    def pause(self, seconds: float) -> None:
        """The provider said to slow down: nobody calls for ``seconds``."""
        with self._lock:
            self._tokens = min(self._tokens, 0.0) - seconds * self.rate


_BUCKETS: dict[tuple, TokenBucket] = {}
_BUCKETS_LOCK = threading.Lock()


def bucket_for(key: tuple, rate: float, burst: int) -> TokenBucket:
    with _BUCKETS_LOCK:
        b = _BUCKETS.get(key)
        if b is None or (b.rate, b.burst) != (rate, max(1, burst)):
            b = _BUCKETS[key] = TokenBucket(rate, burst)
        return b


class ApiClient:
    def __init__(self, name: str, base: str, headers: dict[str, str], bucket: TokenBucket,
                 timeout: float = 30.0, retries: int = 3, backoff: float = 0.25, max_backoff: float = 30.0):
        self.name, self.base = name, base.rstrip("/")
        self.headers = {"Accept": "application/json", "User-Agent": "reconciler", **headers}
        self.bucket, self.timeout = bucket, timeout
        self.retries, self.backoff, self.max_backoff = retries, backoff, max_backoff
        self.calls = 0  # HTTP requests sent, retries included
        self.throttled = 0  # 429 answers seen
        self._lock = threading.Lock()

    def request(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None,
                ok_missing: bool = False, idempotent: bool | None = None) -> Any:
        """One call; ``idempotent`` (default: by method) says whether a lost answer may be retried."""
        if idempotent is None:
            idempotent = method in IDEMPOTENT
        url = self.base + path
        if query:
            from urllib.parse import urlencode

            url += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        data = json.dumps(body).encode() if body is not None else None
        delay = self.backoff
        for attempt in range(self.retries + 1):
            self.bucket.take()
            with self._lock:
                self.calls += 1
            req = urllib.request.Request(url, data=data, method=method, headers=dict(
                self.headers, **({"Content-Type": "application/json"} if data is not None else {})))
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    raw = resp.read()
                return json.loads(raw) if raw.strip() else None
            except urllib.error.HTTPError as e:
                text = e.read().decode("utf-8", "replace")[:500]
                if e.code == 404 and ok_missing:
                    return None
                if e.code == 429:
                    with self._lock:
                        self.throttled += 1
                    wait = _retry_after(e.headers.get("Retry-After")) or delay
                    self.bucket.pause(min(wait, self.max_backoff))
                    last = TemporaryError(f"{self.name}: rate limited (429) on {method} {path}",
                                          retry_after=min(wait, self.max_backoff))
                elif e.code >= 500:
                    why = f"{self.name}: {method} {path}: HTTP {e.code}: {_message(text)}"
                    if not idempotent:
                        raise AnswerLost(why) from None
                    last = TemporaryError(why)
                    time.sleep(min(delay, self.max_backoff))
                else:
                    raise ApiError(f"{self.name}: {method} {path}: HTTP {e.code}: {_message(text)}", e.code,
                                   _code(text)) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
                reason = getattr(e, "reason", e)
                why = f"{self.name}: {method} {path}: {reason}"
                if not idempotent:
                    raise AnswerLost(why) from None
                last = TemporaryError(why)
                time.sleep(min(delay, self.max_backoff))
            except json.JSONDecodeError:
                if not idempotent:
                    raise AnswerLost(f"{self.name}: {method} {path}: the answer is not JSON") from None
                raise TemporaryError(f"{self.name}: {method} {path}: the answer is not JSON") from None
            delay = min(delay * 2, self.max_backoff)
        raise last


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None


def _code(text: str) -> str | None:
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    err = doc.get("error")
    if isinstance(err, dict):
        return str(err.get("code")) if err.get("code") else None
    return str(doc["reason"]) if doc.get("reason") else None


def _message(text: str) -> str:
    """The provider's own words: {"error": ..., "reason": ...}, {"error": {"message": ...}}, or text."""
    try:
        doc = json.loads(text)
    except ValueError:
        return text.strip() or "no message"
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict):
            return str(err.get("message") or err.get("code") or err)
        parts = [str(doc[k]) for k in ("error", "reason", "message") if doc.get(k)]
        if parts:
            return ": ".join(parts)
    return text.strip()[:200]


class HttpAdapter:
    """What the adapters of HTTP APIs share: a rate-limited client per provider, the bearer key
    read at each call (a secret rotated on the reconciler host is used at once), the catalog."""

    api = "http"  # the bucket's namespace, per API
    default_base = ""
    default_rate: tuple[float, int] | None = None  # the provider's documented rate, when rateLimit is not set

    def __init__(self, provider, ctx):
        from .names import book_for

        self.provider, self.ctx = provider, ctx
        spec = provider.spec
        base = spec.endpoint or self.default_base
        rate, burst = spec.rateLimit.requestsPerSecond, spec.rateLimit.burst
        if self.default_rate is not None and "rateLimit" not in spec.model_fields_set:
            rate, burst = self.default_rate
        self.client = ApiClient(f"provider {provider.metadata.name}", base, {},
                                bucket_for((self.api, base, provider.metadata.name), rate, burst))
        self.dropped: list[str] = []  # why rentals of the last inventory were left out (bad ids)
        self.book = book_for(getattr(ctx, "state_dir", None), provider.metadata.name)

    @property
    def calls(self) -> int:
        return self.client.calls

    def _auth(self) -> None:
        from .base import credential

        self.client.headers["Authorization"] = "Bearer " + credential(self.provider, self.ctx)

    def offers(self):
        return list(self.provider.spec.offers)
