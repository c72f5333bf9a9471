"""The worker's lifecycle: the Faust app and its runtime seam, the tables, start, graceful
stop, revoke, the stats line, and the ownership lease (act only while it holds).

What happens to each record is the partition driver's (streams/partition_driver.py);
`streams.app.build_engine` builds both and connects them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import faust
from faust.types import TP

from kron.clock import Clock, SystemClock
from kron.kafka_security import confluent_config
from kron.settings import Settings
from schemas import codec, names
from streams import localstate
from streams.barrier import DurabilityBarrier
from streams.changelog import changelog_producer
from streams.collector import IdleCollector
from streams.commits import CommitGuard
from streams.engine.faust_store import RecordCache
from streams.executor import Executor
from streams.lease import OwnershipLease
from streams.rebalance import RebalanceGate
from streams.reports import ResultBatcher, result_item
from streams.restore import read_range
from streams.runtime.group import FaustRuntime
from streams.tables import FencedTable
from streams.ticker import BEHIND_BACKLOG, Ticker

log = logging.getLogger("kron.engine")

RESULTS = frozenset({names.EXECUTION_SUCCEEDED, names.EXECUTION_FAILED})
# Avro bytes pass through Faust untouched; the codec owns (de)serialisation.
RAW: dict[str, Any] = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw",
                       "value_serializer": "raw"}
# sysexits' EX_IOERR: a supervisor sees a machine problem, not a crash in kron.
EXIT_STATE_UNWRITABLE = 74
# With ticks or results travelling as events: a fetch returns once this much is there or
# after this long. Added latency per hop is at most the wait; fetch round trips drop from
# one per record to a few hundred a second.
FETCH_MIN_BYTES = 64 << 10
FETCH_WAIT_MS = 5
# A collection waits while calls decided ahead are due within this long: a full one took
# 55-68 ms and a young one up to 43 ms (gc.callbacks, kron bench noisy --steady), and one
# begun just before the top of a second held that second's calls as long.
GC_CLEAR_S = 0.1
# How often the lease is looked at besides hold_lease (see _watch_lease).
LEASE_WATCH_S = 1.0


@dataclass(kw_only=True)
class Stats:
    commands: int = 0
    ticks: int = 0
    reports: int = 0
    dead_letters: int = 0
    dispatched: int = 0
    # From a tick's send to the agent starting on it, since the last stats line: the
    # trip through the producer, the broker and the consumer, plus any queue ahead of it.
    tick_lag_ms: list[int] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def lag_summary(self) -> dict[str, int]:
        lags, self.tick_lag_ms = sorted(self.tick_lag_ms), []
        if not lags:
            return {}
        return {"tick_lag_p50_ms": lags[len(lags) // 2], "tick_lag_max_ms": lags[-1]}


class WorkerLifecycle:
    """Builds the app, its topics and tables; starts, stops and hands partitions over; holds
    the ownership lease. The executor, result batcher, ticker, barrier and collector are
    built by build_engine and handed over with `attach`."""

    # Set by attach(): the parts started and stopped here.
    executor: Executor
    results: ResultBatcher
    ticker: Ticker
    barrier: DurabilityBarrier
    collector: IdleCollector
    _caches: tuple[RecordCache, ...]

    def __init__(self, settings: Settings, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self.stats = Stats()
        self.lease = OwnershipLease(clock=self.clock, session_timeout_s=settings.session_timeout_s)
        # Set as a graceful stop begins: from then on nothing is applied here (ticks and
        # results go through kron.signals), so no store is reopened while Faust closes them.
        self._stopping = False
        self.app = self._build_app()
        # Faust's and aiokafka's internals, behind one interface (streams/runtime/); it
        # refuses to be built on library versions that lack one of them.
        self.runtime = FaustRuntime(self.app, owned_topic=settings.topic("signals"))
        self.gate = RebalanceGate()
        self.gate.install(self.app)
        p = settings.partitions

        def topic(name: str, **kw: Any) -> Any:
            return self.app.topic(settings.topic(name), partitions=p, **RAW, **kw)

        self.commands = topic("commands")
        self.signals = topic("signals")
        self.dead_letters = topic("dead-letters")
        opts = {"block_cache_size": 16 << 20, "write_buffer_size": 16 << 20}

        self.changelog = changelog_producer(
            confluent_config(settings, {"client.id": f"kron-{settings.worker_id}-changelog"}),
            writer=settings.changelog_writer, on_offsets=self._persist_offsets,
            on_fatal=self.restart)

        gap_config = confluent_config(settings, {
            "group.id": f"{settings.app_id}-gaps",
            "client.id": f"kron-{settings.worker_id}-gaps"})

        def read_gap(topic_name: str, partition: int, start: int, end: int) -> list[Any]:
            return read_range(gap_config, topic_name, partition, start, end)

        def table(name: str) -> Any:
            return self.app.tables.add(FencedTable(
                self.app, name=name, beacon=self.app.tables.beacon, key_type=bytes,
                value_type=bytes, partitions=p, changelog_topic=topic(name, compacting=True),
                options=opts, epoch=self.epoch, changelog=self.changelog,
                gap_reader=read_gap))

        self.jobs = table("jobs")
        self.executions = table("executions")
        self.timers = table("timers")

    def attach(self, *, agent: Callable[[Any], Awaitable[None]], executor: Executor,
               results: ResultBatcher, ticker: Ticker, barrier: DurabilityBarrier,
               collector: IdleCollector, caches: Iterable[RecordCache]) -> None:
        """Take the parts built around this one, run `agent` on the commands and signals
        topics (one at a time: concurrency=1), and connect start, stop and revoke."""
        self.executor, self.results, self.ticker = executor, results, ticker
        self.barrier, self.collector, self._caches = barrier, collector, tuple(caches)
        s = self.settings
        self.app.agent(self.app.topic(s.topic("commands"), s.topic("signals"), **RAW),
                       name="kron-engine", concurrency=1)(agent)
        self._guard_commits()
        self.app.task(self._on_start)
        self.app.on_before_shutdown.connect(self._on_shutdown)
        self.app.on_partitions_revoked.connect(self._on_revoked)
        self.app.timer(s.stats_every_s)(self._log_stats)
        self.app.timer(LEASE_WATCH_S)(self._watch_lease)

    def _build_app(self) -> faust.App:
        # The same Settings -> SASL/TLS mapping the confluent-kafka clients use.
        from kron.kafka_security import faust_app_kwargs

        s = self.settings
        return faust.App(
            s.app_id,
            **faust_app_kwargs(s),  # broker URLs and broker_credentials (SASL/TLS)
            store="rocksdb://",
            datadir=str(s.data_dir),
            autodiscover=False,
            topic_partitions=s.partitions,
            topic_replication_factor=s.replication_factor,
            topic_allow_declare=False,
            web_enabled=False,
            table_standby_replicas=s.standby_replicas,
            broker_session_timeout=s.session_timeout_s,
            # The survivors of a crash learn of the rebalance at their next heartbeat.
            broker_heartbeat_interval=min(1.0, s.session_timeout_s / 3),
            producer_acks=-1,
            producer_linger_ms=5,
            stream_buffer_maxsize=4096,
            # Commits wait for the changelog acks (streams.commits). Faust's count-based
            # commit runs inside its fetch loop and would stall it on that wait; the
            # interval commit runs in its own task.
            broker_commit_every=10_000_000,
            broker_commit_interval=1.0,
            processing_guarantee="at_least_once",
            logging_config=None,
        )

    def _guard_commits(self) -> None:
        """Faust can drop a record at a rebalance and commit over it (streams.commits)."""
        self.commit_guard = CommitGuard(
            commits=self.runtime.commit_control(), monotonic=self.clock.monotonic,
            sources={self.settings.topic("commands"), self.settings.topic("signals")},
            before_commit=self.changelog.flush,
            before_commit_timeout_s=self.settings.session_timeout_s / 2,
            generation=self.epoch)
        self.commit_guard.install()

    # --- start, stop, revoke -----------------------------------------------------------------

    async def _on_start(self) -> None:
        self.changelog.start()
        self.barrier.start()
        self.results.start()
        self.executor.start()
        self.ticker.start()
        self.collector.start()
        log.info("engine started", extra={"worker": self.settings.worker_id})

    async def _on_shutdown(self, app: Any, /, *args: Any, signal: Any, **kw: Any) -> None:
        """Report what finished before a graceful stop and close target connections; once
        every changelog write is acknowledged, mark the local state as trustworthy."""
        self._stopping = True
        await self.collector.stop()
        await self.executor.stop()
        await self.results.stop()
        for runner in self.executor.runners.values():
            close = getattr(runner, "close", None)
            if close is not None:
                await close()
        await self.app.producer.flush()
        await self.changelog.close()
        localstate.mark_clean(self.settings.data_dir)
        log.info("local state marked clean", extra={"worker": self.settings.worker_id})

    async def _on_revoked(self, app: Any, /, *args: Any, signal: Any, **kw: Any) -> None:
        """Hand partitions over only with their state writes acknowledged: the next owner
        restores up to the changelog's end as it finds it, and a write of ours landing
        after that would be in Kafka but missing from its tables."""
        try:
            await asyncio.wait_for(self.changelog.flush(),
                                   self.settings.session_timeout_s / 2)
        except Exception as exc:  # a failed write restarts us (on_fatal); keep rebalancing
            log.warning("state writes not acknowledged before a revoke: %r", exc,
                        extra={"worker": self.settings.worker_id})
            # The next owner may restore without them, and decide the same attempts again:
            # the calls those writes started must not go out here.
            self.executor.handed_over_unacknowledged()

    async def _log_stats(self) -> None:
        """The figures an operator looks at first, as one structured line."""
        st = self.stats
        log.info("engine stats", extra={
            "worker": self.settings.worker_id, "commands": st.commands, "ticks": st.ticks,
            "reports": st.reports, "dispatched": st.dispatched,
            "completed": self.executor.completed, "backlog": self.executor.backlog,
            "held": self.executor.held,
            "dead_letters": st.dead_letters, "ticks_sent": self.ticker.sent,
            "flushes": self.barrier.flushes, "result_batches": self.results.batches,
            "gc_collections": self.collector.collections, "gc_forced": self.collector.forced,
            "result_batches_applied_here": self.results.applied,
            "changelog_writes": self.changelog.writes, "fenced": self.executor.fenced,
            "paused": self.executor.paused,
            "changelog_gaps_filled": sum(t.gaps_filled
                                         for t in (self.jobs, self.executions, self.timers)),
            "skipped_records": self.commit_guard.holes, **st.lag_summary(),
            "record_cache_hits": sum(c.hits for c in self._caches),
            "record_cache_misses": sum(c.misses for c in self._caches),
            "uptime_s": round(time.monotonic() - st.started, 1)})

    # --- what the executor, the barrier and the result batcher call -------------------------

    async def flush(self) -> None:
        """Wait for the state writes made *now*, not for a queue that keeps filling."""
        await self.changelog.flush()

    def _persist_offsets(self, offsets: dict[tuple[str, int], int]) -> None:
        """Where a restart with local state kept resumes each changelog: what Faust's own
        send callback records, for writes that now bypass it."""
        tables = {t.changelog_topic.get_topic_name(): t
                  for t in (self.jobs, self.executions, self.timers)}
        for (topic, partition), offset in offsets.items():
            try:
                tables[topic].data.set_persisted_offset(TP(topic, partition), offset)
            except Exception:  # a DB closed by a rebalance: the restore reads a bit more
                log.debug("persisted offset not recorded for %s[%s]", topic, partition)

    async def publish(self, topic: str, key: bytes | None, value: bytes | None,
                      headers: dict[str, str]) -> tuple[int, int]:
        """A Kafka target's record; returns its (partition, offset) once acked."""
        return await self.changelog.publish(topic, key, value,
                                            [(k, v.encode()) for k, v in headers.items()])

    async def report(self, partition: int, name: str, record: dict[str, Any], /, *,
                     wait_until_lease_ms: int | None = None) -> None:
        if name in RESULTS:
            self.results.add(partition, result_item(name, record),
                             wait_until_lease_ms=wait_until_lease_ms)
            return
        value = codec.encode_trusted(name, record)
        await self.signals.send(key=record.get("job_id", "").encode(), value=value,
                                partition=partition)

    async def send_results(self, partition: int, value: bytes) -> None:
        await self.signals.send(key=b"results", value=value, partition=partition)

    def results_may_wait(self) -> bool:
        """Results that may wait (streams/reports.py) do, while attempts are queued for a
        runner or the ticker is deciding due slots: applying them competes on this loop with
        calls and decisions that are already late."""
        return self.executor.backlog > BEHIND_BACKLOG or self.ticker.deciding()

    def busy(self) -> bool:
        """Slots are being decided, calls wait for a runner or for their writes' acks, or
        calls decided ahead are due soon: a collection now would pause them."""
        return (self.ticker.deciding() or self.executor.backlog > 0 or self.barrier.pending
                or self.executor.releases_within(GC_CLEAR_S))

    # --- ownership ---------------------------------------------------------------------------

    def coordinator(self) -> Any:
        return self.runtime.coordinator()

    def epoch(self) -> int:
        """The consumer group generation: it only grows, so it fences older owners."""
        return self.runtime.epoch()

    def owned_partitions(self) -> frozenset[int]:
        return self.runtime.owned_partitions()

    @property
    def stopping(self) -> bool:
        return self._stopping

    def owns(self, partition: int) -> bool:
        """May this process still act for the partition? Checked before every dispatch."""
        return self.lease.valid() and partition in self.runtime.owned_partitions()

    def may_apply_here(self, partition: int) -> bool:
        """Events of our own making (ticks, results) may skip the topic only while we own
        the partition, its tables are recovered and no rebalance is under way (the gate:
        Faust's own flag can read False mid-rebalance), and we are not stopping."""
        return (not self._stopping and self.gate.open and not self.app.rebalancing
                and self.owns(partition))

    async def hold_lease(self) -> None:
        """Act only inside the lease. After a pause longer than the session (SIGSTOP, a
        frozen VM) the group has likely given our partitions away: wait briefly for a
        heartbeat to prove otherwise, else start over as a fresh member."""
        self.lease.watch(self.coordinator())
        if self.lease.valid():
            return
        log.warning("ownership lease lapsed; holding the stream",
                    extra={"worker": self.settings.worker_id,
                           "lapsed_s": round(-self.lease.remaining_s(), 1)})
        deadline = self.clock.monotonic() + self.settings.session_timeout_s
        while not self.lease.valid():
            if self.app.rebalancing or self.clock.monotonic() > deadline:
                self.restart("ownership lease lost: the group may have moved our partitions")
            await asyncio.sleep(0.05)
        log.info("ownership lease renewed", extra={"worker": self.settings.worker_id})

    async def _watch_lease(self) -> None:
        """hold_lease runs before each event, and a stream waiting for a broker that is away
        reads none. Our writes of before, queued in the producer meanwhile, would land when
        it is back: after another member, given our partitions by a coordinator that gave
        up on us, restored them without those writes (fenced only from its first write on)
        and decided the same slots again (a broker-restart fault run recorded 30 slots
        triggered twice so). Lapsed a session past its end, the lease is surely lost: with
        writes waiting, start over now, dropping what is unsent, as hold_lease would at the
        next event. With none (a coordinator moving to another broker: the 3-node fault
        run restarted both workers for nothing), there is nothing to land late: the group
        tells whether we are still in it."""
        if (not self._stopping and -self.lease.remaining_s() > self.settings.session_timeout_s
                and self.changelog.unacknowledged):
            self.restart("ownership lease lost (lapsed a session past its end) while no "
                         "event came: the group may have moved our partitions")

    def tune_fetches(self) -> bool:
        return tune_fetches(self.runtime, self.settings)

    # --- stopping the process ----------------------------------------------------------------

    def stop_for_environment(self, exc: BaseException, what: str) -> None:
        """A full or unwritable state dir is not the record's fault: dead-lettering would
        drop a valid command. Stop without acknowledging it; after a restart (with space
        again) the record is read again and local state is restored from the changelogs."""
        log.critical("local state unwritable (%s); stopping the worker so %s is not lost: "
                     "free space in KRON_DATA_DIR=%s and start it again", exc, what,
                     self.settings.data_dir,
                     extra={"worker": self.settings.worker_id})
        logging.shutdown()
        os._exit(EXIT_STATE_UNWRITABLE)

    def restart(self, why: str) -> None:
        """Replace this process with a fresh worker: nothing buffered by the old owner
        (records, queued attempts) survives, and the new member restores from Kafka."""
        log.error("%s; restarting the worker", why, extra={"worker": self.settings.worker_id})
        with contextlib.suppress(Exception):  # the restart must happen whatever this finds
            self.changelog.abandon()
        logging.shutdown()
        os.execv(sys.executable, sys.orig_argv)


def tune_fetches(runtime: FaustRuntime, settings: Settings) -> bool:
    """Let the broker gather records for up to FETCH_WAIT_MS while this worker's own
    ticks or results travel as events: with fetch.min.bytes at aiokafka's 1 (Faust
    does not expose it), a spread-out load got one fetch round trip per record, and the
    consumer thread used a third of the worker's CPU.

    With both applied here (the default) the topics carry commands and other owners'
    signals only, and Faust's own fetches (return with any record, else after 1.5 s)
    are kept: the 5 ms waits woke the consumer thread 200 times a second for nothing,
    7.1% of a core at 500 executions/s (0.5% with 200 ms waits), contending for the
    GIL with the event loop."""
    if settings.local_ticks and settings.local_results:
        return True  # decided: Faust's own fetches are kept
    return runtime.tune_fetches(min_bytes=FETCH_MIN_BYTES, max_wait_ms=FETCH_WAIT_MS)
