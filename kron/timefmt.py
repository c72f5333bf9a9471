"""The one rendering of a time: epoch milliseconds as RFC 3339 in UTC, with milliseconds.

``2026-11-30T00:00:00.000Z``: the API's times (a public contract) and the audit's findings;
the ``X-Kron-Scheduled-For`` header and ``KRON_SCHEDULED_FOR`` carry the same instant with a
``+00:00`` offset (streams/executor.py), as targets always received it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def iso(ms: int) -> str:
    """Epoch milliseconds as RFC 3339 UTC with milliseconds: ``2026-11-30T00:00:00.000Z``.
    Years 1 to 9999; raises OverflowError outside them."""
    t = _EPOCH + timedelta(milliseconds=ms)
    return (f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:"
            f"{t.second:02d}.{ms % 1000:03d}Z")
