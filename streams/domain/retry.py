"""Failure classification and retry timing for job executions."""

from __future__ import annotations

import math
import re
from datetime import UTC
from email.utils import parsedate_to_datetime
from enum import StrEnum

from streams.domain.policies import Backoff, RetryPolicy

MAX_RETRY_AFTER_S = 86400.0
_DELTA_SECONDS = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,9})?")
# 2**63 * base_s overflows no float, but min() against max_s must see a finite number.
_MAX_EXPONENT = 62


class ErrorClass(StrEnum):
    TRANSIENT = "transient"
    PERMANENT = "permanent"
    TIMEOUT = "timeout"
    LEASE_EXPIRED = "lease_expired"
    CANCELLED = "cancelled"


def classify_http_status(status: int) -> ErrorClass | None:
    """None for success (2xx), otherwise whether repeating the request can help.

    408, 425 (too early), 429 and 5xx are the server's way of saying "not now". Everything else is
    permanent: other 4xx mean the request is wrong, 3xx because redirects are not followed
    (the answer would be the same redirect), and 1xx or nonstandard codes are never a valid
    final answer, so repeating the same request gets the same one.
    """
    if 200 <= status <= 299:
        return None
    if status in (408, 425, 429) or 500 <= status <= 599:
        return ErrorClass.TRANSIENT
    return ErrorClass.PERMANENT


def parse_retry_after(value: str | None, *, now_ms: int) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date).

    None when absent, unparseable, negative or in the past; capped at one day so a hostile
    or broken server cannot park an execution indefinitely.
    """
    if value is None:
        return None
    text = value.strip()
    if _DELTA_SECONDS.fullmatch(text):
        seconds = float(text)
    else:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:  # RFC 9110 dates are GMT; "-0000" parses as naive
            when = when.replace(tzinfo=UTC)
        seconds = (when.timestamp() * 1000 - now_ms) / 1000
        if seconds < 0:
            return None
    return min(seconds, MAX_RETRY_AFTER_S)


def retry_delay_s(
    policy: RetryPolicy, *, failed_attempt: int, rand: float, retry_after_s: float | None
) -> float:
    """Delay before the attempt after ``failed_attempt`` (1-based), with full jitter.

    Full jitter (uniform over [0, backoff)) spreads a burst of failures from many jobs
    instead of retrying them in lockstep. A server's Retry-After is a floor, never cut by
    ``max_s``, but itself capped at one day.
    """
    if failed_attempt < 1:
        raise ValueError(f"failed_attempt is 1-based; got {failed_attempt}")
    if not 0.0 <= rand < 1.0:
        raise ValueError(f"rand must be in [0, 1); got {rand}")
    if policy.backoff == Backoff.FIXED:
        backoff = policy.base_s
    else:
        exponent = min(failed_attempt - 1, _MAX_EXPONENT)
        backoff = min(policy.max_s, policy.base_s * 2.0**exponent)
    delay = rand * backoff
    if retry_after_s is not None and math.isfinite(retry_after_s) and retry_after_s > 0:
        delay = max(delay, min(retry_after_s, MAX_RETRY_AFTER_S))
    return delay


def should_retry(policy: RetryPolicy, *, failed_attempt: int, error_class: ErrorClass) -> bool:
    """Whether attempt ``failed_attempt + 1`` should happen at all."""
    if error_class in (ErrorClass.PERMANENT, ErrorClass.CANCELLED):
        return False
    return failed_attempt < policy.max_attempts
