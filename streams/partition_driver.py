"""The per-partition driver: each record read by the worker's agent, decoded, applied to
its partition's PartitionCore, and the effects carried out (dispatches to the executor,
cancels, emitted events, dead letters). Ticks and result batches of our own making are
applied here too, without the round trip through kron.signals, when they may be.

Start, stop, rebalance and the lease are the worker's lifecycle
(streams/worker_lifecycle.py); `streams.app.build_engine` builds both and connects them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from typing import TYPE_CHECKING, Any

from schemas import codec, names
from schemas.envelope import make_envelope
from schemas.errors import DecodeError
from streams.domain.errors import PermanentError
from streams.engine.batch import CHUNK as BATCH_CHUNK
from streams.engine.batch import Refused, apply_batch, item_command
from streams.engine.core import Cancel, Context, Dispatch, Emit, PartitionCore, PlanCache
from streams.engine.faust_store import (
    EXECUTION_STATE,
    JOB_STATE,
    RecordCache,
    TableStore,
    TerminalMemo,
    has_waiting_lanes,
    job_encoder,
)
from streams.engine.lanes import TenantWeights
from streams.engine.running_gate import PartitionGate, RunningGate
from streams.executor import Executor
from streams.guard import TargetGuard
from streams.ticker import Ticker
from streams.worker_lifecycle import RAW, RESULTS, WorkerLifecycle

if TYPE_CHECKING:
    from streams.metrics import WorkerCounts

log = logging.getLogger("kron.engine")

REPORTS = RESULTS | {names.EXECUTION_HEARTBEAT, names.ATTEMPTS_FINISHED}
IGNORED = frozenset({names.CIRCUIT_OPENED, names.CIRCUIT_CLOSED, names.TRIGGER_SUPPRESSED})
# Timers fired between two dispatches, and per tick before other partitions' events get a
# turn (the ticker sends the next tick at once when more are due). Each turn of the loop
# between chunks moves the dispatch barrier and the calls one step: at 4,000/s, chunks of
# 32 instead of 128 took the median call from 449 to 367 ms after its second began.
TICK_CHUNK = 32
TICK_BUDGET = 2048
# A tick's budget while other partitions have timers due: the ticker goes over the
# partitions one tick at a time, so a slot due in the last of P partitions waits for the
# others' ticks; at 2,048 each, a tenant's critical slot waited 2-4 s behind another's
# flood (kron bench noisy, fire-ahead off, 8 partitions). 256 bounds that to (P-1) x 256
# decisions, each partition's round still fair and tiered within.
SHARED_TICK_BUDGET = 256


class PartitionDriver:
    """Decode -> PartitionCore -> effects, for every partition this worker owns. The
    executor and the ticker are built after it (they call back into it): `connect` them."""

    executor: Executor
    ticker: Ticker

    def __init__(self, lifecycle: WorkerLifecycle) -> None:
        self._lifecycle = lifecycle
        settings = self.settings = lifecycle.settings
        self.clock = lifecycle.clock
        self.stats = lifecycle.stats
        self._runtime = lifecycle.runtime
        self.jobs, self.executions, self.timers = (
            lifecycle.jobs, lifecycle.executions, lifecycle.timers)
        self._topics: dict[str, Any] = {"signals": lifecycle.signals,
                                         "dead-letters": lifecycle.dead_letters}
        self._fetches_decided = False
        self.terminal = TerminalMemo()
        self.job_cache = RecordCache(schema=JOB_STATE)
        self.execution_cache = RecordCache(schema=EXECUTION_STATE)
        self.plans = PlanCache()
        # Each tenant's share of a tick's rounds when more is due than a round takes
        # (streams/engine/lanes.py): KRON_TENANTS_FILE's weights.
        self.weights = TenantWeights.from_table(settings.tenants)
        # Each tenant's max_running, counted over the partitions this worker owns (one gate
        # for them all; streams/engine/running_gate.py).
        self.gate = RunningGate(settings.tenants, partitions=settings.partitions)
        self._gates: dict[int, PartitionGate] = {}
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
        # Metrics (streams/metrics.py): dead letters counted here, executions' ends by the
        # store class the counts give. None: nothing counted.
        self.metrics: WorkerCounts | None = None
        self.store_class: type[TableStore] = TableStore

    def connect(self, *, executor: Executor, ticker: Ticker) -> None:
        self.executor, self.ticker = executor, ticker
        self.gate.on_room = self._tenant_has_room

    def _tenant_has_room(self, tenant: str) -> None:
        """A capped tenant's execution ended: tick the partitions that may hold its queued
        executions now rather than at the ticker's next rescan."""
        for partition in self._lifecycle.owned_partitions():
            if has_waiting_lanes(self.timers, partition):
                self.ticker.wake(partition)

    # --- the agent ---------------------------------------------------------------------------

    async def agent(self, stream: Any) -> None:
        lifecycle = self._lifecycle
        async for event in stream.events():
            msg = event.message
            if not self._fetches_decided:
                self._fetches_decided = lifecycle.tune_fetches()
            await lifecycle.hold_lease()
            try:
                # A CreateJobs batch is read part by part, so that its jobs are written with
                # their specs' bytes as they came instead of encoding them again.
                decoded, spec_bytes = self.batch_reader.decode(msg.value)
                if decoded.name == names.TICK:
                    await self._tick(msg.partition, decoded.record)
                    continue
                if self.executor.full:
                    # A command may start attempts (a trigger, a job due at its create, a
                    # backfill): it waits for the dispatch queue's room as a tick does.
                    await self.executor.room()
                if decoded.name == names.CREATE_JOBS:
                    await self._create_jobs(msg, decoded.record, spec_bytes)
                    continue
                effects = self._handle(msg, decoded)
            except (DecodeError, PermanentError) as exc:
                await self._dead_letter(msg, exc)
                continue
            except Exception as exc:  # a poison record must not stall the partition
                if _environmental(exc):
                    lifecycle.stop_for_environment(
                        exc, f"{msg.topic}[{msg.partition}]@{msg.offset}")
                log.exception("handler failed; dead-lettering the record")
                await self._dead_letter(msg, exc)
                continue
            await self._apply(effects, msg.partition)

    def _core(self, partition: int, rec: dict[str, Any]) -> tuple[PartitionCore, Context]:
        epoch = self._runtime.epoch()
        store = self.store_class(
            jobs=self.jobs, executions=self.executions, timers=self.timers,
            partition=partition, epoch=epoch, on_timer=self.ticker.timer_added,
            terminal=self.terminal, job_cache=self.job_cache,
            execution_cache=self.execution_cache)
        gate = self._gates.get(partition)
        if gate is None:
            gate = self._gates[partition] = PartitionGate(self.gate, partition)
        return (PartitionCore(store, self.plans, check_target=self.guard.check,
                              weights=self.weights, gate=gate,
                              history_ms=self.settings.history_ms),
                self._context(rec, epoch))

    def _context(self, rec: dict[str, Any], epoch: int) -> Context:
        return Context(now_ms=rec["envelope"]["occurred_at_ms"],
                       causation_id=rec["envelope"]["event_id"],
                       worker=self.settings.worker_id, epoch=epoch,
                       incarnation=self.incarnation, stuck=self.executor.stuck,
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
        budget = (SHARED_TICK_BUDGET if self.ticker.others_due(partition, rec["now_ms"])
                  else TICK_BUDGET)
        while True:
            effects, more = core.on_tick(ctx, limit=TICK_CHUNK)
            ctx.effects = []
            await self._apply(effects, partition)
            fired += TICK_CHUNK
            if not more or fired >= budget or self._lifecycle.stopping:
                break
            if here and not self._lifecycle.may_apply_here(partition):
                break
            await asyncio.sleep(0)  # the executor and the producer run between chunks
        try:
            self.ticker.ticked(partition, more=more)
        except Exception:  # the ticker's rescan catches up; the tick's writes stand
            log.exception("ticker bookkeeping failed")

    async def tick_here(self, record: dict[str, Any]) -> bool:
        """The ticker's tick for a partition we own, applied at once instead of through
        kron.signals: the round trip cost ~10 ms before the first decision of every due
        second, and a consumed event's overhead per tick. Declined as apply_results is
        (the ticker then sends the tick as an event); a tick that fails here is sent too,
        and the agent dead-letters it if it fails again."""
        partition = record["partition"]
        if not self.settings.local_ticks or not self._lifecycle.may_apply_here(partition):
            return False
        try:
            await self._tick(partition, record, here=True)
        except Exception as exc:
            if _environmental(exc):
                self._lifecycle.stop_for_environment(exc, f"tick for partition {partition}")
            log.exception("ticking here failed; sending the tick as an event",
                          extra={"worker": self.settings.worker_id, "partition": partition})
            return False
        return True

    async def apply_results(self, partition: int, record: dict[str, Any]) -> bool:
        """Our own executor's AttemptsFinished batch, applied as the agent applies one read
        from kron.signals (streams/reports.py says why). Declined (then sent as an event)
        while we may not act for the partition, or if applying it failed: the agent then
        tries it from the topic, and dead-letters it if it fails again."""
        if not self._lifecycle.may_apply_here(partition):
            return False
        try:
            effects = self._on_report(partition, names.ATTEMPTS_FINISHED, record)
        except Exception:
            log.exception("applying results here failed; sending them as an event",
                          extra={"worker": self.settings.worker_id, "partition": partition})
            return False
        await self._apply(effects, partition)
        return True

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
                await self._lifecycle.hold_lease()
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
        executor for a partition we own (apply_results)."""
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
                if effect.topic == "dead-letters" and self.metrics is not None:
                    self.metrics.dead_letter(str(effect.record.get("error_class")))
                await self._topic(effect.topic).send(
                    key=effect.key.encode(), value=codec.encode(effect.name, effect.record))

    def _topic(self, name: str) -> Any:
        """One topic object per kron topic, not one per emitted record."""
        if name not in self._topics:
            self._topics[name] = self._lifecycle.app.topic(self.settings.topic(name), **RAW)
        return self._topics[name]

    async def _dead_letter(self, msg: Any, exc: Exception, *, item: str | None = None,
                           key: bytes | None = None, value: bytes | None = None) -> None:
        """`item`: the part of a batch record that failed (its other parts were applied);
        it names the dead letter and leads its error, and `key` and `value` are its own."""
        self.stats.dead_letters += 1
        error_class = ("decode" if isinstance(exc, DecodeError)
                       else "validation" if isinstance(exc, PermanentError) else "handler")
        if self.metrics is not None:
            self.metrics.dead_letter(error_class)
        event_id = f"dlq:{msg.topic}:{msg.partition}:{msg.offset}"
        error = f"{type(exc).__name__}: {exc}"
        if item is not None:
            event_id, error = f"{event_id}:{item}", f"{item}: {error}"
        record = {
            "envelope": make_envelope(
                event_id=event_id, event_type="record.dead_lettered",
                occurred_at_ms=self.clock.now_ms(), tenant="",
                producer=self.settings.worker_id),
            "source_topic": msg.topic, "source_partition": msg.partition,
            "source_offset": msg.offset, "key": msg.key if key is None else key,
            "value": msg.value if value is None else value,
            "error": error[:4000], "error_class": error_class,
        }
        log.warning("dead-lettered %s[%s]@%s: %s", msg.topic, msg.partition, msg.offset, error)
        await self._topics["dead-letters"].send(key=record["key"], value=codec.encode(
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
