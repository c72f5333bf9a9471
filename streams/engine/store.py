"""What the partition core needs from storage, and a real in-memory adapter.

The Faust adapter (streams.engine.faust_store) backs the same interface with RocksDB tables
whose changelogs are kron's compacted topics. The in-memory adapter is complete, not a mock:
the property tests run the core against it.
"""

from __future__ import annotations

import bisect
import copy
import functools
import heapq
from collections.abc import Generator, Mapping
from typing import Any, Final, Protocol, TypeVar, cast

from schemas import codec, names
from schemas.registry import default_registry
from streams.domain.states import ExecutionStatus
from streams.domain.timer import (
    Lane,
    due_bound,
    due_order,
    lane_end,
    lane_of_prefix,
    lane_prefix_of,
)
from streams.engine.records import ExecutionRecord, JobRecord

# A record of no schema in particular (an effect's, say); the state the core reads and
# writes is typed by streams.engine.records.
Record = dict[str, Any]
RecordT = TypeVar("RecordT", bound=Mapping[str, Any])

# The execution states that are over (read by name where decisions test them).
TERMINAL = ExecutionStatus.TERMINAL


class RecordCopier(Protocol):
    """A copy of a record, as copy_record makes one: of the same type (a JobRecord's copy is
    a JobRecord), because at run time a record is a plain dict and so is its copy."""

    def __call__(self, record: RecordT, /) -> RecordT: ...


def _copy_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """A copy the core may change the way it changes records: a new top-level dict, new
    lists and new dicts inside them (an execution's attempts). Nested records (the spec,
    the envelope) are shared: the core replaces them and never changes them in place.
    MemoryStore checks that rule, and the canonical form, on every write of every test
    that runs the core, because the real store's cache of decoded records relies on both.

    A fifth of the cost of decoding the record's Avro bytes (0.6-0.8 us against 13-19 us).
    """
    out = dict(record)
    for key, value in record.items():
        if type(value) is list:
            out[key] = [dict(v) if type(v) is dict else v for v in value]
    return out


# Typed once here, not at every call (a cast is a call): the copy is the record's type.
copy_record: Final = cast(RecordCopier, _copy_record)


@functools.cache
def record_copier(schema_name: str) -> RecordCopier:
    """copy_record for records of one schema (see copier_for_fields)."""
    return copier_for_fields(default_registry().latest(schema_name).schema["fields"])


