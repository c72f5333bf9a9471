"""A worker's /metrics: prometheus_client's HTTP server in its own thread, and a collector
that asks the event loop for a snapshot at each scrape.

Everything the snapshot reads (the counts, the dispatch queue, the circuits, the consumer's
offsets, the timers' RocksDB) belongs to the event loop's thread: the scrape thread never
touches it, it waits (SNAPSHOT_TIMEOUT_S at most) for the loop to copy it. A loop too busy
to answer gets the previous snapshot served. Gauges cost nothing between scrapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from streams.domain.timer import LANE_TAG, TimerKind, kind_of
from streams.metrics import ACK_BUCKETS, LATENESS_BUCKETS, Folder, Histogram, WorkerCounts

log = logging.getLogger("kron.metrics")

SNAPSHOT_TIMEOUT_S = 5.0
# Counting the timers reads every key of the owned partitions (~0.3 us a key): at most this
# often, and at most TIMERS_LOOP_SHARE of the loop's time (a million timers are counted
# about every 15 s rather than every 10), a chunk of keys per turn of the loop.
TIMERS_EVERY_S = 10.0
TIMERS_LOOP_SHARE = 0.02
TIMERS_CHUNK = 4096
PORT_FILE = "metrics-port"


@dataclass(kw_only=True)
class Snapshot:
    """What one scrape shows, copied on the event loop's thread."""

    attempts: dict[tuple[str, str], int] = field(default_factory=dict)
    executions: dict[tuple[str, str], int] = field(default_factory=dict)
    dead_letters: dict[str, int] = field(default_factory=dict)
    lateness: Histogram = field(default_factory=lambda: Histogram(LATENESS_BUCKETS))
    changelog_ack: Histogram = field(default_factory=lambda: Histogram(ACK_BUCKETS))
    in_flight: int = 0
    queue: dict[str, int] = field(default_factory=dict)
    partitions_owned: int = 0
    lag: dict[tuple[str, int], int] = field(default_factory=dict)
    circuits: dict[str, int] = field(default_factory=dict)
    timers: dict[tuple[int, str], int] = field(default_factory=dict)
    # The notifier's (streams/notify/): alerts by outcome, and deliveries queued.
    alerts: dict[str, int] = field(default_factory=dict)
    alert_queue: int = 0


class ExecutorView(Protocol):
    """The executor as the probe reads it (streams.executor.Executor)."""

    @property
    def in_flight(self) -> int: ...

    def queue_depths(self) -> dict[str, int]: ...

    @property
    def breaker(self) -> Any: ...


class WorkerView(Protocol):
    """The worker's lifecycle as the probe reads it (streams.worker_lifecycle)."""

    @property
    def app(self) -> Any: ...

    @property
    def timers(self) -> Any: ...

    @property
    def runtime(self) -> Any: ...

    def owned_partitions(self) -> frozenset[int]: ...

    def may_apply_here(self, partition: int) -> bool: ...


class AlertsView(Protocol):
    """The notifier as the probe reads it (streams.notify.notifier.Notifier)."""

    @property
    def depth(self) -> int: ...

    def outcomes(self) -> dict[str, int]: ...


