"""The fire-ahead window sized for what is coming (streams.domain.lookahead)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streams.domain.lookahead import carrying_stream, window_ms

NOW = 1_000_000
BASE = 500
CAP = 5_000

dues_st = st.lists(st.integers(NOW + BASE + 1, NOW + 2 * CAP), max_size=300)
rate_st = st.integers(100, 20_000)
slack_st = st.integers(0, 500)


def _window(dues: list[int], rate: int, slack: int) -> int:
    return window_ms(dues, now_ms=NOW, base_ms=BASE, cap_ms=CAP, decide_per_s=rate,
                     slack=slack)


@given(dues_st, rate_st, slack_st)
def test_the_window_is_never_shorter_than_the_base_nor_longer_than_the_cap(
        dues: list[int], rate: int, slack: int) -> None:
    assert BASE <= _window(dues, rate, slack) <= CAP


@given(dues_st, dues_st, rate_st, slack_st)
def test_more_work_coming_never_shrinks_the_window(
        dues: list[int], more: list[int], rate: int, slack: int) -> None:
    assert _window(dues + more, rate, slack) >= _window(dues, rate, slack)


@given(st.integers(1, 5_000), rate_st, slack_st)
def test_a_steady_stream_slower_than_deciding_keeps_the_base_window(
        per_s: int, rate: int, slack: int) -> None:
    per_s = min(per_s, rate - 1)
    # Rounded up: a due rounded down is a stream a little faster than per_s.
    dues = [NOW + BASE - (-(i + 1) * 1000 // per_s) for i in range(per_s * CAP // 1000)]
    assert _window(dues, rate, slack) == BASE


@given(st.integers(1, 3_000), st.integers(BASE + 1, CAP), rate_st, slack_st)
def test_a_spike_is_taken_in_exactly_when_deciding_it_needs_the_time_left(
        n: int, ahead: int, rate: int, slack: int) -> None:
    """n timers due `ahead` from now: in the window once deciding the n less the slack at
    `rate` takes at least the time before them beyond the base window."""
    needed = (n - slack) * 1000 >= (ahead - BASE) * rate
    window = _window([NOW + ahead] * n, rate, slack)
    assert window == (ahead if needed else BASE)


def test_a_twenty_thousand_spike_starts_in_time_to_be_decided_by_its_second() -> None:
    spike = [NOW + 3_000] * 20_000
    assert _window(spike, 6_000, 3_000) == 3_000  # 17,000 at 6,000/s: 2.8 s + 0.5 s
    assert _window([d + 500 for d in spike], 6_000, 3_000) == BASE  # 3.5 s away: later


@given(rate_st, st.floats(0, 1))
def test_a_worker_making_calls_at_half_the_deciding_rate_is_carrying_a_stream(
        rate: int, share: float) -> None:
    """From half the deciding rate in calls a second, any pile is the stream itself (the
    ticker then keeps the base window: test_ticker's spike with 50 calls a second)."""
    assert carrying_stream(rate * (0.5 + share), rate)
    assert not carrying_stream(rate * 0.49, rate)
