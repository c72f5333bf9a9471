"""Faust tables whose changelog writes carry the owner's epoch, and whose replays are fenced.

The active owner tags every changelog write with its epoch (a Kafka header, so no consumer
has to decode a value to judge it). Standbys and restores apply a partition's changelog
through an EpochFence: a write from an owner that had already been replaced is skipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faust
import rocksdict
from faust.types import TP

from streams.changelog import Changelog
from streams.domain.fencing import EPOCH_HEADER, EpochFence, epoch_of_headers
from streams.engine.lane_floors import LaneFloors
from streams.runtime.stores import StoreTable

# (topic, partition, first offset, end offset) -> the records in that range, in order.
GapReader = Callable[[str, int, int, int], list[Any]]


class KeyFloor:
    """Per partition of a timers table: its lanes, each with a key that no live key of the
    lane sorts below (streams.engine.lane_floors.LaneFloors says why).

    Every write that can add a key lowers its lane's floor (our puts and every changelog
    batch a restore or standby applies), or adds the lane; a scan raises a floor to the
    first live key it finds, and drops a lane it finds empty. Unknown (None) until the
    first scan after a reset has found the lanes by skip-scan (faust_store.lanes); writes
    until then change nothing here.
    """

    def __init__(self) -> None:
        self._lanes: dict[int, LaneFloors] = {}

    def lanes(self, partition: int) -> LaneFloors | None:
        """The partition's lanes, or None if not known."""
        return self._lanes.get(partition)

    def know(self, partition: int, lanes: LaneFloors) -> None:
        """Every lane holding a live key, each with its first key (a skip-scan's finding)."""
        self._lanes[partition] = lanes

    def lower(self, partition: int, key: bytes) -> None:
        lanes = self._lanes.get(partition)
        if lanes is not None:
            lanes.lower(key)

    def reset(self) -> None:
        self._lanes.clear()


log = logging.getLogger("kron.tables")


class WithoutWal:
    """Faust's RocksDB options, opening every partition store without a write-ahead log.

    The changelog in Kafka is the log of these stores: local state is trusted only after a
    clean stop (streams.localstate), and rebuilt from Kafka after any other. RocksDB's own
    log is then written for nothing, and it was most of a write's cost (rocksdict put
    2.5 -> 0.5 us, delete 1.8 -> 0.35 us, measured). A store closed without a flush loses
    its memtable, but a single column family loses only writes after its last flush: the
    persisted offset (written after the data it covers) then points back as far, and
    Faust's recovery reads those writes again. A clean stop flushes (FencedTable.on_stop).
    """

    def __init__(self, options: Any) -> None:
        self._options = options

    def __getattr__(self, name: str) -> Any:
        return getattr(self._options, name)

    def open(self, path: Path, *, read_only: bool = False) -> Any:
        db = self._options.open(path, read_only=read_only)
        db.set_write_options(unlogged_writes())
        return db


def unlogged_writes() -> rocksdict.WriteOptions:
    """Write options without RocksDB's write-ahead log (see WithoutWal)."""
    options = rocksdict.WriteOptions()
    # A property in the binding, though its stub declares a method (checked: the store's
    # .log file stays empty).
    setattr(options, "disable_wal", True)  # noqa: B010
    return options


