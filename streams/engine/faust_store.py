"""The partition store backed by Faust RocksDB tables whose changelogs are kron's topics.

Reads and writes go through the tables (so every write reaches the changelog), except the
ordered range scan of the time index, which reads the partition's rocksdict directly:
Faust's table API has no ordered scan. That access is read-only and never held across an
await, because a rebalance may close the DB.
"""

from __future__ import annotations

from typing import Any

from schemas import codec
from streams.engine.store import Record

FAUST_OFFSET_KEY = b"__faust\x00offset__"
JOB_STATE = "kron.state.JobState"
EXECUTION_STATE = "kron.executions.ExecutionState"


def partition_db(table: Any, partition: int) -> Any:
    return table.data._db_for_partition(partition)


def first_timer_key(table: Any, partition: int) -> bytes | None:
    """The earliest timer of a partition, or None. Cheap: one seek."""
    for key, _ in scan(table, partition, limit=1):
        return key
    return None


def scan(table: Any, partition: int, *, upper: bytes | None = None,
         limit: int) -> list[tuple[bytes, bytes]]:
    """Ordered (key, value) pairs from the start of the partition's DB, below `upper`."""
    it = partition_db(table, partition).iter()
    it.seek_to_first()
    out: list[tuple[bytes, bytes]] = []
    while it.valid() and len(out) < limit:
        key = bytes(it.key())
        if upper is not None and key >= upper:
            break
        if key != FAUST_OFFSET_KEY:
            out.append((key, bytes(it.value())))
        it.next()
    return out


class TableStore:
    def __init__(self, *, jobs: Any, executions: Any, timers: Any, partition: int,
                 on_timer: Any = None) -> None:
        self._jobs = jobs
        self._executions = executions
        self._timers = timers
        self._partition = partition
        self._on_timer = on_timer

    def job(self, job_id: str) -> Record | None:
        raw = self._jobs.get(job_id.encode())
        return None if raw is None else codec.decode(raw).record

    def put_job(self, job: Record) -> None:
        self._jobs[job["job_id"].encode()] = codec.encode_trusted(JOB_STATE, job)

    def execution(self, exec_id: str) -> Record | None:
        raw = self._executions.get(exec_id.encode())
        return None if raw is None else codec.decode(raw).record

    def put_execution(self, execution: Record) -> None:
        self._executions[execution["exec_id"].encode()] = codec.encode_trusted(
            EXECUTION_STATE, execution)

    def put_timer(self, key: bytes, value: bytes) -> None:
        self._timers[key] = value
        if self._on_timer is not None:
            self._on_timer(self._partition, key)

    def delete_timer(self, key: bytes) -> None:
        # Faust raises KeyError for a missing key; a timer already gone is fine.
        if self._timers.get(key) is not None:
            del self._timers[key]

    def due_timers(self, upper: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        return scan(self._timers, self._partition, upper=upper, limit=limit)