def copier_for_fields(fields: list[dict[str, Any]]) -> RecordCopier:
    """copy_record for records with these fields, visiting the fields that may hold an
    array (an array, or a union with one) instead of every value: 1.0 against 1.9 us for an
    execution. The same copy for any record the store holds: one with a key outside its
    schema fails to encode and is never stored, so only those fields can hold lists; a
    missing one is left out of the copy as it is of the record."""
    arrays = tuple(f["name"] for f in fields if _may_hold_array(f["type"]))

    def copy_of(record: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(record)
        for key in arrays:
            value = record.get(key)
            if type(value) is list:
                out[key] = [dict(v) if type(v) is dict else v for v in value]
        return out

    return cast(RecordCopier, copy_of)


def _may_hold_array(schema: Any) -> bool:
    if isinstance(schema, list):  # a union
        return any(_may_hold_array(branch) for branch in schema)
    return isinstance(schema, dict) and schema.get("type") == "array"


class PartitionStore(Protocol):
    """One partition's state. Every method is synchronous: the core never awaits."""

    def job(self, job_id: str) -> JobRecord | None: ...

    def put_job(self, job: JobRecord, *, cache: bool = True) -> None:
        """cache=False: the job will not be read soon (it fires much later), so a store
        that keeps decoded copies of what it wrote need not keep this one."""
        ...

    def execution(self, exec_id: str) -> ExecutionRecord | None: ...

    def put_execution(self, execution: ExecutionRecord) -> None: ...

    def delete_execution(self, exec_id: str) -> None:
        """Write the execution's tombstone (history retention: streams.engine.retention).
        known_terminal may go on answering True for it: the id ended, and nothing may start
        it again."""
        ...

    def put_timer(self, key: bytes, value: bytes) -> None: ...

    def delete_timer(self, key: bytes, *, read: bool = False) -> None:
        """Remove a timer. read=True: the caller read it from this store during this
        event, so the store need not check that it exists before writing the delete."""
        ...

    def known_terminal(self, exec_id: str, attempt: int = 0) -> bool:
        """True if the execution is known, without decoding it, to have reached a terminal
        state at `attempt` or a later attempt (0: at any), so that attempt is over.

        A hint: False means "look it up". Only a backfill's rerun takes a terminal
        execution back to running, and only with a higher attempt, so a memo of (exec id,
        attempt at its end) never goes stale for the attempts it answers about. Without
        `attempt` (a job's `running` list) an entry another process made may predate a
        rerun; the callers that ask so only prune or skip re-arming on it.
        """
        ...

    def due_lanes(self, now_ms: int) -> list[tuple[Lane, Generator[tuple[bytes, bytes]]]]:
        """The lanes (streams.domain.timer) that may hold timers due at or before now_ms
        (every lane that does, perhaps others), in key order, each with a lazy reader of
        its due timers in due order. The caller reads them before it writes a timer, and
        closes them."""
        ...

    def timers_in(self, after_ms: int, until_ms: int,
                  start: Mapping[bytes, bytes] | None = None) -> Generator[tuple[bytes, bytes]]:
        """Timers due in (after_ms, until_ms], of every lane, in due order (ties in key
        order past the lane prefix); in a lane whose prefix `start` maps to a key, only
        those from that key on. As they were when the iteration started: the caller may
        write timers while it iterates."""
        ...

    def lanes_in(self, after_ms: int, until_ms: int, start: Mapping[bytes, bytes] | None = None
                 ) -> list[tuple[Lane, Generator[tuple[bytes, bytes]]]]:
        """The timers timers_in gives, lane by lane: each lane's in due order."""
        ...


class MemoryStore:
    """A partition held in dicts plus a sorted key list for the time index.

    Records are copied in and out with copy_record, as the real store's record cache does,
    so a caller that changes a record without saving it changes nothing here either. Every
    write is checked the way the cache needs: the record must read back from its Avro
    bytes as the same dict (canonical form), and no nested part of it may change after
    it was saved (a deep snapshot is compared at each read).
    """

    def __init__(self) -> None:
        self.jobs: dict[str, JobRecord] = {}
        self.executions: dict[str, ExecutionRecord] = {}
        self.timers: dict[bytes, bytes] = {}
        self._keys: list[bytes] = []
        self._saved: dict[tuple[str, str], Mapping[str, Any]] = {}
        # Every state write in order: the in-memory twin of the changelog topics.
        self.log: list[tuple[str, Mapping[str, Any]]] = []

    def job(self, job_id: str) -> JobRecord | None:
        return self._read("job", self.jobs, job_id)

    def put_job(self, job: JobRecord, *, cache: bool = True) -> None:
        self._write("job", self.jobs, job["job_id"], job, names.JOB_STATE)

    def execution(self, exec_id: str) -> ExecutionRecord | None:
        return self._read("execution", self.executions, exec_id)

    def put_execution(self, execution: ExecutionRecord) -> None:
        self._write("execution", self.executions, execution["exec_id"], execution,
                    names.EXECUTION_STATE)

    def delete_execution(self, exec_id: str) -> None:
        if self.executions.pop(exec_id, None) is not None:
            del self._saved[("execution", exec_id)]
        # The changelog's tombstone: the kind says so, the record holds only the key.
        self.log.append(("execution-tombstone", {"exec_id": exec_id}))

    def _read(self, kind: str, table: dict[str, RecordT], key: str) -> RecordT | None:
        record = table.get(key)
        if record is None:
            return None
        if record != self._saved[(kind, key)]:
            raise AssertionError(f"{kind} {key!r} changed in place after it was saved")
        return copy_record(record)

    def _write(self, kind: str, table: dict[str, RecordT], key: str, record: RecordT,
               schema: str) -> None:
        if codec.decode(codec.encode_trusted(schema, record)).record != record:
            raise AssertionError(f"{kind} {key!r} is not in the form its Avro bytes read back as")
        table[key] = copy_record(record)
        self._saved[(kind, key)] = copy.deepcopy(record)
        self.log.append((kind, copy.deepcopy(record)))

    def put_timer(self, key: bytes, value: bytes) -> None:
        if key not in self.timers:
            bisect.insort(self._keys, key)
        self.timers[key] = value

    def known_terminal(self, exec_id: str, attempt: int = 0) -> bool:
        ex = self.executions.get(exec_id)
        return ex is not None and ex["state"] in TERMINAL and ex["attempt"] >= attempt

    def delete_timer(self, key: bytes, *, read: bool = False) -> None:
        if self.timers.pop(key, None) is not None:
            del self._keys[bisect.bisect_left(self._keys, key)]

    def _lanes(self) -> Generator[tuple[bytes, int, int]]:
        """(prefix, first index, end index) of each lane holding a key, by skip-scan."""
        keys, i = self._keys, 0
        while i < len(keys):
            prefix = lane_prefix_of(keys[i])
            if prefix is None:
                return
            end = bisect.bisect_left(keys, lane_end(prefix), lo=i)
            yield prefix, i, end
            i = end

    def _read_timers(self, keys: list[bytes]) -> Generator[tuple[bytes, bytes]]:
        for k in keys:
            yield k, self.timers[k]

    def due_lanes(self, now_ms: int) -> list[tuple[Lane, Generator[tuple[bytes, bytes]]]]:
        out = []
        for prefix, lo, hi in self._lanes():
            end = bisect.bisect_left(self._keys, due_bound(prefix, now_ms), lo=lo, hi=hi)
            if end > lo:
                out.append((lane_of_prefix(prefix), self._read_timers(self._keys[lo:end])))
        return out

    def timers_in(self, after_ms: int, until_ms: int,
                  start: Mapping[bytes, bytes] | None = None) -> Generator[tuple[bytes, bytes]]:
        runs = self.lanes_in(after_ms, until_ms, start)
        yield from heapq.merge(*(run for _, run in runs), key=due_order)

    def lanes_in(self, after_ms: int, until_ms: int, start: Mapping[bytes, bytes] | None = None
                 ) -> list[tuple[Lane, Generator[tuple[bytes, bytes]]]]:
        keys, runs = self._keys, []
        for prefix, lo, hi in self._lanes():
            lower = due_bound(prefix, after_ms)
            if start and prefix in start:
                lower = max(lower, start[prefix])
            first = bisect.bisect_left(keys, lower, lo=lo, hi=hi)
            end = bisect.bisect_left(keys, due_bound(prefix, until_ms), lo=lo, hi=hi)
            if end > first:
                runs.append((lane_of_prefix(prefix), _each([(k, self.timers[k])
                                                            for k in keys[first:end]])))
        return runs


def _each(items: list[tuple[bytes, bytes]]) -> Generator[tuple[bytes, bytes]]:
    yield from items
