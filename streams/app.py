"""The worker's Faust app: one agent per partition stream, three co-partitioned tables.

Built by `build_engine(settings)` at process start; nothing is built at import time.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import faust
from faust.types import TP

from kron.clock import Clock, SystemClock
from kron.kafka_security import confluent_config
from kron.settings import Settings
from schemas import codec, names
from schemas.errors import DecodeError
from streams import localstate
from streams.barrier import DurabilityBarrier
from streams.changelog import changelog_producer
from streams.collector import IdleCollector
from streams.commits import CommitGuard
from streams.domain.errors import PermanentError
from streams.engine.batch import CHUNK as BATCH_CHUNK
from streams.engine.batch import Refused, apply_batch, item_command
from streams.engine.core import Cancel, Context, Dispatch, Emit, PartitionCore, PlanCache
from streams.engine.faust_store import (
    EXECUTION_STATE,
    JOB_STATE,
    RecordCache,
    TableStore,
    TableTimerIndex,
    TerminalMemo,
    job_encoder,
)
from streams.executor import Executor
from streams.guard import TargetGuard
from streams.lease import OwnershipLease
from streams.rebalance import RebalanceGate
from streams.reports import ResultBatcher, result_item
from streams.restore import read_range
from streams.runtime.group import FaustRuntime
from streams.tables import FencedTable
from streams.targets import CommandRunner, HttpRunner, KafkaRunner
from streams.ticker import BEHIND_BACKLOG, Ticker

log = logging.getLogger("kron.engine")

RESULTS = frozenset({names.EXECUTION_SUCCEEDED, names.EXECUTION_FAILED})
REPORTS = RESULTS | {names.EXECUTION_HEARTBEAT, names.ATTEMPTS_FINISHED}
# Avro bytes pass through Faust untouched; the codec owns (de)serialisation.
RAW: dict[str, Any] = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw",
                       "value_serializer": "raw"}
# sysexits' EX_IOERR: a supervisor sees a machine problem, not a crash in kron.
EXIT_STATE_UNWRITABLE = 74
IGNORED = frozenset({names.CIRCUIT_OPENED, names.CIRCUIT_CLOSED, names.TRIGGER_SUPPRESSED})
# Timers fired between two dispatches, and per tick before other partitions' events get a
# turn (the ticker sends the next tick at once when more are due). Each turn of the loop
# between chunks moves the dispatch barrier and the calls one step: at 4,000/s, chunks of
# 32 instead of 128 took the median call from 449 to 367 ms after its second began.
TICK_CHUNK = 32
TICK_BUDGET = 2048
# With ticks or results travelling as events: a fetch returns once this much is there or
# after this long. Added latency per hop is at most the wait; fetch round trips drop from
# one per record to a few hundred a second.
FETCH_MIN_BYTES = 64 << 10
FETCH_WAIT_MS = 5


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


class _TickerHost:
    """The worker as the ticker sees it (streams.ticker.TickerHost)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.clock = engine.clock
        self.timers = TableTimerIndex(engine.timers)

    def tickable(self) -> frozenset[int]:
        # Outside the lease we may not be the owner any more: the new one ticks. Watching
        # starts here too, as a worker with timers but no commands gets no other event.
        engine = self._engine
        engine.lease.watch(engine.runtime.coordinator())
        return engine.runtime.owned_partitions() if engine.lease.valid() else frozenset()

    def backlog(self) -> int:
        return self._engine.executor.backlog

    def completed(self) -> int:
        return self._engine.executor.completed

    async def tick_here(self, record: dict[str, Any]) -> bool:
        return await self._engine.tick_here(record)

    async def send_tick(self, partition: int, value: bytes) -> None:
        await self._engine.signals.send(key=b"tick", value=value, partition=partition)


