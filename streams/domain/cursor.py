"""The scheduler's per-job cursor: the latest slot instant already handled."""

from __future__ import annotations


def advance_cursor(current: int | None, proposed: int) -> int:
    """Move the cursor to ``proposed`` unless that would move it backwards.

    Redelivered or reordered records may propose an older position; honouring one would
    make already-fired slots look due again.
    """
    return proposed if current is None or proposed > current else current
