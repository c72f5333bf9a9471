from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.domain.timer import (
    TimerKey,
    TimerKind,
    decode_timer_key,
    due_of,
    due_prefix_upper_bound,
    encode_timer_key,
    kind_of,
)

no_nul_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
keys = st.builds(
    TimerKey,
    due_ms=st.integers(0, 2**64 - 1) | st.integers(0, 5),
    kind=st.sampled_from(TimerKind),
    job_id=no_nul_text,
    ref=st.text(st.characters(codec="utf-8"), max_size=12),
)


def enc(k: TimerKey) -> bytes:
    return encode_timer_key(due_ms=k.due_ms, kind=k.kind, job_id=k.job_id, ref=k.ref)


def as_tuple(k: TimerKey) -> tuple[int, int, str, str]:
    return (k.due_ms, int(k.kind), k.job_id, k.ref)


@given(keys)
def test_roundtrip(k: TimerKey) -> None:
    assert decode_timer_key(enc(k)) == k


@given(keys)
def test_due_and_kind_read_without_decoding(k: TimerKey) -> None:
    assert (due_of(enc(k)), kind_of(enc(k))) == (k.due_ms, k.kind)


@given(keys, keys)
def test_byte_order_is_tuple_order(a: TimerKey, b: TimerKey) -> None:
    assert (enc(a) < enc(b)) == (as_tuple(a) < as_tuple(b))
    assert (enc(a) == enc(b)) == (as_tuple(a) == as_tuple(b))


@given(st.lists(keys, max_size=30))
def test_sorting_bytes_sorts_tuples(ks: list[TimerKey]) -> None:
    assert [decode_timer_key(b) for b in sorted(map(enc, ks))] == sorted(ks, key=as_tuple)


@given(keys, st.integers(-5, 2**64 + 5))
def test_due_upper_bound_splits_due_from_not_due(k: TimerKey, now: int) -> None:
    assert (enc(k) < due_prefix_upper_bound(now)) == (k.due_ms <= now)


def test_layout_and_prefix_job_ids() -> None:
    key = encode_timer_key(due_ms=1, kind=TimerKind.RETRY, job_id="ab", ref="x")
    assert key == b"\x00" * 7 + b"\x01" + b"\x02" + b"ab\x00x"
    shorter = encode_timer_key(due_ms=1, kind=TimerKind.FIRE, job_id="a", ref="zzz")
    longer = encode_timer_key(due_ms=1, kind=TimerKind.FIRE, job_id="a\x01", ref="")
    assert shorter < longer


def test_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        encode_timer_key(due_ms=1, kind=TimerKind.FIRE, job_id="a\x00b", ref="")
    with pytest.raises(ValueError):
        encode_timer_key(due_ms=-1, kind=TimerKind.FIRE, job_id="a", ref="")
    with pytest.raises(ValueError):
        encode_timer_key(due_ms=2**64, kind=TimerKind.FIRE, job_id="a", ref="")
    with pytest.raises(ValueError):
        encode_timer_key(due_ms=1, kind=9, job_id="a", ref="")  # type: ignore[arg-type]
    for bad in (b"", b"\x00" * 9, b"\x00" * 8 + b"\x01abc", b"\x00" * 8 + b"\x09a\x00"):
        with pytest.raises(ValueError):
            decode_timer_key(bad)
