from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.domain.timer import (
    LEGACY_LANE,
    SYSTEM_LANE,
    Lane,
    Tier,
    TimerKey,
    TimerKind,
    decode_timer_key,
    due_bound,
    due_of,
    due_order,
    encode_timer_key,
    kind_of,
    lane_end,
    lane_of_prefix,
    lane_prefix_of,
    tenant_hash,
    tenant_lane,
)

no_nul_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
lanes = st.builds(Lane, tier=st.integers(0, 3) | st.integers(0, 255),
                  tenant=st.integers(0, 2**32 - 1) | st.integers(0, 3))
lane_keys = st.builds(
    TimerKey,
    due_ms=st.integers(0, 2**64 - 1) | st.integers(0, 5),
    kind=st.sampled_from(TimerKind),
    job_id=no_nul_text,
    ref=st.text(st.characters(codec="utf-8"), max_size=12),
    lane=lanes,
)
legacy_keys = st.builds(
    TimerKey,
    due_ms=st.integers(0, 2**56 - 1) | st.integers(0, 5),
    kind=st.sampled_from(TimerKind),
    job_id=no_nul_text,
    ref=st.text(st.characters(codec="utf-8"), max_size=12),
    lane=st.just(LEGACY_LANE),
)
keys = lane_keys | legacy_keys


def enc(k: TimerKey) -> bytes:
    return encode_timer_key(due_ms=k.due_ms, kind=k.kind, job_id=k.job_id, ref=k.ref,
                            lane=k.lane)


def as_tuple(k: TimerKey) -> tuple[tuple[int, int], int, int, str, str]:
    # The legacy lane sorts before every other.
    lane = (-1, -1) if k.lane == LEGACY_LANE else (k.lane.tier, k.lane.tenant)
    return (lane, k.due_ms, int(k.kind), k.job_id, k.ref)


@given(keys)
def test_roundtrip(k: TimerKey) -> None:
    assert decode_timer_key(enc(k)) == k


@given(keys)
def test_due_kind_and_lane_read_without_decoding(k: TimerKey) -> None:
    key = enc(k)
    assert (due_of(key), kind_of(key)) == (k.due_ms, k.kind)
    assert lane_prefix_of(key) == k.lane.prefix
    assert lane_of_prefix(k.lane.prefix) == k.lane
    assert k.lane.prefix <= key < lane_end(k.lane.prefix)


@given(keys, keys)
def test_byte_order_is_lane_then_tuple_order(a: TimerKey, b: TimerKey) -> None:
    assert (enc(a) < enc(b)) == (as_tuple(a) < as_tuple(b))
    assert (enc(a) == enc(b)) == (as_tuple(a) == as_tuple(b))


@given(st.lists(keys, max_size=30))
def test_sorting_bytes_sorts_tuples(ks: list[TimerKey]) -> None:
    assert [decode_timer_key(b) for b in sorted(map(enc, ks))] == sorted(ks, key=as_tuple)


@given(keys, keys)
def test_due_order_is_due_tuple_order_across_lanes(a: TimerKey, b: TimerKey) -> None:
    def due_tuple(k: TimerKey) -> tuple[int, int, str, str]:
        return (k.due_ms, int(k.kind), k.job_id, k.ref)
    if due_tuple(a) != due_tuple(b):
        assert ((due_order((enc(a), b"")) < due_order((enc(b), b"")))
                == (due_tuple(a) < due_tuple(b)))


@given(keys, st.integers(-5, 2**64 + 5))
def test_due_bound_splits_due_from_not_due_in_a_lane(k: TimerKey, now: int) -> None:
    bound = due_bound(k.lane.prefix, now)
    assert (enc(k) < bound) == (k.due_ms <= now)
    assert k.lane.prefix <= bound <= lane_end(k.lane.prefix)


@given(lanes, lanes)
def test_lanes_sort_by_tier_then_tenant_each_a_range(a: Lane, b: Lane) -> None:
    assert (a.prefix < b.prefix) == ((a.tier, a.tenant) < (b.tier, b.tenant))
    if a != b:  # disjoint ranges
        assert lane_end(a.prefix) <= b.prefix or lane_end(b.prefix) <= a.prefix
    assert LEGACY_LANE.prefix < lane_end(LEGACY_LANE.prefix) <= a.prefix


def test_layout_and_prefix_job_ids() -> None:
    lane = Lane(Tier.CRITICAL, 0x0A0B0C0D)
    key = encode_timer_key(due_ms=1, kind=TimerKind.RETRY, job_id="ab", ref="x", lane=lane)
    assert key == b"\x01\x01\x0a\x0b\x0c\x0d" + b"\x00" * 7 + b"\x01" + b"\x02" + b"ab\x00x"
    legacy = encode_timer_key(due_ms=1, kind=TimerKind.RETRY, job_id="ab", ref="x",
                              lane=LEGACY_LANE)
    assert legacy == b"\x00" * 7 + b"\x01" + b"\x02" + b"ab\x00x"
    assert decode_timer_key(legacy).lane == LEGACY_LANE
    shorter = encode_timer_key(due_ms=1, kind=TimerKind.FIRE, job_id="a", ref="zzz", lane=lane)
    longer = encode_timer_key(due_ms=1, kind=TimerKind.FIRE, job_id="a\x01", ref="", lane=lane)
    assert shorter < longer
    assert SYSTEM_LANE.prefix == b"\x01\x00\x00\x00\x00\x00"


def test_a_tenants_lane_is_its_name_hash_at_its_tier() -> None:
    digest = hashlib.blake2b(b"acme", digest_size=4).digest()
    assert tenant_hash("acme") == int.from_bytes(digest, "big")
    assert tenant_lane("acme", Tier.BATCH).prefix == b"\x01\x03" + digest
    assert tenant_lane("acme", Tier.BATCH) is tenant_lane("acme", Tier.BATCH)


def test_rejects_bad_input() -> None:
    lane = SYSTEM_LANE
    with pytest.raises(ValueError):
        encode_timer_key(due_ms=1, kind=TimerKind.FIRE, job_id="a\x00b", ref="", lane=lane)
    with pytest.raises(ValueError):
        encode_timer_key(due_ms=-1, kind=TimerKind.FIRE, job_id="a", ref="", lane=lane)
    with pytest.raises(ValueError):
        encode_timer_key(due_ms=2**64, kind=TimerKind.FIRE, job_id="a", ref="", lane=lane)
    with pytest.raises(ValueError):
        encode_timer_key(due_ms=2**56, kind=TimerKind.FIRE, job_id="a", ref="",
                         lane=LEGACY_LANE)
    with pytest.raises(ValueError):
        encode_timer_key(due_ms=1, kind=9, job_id="a", ref="", lane=lane)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Lane(256, 0)
    with pytest.raises(ValueError):
        Lane(1, 2**32)
    for bad in (b"", b"\x00" * 9, b"\x00" * 8 + b"\x01abc", b"\x00" * 8 + b"\x09a\x00",
                b"\x01" * 6 + b"\x00" * 8, b"\x01" * 6 + b"\x00" * 8 + b"\x01abc",
                b"__faust\x00offset__"):
        with pytest.raises(ValueError):
            decode_timer_key(bad)
