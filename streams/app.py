"""The worker's Faust app: one agent per partition stream, three co-partitioned tables.

Built by `build_engine(settings)` at process start; nothing is built at import time. Two
parts, connected here and nowhere else:

- `WorkerLifecycle` (streams/worker_lifecycle.py): the app and its runtime seam, the tables,
  start, graceful stop, revoke, stats and the ownership lease;
- `PartitionDriver` (streams/partition_driver.py): each record decoded, applied to its
  partition's PartitionCore, and the effects carried out.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from kron.clock import Clock
from kron.settings import Settings
from streams.barrier import DurabilityBarrier
from streams.collector import IdleCollector
from streams.engine.faust_store import TableTimerIndex
from streams.engine.running_gate import RunningGate
from streams.executor import Executor
from streams.metrics import WorkerCounts
from streams.metrics_server import WorkerCollector, WorkerProbe
from streams.notify.backoff import Backoff
from streams.notify.consumer import AlertFeed
from streams.notify.notifier import Notifier
from streams.partition_driver import (
    IGNORED,
    REPORTS,
    TICK_BUDGET,
    TICK_CHUNK,
    PartitionDriver,
    _environmental,
    _jobs_fault,
)
from streams.reports import ResultBatcher
from streams.targets import CommandRunner, HttpRunner, KafkaRunner
from streams.ticker import Ticker
from streams.worker_lifecycle import (
    EXIT_STATE_UNWRITABLE,
    FETCH_MIN_BYTES,
    FETCH_WAIT_MS,
    RAW,
    RESULTS,
    Stats,
    WorkerLifecycle,
    tune_fetches,
)

log = logging.getLogger("kron.worker")

__all__ = ["EXIT_STATE_UNWRITABLE", "FETCH_MIN_BYTES", "FETCH_WAIT_MS", "IGNORED", "RAW",
           "REPORTS", "RESULTS", "TICK_BUDGET", "TICK_CHUNK", "Engine", "PartitionDriver",
           "Stats", "WorkerLifecycle", "_environmental", "_jobs_fault", "build_engine",
           "tune_fetches"]


class _TickerHost:
    """The worker as the ticker sees it (streams.ticker.TickerHost)."""

    def __init__(self, lifecycle: WorkerLifecycle, driver: PartitionDriver,
                 executor: Executor) -> None:
        self._lifecycle = lifecycle
        self._executor = executor
        self.clock = lifecycle.clock
        self.timers = TableTimerIndex(lifecycle.timers)
        self.tick_here = driver.tick_here

    def tickable(self) -> frozenset[int]:
        # Outside the lease we may not be the owner any more: the new one ticks. Watching
        # starts here too, as a worker with timers but no commands gets no other event.
        lifecycle = self._lifecycle
        lifecycle.lease.watch(lifecycle.runtime.coordinator())
        if self._executor.full:
            # The executor's bound (Executor.room): it cannot refuse an attempt already
            # started, so no tick decides more until its runners have made room. The ticker
            # looks again within RESCAN_S, and decides with a fresh `now` then.
            return frozenset()
        return lifecycle.runtime.owned_partitions() if lifecycle.lease.valid() else frozenset()

    def backlog(self) -> int:
        return self._executor.backlog

    def completed(self) -> int:
        return self._executor.completed

    async def send_tick(self, partition: int, value: bytes) -> None:
        await self._lifecycle.signals.send(key=b"tick", value=value, partition=partition)


@dataclass(frozen=True, kw_only=True)
class Engine:
    """One worker's objects, as build_engine connected them."""

    lifecycle: WorkerLifecycle
    driver: PartitionDriver
    executor: Executor
    results: ResultBatcher
    ticker: Ticker
    # /metrics (streams/metrics_server.py), served by run_worker; None with metrics off.
    metrics: WorkerCollector | None = None
    # Failure alerts to webhooks (streams/notify/); None with KRON_NOTIFY_ENABLED=false.
    alerts: AlertFeed | None = None

    # Unit tests call these unbound, with a stand-in for the lifecycle.
    _build_app = WorkerLifecycle._build_app
    _may_apply_here = WorkerLifecycle.may_apply_here

    @property
    def settings(self) -> Settings:
        return self.lifecycle.settings

    @property
    def app(self) -> Any:
        return self.lifecycle.app

    @property
    def jobs(self) -> Any:
        return self.lifecycle.jobs

    @property
    def executions(self) -> Any:
        return self.lifecycle.executions

    @property
    def timers(self) -> Any:
        return self.lifecycle.timers


