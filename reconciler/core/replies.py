"""Decoding machines' replies within one process-wide memory budget.

A reply decodes to up to ~8x its size, and ``parallel_machines`` probes decode at once: sixteen
replies at the 16 MiB limit would hold over a gigabyte. The budget bounds the reply bytes whose
decoded values are alive at once, process-wide: a reply waits for room before it is decoded and
gives it back when the caller has done with the decoded value (``scope``), or at once. The
parsing itself is the trust boundary's (``core/boundary.py``: ``loads``).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any

from .boundary import MAX_REPLY_BYTES, BadReply, loads

DECODE_BUDGET_BYTES = 128 << 20


class ReplyBudget:
    """Reply bytes being decoded (and their values being checked) at once, across threads."""

    def __init__(self, total: int = DECODE_BUDGET_BYTES) -> None:
        self.total = total
        self.used = 0
        self.peak = 0
        self._cond = threading.Condition()
        self._local = threading.local()

    def resize(self, total: int) -> None:
        with self._cond:
            self.total = total
            self._cond.notify_all()

    def _acquire(self, n: int, timeout: float) -> None:
        if n > self.total:
            raise BadReply(f"the reply is {n} bytes, over the whole decoding budget of {self.total} "
                           "(ssh_decode_budget_bytes)")
        with self._cond:
            if not self._cond.wait_for(lambda: self.used + n <= self.total, timeout):
                raise BadReply(f"no room to decode a reply of {n} bytes within {timeout:g}s "
                               f"(other replies hold the decoding budget of {self.total} bytes)")
            self.used += n
            self.peak = max(self.peak, self.used)

    def _release(self, n: int) -> None:
        if n:
            with self._cond:
                self.used -= n
                self._cond.notify_all()

    @contextmanager
    def scope(self):
        """Within it, a reply this thread decodes keeps its share of the budget until the scope
        ends (the caller is done with the decoded value). A second decode in the scope replaces
        the first: a transport decodes again only after it dropped the first answer. A scope
        within a scope is the outer one (it alone releases what is held)."""
        if getattr(self._local, "held", None) is not None:
            yield
            return
        self._local.held = 0
        try:
            yield
        finally:
            held, self._local.held = self._local.held, None
            self._release(held or 0)

    def decode(self, data: bytes | str, limit: int = MAX_REPLY_BYTES, timeout: float = 30.0) -> Any:
        """``loads`` once the reply's size fits in the budget (waiting at most ``timeout``);
        ``BadReply`` when it never can, or does not in time."""
        held = getattr(self._local, "held", None)
        if held:
            self._release(held)
            self._local.held = 0
        n = len(data)
        self._acquire(n, timeout)
        try:
            value = loads(data, limit)
        except BaseException:
            self._release(n)
            raise
        if getattr(self._local, "held", None) is not None:
            self._local.held = n
        else:
            self._release(n)
        return value


REPLY_BUDGET = ReplyBudget()
