from __future__ import annotations

import math
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.domain.policies import Backoff, RetryPolicy
from streams.domain.retry import (
    ErrorClass,
    classify_http_status,
    parse_retry_after,
    retry_delay_s,
    should_retry,
)

NOW = int(datetime(2026, 6, 1, 12, tzinfo=UTC).timestamp() * 1000)


def expected_class(status: int) -> ErrorClass | None:
    if 200 <= status < 300:
        return None
    if status in (408, 425, 429) or 500 <= status < 600:
        return ErrorClass.TRANSIENT
    return ErrorClass.PERMANENT


@pytest.mark.parametrize("status", range(100, 600))
def test_classification_table(status: int) -> None:
    assert classify_http_status(status) == expected_class(status)


def test_classification_spot_checks() -> None:
    assert classify_http_status(204) is None
    assert classify_http_status(301) is ErrorClass.PERMANENT
    assert classify_http_status(404) is ErrorClass.PERMANENT
    assert classify_http_status(408) is ErrorClass.TRANSIENT
    assert classify_http_status(429) is ErrorClass.TRANSIENT
    assert classify_http_status(503) is ErrorClass.TRANSIENT
    assert classify_http_status(999) is ErrorClass.PERMANENT


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("0", 0.0),
        ("120", 120.0),
        (" 7 ", 7.0),
        ("1.5", 1.5),
        ("-5", None),
        ("soon", None),
        ("inf", None),
        ("nan", None),
        ("1e3", None),
        ("999999999", 86400.0),
        ("Mon, 01 Jun 2026 12:02:00 GMT", 120.0),
        ("Monday, 01-Jun-26 12:00:30 GMT", 30.0),
        ("Mon Jun  1 12:00:10 2026", 10.0),
        ("Mon, 01 Jun 2026 11:59:00 GMT", None),
        ("Fri, 01 Jun 2035 12:00:00 GMT", 86400.0),
        ("Mon, 99 Foo 2026 12:00:00 GMT", None),
    ],
)
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value, now_ms=NOW) == expected


# Whole seconds from 2000-01-01 to 2100-01-01, UTC (an HTTP-date has no fractions).
@given(st.integers(946_684_800, 4_102_444_800).map(lambda s: datetime.fromtimestamp(s, UTC)))
def test_parse_retry_after_dates_roundtrip(aware: datetime) -> None:
    got = parse_retry_after(format_datetime(aware, usegmt=True), now_ms=NOW)
    delta = aware.timestamp() - NOW / 1000
    assert got == (None if delta < 0 else min(delta, 86400.0))


@given(st.text(max_size=40))
def test_parse_retry_after_never_raises(value: str) -> None:
    got = parse_retry_after(value, now_ms=NOW)
    assert got is None or 0 <= got <= 86400


retry_policies = st.builds(
    RetryPolicy,
    max_attempts=st.integers(1, 100),
    backoff=st.sampled_from(Backoff),
    base_s=st.floats(0.01, 3600),
).flatmap(
    lambda p: st.builds(
        RetryPolicy,
        max_attempts=st.just(p.max_attempts),
        backoff=st.just(p.backoff),
        base_s=st.just(p.base_s),
        max_s=st.floats(p.base_s, 86400),
    )
)


@given(
    retry_policies,
    st.integers(1, 10_000),
    st.floats(0, 1, exclude_max=True),
    st.none() | st.floats(0, 200_000, allow_nan=False),
)
def test_delay_is_within_bounds(
    policy: RetryPolicy, attempt: int, rand: float, retry_after: float | None
) -> None:
    policy.validate()
    delay = retry_delay_s(policy, failed_attempt=attempt, rand=rand, retry_after_s=retry_after)
    after = min(retry_after or 0.0, 86400.0)
    assert math.isfinite(delay)
    assert 0 <= delay <= max(policy.max_s, after)
    assert delay >= after
    if policy.backoff is Backoff.FIXED:
        assert delay <= max(policy.base_s, after)


def test_delay_values() -> None:
    p = RetryPolicy(base_s=1.0, max_s=300.0)
    almost_one = math.nextafter(1.0, 0.0)
    assert [
        retry_delay_s(p, failed_attempt=n, rand=almost_one, retry_after_s=None) for n in (1, 2, 3)
    ] == pytest.approx([1, 2, 4])
    assert retry_delay_s(p, failed_attempt=20, rand=0.5, retry_after_s=None) == 150.0
    assert retry_delay_s(p, failed_attempt=3, rand=0.0, retry_after_s=None) == 0.0
    assert retry_delay_s(p, failed_attempt=1, rand=0.5, retry_after_s=1000.0) == 1000.0
    fixed = RetryPolicy(backoff=Backoff.FIXED, base_s=5.0, max_s=10.0)
    assert retry_delay_s(fixed, failed_attempt=50, rand=0.5, retry_after_s=None) == 2.5
    with pytest.raises(ValueError):
        retry_delay_s(p, failed_attempt=0, rand=0.5, retry_after_s=None)
    with pytest.raises(ValueError):
        retry_delay_s(p, failed_attempt=1, rand=1.0, retry_after_s=None)


@given(retry_policies, st.sampled_from(ErrorClass))
def test_attempts_are_bounded(policy: RetryPolicy, error_class: ErrorClass) -> None:
    attempt = 1
    while should_retry(policy, failed_attempt=attempt, error_class=error_class):
        attempt += 1
        assert attempt <= policy.max_attempts
    if error_class in (ErrorClass.PERMANENT, ErrorClass.CANCELLED):
        assert attempt == 1
    else:
        assert attempt == policy.max_attempts


def test_should_retry_table() -> None:
    p = RetryPolicy(max_attempts=3)
    assert should_retry(p, failed_attempt=1, error_class=ErrorClass.TRANSIENT)
    assert should_retry(p, failed_attempt=2, error_class=ErrorClass.TIMEOUT)
    assert should_retry(p, failed_attempt=2, error_class=ErrorClass.LEASE_EXPIRED)
    assert not should_retry(p, failed_attempt=3, error_class=ErrorClass.TRANSIENT)
    assert not should_retry(p, failed_attempt=1, error_class=ErrorClass.PERMANENT)
    assert not should_retry(p, failed_attempt=1, error_class=ErrorClass.CANCELLED)
    assert not should_retry(
        RetryPolicy(max_attempts=1), failed_attempt=1, error_class=ErrorClass.TRANSIENT
    )
