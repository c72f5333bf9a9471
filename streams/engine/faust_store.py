"""The partition store backed by Faust RocksDB tables whose changelogs are kron's topics.

Reads and writes go through the tables (so every write reaches the changelog), except the
ordered range scan of the time index, which reads the partition's rocksdict directly
(`table.partition_db`, streams.runtime.stores): Faust's table API has no ordered scan. That
access is read-only and never held across an await, because a rebalance may close the DB.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
from collections import OrderedDict
from collections.abc import Callable, Generator, Mapping
from typing import Any, cast

from schemas import codec
from streams.domain.timer import (
    Lane,
    TimerKind,
    due_bound,
    due_of,
    due_order,
    is_waiting,
    kind_of,
    lane_end,
    lane_of_prefix,
    lane_prefix_of,
)
from streams.engine.lane_floors import LaneFloors
from streams.engine.records import ExecutionRecord, JobRecord
from streams.engine.store import TERMINAL, RecordCopier, copy_record, record_copier

JOB_STATE = "kron.state.JobState"
EXECUTION_STATE = "kron.executions.ExecutionState"


@functools.cache
def job_encoder() -> codec.SplicedEncoder:
    """A job's spec is re-encoded only when it is replaced (create, update)."""
    return codec.SplicedEncoder(JOB_STATE, "spec")


def lanes(table: Any, partition: int) -> LaneFloors:
    """Every lane of the partition's timers that holds a live key, each with its floor: the
    table's key floor (streams.tables.KeyFloor) if it knows them, else found by skip-scan
    and given to it. The skip-scan seeks to the smallest key, whose prefix names a lane,
    then to the first key past that lane, and so on: one seek a lane (each stepping over
    the tombstones at its lane's front once)."""
    floor = getattr(table, "floor", None)
    known: LaneFloors | None = floor.lanes(partition) if floor is not None else None
    if known is not None:
        return known
    found: dict[bytes, bytes] = {}
    it = table.partition_db(partition).iter()
    it.seek_to_first()
    while it.valid():
        key = bytes(it.key())
        prefix = lane_prefix_of(key)
        if prefix is None:  # Faust's offset key: it sorts after every lane
            break
        found[prefix] = key
        it.seek(lane_end(prefix))
    known = LaneFloors(found)
    if floor is not None:
        floor.know(partition, known)
    return known


def _first_in_lane(known: LaneFloors, it: Any, prefix: bytes, floor_key: bytes) -> bytes | None:
    """The lane's first live key, from its floor (raised to it), or None (the lane is
    dropped): `it` is left on that key."""
    it.seek(floor_key)
    key = bytes(it.key()) if it.valid() else None
    if key is None or key >= lane_end(prefix):
        known.drop(prefix)
        return None
    known.raise_to(prefix, key)
    return key


def due_lanes(table: Any, partition: int,
              now_ms: int) -> list[tuple[Lane, Generator[tuple[bytes, bytes]]]]:
    """The lanes whose floors are due at or before now_ms, in key order, each with a lazy
    reader of its due timers (which may find none: a floor is a bound). A lane is only
    sought when its reader is first read, so a round that takes from a few of many lanes
    seeks those few. Readers raise and drop floors: the caller reads them before it writes
    anything, as a floor must never be raised past a key written after the iterator that
    found it was made."""
    db = table.partition_db(partition)
    known = lanes(table, partition)
    return [(lane_of_prefix(prefix), _due_in_lane(db, known, prefix, now_ms))
            for prefix in known.due(now_ms)]


def _due_in_lane(db: Any, known: LaneFloors, prefix: bytes,
                 now_ms: int) -> Generator[tuple[bytes, bytes]]:
    floor_key = known.get(prefix)
    if floor_key is None:
        return
    it = db.iter()
    key = _first_in_lane(known, it, prefix, floor_key)
    if key is None:
        return
    upper = due_bound(prefix, now_ms)
    if key < upper:
        yield from _read_lane(it, key, upper)


def _read_lane(it: Any, key: bytes, upper: bytes) -> Generator[tuple[bytes, bytes]]:
    """From the iterator's key (`key`) on, the pairs below `upper`."""
    while True:
        yield key, bytes(it.value())
        it.next()
        if not it.valid():
            return
        key = bytes(it.key())
        if key >= upper:
            return


def first_timer_key(table: Any, partition: int) -> bytes | None:
    """The earliest-due timer of a partition, or None: the lanes taken by their floors'
    due times (each a bound on the lane's), a seek each, until none can be earlier than
    the one found."""
    return _earliest(table, partition, lambda known, db, prefix: _first_in_lane(
        known, db.iter(), prefix, cast(bytes, known.get(prefix))))


