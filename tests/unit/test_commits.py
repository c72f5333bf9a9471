"""The commit guard against Faust's own `_new_offset` (the real function, on a consumer whose
bookkeeping is plain dicts: no broker is needed to show the off-by-one)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

from faust.transport.consumer import Consumer
from faust.types import TP
from hypothesis import given
from hypothesis import strategies as st
from intervaltree import IntervalTree

from streams.commits import RESEEK_S, CommitGuard, has_hole, head_offset
from streams.runtime.group import CommitControl

SRC = TP("kron.commands", 2)
OTHER = TP("kron.jobs-changelog", 2)


class BookkeepingConsumer:
    """Faust's commit bookkeeping with its real `_new_offset`; seeks are recorded."""

    def __init__(self, committed: dict[TP, int | None]) -> None:
        self._acked: defaultdict[TP, list[int]] = defaultdict(list)
        self._acked_index: defaultdict[TP, set[int]] = defaultdict(set)
        self._gap: defaultdict[TP, IntervalTree] = defaultdict(IntervalTree)
        self._committed_offset: dict[TP, int | None] = dict(committed)
        self.seeks: list[tuple[TP, int]] = []
        self.log_start = 0

    def _new_offset(self, tp: TP) -> int | None:
        return Consumer._new_offset(self, tp)  # type: ignore[arg-type]

    async def _add_gap(self, tp: TP, offset_from: int, offset_to: int) -> None:
        await Consumer._add_gap(self, tp, offset_from, offset_to)  # type: ignore[arg-type]

    def ack(self, tp: TP, *offsets: int) -> None:
        for o in offsets:
            self._acked[tp].append(o)
            self._acked_index[tp].add(o)

    async def perform_seek(self) -> None:
        return None

    def assignment(self) -> set[TP]:
        return {SRC, OTHER}

    async def seek(self, tp: TP, offset: int) -> None:
        self.seeks.append((tp, offset))

    async def earliest_offsets(self, *tps: TP) -> dict[TP, int]:
        return {tp: self.log_start for tp in tps}


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def guarded(committed: dict[TP, int | None], generation: list[int] | None = None,
            ) -> tuple[BookkeepingConsumer, CommitGuard, Clock]:
    consumer, clock = BookkeepingConsumer(committed), Clock()
    gen = generation or [1]
    guard = CommitGuard(commits=CommitControl(consumer), sources={SRC.topic}, monotonic=clock,
                        generation=lambda: gen[0])
    guard.install()
    return consumer, guard, clock


def test_faust_alone_commits_over_one_skipped_record() -> None:
    # Why the guard exists: record 27 was never acked, yet Faust would commit 30.
    consumer = BookkeepingConsumer({SRC: 27})
    consumer.ack(SRC, 28, 29)
    assert consumer._new_offset(SRC) == 30


def test_guard_refuses_the_commit_and_reads_the_hole_again() -> None:
    async def scenario() -> None:
        consumer, guard, clock = guarded({SRC: 27})
        consumer.ack(SRC, 28, 29)
        assert consumer._new_offset(SRC) is None
        await asyncio.sleep(0)
        assert consumer.seeks == [(SRC, 27)] and guard.holes == 1
        assert consumer._new_offset(SRC) is None  # within RESEEK_S: no second seek
        await asyncio.sleep(0)
        assert consumer.seeks == [(SRC, 27)]
        clock.t += RESEEK_S
        assert consumer._new_offset(SRC) is None
        await asyncio.sleep(0)
        assert consumer.seeks == [(SRC, 27), (SRC, 27)]
        consumer.ack(SRC, 27)  # the re-read record is processed
        assert consumer._new_offset(SRC) == 30

    asyncio.run(scenario())


def test_contiguous_acks_commit_as_before() -> None:
    consumer, guard, _ = guarded({SRC: 27})
    consumer.ack(SRC, 27, 28, 30)
    assert consumer._new_offset(SRC) == 29
    assert guard.holes == 0


def test_other_topics_and_uncommitted_partitions_are_left_to_faust() -> None:
    consumer, guard, _ = guarded({OTHER: 6, SRC: None})
    consumer.ack(OTHER, 7, 8)
    consumer.ack(SRC, 0, 1)
    assert consumer._new_offset(OTHER) == 9
    assert consumer._new_offset(SRC) == 2
    assert guard.holes == 0


def test_uncommitted_source_partitions_are_read_from_the_start() -> None:
    consumer, _, _ = guarded({SRC: None, OTHER: None})
    asyncio.run(consumer.perform_seek())
    assert consumer.seeks == [(SRC, 0)]


@given(committed=st.integers(0, 50), acked=st.sets(st.integers(0, 80), max_size=20),
       gap=st.none() | st.tuples(st.integers(0, 80), st.integers(1, 5)))
def test_a_commit_never_jumps_over_an_unprocessed_record(committed: int, acked: set[int],
                                                        gap: tuple[int, int] | None) -> None:
    """Invariant: every offset from the committed one up to the new commit was acked or is a
    known gap (a compacted or transactional hole), whatever Faust's bookkeeping holds."""
    acked = {o for o in acked if o >= committed}
    consumer, _, _ = guarded({SRC: committed})

    async def run() -> int | None:
        consumer.ack(SRC, *sorted(acked))
        gaps: set[int] = set()
        if gap is not None:
            consumer._gap[SRC].addi(gap[0], gap[0] + gap[1])
            gaps = set(range(gap[0], gap[0] + gap[1]))
        new = consumer._new_offset(SRC)
        if new is not None:
            assert set(range(committed, new)) <= acked | gaps
        return new

    asyncio.run(run())


