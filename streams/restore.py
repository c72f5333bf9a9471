"""Start: bring partition stores up to their changelogs' ends with librdkafka.

Faust restores a changelog record by record through its consumer, stream and recovery
service: about 17k records/s here (1M pending one-offs are 2M state records; their cold
rebuild took 121 s). This reads a partition's changelog up to its current end in large
batches and writes RocksDB write batches, through the same epoch fence as Faust's restore:
from the start when the store does not exist (a first start, or local state dropped after a
crash), and from the offset after its persisted one when it exists but is behind (a
partition another worker owned while this one kept no standby of it: a warm restart of two
workers without standbys waited 47-67 s for Faust to read those). The last offset read
becomes the store's persisted offset, so Faust's recovery then reads only what was written
after it.

It runs before the Faust app starts, for every partition of every table: which ones this
process will own is known only after it joins the group, and a store of a partition it
never gets is a valid prefix Faust resumes from if it ever does.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from streams.domain.fencing import EpochFence, epoch_of_headers
from streams.runtime import OFFSET_KEY

log = logging.getLogger("kron.restore")

BATCH = 10_000
PROGRESS_EVERY_S = 5.0
WATERMARK_DEADLINE_S = 60.0


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreSpec:
    """One table: its changelog topic and where Faust keeps each partition's store."""

    name: str
    topic: str
    path_of: Callable[[int], Path]
    open_db: Callable[[Path], Any]
    fence: EpochFence


@dataclass(kw_only=True, slots=True)
class RestoreReport:
    created: int = 0  # stores that did not exist
    caught_up: int = 0  # stores that existed and were behind
    records: int = 0
    rejected: int = 0
    seconds: float = 0.0
    per_table: dict[str, int] = field(default_factory=dict)


def restore_stores(tables: Iterable[StoreSpec], *, partitions: int,
                   consumer_config: dict[str, Any], batch_module: Any) -> RestoreReport:
    """Create every partition store that does not exist yet and catch up every one that is
    behind its changelog; returns what was done."""
    started = time.monotonic()
    report = RestoreReport()
    for spec in tables:
        n = _restore_table(spec, partitions, consumer_config, batch_module, report)
        if n:
            report.per_table[spec.name] = n
    report.seconds = round(time.monotonic() - started, 2)
    if report.created or report.caught_up:
        # Not "created": that name is LogRecord's own (its timestamp), and logging raises
        # on it, which turned every successful restore into "bulk restore failed".
        log.info("restored partition stores from the changelogs", extra={
            "stores_created": report.created, "stores_caught_up": report.caught_up,
            "records": report.records, "rejected_stale_epoch": report.rejected,
            "seconds": report.seconds, "per_table": report.per_table})
    return report


def _restore_table(spec: StoreSpec, partitions: int, consumer_config: dict[str, Any],
                   batch_module: Any, report: RestoreReport) -> int:
    consumer = Consumer({**consumer_config, "enable.auto.commit": False,
                         "enable.partition.eof": True, "auto.offset.reset": "earliest",
                         "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20,
                         "queued.max.messages.kbytes": 256 << 10})
    dbs: dict[int, Any] = {}
    try:
        ends: dict[int, int] = {}
        starts: list[TopicPartition] = []
        for p in range(partitions):
            low, high = _watermarks(consumer, TopicPartition(spec.topic, p))
            path = spec.path_of(p)
            exists = path.exists()
            path.parent.mkdir(parents=True, exist_ok=True)
            db = dbs[p] = spec.open_db(path)  # created even when empty: nothing to read
            start = _next_offset(db, low) if exists else low
            if start is not None and high > start:
                ends[p] = high
                starts.append(TopicPartition(spec.topic, p, start))
                if exists:
                    report.caught_up += 1
            if not exists:
                report.created += 1
        if not starts:
            return 0
        consumer.assign(starts)
        return _drain(spec, consumer, ends, dbs, batch_module, report)
    finally:
        consumer.close()
        for db in dbs.values():
            db.close()