class WorkerProbe:
    """Takes snapshots on the event loop: the counts copied, the gauges read."""

    def __init__(self, *, counts: WorkerCounts, executor: ExecutorView, worker: WorkerView,
                 topics: Iterable[str], monotonic: Callable[[], float],
                 max_hosts: int = 50, alerts: AlertsView | None = None) -> None:
        self._counts = counts
        self._alerts = alerts
        self._executor = executor
        self._worker = worker
        self._topics = frozenset(topics)
        self._monotonic = monotonic
        self._hosts = Folder(max_hosts)
        self._timers: dict[tuple[int, str], int] = {}
        self._timers_next: float | None = None

    async def snapshot(self) -> Snapshot:
        c, ex = self._counts, self._executor
        fold = c.tenants.fold
        queue: dict[str, int] = {}
        for tenant, n in ex.queue_depths().items():
            queue[fold(tenant)] = queue.get(fold(tenant), 0) + n
        circuits: dict[str, int] = {}
        for host in ex.breaker.open_hosts():
            folded = self._hosts.fold(host)
            circuits[folded] = circuits.get(folded, 0) + 1
        snap = Snapshot(
            attempts=dict(c.attempts), executions=dict(c.executions),
            dead_letters=dict(c.dead_letters), lateness=c.lateness.copy(),
            changelog_ack=c.changelog_ack.copy(), in_flight=ex.in_flight, queue=queue,
            partitions_owned=len(self._worker.owned_partitions()), lag=self._lag(),
            circuits=circuits)
        snap.timers = await self._pending_timers()
        if self._alerts is not None:
            snap.alerts, snap.alert_queue = self._alerts.outcomes(), self._alerts.depth
        return snap

    def _lag(self) -> dict[tuple[str, int], int]:
        """Records not yet committed per partition of the topics the agent reads."""
        out: dict[tuple[str, int], int] = {}
        try:
            consumer = self._worker.app.consumer
            commits = self._worker.runtime.commit_control()
            assigned = [tp for tp in consumer.assignment() if tp.topic in self._topics]
        except Exception:  # not started yet, or mid-rebalance: no lag to show
            return out
        for tp in assigned:
            with contextlib.suppress(Exception):  # a partition just revoked
                high = consumer.highwater(tp)
                if high is not None:
                    out[(tp.topic, tp.partition)] = max(0, high - (commits.committed(tp) or 0))
        return out

    async def _pending_timers(self) -> dict[tuple[int, str], int]:
        started = self._monotonic()
        if self._timers_next is None or started >= self._timers_next:
            self._timers_next = started + TIMERS_EVERY_S  # a scrape meanwhile: the last
            self._timers, busy_s = await self._count_timers()
            self._timers_next = started + max(TIMERS_EVERY_S, busy_s / TIMERS_LOOP_SHARE)
        return self._timers

    async def _count_timers(self) -> tuple[dict[tuple[int, str], int], float]:
        """The timers by partition and kind, and the loop's time it took."""
        counts: dict[tuple[int, str], int] = {}
        busy_s = 0.0
        for partition in sorted(self._worker.owned_partitions()):
            start: bytes | None = None
            # The DB is looked up afresh for every chunk and never held across the await:
            # a rebalance may close it (streams.runtime.stores).
            while self._worker.may_apply_here(partition):
                began = self._monotonic()
                start = count_timer_keys(self._worker.timers.partition_db(partition),
                                         partition, start, counts)
                busy_s += self._monotonic() - began
                if start is None:
                    break
                await asyncio.sleep(0)
        return counts, busy_s


def count_timer_keys(db: Any, partition: int, start: bytes | None,
                     counts: dict[tuple[int, str], int]) -> bytes | None:
    """Count up to TIMERS_CHUNK timer keys from `start` by kind; where to go on, or None
    at the end of the timers (Faust's own offset key sorts after every timer)."""
    it = db.iter()
    if start is None:
        it.seek_to_first()
    else:
        it.seek(start)
    by_kind = [0] * 256  # per kind byte: one list increment a key
    nxt: bytes | None = None
    for _ in range(TIMERS_CHUNK):
        if not it.valid():
            break
        key = it.key()
        if key[0] > LANE_TAG:
            break
        by_kind[kind_of(key)] += 1
        it.next()
    else:
        nxt = bytes(it.key()) if it.valid() else None
    for kind, n in enumerate(by_kind):
        if n:
            name = _KIND_NAMES.get(kind) or str(kind)
            counts[(partition, name)] = counts.get((partition, name), 0) + n
    return nxt


_KIND_NAMES = {kind.value: kind.name.lower() for kind in TimerKind}


