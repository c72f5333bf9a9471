"""Error taxonomy shared by the API, the stream processors and the workers.

The split that matters operationally is permanent vs transient: a permanent error means
the input itself is wrong (the API answers 4xx, a processor dead-letters the record), a
transient one means the same input may succeed later (retry with backoff).
"""

from __future__ import annotations

from typing import Any


class KronError(Exception):
    """Base of every error raised deliberately by kron code."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class PermanentError(KronError):
    """Bad input: retrying the same input cannot succeed.

    ``field`` is a dotted path into the request (e.g. ``"schedule.cron"``) so the API can
    point the caller at the offending value; ``None`` when no single field is to blame.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field

    def __reduce__(self) -> tuple[Any, ...]:
        # Exceptions pickle as cls(*args); the keyword-only field would be lost, and the
        # errors cross process boundaries (worker pools, test runners).
        return (self.__class__, (self.message,), {"field": self.field})

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, field={self.field!r})"


class InvalidSchedule(PermanentError):
    """A cron expression, timezone or one-off time that cannot be scheduled."""


class InvalidPolicy(PermanentError):
    """A retry, misfire, DST or jitter setting outside its allowed range."""
