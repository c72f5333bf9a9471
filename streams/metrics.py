"""A worker's Prometheus metrics, counted on the hot path in plain ints and dicts (issue 40).

A worker makes ~5,000 calls a second per process: a prometheus_client `labels().inc()` per
event takes a lock and looks the child up each time. Here an event is a dict update on the
event loop's thread, and the exposition is built only when /metrics is scraped
(streams/metrics_server.py), from a snapshot taken on that same thread, so nothing is shared
between threads while it changes.

Label values are bounded: the first `limit` tenants (or hosts) seen keep their name, the
rest are counted as `other`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from typing import Any, Protocol

from streams.engine.faust_store import TableStore
from streams.engine.store import TERMINAL

OTHER = "other"
# Slot's time to the call: a healthy worker calls within tens of milliseconds; a failover
# or a spike shows as seconds.
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                    60.0, 300.0)
# A state write's ack as the dispatch barrier waits for it: milliseconds on a healthy broker.
ACK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Folder:
    """Maps label values to themselves for the first `limit` distinct ones, else `other`."""

    __slots__ = ("_known", "_limit", "_named")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._named = 0
        self._known: dict[str, str] = {}

    def fold(self, value: str) -> str:
        known = self._known.get(value)
        if known is not None:
            return known
        if self._named < self._limit:
            self._named += 1
            self._known[value] = value
            return value
        # Values past the limit are remembered as `other` (a later lookup is one get), up
        # to a bound: a flood of distinct values must not grow this dict either.
        if len(self._known) < self._limit * 4:
            self._known[value] = OTHER
        return OTHER


class Histogram:
    """Bucket counts and sums per label tuple; Prometheus' cumulative form at scrape."""

    __slots__ = ("bounds", "series")

    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds = tuple(bounds)
        # labels -> [count per bucket (+Inf last)..., sum]
        self.series: dict[tuple[str, ...], list[float]] = {}

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        row = self.series.get(labels)
        if row is None:
            row = self.series[labels] = [0] * (len(self.bounds) + 2)
        row[bisect_left(self.bounds, value)] += 1
        row[-1] += value

    def copy(self) -> Histogram:
        out = Histogram(self.bounds)
        out.series = {k: list(v) for k, v in self.series.items()}
        return out


class AttemptDispatch(Protocol):
    """What an attempt's metrics read of its Dispatch (streams.engine.core.Dispatch)."""

    @property
    def tenant(self) -> str: ...
    @property
    def priority(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def scheduled_for_ms(self) -> int: ...
    @property
    def task_id(self) -> str | None: ...


class WorkerCounts:
    """Everything a worker counts as it happens. Only touched on the event loop's thread."""

    def __init__(self, *, max_tenants: int = 100) -> None:
        self.tenants = Folder(max_tenants)
        self.attempts: dict[tuple[str, str], int] = {}
        self.executions: dict[tuple[str, str], int] = {}
        self.dead_letters: dict[str, int] = {}
        self.lateness = Histogram(LATENESS_BUCKETS)
        self.changelog_ack = Histogram(ACK_BUCKETS)

    def attempt(self, d: AttemptDispatch, outcome: str, called_ms: int) -> None:
        """A call made and answered (`outcome`: succeeded, or the error class). A slot's
        first call also times its lateness; a DAG task's waits on its parents by design."""
        tenant = self.tenants.fold(d.tenant)
        key = (tenant, outcome)
        self.attempts[key] = self.attempts.get(key, 0) + 1
        if d.attempt == 1 and d.task_id is None:
            late_s = (called_ms - d.scheduled_for_ms) / 1000
            self.lateness.observe((tenant, str(d.priority)), late_s if late_s > 0 else 0.0)

    def execution(self, tenant: str, state: str) -> None:
        key = (self.tenants.fold(tenant), state)
        self.executions[key] = self.executions.get(key, 0) + 1

    def dead_letter(self, reason: str) -> None:
        self.dead_letters[reason] = self.dead_letters.get(reason, 0) + 1

    def ack_wait(self, seconds: float) -> None:
        self.changelog_ack.observe((), seconds)

    def store_class(self) -> type[TableStore]:
        """The partition store the engine writes through, counting executions as they end."""
        return _counting_store(self)


def _counting_store(counts: WorkerCounts) -> type[TableStore]:
    """A TableStore that counts each execution's terminal write once: the core writes every
    outcome (succeeded, failed, missed, skipped, cancelled) through put_execution, and the
    store's terminal memo tells a first end from a rewrite of one. A rerun's new end counts
    again; a DAG run counts, its task instances don't. Built once per worker: the class
    carries the counts, so a store (one per event) costs nothing more to make."""

    put = TableStore.put_execution  # called directly: no super() object per write

    class CountingTableStore(TableStore):
        def put_execution(self, execution: Any) -> None:
            state = execution["state"]
            # A DAG's task instances are parts of its run, which counts once (as the API
            # lists runs).
            if (state in TERMINAL and execution.get("task_id") is None
                    and not self.known_terminal(execution["exec_id"], execution["attempt"])):
                counts.execution(execution["envelope"]["tenant"], str(state))
            put(self, execution)

    return CountingTableStore