class Engine:
    def __init__(self, settings: Settings, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self.stats = Stats()
        self.lease = OwnershipLease(clock=self.clock, session_timeout_s=settings.session_timeout_s)
        self._fetches_decided = False
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
            on_fatal=self._restart)

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

        self._topics: dict[str, Any] = {"signals": self.signals,
                                         "dead-letters": self.dead_letters}
        self.jobs = table("jobs")
        self.executions = table("executions")
        self.timers = table("timers")
        self.ticker = Ticker(host=_TickerHost(self), fire_ahead_s=settings.fire_ahead_s,
                             worker_id=settings.worker_id)
        self.terminal = TerminalMemo()
        self.job_cache = RecordCache(schema=JOB_STATE)
        self.execution_cache = RecordCache(schema=EXECUTION_STATE)
        self.plans = PlanCache()
        # A malformed commands file stops the worker here, naming the line or the entry.
        self.guard = TargetGuard(commands=settings.commands,
                                 topics=settings.topic_grants,
                                 allow_private=settings.allow_private_targets)
        self.batch_reader = codec.ItemFieldReader(names.CREATE_JOBS)
        # Only while a batch's spec is written as a job's spec (two schema versions could
        # part): bytes of another shape would be spliced into job records unnoticed.
        self._keep_specs = job_encoder().field_schema == self.batch_reader.field_schema
        # This process: slots it decides ahead are held here and nowhere else.
        self.incarnation = uuid.uuid4().hex
        # Built now, started with the app: a dispatch may arrive before the start-up task.
        self.barrier = DurabilityBarrier(self._flush)
        self.collector = IdleCollector(busy=self._busy)
        self.results = ResultBatcher(
            send=self._send_signal, clock=self.clock, worker_id=settings.worker_id,
            busy=self._results_may_wait,
            apply=self._apply_results if settings.local_results else None)
        self.executor = Executor(
            runners={"http": HttpRunner(allow_private=settings.allow_private_targets),
                     "command": CommandRunner(registry=self.guard.commands,
                                              scratch_dir=settings.data_dir / "scratch",
                                              user=settings.command_user),
                     "kafka": KafkaRunner(self._publish, settings.topic_grants)},
            report=self._report, clock=self.clock, worker_id=settings.worker_id,
            concurrency=settings.executor_concurrency,
            before_dispatch=self.barrier.wait if settings.dispatch_barrier else None,
            may_dispatch=self.owns)
        self.app.agent(self.app.topic(settings.topic("commands"), settings.topic("signals"),
                                      **RAW),
                       name="kron-engine", concurrency=1)(self._agent)
        self._guard_commits()
        self.app.task(self._on_start)
        self.app.on_before_shutdown.connect(self._on_shutdown)
        self.app.on_partitions_revoked.connect(self._on_revoked)
        self.app.timer(settings.stats_every_s)(self._log_stats)

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

    # --- lifecycle ---------------------------------------------------------------------------

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
            "record_cache_hits": self.job_cache.hits + self.execution_cache.hits,
            "record_cache_misses": self.job_cache.misses + self.execution_cache.misses,
            "uptime_s": round(time.monotonic() - st.started, 1)})

    async def _flush(self) -> None:
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

    async def _publish(self, topic: str, key: bytes | None, value: bytes | None,
                       headers: dict[str, str]) -> None:
        await self.changelog.publish(topic, key, value,
                                     [(k, v.encode()) for k, v in headers.items()])

    async def _report(self, partition: int, name: str, record: dict[str, Any], /, *,
                      wait_until_lease_ms: int | None = None) -> None:
        if name in RESULTS:
            self.results.add(partition, result_item(name, record),
                             wait_until_lease_ms=wait_until_lease_ms)
            return
        value = codec.encode_trusted(name, record)
        await self.signals.send(key=record.get("job_id", "").encode(), value=value,
                                partition=partition)

    async def _apply_results(self, partition: int, record: dict[str, Any]) -> bool:
        """Our own executor's AttemptsFinished batch, applied as the agent applies one read
        from kron.signals (streams/reports.py says why). Declined (then sent as an event)
        while we may not act for the partition, or if applying it failed: the agent then
        tries it from the topic, and dead-letters it if it fails again."""
        if not self._may_apply_here(partition):
            return False
        try:
            effects = self._on_report(partition, names.ATTEMPTS_FINISHED, record)
        except Exception:
            log.exception("applying results here failed; sending them as an event",
                          extra={"worker": self.settings.worker_id, "partition": partition})
            return False
        await self._apply(effects, partition)
        return True

    async def tick_here(self, record: dict[str, Any]) -> bool:
        """The ticker's tick for a partition we own, applied at once instead of through
        kron.signals: the round trip cost ~10 ms before the first decision of every due
        second, and a consumed event's overhead per tick. Declined as _apply_results is
        (the ticker then sends the tick as an event); a tick that fails here is sent too,
        and the agent dead-letters it if it fails again."""
        partition = record["partition"]
        if not self.settings.local_ticks or not self._may_apply_here(partition):
            return False
        try:
            await self._tick(partition, record, here=True)
        except Exception as exc:
            if _environmental(exc):
                self._stop_for_environment(exc, f"tick for partition {partition}")
            log.exception("ticking here failed; sending the tick as an event",
                          extra={"worker": self.settings.worker_id, "partition": partition})
            return False
        return True

    def _may_apply_here(self, partition: int) -> bool:
        """Events of our own making (ticks, results) may skip the topic only while we own
        the partition, its tables are recovered and no rebalance is under way (the gate:
        Faust's own flag can read False mid-rebalance), and we are not stopping."""
        return (not self._stopping and self.gate.open and not self.app.rebalancing
                and self.owns(partition))

    async def _send_signal(self, partition: int, value: bytes) -> None:
        await self.signals.send(key=b"results", value=value, partition=partition)

    def coordinator(self) -> Any:
        return self.runtime.coordinator()

    def epoch(self) -> int:
        """The consumer group generation: it only grows, so it fences older owners."""
        return self.runtime.epoch()

    def owned_partitions(self) -> frozenset[int]:
        return self.runtime.owned_partitions()

    def _results_may_wait(self) -> bool:
        """Results that may wait (streams/reports.py) do, while attempts are queued for a
        runner or the ticker is deciding due slots: applying them competes on this loop with
        calls and decisions that are already late."""
        return self.executor.backlog > BEHIND_BACKLOG or self.ticker.deciding()

    def _busy(self) -> bool:
        """Slots are being decided, or calls wait for a runner or for their writes' acks:
        a collection now would pause them."""
        return self.ticker.deciding() or self.executor.backlog > 0 or self.barrier.pending

    def owns(self, partition: int) -> bool:
        """May this process still act for the partition? Checked before every dispatch."""
        return self.lease.valid() and partition in self.runtime.owned_partitions()

    async def _hold_lease(self) -> None:
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
                self._restart("ownership lease lost: the group may have moved our partitions")
            await asyncio.sleep(0.05)
        log.info("ownership lease renewed", extra={"worker": self.settings.worker_id})

    def _stop_for_environment(self, exc: BaseException, what: str) -> None:
        """A full or unwritable state dir is not the record's fault: dead-lettering would
        drop a valid command. Stop without acknowledging it; after a restart (with space
        again) the record is read again and local state is restored from the changelogs."""
        log.critical("local state unwritable (%s); stopping the worker so %s is not lost: "
                     "free space in KRON_DATA_DIR=%s and start it again", exc, what,
                     self.settings.data_dir,
                     extra={"worker": self.settings.worker_id})
        logging.shutdown()
        os._exit(EXIT_STATE_UNWRITABLE)

    def _restart(self, why: str) -> None:
        """Replace this process with a fresh worker: nothing buffered by the old owner
        (records, queued attempts) survives, and the new member restores from Kafka."""
        log.error("%s; restarting the worker", why, extra={"worker": self.settings.worker_id})
        with contextlib.suppress(Exception):  # the restart must happen whatever this finds
            self.changelog.abandon()
        logging.shutdown()
        os.execv(sys.executable, sys.orig_argv)

    # --- the agent ---------------------------------------------------------------------------

    def _tune_fetches(self) -> None:
        self._fetches_decided = tune_fetches(self.runtime, self.settings)

    async def _agent(self, stream: Any) -> None:
        async for event in stream.events():
            msg = event.message
            if not self._fetches_decided:
                self._tune_fetches()
            await self._hold_lease()
            try:
                # A CreateJobs batch is read part by part, so that its jobs are written with
                # their specs' bytes as they came instead of encoding them again.
                decoded, spec_bytes = self.batch_reader.decode(msg.value)
                if decoded.name == names.TICK:
                    await self._tick(msg.partition, decoded.record)
                    continue
                if decoded.name == names.CREATE_JOBS:
                    await self._create_jobs(msg, decoded.record, spec_bytes)
                    continue
                effects = self._handle(msg, decoded)
            except (DecodeError, PermanentError) as exc:
                await self._dead_letter(msg, exc)
                continue
            except Exception as exc:  # a poison record must not stall the partition
                if _environmental(exc):
                    self._stop_for_environment(
                        exc, f"{msg.topic}[{msg.partition}]@{msg.offset}")
                log.exception("handler failed; dead-lettering the record")
                await self._dead_letter(msg, exc)
                continue
            await self._apply(effects, msg.partition)

    def _core(self, partition: int, rec: dict[str, Any]) -> tuple[PartitionCore, Context]:
        epoch = self.runtime.epoch()
        store = TableStore(jobs=self.jobs, executions=self.executions, timers=self.timers,
                           partition=partition, epoch=epoch, on_timer=self.ticker.timer_added,
                           terminal=self.terminal, job_cache=self.job_cache,
                           execution_cache=self.execution_cache)
        return (PartitionCore(store, self.plans, check_target=self.guard.check),
                self._context(rec, epoch))

    def _context(self, rec: dict[str, Any], epoch: int) -> Context:
        return Context(now_ms=rec["envelope"]["occurred_at_ms"],
                       causation_id=rec["envelope"]["event_id"],
                       worker=self.settings.worker_id, epoch=epoch,
                       incarnation=self.incarnation,
                       misfire_grace_ms=int(self.settings.misfire_grace_s * 1000))

    async def _tick(self, partition: int, rec: dict[str, Any], *, here: bool = False) -> None:
        """Fire what is due, TICK_CHUNK timers at a time, dispatching each chunk before the
        next: the first slots of a top-of-the-second spike leave while the rest are still
        being decided, instead of all waiting for the last.

        `here`: a tick applied in the process (tick_here) looks again before every chunk
        whether it may: Faust waits for the agent's event before it hands partitions over,
        not for this, so a chunk after the revoke's flush could reach Kafka after the next
        owner restored the partition."""
        self.stats.ticks += 1
        if len(self.stats.tick_lag_ms) < 100_000:
            self.stats.tick_lag_ms.append(self.clock.now_ms() - rec["now_ms"])
        core, ctx = self._core(partition, rec)
        ctx.now_ms = rec["now_ms"]
        ctx.fire_ahead_ms = rec["fire_ahead_ms"]  # the ticker's choice, recorded in the tick
        fired = 0
        while True:
            effects, more = core.on_tick(ctx, limit=TICK_CHUNK)
            ctx.effects = []
            await self._apply(effects, partition)
            fired += TICK_CHUNK
            if not more or fired >= TICK_BUDGET or self._stopping:
                break
            if here and not self._may_apply_here(partition):
                break
            await asyncio.sleep(0)  # the executor and the producer run between chunks
        try:
            self.ticker.ticked(partition, more=more)
        except Exception:  # the ticker's rescan catches up; the tick's writes stand
            log.exception("ticker bookkeeping failed")

    def _handle(self, msg: Any, decoded: Any) -> list[Any]:
        name, rec = decoded.name, decoded.record
        if name in REPORTS:
            return self._on_report(msg.partition, name, rec)
        core, ctx = self._core(msg.partition, rec)
        if name.startswith("kron.commands."):
            self.stats.commands += 1
            if name == names.CREATE_JOB:
                # The new job is written with the spec's bytes as they came, not re-encoded.
                job_encoder().adopt(msg.value, decoded)
            return core.on_command(name, rec, ctx)
        if name in IGNORED:
            return []
        raise PermanentError(f"{name} does not belong on {msg.topic}", field=None)

    async def _create_jobs(self, msg: Any, batch: dict[str, Any],
                           spec_bytes: list[bytes]) -> None:
        """Each job of a CreateJobs batch as its own CreateJob (streams/engine/batch.py), a
        chunk at a time: one that cannot be created is dead-lettered alone, naming its
        index, and the rest are created. A batch cut short (a crash, a lost lease) is read
        again, and the jobs it created are found applied."""
        if self._keep_specs:  # no bytes when the reader fell back to a plain decode
            encoder = job_encoder()
            for job, blob in zip(batch["jobs"], spec_bytes, strict=False):
                encoder.keep(job["spec"], blob)
        self.stats.commands += len(batch["jobs"])
        for start in range(0, len(batch["jobs"]), BATCH_CHUNK):
            if start:
                await asyncio.sleep(0)
                await self._hold_lease()
            core, ctx = self._core(msg.partition, batch)
            effects, refused = apply_batch(
                core, batch, partitions=self.settings.partitions, partition=msg.partition,
                context=functools.partial(self._context, batch, ctx.epoch),
                refusable=_jobs_fault,
                start=start, stop=start + BATCH_CHUNK)
            await self._apply(effects, msg.partition)
            for one in refused:
                await self._refuse(msg, batch, one)

    async def _refuse(self, msg: Any, batch: dict[str, Any], one: Refused) -> None:
        """The letter holds the refused job alone, as the CreateJob it stands for: one that
        can be mended and sent again, and not the whole batch again for every job."""
        if not isinstance(one.error, PermanentError):
            log.error("creating %s of a batch failed; dead-lettering it", one.where,
                      exc_info=one.error)
        command = item_command(batch, one.index)
        try:
            value = codec.encode(names.CREATE_JOB, command)
        except Exception:  # the letter then holds the batch, as for a whole record
            log.exception("%s of a batch does not encode as a CreateJob", one.where)
            value = msg.value
        await self._dead_letter(msg, one.error, item=one.where,
                                key=command["job_id"].encode(), value=value)

    def _on_report(self, partition: int, name: str, rec: dict[str, Any]) -> list[Any]:
        """An attempt's report, or a batch of them: from kron.signals, or from our own
        executor for a partition we own (_apply_results)."""
        core, ctx = self._core(partition, rec)
        self.stats.reports += 1
        return core.on_report(name, rec, ctx)

    async def _apply(self, effects: list[Any], partition: int) -> None:
        for effect in effects:
            if isinstance(effect, Dispatch):
                self.executor.submit(effect, partition)
                self.stats.dispatched += 1
            elif isinstance(effect, Cancel):
                self.executor.cancel(effect.exec_id)
            elif isinstance(effect, Emit):
                await self._topic(effect.topic).send(
                    key=effect.key.encode(), value=codec.encode(effect.name, effect.record))

    def _topic(self, name: str) -> Any:
        """One topic object per kron topic, not one per emitted record."""
        if name not in self._topics:
            self._topics[name] = self.app.topic(self.settings.topic(name), **RAW)
        return self._topics[name]

    async def _dead_letter(self, msg: Any, exc: Exception, *, item: str | None = None,
                           key: bytes | None = None, value: bytes | None = None) -> None:
        """`item`: the part of a batch record that failed (its other parts were applied);
        it names the dead letter and leads its error, and `key` and `value` are its own."""
        self.stats.dead_letters += 1
        now = self.clock.now_ms()
        error_class = ("decode" if isinstance(exc, DecodeError)
                       else "validation" if isinstance(exc, PermanentError) else "handler")
        event_id = f"dlq:{msg.topic}:{msg.partition}:{msg.offset}"
        error = f"{type(exc).__name__}: {exc}"
        if item is not None:
            event_id, error = f"{event_id}:{item}", f"{item}: {error}"
        record = {
            "envelope": {"event_id": event_id,
                         "event_type": "record.dead_lettered", "schema_version": 1,
                         "occurred_at_ms": now, "tenant": "", "causation_id": None,
                         "correlation_id": None, "producer": self.settings.worker_id},
            "source_topic": msg.topic, "source_partition": msg.partition,
            "source_offset": msg.offset, "key": msg.key if key is None else key,
            "value": msg.value if value is None else value,
            "error": error[:4000], "error_class": error_class,
        }
        log.warning("dead-lettered %s[%s]@%s: %s", msg.topic, msg.partition, msg.offset, error)
        await self.dead_letters.send(key=record["key"], value=codec.encode(
            "kron.deadletter.DeadLetter", record), partition=msg.partition)


_ENVIRONMENTAL_MARKERS = ("No space left", "IO error", "Read-only file system",
                        "Disk quota exceeded", "Too many open files")


def _jobs_fault(exc: Exception) -> bool:
    """May a job of a batch be refused alone for this error? Not for the machine's."""
    return not _environmental(exc)


def _environmental(exc: BaseException) -> bool:
    """Is this the machine's fault (disk, descriptors), not the record's?"""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) or any(m in str(seen) for m in _ENVIRONMENTAL_MARKERS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


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


def build_engine(settings: Settings, clock: Clock | None = None) -> Engine:
    return Engine(settings, clock)

