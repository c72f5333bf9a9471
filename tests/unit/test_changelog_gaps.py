"""A changelog batch that skips offsets is completed from Kafka before it is applied
(streams.tables.FencedTable._with_gaps_filled). The table here is a stand-in with the
three things the check reads (its gap reader, its store's persisted offsets, a counter);
the read itself (streams.restore.read_range) runs against the real broker in the fault
suite."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from faust.types import TP

from streams.restore import RangeRecord
from streams.tables import _fill_gaps

TOPIC = "kron.jobs"


def _event(partition: int, offset: int) -> Any:
    return SimpleNamespace(message=SimpleNamespace(
        tp=TP(TOPIC, partition), topic=TOPIC, partition=partition, offset=offset,
        key=b"k%d" % offset, value=b"v%d" % offset, headers=None, timestamp=1.0))


class Table:
    def __init__(self, persisted: dict[int, int], log: dict[int, list[int]]) -> None:
        self.reads: list[tuple[int, int, int]] = []
        self.gaps_filled = 0
        self.data = SimpleNamespace(
            persisted_offset=lambda tp: persisted.get(tp.partition))
        self._log = log

    def _gap_reader(self, topic: str, partition: int, start: int, end: int) -> list[Any]:
        self.reads.append((partition, start, end))
        return [RangeRecord(offset=o, key=b"k%d" % o, value=b"v%d" % o, headers=None,
                            timestamp_ms=1000)
                for o in self._log.get(partition, []) if start <= o < end]


def _offsets(events: list[Any]) -> list[tuple[int, int]]:
    return [(e.message.partition, e.message.offset) for e in events]


def test_records_missing_after_the_persisted_offset_are_read_and_put_first() -> None:
    table = Table({3: 45}, {3: list(range(100))})
    out = _fill_gaps(table, [_event(3, 52), _event(3, 53)])  # type: ignore[arg-type]
    assert table.reads == [(3, 46, 52)]
    assert _offsets(out) == [(3, o) for o in range(46, 54)]
    assert table.gaps_filled == 1
    assert out[0].message.key == b"k46" and out[0].message.tp == TP(TOPIC, 3)


def test_a_gap_inside_a_batch_is_filled_in_place_and_partitions_are_judged_apart() -> None:
    table = Table({1: 9, 2: 4}, {1: list(range(30)), 2: list(range(30))})
    batch = [_event(1, 10), _event(2, 5), _event(1, 11), _event(1, 14), _event(2, 6)]
    out = _fill_gaps(table, batch)  # type: ignore[arg-type]
    assert table.reads == [(1, 12, 14)]
    assert _offsets(out) == [(1, 10), (2, 5), (1, 11), (1, 12), (1, 13), (1, 14), (2, 6)]


def test_a_compacted_range_reads_nothing_and_changes_nothing() -> None:
    table = Table({0: 5}, {0: [5, 20]})  # 6..19 compacted away
    out = _fill_gaps(table, [_event(0, 20)])  # type: ignore[arg-type]
    assert table.reads == [(0, 6, 20)] and _offsets(out) == [(0, 20)]


def test_without_a_persisted_offset_the_first_record_is_where_reading_starts() -> None:
    table = Table({}, {0: list(range(10))})
    out = _fill_gaps(table, [_event(0, 3), _event(0, 4), _event(0, 6)])  # type: ignore[arg-type]
    assert table.reads == [(0, 5, 6)]
    assert _offsets(out) == [(0, 3), (0, 4), (0, 5), (0, 6)]


def test_a_contiguous_batch_reads_nothing() -> None:
    table = Table({0: 2}, {})
    batch = [_event(0, 3), _event(0, 4)]
    assert _fill_gaps(table, batch) == batch  # type: ignore[arg-type]
    assert table.reads == [] and table.gaps_filled == 0


def test_a_range_that_cannot_be_read_leaves_the_batch_as_it_came() -> None:
    """Kafka unreachable (a broker restart): logged, and the batch applied as Faust
    delivered it rather than failing a revoke, which would crash the worker."""
    table = Table({0: 2}, {})

    def unreachable(topic: str, partition: int, start: int, end: int) -> list[Any]:
        raise TimeoutError("no broker")

    table._gap_reader = unreachable  # type: ignore[method-assign]
    batch = [_event(0, 9)]
    assert _fill_gaps(table, batch) == batch  # type: ignore[arg-type]
