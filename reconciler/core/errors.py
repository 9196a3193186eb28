"""Error types that say whether retrying can help.

A reconcile step ends in one of three ways: done, retry later, or stop until a human changes
something. The exception type carries that decision so that callers never guess from a message:
``PermanentError`` means "fix the spec or the machine", ``TemporaryError`` means "the world may
change; try again after ``retry_after`` seconds".
"""

from __future__ import annotations


class ReconcilerError(Exception):
    """Base class for errors the reconciler reports to a user (never with a traceback)."""


class PermanentError(ReconcilerError):
    """Retrying the same thing will fail the same way: a bad spec, a missing image, a refused key."""


class TemporaryError(ReconcilerError):
    """The machine or network may recover: a timeout, a refused connection, a busy lock."""

    def __init__(self, message: str, retry_after: float = 30.0):
        super().__init__(message)
        self.retry_after = retry_after


class UsageError(ReconcilerError):
    """The command line or the repository layout is wrong (exit code 2)."""