def test_head_and_hole_helpers() -> None:
    tree: Any = IntervalTree()
    tree.addi(3, 6)
    assert head_offset([9, 7], tree) == 3
    assert head_offset([], []) is None
    assert has_hole(head=5, committed=4)
    assert not has_hole(head=4, committed=4)
    assert has_hole(head=5, committed=None)  # never committed: the log starts at 0
    assert not has_hole(head=0, committed=None)
    assert not has_hole(head=None, committed=4)


def test_offsets_are_committed_only_after_the_state_writes_are_acked() -> None:
    order: list[str] = []
    acked = asyncio.Event()

    async def commit(offsets: Any) -> bool:
        order.append(f"commit {offsets}")
        return True

    async def writes_acked() -> None:
        await acked.wait()
        order.append("writes acked")

    async def scenario() -> None:
        consumer = BookkeepingConsumer({SRC: 27})
        consumer._commit = commit  # type: ignore[attr-defined]
        CommitGuard(commits=CommitControl(consumer), sources={SRC.topic}, monotonic=Clock(),
                    before_commit=writes_acked).install()
        pending = asyncio.ensure_future(consumer._commit({SRC: 30}))  # type: ignore[attr-defined]
        await asyncio.sleep(0.01)
        assert order == []  # held while writes are unacknowledged
        acked.set()
        assert await pending is True
        assert order == ["writes acked", f"commit { {SRC: 30} }"]

    asyncio.run(scenario())


def test_a_failed_state_write_keeps_the_offsets_uncommitted() -> None:
    committed: list[Any] = []

    async def commit(offsets: Any) -> bool:
        committed.append(offsets)
        return True

    async def write_failed() -> None:
        raise RuntimeError("changelog write failed: broker away")

    async def scenario() -> bool:
        consumer = BookkeepingConsumer({SRC: 27})
        consumer._commit = commit  # type: ignore[attr-defined]
        CommitGuard(commits=CommitControl(consumer), sources={SRC.topic}, monotonic=Clock(),
                    before_commit=write_failed).install()
        return bool(await consumer._commit({SRC: 30}))  # type: ignore[attr-defined]

    assert asyncio.run(scenario()) is False
    assert committed == []


def test_records_gone_by_retention_move_the_commit_base_instead_of_stalling() -> None:
    async def scenario() -> None:
        consumer, guard, _ = guarded({SRC: 27})
        consumer.log_start = 40  # the group was away longer than the topic's retention
        consumer.ack(SRC, 40, 41)
        assert consumer._new_offset(SRC) is None
        for _ in range(3):
            await asyncio.sleep(0)
        assert consumer.seeks == []  # nothing to read again
        assert consumer._committed_offset[SRC] == 40
        assert consumer._new_offset(SRC) == 42
        assert guard.holes == 1

    asyncio.run(scenario())


def test_a_jump_in_a_source_topic_is_not_a_gap() -> None:
    """A record from a fetch made before a seek back arrives after it: Faust would count the
    jump as a gap (done), and the commit would cover the records sought."""
    async def scenario() -> None:
        consumer, _, _ = guarded({SRC: 100, OTHER: 100})
        await consumer._add_gap(SRC, 101, 161)
        await consumer._add_gap(OTHER, 101, 161)  # a compacted changelog: a real gap
        assert not consumer._gap[SRC] and consumer._gap[OTHER]
        consumer.ack(SRC, 100, 161)
        assert consumer._new_offset(SRC) == 101  # not 162

    asyncio.run(scenario())


def test_a_hole_in_a_never_committed_partition_is_read_again_from_the_start() -> None:
    async def scenario() -> None:
        consumer, guard, _ = guarded({SRC: None})
        consumer.ack(SRC, 5, 6)
        assert consumer._new_offset(SRC) is None
        await asyncio.sleep(0)
        assert consumer.seeks == [(SRC, 0)] and guard.holes == 1

    asyncio.run(scenario())


def test_a_rebalance_during_the_seek_back_leaves_faust_in_charge() -> None:
    async def scenario() -> None:
        generation = [1]
        consumer, _, _ = guarded({SRC: 27}, generation)
        consumer.ack(SRC, 28)
        assert consumer._new_offset(SRC) is None  # schedules the seek back
        generation[0] = 2  # before it runs, a rebalance: Faust seeks to committed itself
        await asyncio.sleep(0)
        assert consumer.seeks == []

    asyncio.run(scenario())


def test_a_commit_does_not_wait_for_acks_longer_than_its_timeout() -> None:
    async def commit(offsets: Any) -> bool:
        raise AssertionError("committed without durable writes")

    async def never_acked() -> None:
        await asyncio.sleep(3600)

    async def scenario() -> bool:
        consumer = BookkeepingConsumer({SRC: 27})
        consumer._commit = commit  # type: ignore[attr-defined]
        CommitGuard(commits=CommitControl(consumer), sources={SRC.topic}, monotonic=Clock(),
                    before_commit=never_acked, before_commit_timeout_s=0.05).install()
        return bool(await asyncio.wait_for(
            consumer._commit({SRC: 30}), 5))  # type: ignore[attr-defined]

    assert asyncio.run(scenario()) is False