def _next_offset(db: Any, low: int) -> int | None:
    """Where an existing store's changelog reading goes on: after its persisted offset, or
    from the start if it has none. None for an offset that does not parse, and an offset
    past the end reads nothing: Faust's own recovery judges those stores (its consistency
    check names an offset past the end)."""
    raw = db.get(OFFSET_KEY)
    if raw is None:
        return low
    try:
        offset = int(bytes(raw))
    except ValueError:
        return None
    return max(offset + 1, low)


def _watermarks(consumer: Consumer, tp: TopicPartition,
                deadline_s: float = WATERMARK_DEADLINE_S) -> tuple[int, int]:
    """A new topic or a leader election answers "not leader" for a while: retry those."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=10)
            return low, high
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            retriable = isinstance(err, KafkaError) and (err.retriable() or err.code() in (
                KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._TRANSPORT,
                KafkaError._TIMED_OUT))
            if not retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _drain(spec: StoreSpec, consumer: Consumer, ends: dict[int, int], dbs: dict[int, Any],
           batch_module: Any, report: RestoreReport) -> int:
    remaining = dict(ends)  # partition -> high watermark still to reach
    read = 0
    last_log = time.monotonic()
    while remaining:
        batches: defaultdict[int, Any] = defaultdict(
            lambda: batch_module.WriteBatch(raw_mode=True))
        last: dict[int, int] = {}
        for msg in consumer.consume(BATCH, timeout=1.0):
            err, p, offset = msg.error(), msg.partition(), msg.offset()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    if p is not None:
                        remaining.pop(p, None)
                elif err.fatal() or not err.retriable():
                    raise KafkaException(err)
                continue  # librdkafka retries transport errors and leader changes itself
            if p is None or offset is None:
                continue  # a data message always has both
            last[p] = offset
            if offset + 1 >= ends[p]:
                remaining.pop(p, None)
            read += 1
            ts = msg.timestamp()[1]
            if not spec.fence.admit(p, epoch_of_headers(msg.headers()), ts):
                report.rejected += 1
                continue
            value = msg.value()
            if value is None:
                batches[p].delete(msg.key())
            else:
                batches[p].put(msg.key(), value)
        for p, offset in last.items():
            batch = batches[p]
            batch.put(OFFSET_KEY, str(offset).encode())  # with the data: one atomic write
            dbs[p].write(batch)
        if time.monotonic() - last_log >= PROGRESS_EVERY_S:
            last_log = time.monotonic()
            log.info("restoring %s: %d records read, %d partitions to go", spec.name, read,
                     len(remaining))
    report.records += read
    return read


@dataclass(frozen=True, slots=True)
class RangeRecord:
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Any  # as confluent-kafka gives them: (key, value) pairs or None
    timestamp_ms: int


def read_range(consumer_config: dict[str, Any], topic: str, partition: int, start: int,
               end: int, *, timeout_s: float = 10.0) -> list[RangeRecord]:
    """The records of one partition with start <= offset < end, in order: fewer than
    end - start where compaction removed some. Raises TimeoutError if the range could not
    be read within timeout_s (the caller must not count the range as read)."""
    consumer = Consumer({**consumer_config, "enable.auto.commit": False,
                         "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    out: list[RangeRecord] = []
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    return out
                if err.fatal() or not err.retriable():
                    raise KafkaException(err)
                continue
            offset = msg.offset()
            if offset is None:
                continue
            if offset >= end:
                return out
            out.append(RangeRecord(offset=offset, key=msg.key(), value=msg.value(),
                                   headers=msg.headers(),
                                   timestamp_ms=msg.timestamp()[1]))
            if offset + 1 >= end:
                return out
        raise TimeoutError(f"{topic}[{partition}] {start}..{end} not read in {timeout_s}s")
    finally:
        consumer.close()
