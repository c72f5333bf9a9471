"""The epoch fence and the ownership lease, with injected time."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kron.clock import ManualClock
from streams.domain.fencing import LINEAGE_GAP_MS, EpochFence, epoch_of_headers
from streams.lease import OwnershipLease


def test_lower_epoch_after_a_higher_one_is_rejected() -> None:
    fence = EpochFence()
    assert fence.admit(0, 5, 1_000)
    assert fence.admit(0, 6, 2_000)
    assert not fence.admit(0, 5, 2_100)  # the paused owner's buffered write
    assert fence.admit(0, 6, 2_200)
    assert fence.admit(1, 5, 2_300)  # partitions are judged apart
    assert fence.rejected == 1


def test_unknown_epochs_always_count() -> None:
    fence = EpochFence()
    assert fence.admit(0, 9, 0)
    assert fence.admit(0, None, 1) and fence.admit(0, 0, 2)


def test_a_recreated_group_starts_a_new_lineage() -> None:
    fence = EpochFence()
    assert fence.admit(0, 40, 0)
    assert fence.admit(0, 1, LINEAGE_GAP_MS + 1)
    assert fence.admit(0, 2, LINEAGE_GAP_MS + 2)
    assert not fence.admit(0, 1, LINEAGE_GAP_MS + 3)


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 20), st.integers(0, 5_000)),
                max_size=60))
def test_admitted_epochs_never_go_down_within_the_gap(writes: list[tuple[int, int, int]]) -> None:
    fence = EpochFence()
    ts = 0
    highest: dict[int, int] = {}
    for partition, epoch, step in writes:
        ts += step
        if fence.admit(partition, epoch, ts):
            assert epoch >= highest.get(partition, 0)
            highest[partition] = epoch
        else:
            assert epoch < highest[partition]


@given(st.lists(st.tuples(st.integers(0, 2), st.integers(-1, 6), st.integers(0, 400)),
                max_size=80))
def test_admit_decides_as_the_rule_states(writes: list[tuple[int, int, int]]) -> None:
    """Against the rule written out plainly: a write counts if its epoch is unknown, at
    least the partition's mark, or the mark's last write is over the gap ago; a counted
    write becomes the mark. Timestamps may go backwards (clocks of different owners)."""
    fence = EpochFence(gap_ms=100)
    marks: dict[int, tuple[int, int]] = {}
    for partition, epoch, ts in writes:
        mark = marks.get(partition)
        expected = (epoch <= 0 or mark is None or epoch >= mark[0]
                    or ts - mark[1] > 100)
        if expected and epoch > 0:
            marks[partition] = (epoch, ts)
        assert fence.admit(partition, epoch, ts) == expected


def test_headers_in_either_shape() -> None:
    assert epoch_of_headers([("kron-epoch", b"7")]) == 7
    assert epoch_of_headers({"kron-epoch": b"8"}) == 8
    assert epoch_of_headers(None) is None
    assert epoch_of_headers([("other", b"1")]) is None
    assert epoch_of_headers([("kron-epoch", b"x")]) is None


def test_lease_expires_a_session_after_the_last_confirmation() -> None:
    clock = ManualClock(monotonic=100.0)
    lease = OwnershipLease(clock=clock, session_timeout_s=10, margin_s=1)
    assert not lease.valid()  # never confirmed: not an owner yet
    lease.confirm(100.0)
    clock.advance(8.9)
    assert lease.valid()
    clock.advance(0.2)
    assert not lease.valid()  # paused past the window: the broker may have moved on
    lease.confirm(99.0)  # an older confirmation arriving late extends nothing
    assert not lease.valid()


def test_lease_listens_to_heartbeats_and_syncs() -> None:
    clock = ManualClock(monotonic=0.0)
    lease = OwnershipLease(clock=clock, session_timeout_s=10, margin_s=1)

    class HeartbeatRequest_v1:
        pass

    class OffsetCommitRequest_v2:
        pass

    codes = {"HeartbeatRequest_v1": 0, "OffsetCommitRequest_v2": 0}

    async def send_req(request: Any) -> Any:
        clock.advance(0.5)  # the round trip
        return SimpleNamespace(error_code=codes[type(request).__name__])

    coordinator = SimpleNamespace(_send_req=send_req)
    lease.watch(coordinator)
    clock.advance(20)
    assert not lease.valid()
    asyncio.run(coordinator._send_req(OffsetCommitRequest_v2()))
    assert not lease.valid()  # a commit proves nothing about membership
    codes["HeartbeatRequest_v1"] = 27  # REBALANCE_IN_PROGRESS
    asyncio.run(coordinator._send_req(HeartbeatRequest_v1()))
    assert not lease.valid()
    codes["HeartbeatRequest_v1"] = 0
    asyncio.run(coordinator._send_req(HeartbeatRequest_v1()))
    assert lease.valid()
    assert 8.0 < lease.remaining_s() <= 8.5  # counted from the send, not the answer
