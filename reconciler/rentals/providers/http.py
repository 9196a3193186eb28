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

from reconciler.core.boundary import clean_text
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
                # Read whole up to a bound, then cut the message: a body cut first is no longer
                # JSON, and a long detail would turn the error into raw text.
                text = e.read(ERROR_BODY_LIMIT).decode("utf-8", "replace")
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


# What a provider's error may show of itself: its answer is untrusted text (a proxy's HTML page,
# a hostile or broken API), shown in statuses, plans and logs.
MESSAGE_LIMIT = 300
ERROR_BODY_LIMIT = 64 * 1024
CODE_LIMIT = 100


def _text(value: Any) -> str:
    """A field of an error body as text: strings only (a structure is never rendered)."""
    return value if isinstance(value, str) else ""


def _code(text: str) -> str | None:
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    err = doc.get("error")
    code = err.get("code") if isinstance(err, dict) else doc.get("reason")
    return clean_text(_text(code), CODE_LIMIT) or None


def _words(text: str) -> str:
    """The provider's own words in its error body, before they are bounded and made printable."""
    try:
        doc = json.loads(text)
    except ValueError:
        return text
    if not isinstance(doc, dict):
        return text
    err = doc.get("error")
    if isinstance(err, dict):  # Lambda: {"error": {"code", "message", "suggestion"}}
        return _text(err.get("message")) or _text(err.get("code")) or "an error without a message"
    if "title" in doc or "detail" in doc:
        # RFC 9457 problem details, RunPod REST v2's ErrorResponse {title, status, detail, errors}
        # (github.com/runpod/docs api-reference-v2/openapi.json): "title: detail", then the
        # validation errors that say which field.
        errors = [_text(e) for e in doc.get("errors") or [] if _text(e)] if isinstance(doc.get("errors"), list) else []
        head = ": ".join(x for x in (_text(doc.get("title")), _text(doc.get("detail"))) if x)
        return "; ".join([head, *errors[:3]] if head else errors[:3]) or text
    # Targon: {"error", "reason"}; others: {"message"}
    parts = [_text(doc.get(k)) for k in ("error", "reason", "message") if _text(doc.get(k))]
    return ": ".join(parts) if parts else text


def _message(text: str) -> str:
    """The provider's own words, printable and at most MESSAGE_LIMIT characters."""
    return clean_text(_words(text), MESSAGE_LIMIT) or "no message"


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