class FencedTable(StoreTable):
    """A table whose changelog is judged by owner epoch on every replay."""

    def __init__(self, *args: Any, epoch: Callable[[], int],
                 changelog: Changelog | None = None,
                 gap_reader: GapReader | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._epoch = epoch
        self._gap_reader = gap_reader
        self.gaps_filled = 0
        # Set: writes go out through librdkafka (see streams.changelog); None: Faust's path.
        self._changelog = changelog
        self._changelog_name: str | None = None
        self._headers: list[tuple[str, bytes]] | None = None
        self._headers_for = 0
        self.fence = EpochFence()
        self.floor = KeyFloor()

    def adapt_store(self, store: Any) -> None:
        if hasattr(store, "rocksdb_options"):  # not for Faust's memory:// store
            store.rocksdb_options = WithoutWal(store.rocksdb_options)

    async def on_stop(self) -> None:
        """Write the memtables out before the store lets go of its DBs (WithoutWal).
        RocksDB also flushes a log-less memtable when the DB closes, but that happens only
        once the last reference (an iterator, say) is gone; this does not wait for it."""
        for partition, db in self.open_dbs().items():
            try:
                db.flush(True)
            except Exception as exc:  # the restart reads more of the changelog; no loss
                log.warning("flushing %s[%s] on stop failed: %r", self.name, partition, exc)
        await super().on_stop()

    async def on_rebalance(self, assigned: Any, revoked: Any, newly_assigned: Any,
                           generation_id: int = 0) -> None:
        # A partition coming back may hold keys another owner wrote meanwhile; start its
        # scans from the first key again rather than trust a floor from before.
        self.floor.reset()
        await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)

    def on_key_set(self, key: Any, value: Any) -> None:
        super().on_key_set(key, value)
        if isinstance(key, bytes):
            event = faust.current_event()
            if event is not None:
                self.floor.lower(event.message.partition, key)

    def send_changelog(self, partition: int | None, key: Any, value: Any,
                       key_serializer: Any = None, value_serializer: Any = None) -> Any:
        epoch = self._epoch()
        if self._changelog is not None and partition is not None:
            # Keys and values are raw bytes (a delete is a None value): nothing to serialise.
            return self._produce(partition, key, value, epoch)
        if partition is not None:
            self._admit_own(partition, epoch)
        return self.changelog_topic.send_soon(
            key=key, value=value, partition=partition, headers=self._epoch_headers(epoch),
            key_serializer=key_serializer or self.key_serializer,
            value_serializer=value_serializer or self.value_serializer,
            callback=self.on_changelog_sent, eager_partitioning=True)

    def _admit_own(self, partition: int, epoch: int) -> None:
        """Our own writes raise the mark too: a replaced owner's late write after them must
        lose to them when this process later replays the partition."""
        if epoch > 0:
            self.fence.admit(partition, epoch, time.time_ns() // 1_000_000)

    def _produce(self, partition: int, key: bytes, value: bytes | None, epoch: int) -> Any:
        """The changelog record of a write, through librdkafka."""
        assert self._changelog is not None
        self._admit_own(partition, epoch)
        if self._changelog_name is None:
            self._changelog_name = self.changelog_topic.get_topic_name()
        return self._changelog.produce(self._changelog_name, partition, key, value,
                                       self._epoch_headers(epoch))

    def _epoch_headers(self, epoch: int) -> list[tuple[str, bytes]] | None:
        """One header list per epoch, not one per write (the producer copies it)."""
        if epoch <= 0:
            return None
        if self._headers_for != epoch:
            self._headers = [(EPOCH_HEADER, str(epoch).encode())]
            self._headers_for = epoch
        return self._headers

    def write(self, partition: int, key: bytes, value: bytes | None, epoch: int) -> None:
        """A state write without Faust's per-record table machinery: the changelog record
        (through librdkafka), then the partition's RocksDB. Reads of the same partition
        see it at once; the key floor learns of a new key."""
        assert self._changelog is not None, "direct writes need the librdkafka changelog"
        self._produce(partition, key, value, epoch)
        db = self.partition_db(partition)
        if value is None:
            db.delete(key)
        else:
            db.put(key, value)
            self.floor.lower(partition, key)

    def _with_gaps_filled(self, events: list[Any]) -> list[Any]:
        """Faust's consumer drops the rest of a fetched batch when its flow stops or the
        generation changes while it hands the batch out (Consumer.getmany); for a changelog
        partition that is a hole: those records never reach the store, and the next ones
        move its persisted offset past them. The owner-crash fault test caught a standby
        that applied a partition's offsets 52-57 after 45; the worker took the partition
        over and fired again the slots whose records were 46-51. So each partition's
        records must follow its persisted offset without a gap; where they do not, the
        missing range is read from Kafka and applied first, in order. (Compaction leaves
        gaps too: the read then finds nothing there, at the cost of one fetch.)"""
        if self._gap_reader is None or not events:
            return events
        return _fill_gaps(self, events)

    def apply_changelog_batch(self, batch: Iterable[Any]) -> None:
        events = self._with_gaps_filled(list(batch))
        admitted = [e for e in events if self.fence.admit(
            e.message.partition, epoch_of_headers(e.message.headers),
            int((e.message.timestamp or 0) * 1000))]
        for e in admitted:
            if e.message.value is not None and isinstance(e.message.key, bytes):
                self.floor.lower(e.message.partition, e.message.key)
        super().apply_changelog_batch(admitted)
        if len(admitted) != len(events):
            # Skipped writes still count as read, or the next start would read them again.
            last: dict[Any, int] = {}
            for e in events:
                last[e.message.tp] = max(e.message.offset, last.get(e.message.tp, -1))
            for tp, offset in last.items():
                self.data.set_persisted_offset(tp, offset)


@dataclass(frozen=True, slots=True)
class _GapMessage:
    """A changelog record read to fill a gap, shaped as the Faust message fields the
    restore reads."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Any
    timestamp: float  # seconds, as Faust's

    @property
    def tp(self) -> Any:
        return TP(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class _GapEvent:
    message: _GapMessage


def _fill_gaps(table: FencedTable, events: list[Any]) -> list[Any]:
    """See FencedTable._with_gaps_filled."""
    reader = table._gap_reader
    assert reader is not None
    out: list[Any] = []
    expected: dict[Any, int | None] = {}
    for e in events:
        msg = e.message
        tp = msg.tp
        if tp not in expected:
            persisted = table.data.persisted_offset(tp)
            expected[tp] = None if persisted is None else persisted + 1
        want = expected[tp]
        if want is not None and msg.offset > want:
            try:
                records = reader(tp.topic, tp.partition, want, msg.offset)
            except Exception:  # Kafka unreachable: apply what came, as Faust would have
                log.exception("changelog gap %s[%s] %d..%d could not be read", tp.topic,
                              tp.partition, want, msg.offset - 1)
                records = []
            table.gaps_filled += 1
            log.warning("changelog gap filled: %s[%s] offsets %d..%d were not delivered; "
                        "read %d records of them from Kafka", tp.topic, tp.partition, want,
                        msg.offset - 1, len(records))
            out.extend(_GapEvent(message=_GapMessage(
                topic=tp.topic, partition=tp.partition, offset=r.offset, key=r.key,
                value=r.value, headers=r.headers, timestamp=r.timestamp_ms / 1000))
                for r in records)
        if want is None or msg.offset >= want:
            expected[tp] = msg.offset + 1
        out.append(e)
    return out