# A lane's first timer as one of _earliest's callers reads it: (lanes, db, prefix) -> key.
LaneFirst = Callable[[LaneFloors, Any, bytes], bytes | None]


def _earliest(table: Any, partition: int, first_in: LaneFirst) -> bytes | None:
    """The earliest of the lanes' first timers (first_in), the lanes taken by their floors'
    due times until none can be earlier than the one found; waiting lanes passed over."""
    known = lanes(table, partition)
    db = table.partition_db(partition)
    best: bytes | None = None
    best_due = 0
    with contextlib.closing(known.ascending()) as ascending:
        for floor_due, prefix in ascending:
            if best is not None and floor_due > best_due:
                break
            if _waiting(prefix):
                continue
            key = first_in(known, db, prefix)
            if key is not None and (best is None
                                    or due_order((key, b"")) < due_order((best, b""))):
                best, best_due = key, due_of(key)
    return best


def _waiting(prefix: bytes) -> bool:
    """A lane of queued executions (TimerKind.WAIT): due from the start, it is not what
    the ticker waits for; a tenant's room wakes its partitions (has_waiting_lanes)."""
    return is_waiting(lane_of_prefix(prefix))


def has_waiting_lanes(table: Any, partition: int) -> bool:
    """The partition may hold queued executions (a lane of them is known)."""
    return any(_waiting(prefix) for prefix in lanes(table, partition))


def first_timer_after(table: Any, partition: int, after_ms: int) -> bytes | None:
    """The earliest timer due after `after_ms`, or None: a seek per lane at most, the
    lanes taken by their floors' due times until none can be earlier than the one found."""
    def first_in(known: LaneFloors, db: Any, prefix: bytes) -> bytes | None:
        it = db.iter()
        it.seek(max(due_bound(prefix, after_ms), cast(bytes, known.get(prefix))))
        key = bytes(it.key()) if it.valid() else None
        return None if key is None or key >= lane_end(prefix) else key

    return _earliest(table, partition, first_in)


def fire_dues(table: Any, partition: int, after_ms: int, until_ms: int,
              limit: int) -> list[int]:
    """Due times of the FIRE timers due in (after_ms, until_ms], at most `limit`, the
    earliest. Keys only: a spike's thousands of timers are counted, not read."""
    dues: list[int] = []
    db = table.partition_db(partition)
    known = lanes(table, partition)
    for prefix in known.due(until_ms):
        it = db.iter()
        it.seek(max(due_bound(prefix, after_ms), cast(bytes, known.get(prefix))))
        upper = due_bound(prefix, until_ms)
        found = 0
        while it.valid() and found < limit:
            key = bytes(it.key())
            if key >= upper:
                break
            if kind_of(key) == TimerKind.FIRE:
                dues.append(due_of(key))
                found += 1
            it.next()
    dues.sort()
    return dues[:limit]


def _lane_range(it: Any, lower: bytes, upper: bytes) -> Generator[tuple[bytes, bytes]]:
    it.seek(lower)
    while it.valid():
        key = bytes(it.key())
        if key >= upper:
            return
        yield key, bytes(it.value())
        it.next()


def _merged(table: Any, partition: int, after_ms: int, until_ms: int,
            start: Mapping[bytes, bytes] | None) -> Generator[tuple[bytes, bytes]]:
    """Timers due in (after_ms, until_ms] of every lane, in due order (heapq.merge of the
    lanes whose floor is due by until_ms: an iterator each, reading the snapshot of its
    creation)."""
    runs = lane_runs(table, partition, after_ms, until_ms, start)
    yield from heapq.merge(*(run for _, run in runs), key=due_order)


def lane_runs(table: Any, partition: int, after_ms: int, until_ms: int,
              start: Mapping[bytes, bytes] | None
              ) -> list[tuple[Lane, Generator[tuple[bytes, bytes]]]]:
    """Each lane's timers due in (after_ms, until_ms], in due order, lane by lane (an
    iterator each, reading the snapshot of its creation)."""
    db = table.partition_db(partition)
    known = lanes(table, partition)
    runs = []
    for prefix in known.due(until_ms):
        lower = max(due_bound(prefix, after_ms), cast(bytes, known.get(prefix)))
        if start and prefix in start:
            lower = max(lower, start[prefix])
        runs.append((lane_of_prefix(prefix),
                     _lane_range(db.iter(), lower, due_bound(prefix, until_ms))))
    return runs