def families(s: Snapshot) -> Iterator[Metric]:
    """The exposition of one snapshot."""
    yield _counter("kron_executions", "Executions ended, by tenant and outcome.",
                   ["tenant", "outcome"], s.executions.items())
    yield _counter("kron_attempts", "Calls of targets answered, by tenant and outcome "
                   "(succeeded, or the error class).", ["tenant", "outcome"], s.attempts.items())
    yield _counter("kron_dead_letters", "Records and failed executions dead-lettered, by "
                   "reason.", ["reason"], _one(s.dead_letters))
    yield _histogram("kron_trigger_lateness_seconds", "From a slot's scheduled time to its "
                     "first call.", ["tenant", "priority"], s.lateness)
    yield _histogram("kron_changelog_ack_seconds", "How long a flush of the worker's state "
                     "writes waited for Kafka's acks.", [], s.changelog_ack)
    yield _gauge("kron_attempts_in_flight", "Calls under way.", [], [((), s.in_flight)])
    yield _gauge("kron_dispatch_queue_depth", "Attempts due and waiting for a runner or "
                 "their tenant's rate.", ["tenant"], _one(s.queue))
    yield _gauge("kron_partitions_owned", "Partitions this worker owns.", [],
                 [((), s.partitions_owned)])
    yield _gauge("kron_consumer_lag", "Records not yet committed, per partition the worker "
                 "reads.", ["topic", "partition"],
                 (((t, str(p)), v) for (t, p), v in s.lag.items()))
    yield _gauge("kron_circuit_open", "Target hosts whose circuit is open (dispatch paused).",
                 ["host"], _one(s.circuits))
    yield _gauge("kron_timers_pending", "Timers in the owned partitions, by kind (counted at "
                 f"most every {TIMERS_EVERY_S:.0f} s).", ["partition", "kind"],
                 (((str(p), k), v) for (p, k), v in s.timers.items()))
    yield _counter("kron_alerts", "Failure alerts by outcome: sent, retried (a try failed, "
                   "another follows), failed (given up), dropped (the queue was full), "
                   "unsigned (no key for the tenant).", ["outcome"], _one(s.alerts))
    yield _gauge("kron_alert_queue_depth", "Alert deliveries waiting for a runner.", [],
                 [((), s.alert_queue)])


def _one(values: dict[str, int]) -> Iterator[tuple[tuple[str, ...], int]]:
    """Values of a metric with one label."""
    return (((k,), v) for k, v in values.items())


def _counter(name: str, doc: str, labels: list[str],
             values: Iterable[tuple[tuple[str, ...], int]]) -> Metric:
    family = CounterMetricFamily(name, doc, labels=labels)
    for key, value in sorted(values):
        family.add_metric(list(key), value)
    return family


def _gauge(name: str, doc: str, labels: list[str],
           values: Iterable[tuple[tuple[str, ...], int]]) -> Metric:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for key, value in sorted(values):
        family.add_metric(list(key), value)
    return family


def _histogram(name: str, doc: str, labels: list[str], hist: Histogram) -> Metric:
    family = HistogramMetricFamily(name, doc, labels=labels)
    for key, row in sorted(hist.series.items()):
        total, buckets = 0.0, []
        for bound, count in zip((*hist.bounds, float("inf")), row[:-1], strict=True):
            total += count
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), total))
        family.add_metric(list(key), buckets, row[-1])
    return family


class WorkerCollector:
    """prometheus_client's view of a worker: a snapshot from the loop at each scrape."""

    def __init__(self, probe: WorkerProbe) -> None:
        self._probe = probe
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last = Snapshot()

    async def started(self) -> None:
        """A Faust task at the app's start: from now on scrapes ask this loop."""
        self._loop = asyncio.get_running_loop()

    def collect(self) -> Iterable[Metric]:
        return list(families(self._snapshot()))

    def _snapshot(self) -> Snapshot:
        loop = self._loop
        if loop is None or loop.is_closed():
            return self._last
        future = asyncio.run_coroutine_threadsafe(self._probe.snapshot(), loop)
        try:
            self._last = future.result(SNAPSHOT_TIMEOUT_S)
        except Exception as exc:  # a stalled or stopping loop: the last snapshot stands
            future.cancel()
            log.warning("metrics snapshot not taken: %r", exc)
        return self._last


def serve(collector: WorkerCollector, *, host: str, port: int, data_dir: Path) -> int | None:
    """Serve /metrics on host:port (0: a free one) in a thread; the bound port, also written
    to `<data_dir>/metrics-port`. A port that can't be bound is logged, not fatal: the
    worker's jobs matter more than its metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    ProcessCollector(registry=registry)  # process_cpu_seconds_total, memory, fds
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        log.error("metrics not served: %s:%s: %s", host, port, exc)
        return None
    bound = int(server.server_port)
    tmp = data_dir / f"{PORT_FILE}.tmp"
    tmp.write_text(f"{bound}\n")
    os.replace(tmp, data_dir / PORT_FILE)
    log.info("metrics on http://%s:%s/metrics", host, bound,
             extra={"metrics_host": host, "metrics_port": bound})
    return bound
