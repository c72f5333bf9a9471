"""The worker's Faust app: one agent per partition stream, three co-partitioned tables.

Built by `build_engine(settings)` at process start; nothing is built at import time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import faust

from kron.clock import Clock, SystemClock
from kron.settings import Settings
from schemas import codec, names
from schemas.errors import DecodeError
from streams import localstate
from streams.barrier import DurabilityBarrier
from streams.commits import CommitGuard
from streams.domain.errors import PermanentError
from streams.engine.core import Cancel, Context, Dispatch, Emit, PartitionCore
from streams.engine.faust_store import TableStore
from streams.executor import Executor
from streams.lease import OwnershipLease
from streams.reports import ResultBatcher, result_item
from streams.tables import FencedTable
from streams.targets import CommandRunner, HttpRunner, KafkaRunner
from streams.ticker import Ticker

log = logging.getLogger("kron.engine")

RESULTS = frozenset({names.EXECUTION_SUCCEEDED, names.EXECUTION_FAILED})
REPORTS = RESULTS | {names.EXECUTION_HEARTBEAT, names.ATTEMPTS_FINISHED}
# Avro bytes pass through Faust untouched; the codec owns (de)serialisation.
RAW: dict[str, Any] = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw",
                       "value_serializer": "raw"}
STATS_EVERY_S = 30.0
# sysexits' EX_IOERR: a supervisor sees a machine problem, not a crash in kron.
EXIT_STATE_UNWRITABLE = 74
IGNORED = frozenset({names.CIRCUIT_OPENED, names.CIRCUIT_CLOSED, names.TRIGGER_SUPPRESSED})


@dataclass(kw_only=True)
class Stats:
    commands: int = 0
    ticks: int = 0
    reports: int = 0
    dead_letters: int = 0
    dispatched: int = 0
    started: float = field(default_factory=time.monotonic)


class Engine:
    def __init__(self, settings: Settings, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self.stats = Stats()
        self.lease = OwnershipLease(clock=self.clock, session_timeout_s=settings.session_timeout_s)
        self.app = self._build_app()
        p = settings.partitions

        def topic(name: str, **kw: Any) -> Any:
            return self.app.topic(settings.topic(name), partitions=p, **RAW, **kw)

        self.commands = topic("commands")
        self.signals = topic("signals")
        self.dead_letters = topic("dead-letters")
        opts = {"block_cache_size": 16 << 20, "write_buffer_size": 16 << 20}

        def table(name: str) -> Any:
            return self.app.tables.add(FencedTable(
                self.app, name=name, beacon=self.app.tables.beacon, key_type=bytes,
                value_type=bytes, partitions=p, changelog_topic=topic(name, compacting=True),
                options=opts, epoch=self.epoch))

        self._topics: dict[str, Any] = {"signals": self.signals,
                                         "dead-letters": self.dead_letters}
        self.jobs = table("jobs")
        self.executions = table("executions")
        self.timers = table("timers")
        self.ticker = Ticker(engine=self)
        # Built now, started with the app: a dispatch may arrive before the start-up task.
        self.barrier = DurabilityBarrier(self._flush)
        self.results = ResultBatcher(send=self._send_signal, clock=self.clock,
                                     worker_id=settings.worker_id)
        self.executor = Executor(
            runners={"http": HttpRunner(allow_private=settings.allow_private_targets),
                     "command": CommandRunner(), "kafka": KafkaRunner(self._publish)},
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
        self.app.timer(STATS_EVERY_S)(self._log_stats)

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
            table_standby_replicas=1,
            broker_session_timeout=s.session_timeout_s,
            # The survivors of a crash learn of the rebalance at their next heartbeat.
            broker_heartbeat_interval=min(1.0, s.session_timeout_s / 3),
            producer_acks=-1,
            producer_linger_ms=5,
            stream_buffer_maxsize=4096,
            broker_commit_every=1000,
            broker_commit_interval=1.0,
            processing_guarantee="at_least_once",
            logging_config=None,
        )

    def _guard_commits(self) -> None:
        """Faust can drop a record at a rebalance and commit over it (streams.commits)."""
        self.commit_guard = CommitGuard(
            consumer=self.app.consumer, monotonic=self.clock.monotonic,
            sources={self.settings.topic("commands"), self.settings.topic("signals")})
        self.commit_guard.install()

    # --- lifecycle ---------------------------------------------------------------------------

    async def _on_start(self) -> None:
        self.barrier.start()
        self.results.start()
        self.executor.start()
        self.ticker.start()
        log.info("engine started", extra={"worker": self.settings.worker_id})

    async def _on_shutdown(self, app: Any, /, *args: Any, signal: Any, **kw: Any) -> None:
        """Report what finished before a graceful stop and close target connections; once
        every changelog write is acknowledged, mark the local state as trustworthy."""
        await self.executor.stop()
        await self.results.stop()
        for runner in self.executor.runners.values():
            close = getattr(runner, "close", None)
            if close is not None:
                await close()
        await self.app.producer.flush()
        localstate.mark_clean(self.settings.data_dir)
        log.info("local state marked clean", extra={"worker": self.settings.worker_id})

    async def _log_stats(self) -> None:
        """The figures an operator looks at first, as one structured line."""
        st = self.stats
        log.info("engine stats", extra={
            "worker": self.settings.worker_id, "commands": st.commands, "ticks": st.ticks,
            "reports": st.reports, "dispatched": st.dispatched,
            "completed": self.executor.completed, "backlog": self.executor.backlog,
            "dead_letters": st.dead_letters, "ticks_sent": self.ticker.sent,
            "flushes": self.barrier.flushes, "result_batches": self.results.batches,
            "fenced": self.executor.fenced, "skipped_records": self.commit_guard.holes,
            "uptime_s": round(time.monotonic() - st.started, 1)})

    async def _flush(self) -> None:
        """Wait for what is produced *now*, not for a buffer that keeps filling under load:
        Faust's own flush drains until empty, which at 300 events/s took seconds."""
        producer: Any = self.app.producer
        await producer.buffer.flush_atmost(producer.buffer.size)
        if producer._producer is not None:
            await producer._producer.flush()

    async def _publish(self, topic: str, key: bytes | None, value: bytes | None,
                       headers: dict[str, str]) -> None:
        fut = await self.app.producer.send(topic, key, value, None, None,
                                           [(k, v.encode()) for k, v in headers.items()])
        await fut

    async def _report(self, partition: int, name: str, record: dict[str, Any]) -> None:
        if name in RESULTS:
            self.results.add(partition, result_item(name, record))
            return
        value = codec.encode_trusted(name, record)
        await self.signals.send(key=record.get("job_id", "").encode(), value=value,
                                partition=partition)

    async def _send_signal(self, partition: int, value: bytes) -> None:
        await self.signals.send(key=b"results", value=value, partition=partition)

    def coordinator(self) -> Any:
        try:
            consumer: Any = self.app.consumer
            return consumer._thread._consumer._coordinator
        except AttributeError:  # not started yet
            return None

    def epoch(self) -> int:
        """The consumer group generation: it only grows, so it fences older owners."""
        generation = getattr(self.coordinator(), "generation", 0)
        return generation if isinstance(generation, int) and generation > 0 else 0

    def owned_partitions(self) -> set[int]:
        topic = self.settings.topic("signals")
        try:
            actives = self.app.assignor.assigned_actives()
        except Exception:  # before the first assignment
            return set()
        return {tp.partition for tp in actives if tp.topic == topic}

    def owns(self, partition: int) -> bool:
        """May this process still act for the partition? Checked before every dispatch."""
        return self.lease.valid() and partition in self.owned_partitions()

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

    def _stop_for_environment(self, exc: BaseException, msg: Any) -> None:
        """A full or unwritable state dir is not the record's fault: dead-lettering would
        drop a valid command. Stop without acknowledging it; after a restart (with space
        again) the record is read again and local state is restored from the changelogs."""
        log.critical("local state unwritable (%s); stopping the worker so %s[%s]@%s is not "
                     "lost: free space in KRON_DATA_DIR=%s and start it again", exc, msg.topic,
                     msg.partition, msg.offset, self.settings.data_dir,
                     extra={"worker": self.settings.worker_id})
        logging.shutdown()
        os._exit(EXIT_STATE_UNWRITABLE)

    def _restart(self, why: str) -> None:
        """Replace this process with a fresh worker: nothing buffered by the old owner
        (records, queued attempts) survives, and the new member restores from Kafka."""
        log.error("%s; restarting the worker", why, extra={"worker": self.settings.worker_id})
        logging.shutdown()
        os.execv(sys.executable, sys.orig_argv)

    # --- the agent ---------------------------------------------------------------------------

    async def _agent(self, stream: Any) -> None:
        async for event in stream.events():
            msg = event.message
            await self._hold_lease()
            try:
                effects = self._handle(msg)
            except (DecodeError, PermanentError) as exc:
                await self._dead_letter(msg, exc)
                continue
            except Exception as exc:  # a poison record must not stall the partition
                if _environmental(exc):
                    self._stop_for_environment(exc, msg)
                log.exception("handler failed; dead-lettering the record")
                await self._dead_letter(msg, exc)
                continue
            await self._apply(effects, msg.partition)

    def _handle(self, msg: Any) -> list[Any]:
        decoded = codec.decode(msg.value)
        name, rec = decoded.name, decoded.record
        partition = msg.partition
        store = TableStore(jobs=self.jobs, executions=self.executions, timers=self.timers,
                           partition=partition, on_timer=self.ticker.timer_added)
        core = PartitionCore(store)
        ctx = Context(now_ms=rec["envelope"]["occurred_at_ms"],
                      causation_id=rec["envelope"]["event_id"],
                      worker=self.settings.worker_id, epoch=self.epoch(),
                      misfire_grace_ms=int(self.settings.misfire_grace_s * 1000))
        if name.startswith("kron.commands."):
            self.stats.commands += 1
            return core.on_command(name, rec, ctx)
        if name == names.TICK:
            self.stats.ticks += 1
            ctx.now_ms = rec["now_ms"]
            effects, more = core.on_tick(ctx)
            try:
                self.ticker.ticked(partition, more=more)
            except Exception:  # the ticker's rescan catches up; the tick's writes stand
                log.exception("ticker bookkeeping failed")
            return effects
        if name in REPORTS:
            self.stats.reports += 1
            return core.on_report(name, rec, ctx)
        if name in IGNORED:
            return []
        raise PermanentError(f"{name} does not belong on {msg.topic}", field=None)

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

    async def _dead_letter(self, msg: Any, exc: Exception) -> None:
        self.stats.dead_letters += 1
        now = self.clock.now_ms()
        error_class = ("decode" if isinstance(exc, DecodeError)
                       else "validation" if isinstance(exc, PermanentError) else "handler")
        record = {
            "envelope": {"event_id": f"dlq:{msg.topic}:{msg.partition}:{msg.offset}",
                         "event_type": "record.dead_lettered", "schema_version": 1,
                         "occurred_at_ms": now, "tenant": "", "causation_id": None,
                         "correlation_id": None, "producer": self.settings.worker_id},
            "source_topic": msg.topic, "source_partition": msg.partition,
            "source_offset": msg.offset, "key": msg.key, "value": msg.value,
            "error": f"{type(exc).__name__}: {exc}"[:4000], "error_class": error_class,
        }
        log.warning("dead-lettered %s[%s]@%s: %s", msg.topic, msg.partition, msg.offset, exc)
        await self.dead_letters.send(key=msg.key, value=codec.encode(
            "kron.deadletter.DeadLetter", record), partition=msg.partition)


_ENVIRONMENTAL_MARKERS = ("No space left", "IO error", "Read-only file system",
                        "Disk quota exceeded", "Too many open files")


def _environmental(exc: BaseException) -> bool:
    """Is this the machine's fault (disk, descriptors), not the record's?"""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) or any(m in str(seen) for m in _ENVIRONMENTAL_MARKERS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def build_engine(settings: Settings, clock: Clock | None = None) -> Engine:
    return Engine(settings, clock)