class TableTimerIndex:
    """The timer index of a timers table, as the ticker reads it (streams.ticker.TimerIndex)."""

    def __init__(self, table: Any) -> None:
        self._table = table

    def first(self, partition: int) -> bytes | None:
        return first_timer_key(self._table, partition)

    def first_after(self, partition: int, after_ms: int) -> bytes | None:
        return first_timer_after(self._table, partition, after_ms)

    def has_waiting(self, partition: int) -> bool:
        return has_waiting_lanes(self._table, partition)

    def fire_dues(self, partition: int, after_ms: int, until_ms: int,
                  limit: int) -> list[int]:
        return fire_dues(self._table, partition, after_ms, until_ms, limit)


class TerminalMemo:
    """Executions this process saw reach a terminal state, with the attempt they ended at,
    newest kept.

    Every attempt's lease timer fires lease_s after it started, long after most attempts
    finished; without the memo each check decodes the whole execution record (8% of the
    worker's CPU at 1,500 executions/s). Only a backfill's rerun leaves a terminal state,
    with the next attempt: this process's own write of it drops the entry, and an entry
    another process's rerun made stale still answers rightly for the attempts it covers
    (PartitionStore.known_terminal). One evicted or never seen costs a lookup.
    """

    def __init__(self, capacity: int = 1 << 18) -> None:
        # Oldest out by OrderedDict.popitem: `next(iter())` on a plain dict walks past every
        # slot deleted since its last resize, so each eviction from a full plain dict cost
        # more the longer since then (171 us an add on average over 400,000 adds past this
        # size, against 1.5 us now, on the 2026-12-02 host; +12 MB when full).
        self._ids: OrderedDict[str, int] = OrderedDict()
        self._capacity = capacity

    def add(self, exec_id: str, attempt: int = 1 << 62) -> None:
        """Terminal at `attempt` (by default: at whatever attempt it will ever reach)."""
        self._ids[exec_id] = attempt
        if len(self._ids) > self._capacity:
            self._ids.popitem(last=False)

    def discard(self, exec_id: str) -> None:
        """Running again (a rerun): no longer terminal."""
        self._ids.pop(exec_id, None)

    def ended_at(self, exec_id: str) -> int | None:
        """The attempt it was terminal at, or None if not known to be terminal."""
        return self._ids.get(exec_id)

    def __contains__(self, exec_id: str) -> bool:
        return exec_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)


class RecordCache:
    """Decoded copies of the records this process wrote, by key, each with its bytes.

    Decoding a job (19 us) or an execution (13 us) from Avro was a sixth of the worker's
    event loop at 3,000 executions/s: each execution read back its job at the fire and at
    the result, and its execution at the result, all written by this process moments
    before. A read hands out a copy of the cached record only while the partition's DB
    still holds the very bytes it was cached with, so a restore, a standby's update or
    another owner's write is never shadowed: those read the bytes again. The copy follows
    copy_record's rule, which MemoryStore enforces in the core's tests. Oldest out.
    """

    def __init__(self, capacity: int = 1 << 14, *, schema: str | None = None) -> None:
        # An OrderedDict, for TerminalMemo's reason: a put of a new key (one per execution)
        # evicts once the cache is full.
        self._entries: OrderedDict[bytes, tuple[bytes, Mapping[str, Any]]] = OrderedDict()
        self._capacity = capacity
        # The records' schema, when all are of one: their copies then skip the non-arrays.
        self._copy: RecordCopier = copy_record if schema is None else record_copier(schema)
        self.hits = 0
        self.misses = 0

    def put(self, key: bytes, raw: bytes, record: Mapping[str, Any]) -> None:
        if not self._capacity:
            return
        entries = self._entries
        entries[key] = (raw, self._copy(record))
        entries.move_to_end(key)
        if len(entries) > self._capacity:
            entries.popitem(last=False)

    def get(self, key: bytes, raw: bytes) -> Mapping[str, Any] | None:
        entry = self._entries.get(key)
        if entry is None or entry[0] != raw:
            self.misses += 1
            return None
        self.hits += 1
        return self._copy(entry[1])

    def __len__(self) -> int:
        return len(self._entries)


