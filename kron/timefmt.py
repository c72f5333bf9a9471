"""The one rendering of a time: epoch milliseconds as RFC 3339 in UTC, with milliseconds.

``2026-11-30T00:00:00.000Z``: the API's times (a public contract) and the audit's findings;
the ``X-Kron-Scheduled-For`` header and ``KRON_SCHEDULED_FOR`` carry the same instant with a
``+00:00`` offset (streams/executor.py), as targets always received it. A job's own next
run times (``next_run_at``, ``upcoming``) are the exception, written in the job's zone by
``iso_in``: the same instant with the offset its owner reads it in.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def iso(ms: int) -> str:
    """Epoch milliseconds as RFC 3339 UTC with milliseconds: ``2026-11-30T00:00:00.000Z``.
    Years 1 to 9999; raises OverflowError outside them."""
    t = _EPOCH + timedelta(milliseconds=ms)
    return (f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:"
            f"{t.second:02d}.{ms % 1000:03d}Z")


# The zone name a job's spec leaves out, and the one whose times keep their `Z`.
UTC_ZONE = "UTC"


def iso_in(ms: int, zone: str | None) -> str:
    """Epoch milliseconds as RFC 3339 with milliseconds in `zone` (an IANA name) with that
    zone's UTC offset at that instant: ``2026-10-11T02:00:00.000+05:30`` in Asia/Kolkata.
    The same instant as ``iso(ms)``, written as a job's owner reads it; a UTC (or unnamed)
    zone keeps ``Z``. An unknown zone falls back to UTC (the engine refuses those)."""
    if not zone or zone == UTC_ZONE:
        return iso(ms)
    tz = _zone(zone)
    if tz is None:
        return iso(ms)
    t = (_EPOCH + timedelta(milliseconds=ms)).astimezone(tz)
    offset = t.utcoffset() or timedelta(0)
    minutes = int(offset.total_seconds()) // 60
    sign = "-" if minutes < 0 else "+"
    hours, mins = divmod(abs(minutes), 60)
    return (f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:"
            f"{t.second:02d}.{ms % 1000:03d}{sign}{hours:02d}:{mins:02d}")


@functools.lru_cache(maxsize=512)
def _zone(name: str) -> ZoneInfo | None:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None