def build_engine(settings: Settings, clock: Clock | None = None) -> Engine:
    """Build the worker's objects and connect them. The executor and the result batcher
    apply through the driver, and the driver dispatches to the executor: both are built
    first and connected after."""
    lifecycle = WorkerLifecycle(settings, clock)
    driver = PartitionDriver(lifecycle)
    # Built now, started with the app: a dispatch may arrive before the start-up task.
    barrier = DurabilityBarrier(lifecycle.flush)
    collector = IdleCollector(busy=lifecycle.busy)
    results = ResultBatcher(
        send=lifecycle.send_results, clock=lifecycle.clock, worker_id=settings.worker_id,
        busy=lifecycle.results_may_wait,
        apply=driver.apply_results if settings.local_results else None)
    executor = Executor(
        runners={"http": HttpRunner(allow_private=settings.allow_private_targets,
                                    output_bytes=settings.output_bytes),
                 "command": CommandRunner(registry=driver.guard.commands,
                                          scratch_dir=settings.data_dir / "scratch",
                                          user=settings.command_user,
                                          output_bytes=settings.output_bytes),
                 "kafka": KafkaRunner(lifecycle.publish, settings.topic_grants,
                                      output_bytes=settings.output_bytes)},
        report=lifecycle.report, clock=lifecycle.clock, worker_id=settings.worker_id,
        concurrency=settings.executor_concurrency,
        before_dispatch=barrier.wait if settings.dispatch_barrier else None,
        may_dispatch=lifecycle.owns, generation=lifecycle.epoch, tenants=settings.tenants,
        partitions=settings.partitions)
    _track_owned_partitions(lifecycle, executor, driver.gate)
    ticker = Ticker(host=_TickerHost(lifecycle, driver, executor),
                    fire_ahead_s=settings.fire_ahead_s, worker_id=settings.worker_id)
    driver.connect(executor=executor, ticker=ticker)
    lifecycle.attach(agent=driver.agent, executor=executor, results=results, ticker=ticker,
                     barrier=barrier, collector=collector,
                     caches=(driver.job_cache, driver.execution_cache))
    alerts = _alert_feed(lifecycle)
    return Engine(lifecycle=lifecycle, driver=driver, executor=executor, results=results,
                  ticker=ticker, alerts=alerts, metrics=_count_metrics(
                      lifecycle, driver, executor, None if alerts is None else alerts.notifier))


def _alert_feed(lifecycle: WorkerLifecycle) -> AlertFeed | None:
    """The notifier: its own consumer of kron.dead-letters, queue, runners and HTTP client
    (the targets' SSRF guard, not their connections), off the executions' path."""
    settings = lifecycle.settings
    if not settings.notify_enabled:
        return None
    notifier = Notifier(
        sender=HttpRunner(allow_private=settings.allow_private_targets,
                          max_connections=settings.notify_concurrency,
                          max_per_host=settings.notify_concurrency),
        keys=settings.notify_key_map, tenants=settings.tenants, clock=lifecycle.clock,
        backoff=Backoff(attempts=settings.notify_attempts, base_s=settings.notify_backoff_s),
        queue_size=settings.notify_queue, concurrency=settings.notify_concurrency)
    feed = AlertFeed(settings, notifier, lifecycle.clock)
    lifecycle.app.task(feed.started)
    lifecycle.app.on_before_shutdown.connect(feed.shutdown)
    return feed


def _count_metrics(lifecycle: WorkerLifecycle, driver: PartitionDriver,
                   executor: Executor, notifier: Notifier | None = None
                   ) -> WorkerCollector | None:
    """Counts where they happen (calls, executions' ends, dead letters, changelog acks),
    gauges read at each scrape (streams/metrics.py)."""
    settings = lifecycle.settings
    if not settings.metrics_enabled:
        return None
    counts = WorkerCounts(max_tenants=settings.metrics_max_tenants)
    executor.metrics = driver.metrics = counts
    driver.store_class = counts.store_class()
    lifecycle.changelog.on_ack_wait = counts.ack_wait
    collector = WorkerCollector(WorkerProbe(
        counts=counts, executor=executor, worker=lifecycle,
        topics=(settings.topic("commands"), settings.topic("signals")),
        monotonic=lifecycle.clock.monotonic, max_hosts=settings.metrics_max_hosts,
        alerts=notifier))
    lifecycle.app.task(collector.started)
    return collector


def _track_owned_partitions(lifecycle: WorkerLifecycle, executor: Executor,
                            gate: RunningGate) -> None:
    """Tenants' dispatch rates and max_running are split over the partitions by the share
    this worker owns: tell the executor and the gate at each assignment. The executor is
    told of each revoke too (Executor.rebalance_started)."""

    def revoked(app: Any, /, *args: Any, signal: Any, **kw: Any) -> None:
        executor.rebalance_started()

    def assigned(app: Any, /, *args: Any, signal: Any, **kw: Any) -> None:
        try:
            owned = lifecycle.owned_partitions()
            executor.set_owned_partitions(owned)
            gate.set_owned(owned)
        except Exception:  # the rates keep the last share; a crash here would stop the app
            log.exception("owned partitions not counted after an assignment")

    lifecycle.app.on_partitions_revoked.connect(revoked)
    lifecycle.app.on_partitions_assigned.connect(assigned)