class TableStore:
    """One partition's state, read from and written to its RocksDB directly.

    Writes go through FencedTable.write (changelog record, then the local DB); Faust's
    table layer is skipped: its per-record bookkeeping cost ~10% of the loop. Only used
    while the agent handles one of the partition's events, so the DBs stay open.
    """

    def __init__(self, *, jobs: Any, executions: Any, timers: Any, partition: int,
                 job_cache: RecordCache, execution_cache: RecordCache,
                 epoch: int = 0, on_timer: Any = None,
                 terminal: TerminalMemo | None = None) -> None:
        self._jobs = jobs
        self._executions = executions
        self._timers = timers
        self._partition = partition
        self._epoch = epoch
        self._on_timer = on_timer
        self._terminal = terminal if terminal is not None else TerminalMemo()
        # Owned by the engine: a store lives for one event, the caches for the process.
        self._job_cache = job_cache
        self._execution_cache = execution_cache

    def _get(self, table: Any, key: bytes) -> bytes | None:
        raw = table.partition_db(self._partition).get(key)
        return None if raw is None else bytes(raw)

    def _read(self, table: Any, cache: RecordCache, key: bytes) -> Mapping[str, Any] | None:
        """The record under `key`, as its bytes decode (or a copy of what this process wrote
        with those bytes): the one place a stored record's schema is taken on trust, by
        job() and execution()."""
        raw = self._get(table, key)
        if raw is None:
            return None
        record = cache.get(key, raw)
        return codec.decode(raw).record if record is None else record

    def _write(self, table: Any, cache: RecordCache | None, key: bytes, raw: bytes,
               record: Mapping[str, Any]) -> None:
        table.write(self._partition, key, raw, self._epoch)
        if cache is not None:
            cache.put(key, raw, record)

    def job(self, job_id: str) -> JobRecord | None:
        # The jobs table holds only JobState records (put_job writes them).
        return cast("JobRecord | None", self._read(self._jobs, self._job_cache, job_id.encode()))

    def put_job(self, job: JobRecord, *, cache: bool = True) -> None:
        encoder = job_encoder()
        self._write(self._jobs, self._job_cache if cache else None, job["job_id"].encode(),
                    encoder.encode(job), job)
        if not cache:  # no cached copy of this object will be written again
            encoder.forget(job["spec"])

    def execution(self, exec_id: str) -> ExecutionRecord | None:
        # The executions table holds only ExecutionState records (put_execution writes them).
        return cast("ExecutionRecord | None",
                    self._read(self._executions, self._execution_cache, exec_id.encode()))

    def put_execution(self, execution: ExecutionRecord) -> None:
        self._write(self._executions, self._execution_cache, execution["exec_id"].encode(),
                    codec.encode_trusted(EXECUTION_STATE, execution), execution)
        if execution["state"] in TERMINAL:
            self._terminal.add(execution["exec_id"], execution["attempt"])
        else:  # live (a rerun's start, say): an entry from an earlier end must go
            self._terminal.discard(execution["exec_id"])

    def delete_execution(self, exec_id: str) -> None:
        # A tombstone in the compacted changelog. The record cache needs nothing: a read
        # finds no bytes and answers None. The terminal memo keeps its entry on purpose:
        # the id did end, and a lease timer left of it must still skip it.
        self._executions.write(self._partition, exec_id.encode(), None, self._epoch)

    def known_terminal(self, exec_id: str, attempt: int = 0) -> bool:
        ended = self._terminal.ended_at(exec_id)
        return ended is not None and ended >= attempt

    def put_timer(self, key: bytes, value: bytes) -> None:
        self._timers.write(self._partition, key, value, self._epoch)
        if self._on_timer is not None:
            self._on_timer(self._partition, key)

    def delete_timer(self, key: bytes, *, read: bool = False) -> None:
        # A timer already gone needs no tombstone; one just read (a fired timer) is there,
        # or a redundant tombstone costs less than the lookup on every fire.
        if read or self._get(self._timers, key) is not None:
            self._timers.write(self._partition, key, None, self._epoch)

    def due_lanes(self, now_ms: int) -> list[tuple[Lane, Generator[tuple[bytes, bytes]]]]:
        return due_lanes(self._timers, self._partition, now_ms)

    def timers_in(self, after_ms: int, until_ms: int,
                  start: Mapping[bytes, bytes] | None = None) -> Generator[tuple[bytes, bytes]]:
        return _merged(self._timers, self._partition, after_ms, until_ms, start)

    def lanes_in(self, after_ms: int, until_ms: int, start: Mapping[bytes, bytes] | None = None
                 ) -> list[tuple[Lane, Generator[tuple[bytes, bytes]]]]:
        return lane_runs(self._timers, self._partition, after_ms, until_ms, start)
