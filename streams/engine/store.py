"""What the partition core needs from storage, and a real in-memory adapter.

The Faust adapter (streams.engine.faust_store) backs the same interface with RocksDB tables
whose changelogs are kron's compacted topics. The in-memory adapter is complete, not a mock:
the property tests run the core against it.
"""

from __future__ import annotations

import bisect
import copy
from collections.abc import Generator
from typing import Any, Protocol

Record = dict[str, Any]

TERMINAL = frozenset({"succeeded", "failed", "skipped", "missed", "cancelled"})


class PartitionStore(Protocol):
    """One partition's state. Every method is synchronous: the core never awaits."""

    def job(self, job_id: str) -> Record | None: ...

    def put_job(self, job: Record) -> None: ...

    def execution(self, exec_id: str) -> Record | None: ...

    def put_execution(self, execution: Record) -> None: ...

    def put_timer(self, key: bytes, value: bytes) -> None: ...

    def delete_timer(self, key: bytes) -> None: ...

    def known_terminal(self, exec_id: str) -> bool:
        """True if the execution is known to be in a terminal state without decoding it.

        A hint: False means "look it up". Terminal states never change, so a memo of them
        never goes stale.
        """
        ...

    def due_timers(self, upper: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        """Timers whose key sorts below `upper`, in key (so due-time) order."""
        ...

    def timers_in(self, lower: bytes, upper: bytes) -> Generator[tuple[bytes, bytes]]:
        """Timers with lower <= key < upper in key order, as they were when the iteration
        started: the caller may write timers while it iterates."""
        ...


class MemoryStore:
    """A partition held in dicts plus a sorted key list for the time index.

    Records are copied in and out, as serialisation does for the real tables, so a caller
    that mutates a record without saving it changes nothing here either.
    """

    def __init__(self) -> None:
        self.jobs: dict[str, Record] = {}
        self.executions: dict[str, Record] = {}
        self.timers: dict[bytes, bytes] = {}
        self._keys: list[bytes] = []
        # Every state write in order: the in-memory twin of the changelog topics.
        self.log: list[tuple[str, Record]] = []

    def job(self, job_id: str) -> Record | None:
        job = self.jobs.get(job_id)
        return None if job is None else copy.deepcopy(job)

    def put_job(self, job: Record) -> None:
        self.jobs[job["job_id"]] = copy.deepcopy(job)
        self.log.append(("job", copy.deepcopy(job)))

    def execution(self, exec_id: str) -> Record | None:
        ex = self.executions.get(exec_id)
        return None if ex is None else copy.deepcopy(ex)

    def put_execution(self, execution: Record) -> None:
        self.executions[execution["exec_id"]] = copy.deepcopy(execution)
        self.log.append(("execution", copy.deepcopy(execution)))

    def put_timer(self, key: bytes, value: bytes) -> None:
        if key not in self.timers:
            bisect.insort(self._keys, key)
        self.timers[key] = value

    def known_terminal(self, exec_id: str) -> bool:
        ex = self.executions.get(exec_id)
        return ex is not None and ex["state"] in TERMINAL

    def delete_timer(self, key: bytes) -> None:
        if self.timers.pop(key, None) is not None:
            del self._keys[bisect.bisect_left(self._keys, key)]

    def due_timers(self, upper: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        end = bisect.bisect_left(self._keys, upper)
        return [(k, self.timers[k]) for k in self._keys[: min(end, limit)]]

    def timers_in(self, lower: bytes, upper: bytes) -> Generator[tuple[bytes, bytes]]:
        lo, hi = bisect.bisect_left(self._keys, lower), bisect.bisect_left(self._keys, upper)
        yield from [(k, self.timers[k]) for k in self._keys[lo:hi]]

    def next_due_key(self) -> bytes | None:
        return self._keys[0] if self._keys else None
