"""The partition core: every decision the trigger owner makes, as a deterministic function.

The owner of a partition feeds it the partition's events in offset order: commands, ticks
and attempt reports. It reads and writes one partition's state through a PartitionStore and
returns the side effects to perform afterwards (dispatch an attempt, cancel one, emit an
event). It never reads a clock: "now" is a field of the event being processed, so replaying
the same events over the same state makes the same decisions.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NotRequired, TypedDict, cast

import orjson

from schemas.envelope import make_envelope
from streams.alerts import alert_value
from streams.domain.cursor import advance_cursor
from streams.domain.errors import PermanentError
from streams.domain.ids import event_id, exec_id, manual_exec_id
from streams.domain.misfire import MissReason, resolve_misfire
from streams.domain.policies import MisfireKind, Overlap, Priority
from streams.domain.retry import ErrorClass, retry_delay_s, should_retry
from streams.domain.schedule import OneOffSchedule, Slot, apply_jitter, bounded_next_slot
from streams.domain.states import (
    AttemptOutcome,
    ExecutionStatus,
    JobStatus,
    QueueReason,
    Trigger,
)
from streams.domain.timer import (
    LEGACY_LANE,
    SYSTEM_LANE,
    WAITING_TIER,
    Lane,
    Tier,
    TimerKind,
    decode_timer_key,
    is_waiting,
    lane_prefix_of,
    tenant_lane,
)
from streams.domain.timer import encode_timer_key as timer_key
from streams.engine import backfill, retention
from streams.engine.lanes import EQUAL_WEIGHTS, FairState, LaneWeight, pick, tier_of
from streams.engine.records import (
    AttemptRecord,
    AttemptsFinishedReport,
    BackfillCommand,
    CancelRunCommand,
    CreateJobCommand,
    DeleteJobCommand,
    EnvelopeRecord,
    ExecutionHeartbeatReport,
    ExecutionRecord,
    ExecutionReport,
    FailedReport,
    JobCommand,
    JobRecord,
    JobSpec,
    PauseJobCommand,
    ResumeJobCommand,
    RetryRunCommand,
    SucceededReport,
    TriggerJobCommand,
    UpdateJobCommand,
)
from streams.engine.running_gate import CONCURRENCY_REASON, PartitionGate, ungated
from streams.engine.runs import DagRuns, is_run, is_task, retry_of, task_target
from streams.engine.spec import JobPlan, branch, plan_of
from streams.engine.store import TERMINAL, PartitionStore, Record
from streams.output import EXECUTION_OUTPUT_BUDGET, utf8_len

# The reason a running execution shows while its call waits for its tenant's dispatch rate
# in the worker (streams/executor.py reports it): the API shows such a run `queued`.
HELD_REASON: Final = QueueReason.DISPATCH_RATE.value
# How late a slot may be found before misfire policy applies: covers tick and GC jitter,
# not downtime.
MISFIRE_GRACE_MS = 5_000
# A process whose calls decided ahead are stuck at their due time (waiting for Kafka to
# acknowledge their start, or for its ownership lease: a broker away) writes their HELD
# timer again this much later, so that if it dies still holding them, the next owner hands
# them over then, not at the end of their lease.
HELD_RECHECK_MS = 5_000
# A worker down for a day must not enumerate a per-second cron's 86,400 slots in one event.
MAX_LATE_SLOTS = 10_000
# Triggers that start a slot of the job's own schedule (not manual runs, not backfills).
SCHEDULE_TRIGGERS = Trigger.OWN_SCHEDULE
# Paced re-fires (fire_all, backfill) go out at most this often per job.
PACE_MS = 100
# The type, and ref prefix, of the FIRE timer holding the rest of a backfill's range.
BACKFILL_PAGE_REF = "backfill-page"
MAX_RECENT_COMMANDS = 32
# A create keeps its job record and plan in this process's caches only if it first fires
# within this window: a job due later is evicted by then on a busy worker, and a bulk load
# of far-future jobs would evict the ones firing now (and paid ~11 us a create, a sixth of
# it, for the evictions: bench.create_micro with 100,000 jobs).
HOT_CREATE_MS = 60_000
# `allow` jobs drop finished runs from `running` when it grows past this, not at every
# finish: that saves a job write per execution (see _finish).
RUNNING_PRUNE_AT = 16

# The states the core reads and writes, bound to module names: on Python 3.11 each read of
# an enum class's attribute goes through EnumType's __getattr__ hook (~70 ns, a global ~10),
# and a decision reads a dozen. The members themselves: records hold the same values.
QUEUED: Final = ExecutionStatus.QUEUED
RUNNING: Final = ExecutionStatus.RUNNING
RETRY_PENDING: Final = ExecutionStatus.RETRY_PENDING
SUCCEEDED: Final = ExecutionStatus.SUCCEEDED
FAILED: Final = ExecutionStatus.FAILED
SKIPPED: Final = ExecutionStatus.SKIPPED
MISSED: Final = ExecutionStatus.MISSED
CANCELLED: Final = ExecutionStatus.CANCELLED
# A plain execution a manual cancel (CancelRun) takes: one not ended yet (queued ones too:
# an execution may wait for its tenant's room to run).
CANCELLABLE: Final = frozenset({QUEUED, RUNNING, RETRY_PENDING})
JOB_ACTIVE: Final = JobStatus.ACTIVE
JOB_PAUSED: Final = JobStatus.PAUSED
JOB_COMPLETED: Final = JobStatus.COMPLETED
JOB_DELETED: Final = JobStatus.DELETED
LIVE_JOB: Final = JobStatus.LIVE
BY_SCHEDULE: Final = Trigger.SCHEDULE
BY_MANUAL: Final = Trigger.MANUAL
BY_BACKFILL: Final = Trigger.BACKFILL
BY_MISFIRE: Final = Trigger.MISFIRE
# A plain str: an attempt's outcome is an Avro string, which the compiled writer takes only
# as `str` itself (schemas/writer.py).
OUTCOME_SUCCEEDED: Final = AttemptOutcome.SUCCEEDED.value


# The JSON values of the timers the core writes (orjson; read back as plain dicts).
class FireTimer(TypedDict):
    """A job's own next slot."""

    s: int  # scheduled_for_ms
    d: str | None  # the slot's DST outcome
    v: int  # the job version that armed it
    e: NotRequired[int]  # 1: may be decided ahead (fire-ahead), read without the job


class PacedTimer(TypedDict):
    """A slot a misfire (fire_all) or a backfill runs in its turn."""

    s: int
    d: str | None
    t: Trigger
    rr: NotRequired[int]  # rerun the slot's execution if it is still at this attempt


class BackfillPageTimer(TypedDict):
    """The rest of a backfill's range, from slot `s` up to `to`."""

    t: str  # BACKFILL_PAGE_REF
    s: int
    d: str | None
    to: int
    r: float  # slots per second
    rerun: bool
    c: str  # the command id


class LeaseTimer(TypedDict):
    """[exec id, attempt] (and, for a first scheduled attempt, [job id, slot]) of the
    attempts one event leased until the same time."""

    l: list[list[Any]]  # noqa: E741 (the stored name)


class HeldTimer(TypedDict):
    """The [exec id, attempt] of the attempts one process decided ahead, due together; a
    timer written again for calls still stuck (HELD_RECHECK_MS) adds each one's due time,
    [exec id, attempt, due ms]."""

    h: list[list[str | int]]
    i: str  # the incarnation holding their calls


class AttemptTimer(TypedDict):
    """A retry's timer: the attempt it follows."""

    a: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Dispatch:
    """Run one attempt. The attempt number is the fencing token of its completion."""

    exec_id: str
    job_id: str
    tenant: str
    scheduled_for_ms: int
    attempt: int
    fencing_token: int
    target: Record
    lease_s: float
    # Decided ahead (fire-ahead): the executor holds the call until this wall-clock time.
    not_before_ms: int = 0
    # The owner's lease end (wall clock); 0 when unknown.
    lease_until_ms: int = 0
    # No decision waits on this execution's end (overlap `allow`): its result may wait
    # behind a spike's calls (streams/reports.py).
    result_may_wait: bool = False
    # A DAG task instance: the run (its slot's execution id) and the task it runs.
    run_id: str | None = None
    task_id: str | None = None
    # The job's tier (critical, normal, batch): the executor's queue calls higher tiers
    # first (streams/fair_dispatch.py).
    priority: Priority = Priority.NORMAL


@dataclass(frozen=True, kw_only=True, slots=True)
class Cancel:
    exec_id: str
    fencing_token: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Emit:
    """An event for a topic other than the partition's own tables."""

    topic: str
    name: str
    key: str
    record: Record


Effect = Dispatch | Cancel | Emit


@dataclass(kw_only=True, slots=True)
class Context:
    """Facts about the event being processed; the only inputs besides state."""

    now_ms: int
    causation_id: str
    worker: str
    epoch: int
    # Which process this is (new at every start): an attempt decided ahead is held by the
    # process that decided it, and only there (see _hand_over).
    incarnation: str = ""
    # Is this process's call of (exec_id, attempt), decided ahead, due and not yet made, stuck
    # (see HELD_RECHECK_MS)? None: nothing is (a replay, a test without an executor).
    stuck: Callable[[str, int], bool] | None = None
    # How late a slot may be before misfire policy judges it. Every owner must use the same
    # value (it is a deployment setting), or replays would decide differently.
    misfire_grace_ms: int = MISFIRE_GRACE_MS
    # How far ahead of their due time a tick decides eligible slots (one-offs and `allow`
    # jobs); 0 is off. A field of the tick (its ticker chose it), so replays decide alike.
    fire_ahead_ms: int = 0
    # Where the next chunk of this tick goes on deciding ahead, per lane prefix: the keys
    # before it were looked at by an earlier chunk, and those it decided are tombstones
    # that a scan from `now` would walk again for every chunk (quadratic in a spike).
    ahead_from: dict[bytes, bytes] = field(default_factory=dict)
    # The tenants' turns so far in this tick's rounds (streams.engine.lanes): a tick's
    # chunks share out the due timers as one round would.
    fair: FairState | None = None
    # The same for the slots decided ahead (fire-ahead), a round of their own.
    fair_ahead: FairState | None = None
    effects: list[Effect] = field(default_factory=list)
    # Numbers the records one event writes, so each gets its own deterministic event id.
    seq: int = 0
    # lease due time -> [exec_id, attempt] of the attempts this event started or re-armed;
    # written as one timer per due time when the event is done (see _flush_leases).
    leases: dict[int, list[list[str | int]]] = field(default_factory=dict)
    # due time -> [exec_id, attempt] of the attempts this event decided ahead: one HELD
    # timer per due time, looked at when it falls due (see _hand_over).
    held: dict[int, list[list[str | int]]] = field(default_factory=dict)
    # FIRE timers a command settled (_settle_overdue): deleted after the event's leases are
    # written, as a tick deletes what it fired, so a durable delete implies durable leases.
    settled: list[bytes] = field(default_factory=list)
    # Executions this event ended: expired together when their history window has passed
    # (streams.engine.retention).
    ended: list[str] = field(default_factory=list)

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq


def _job_lane(job: JobRecord, plan: JobPlan) -> Lane:
    """The lane of a job's FIRE timers: its tenant's, at its tier."""
    return tenant_lane(job["envelope"]["tenant"], tier_of(plan))


def _rand(*parts: object) -> float:
    """A replay-stable uniform in [0, 1): jitter must not differ between owners."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


class PlanCache:
    """Validated plans by (job id, version, creation time): a spec only changes with its
    version, and re-validating it took 6% of a worker's CPU. Bounded, oldest out."""

    def __init__(self, capacity: int = 1 << 16) -> None:
        # Not a plain dict: faust_store.TerminalMemo says why.
        self._plans: OrderedDict[tuple[str, int, int], JobPlan] = OrderedDict()
        self._capacity = capacity

    def plan(self, job: JobRecord) -> JobPlan:
        plan = self._plans.get(_plan_key(job))
        if plan is None:
            plan = plan_of(job["spec"])
            self.put(job, plan)
        return plan

    def put(self, job: JobRecord, plan: JobPlan) -> None:
        """The plan of the job's spec at its current version, validated by the caller."""
        self._plans[_plan_key(job)] = plan
        if len(self._plans) > self._capacity:
            self._plans.popitem(last=False)

    def __len__(self) -> int:
        return len(self._plans)


def _plan_key(job: JobRecord) -> tuple[str, int, int]:
    return job["job_id"], job["version"], job["created_at_ms"]


# (tenant, the spec's target): raises a PermanentError for a target the tenant may not use.
# The worker passes streams.guard.TargetGuard.check; the core itself grants nothing.
TargetCheck = Callable[[str, Any], None]


def _no_tenant_checks(tenant: str, target: Any) -> None:
    """For cores that judge specs alone (the in-memory tests and benchmarks)."""


class PartitionCore:
    def __init__(self, store: PartitionStore, plans: PlanCache | None = None, *,
                 check_target: TargetCheck = _no_tenant_checks,
                 weights: LaneWeight = EQUAL_WEIGHTS, gate: PartitionGate | None = None,
                 history_ms: int = 0) -> None:
        self.store = store
        # How long an ended execution stays (KRON_HISTORY_DAYS); 0 keeps it for good.
        self.history_ms = history_ms
        self._plans = plans if plans is not None else PlanCache()
        self._check_target = check_target
        # Each tenant's share of a round's decisions (a deployment setting, like the grace).
        self._weights = weights
        # Tenants' max_running in this worker (streams/engine/running_gate.py).
        self._gate = gate if gate is not None else ungated()
        # Stats for logs and benchmarks; never part of a decision.
        self.suppressed = 0
        self.stale_rejected = 0
        self._runs = DagRuns(self)

    def _plan(self, job: JobRecord) -> JobPlan:
        return self._plans.plan(job)

    # --- saving ------------------------------------------------------------------------------

    def _save_job(self, ctx: Context, job: JobRecord, event_type: str, *,
                  cache: bool = True) -> None:
        job["updated_at_ms"] = ctx.now_ms
        job["owner_epoch"] = ctx.epoch
        job["envelope"] = make_envelope(
            event_id=event_id(job["job_id"], event_type, ctx.causation_id, ctx.next_seq()),
            event_type=event_type, occurred_at_ms=ctx.now_ms, tenant=job["envelope"]["tenant"],
            causation_id=ctx.causation_id, correlation_id=job["job_id"], producer=ctx.worker)
        self.store.put_job(job, cache=cache)

    def _save_exec(self, ctx: Context, ex: ExecutionRecord, event_type: str) -> None:
        ex["updated_at_ms"] = ctx.now_ms
        ex["owner_epoch"] = ctx.epoch
        ex["envelope"] = make_envelope(
            event_id=event_id(ex["exec_id"], event_type, ex["attempt"], ctx.causation_id,
                              ctx.next_seq()),
            event_type=event_type, occurred_at_ms=ctx.now_ms, tenant=ex["envelope"]["tenant"],
            causation_id=ctx.causation_id, correlation_id=ex["job_id"], producer=ctx.worker)
        self.store.put_execution(ex)
        retention.note_saved(self, ex, ctx)

    # --- commands ----------------------------------------------------------------------------

    def on_command(self, name: str, cmd: Mapping[str, Any], ctx: Context) -> list[Effect]:
        """Apply one command (a record of the kron.commands schema `name` names). Raises
        PermanentError for a command that can never apply."""
        self._on_command(name, cast(JobCommand, cmd), ctx)
        self._flush_leases(ctx)
        for key in ctx.settled:
            self.store.delete_timer(key)
        return ctx.effects

    def _on_command(self, name: str, cmd: JobCommand, ctx: Context) -> list[Effect]:
        kind = name.rsplit(".", 1)[-1]
        job = self.store.job(cmd["job_id"])
        if job is not None:
            if job["envelope"]["tenant"] != cmd["envelope"]["tenant"]:
                raise PermanentError("the command's tenant does not own this job",
                                     field="envelope.tenant")
            if cmd["command_id"] in job["applied_command_ids"]:
                # Applied before, perhaps only in part: one event's writes reach the jobs
                # and timers changelogs independently, and an owner that died or lost the
                # partition between them can leave the job record without its timers
                # (likely how the broker-restart fault test lost an acknowledged create).
                # The command comes again (its offset was not committed), and nothing else
                # would arm the job: put its FIRE timer again (the same key and value, so
                # state that is whole stays as it is).
                self._rearm_next(job)
                if self._restart_lost_start(job, ctx):
                    self._save_job(ctx, job, "job.slot_fired")
                return ctx.effects
        if kind == "CreateJob":
            self._create(cast(CreateJobCommand, cmd), job, ctx)
            return ctx.effects
        if job is None or job["status"] == JOB_DELETED:
            raise PermanentError(f"no job {cmd['job_id']!r}", field="job_id")
        # Before the command changes the spec or prunes `running`; saved with its job write.
        self._restart_lost_start(job, ctx)
        # Each takes the command of its kind (`Any` here: the name, not the type, says which).
        handlers: dict[str, Callable[[Any, JobRecord, Context], None]] = {
            "UpdateJob": self._update,
            "PauseJob": self._pause,
            "ResumeJob": self._resume,
            "DeleteJob": self._delete,
            "TriggerJob": self._trigger,
            "BackfillJob": self._backfill,
            "CancelRun": self._cancel_run,
            "RetryRun": self._retry_run,
        }
        handler = handlers.get(kind)
        if handler is None:
            raise PermanentError(f"unknown command {name}", field=None)
        handler(cmd, job, ctx)
        self._remember(job, cmd["command_id"])
        self._save_job(ctx, job, f"job.{_past(kind)}")
        return ctx.effects

    @staticmethod
    def _remember(job: JobRecord, command_id: str) -> None:
        ids = job["applied_command_ids"]
        ids.append(command_id)
        del ids[:-MAX_RECENT_COMMANDS]

    def _create(self, cmd: CreateJobCommand, existing: JobRecord | None, ctx: Context) -> None:
        if existing is not None:
            same_key = cmd.get("idempotency_key") and (
                existing.get("idempotency_key") == cmd.get("idempotency_key"))
            if same_key:
                self._rearm_next(existing)  # as for a repeated command, above
                return
            raise PermanentError(f"job {cmd['job_id']!r} already exists", field="job_id")
        self.create_new(job_id=cmd["job_id"], tenant=cmd["envelope"]["tenant"],
                        command_id=cmd["command_id"], spec=cmd["spec"],
                        idempotency_key=cmd.get("idempotency_key"), ctx=ctx)

    def create_new(self, *, job_id: str, tenant: str, command_id: str, spec: JobSpec,
                   idempotency_key: str | None, ctx: Context) -> None:
        """What a CreateJob does for a job id the store does not hold (the caller looked):
        writes the job and arms it. No effects, no leases. A CreateJobs batch calls this
        for each new job rather than building a CreateJob and going through on_command
        (streams.engine.batch says why); the writes are numbered from ctx.seq, so a context
        whose seq is 0 gives the event ids a lone create's own context gives."""
        plan = plan_of(spec)
        self._check_targets(tenant, spec["target"], plan)
        job: JobRecord = {
            # Replaced by _save_job's envelope; only the tenant is read from it.
            "envelope": cast(EnvelopeRecord, {"tenant": tenant}),
            "job_id": job_id,
            "version": 1,
            "status": JOB_ACTIVE,
            "spec": spec,
            "created_at_ms": ctx.now_ms,
            "updated_at_ms": ctx.now_ms,
            "next_run_at_ms": None,
            "cursor_ms": None,
            "applied_command_ids": [command_id],
            "idempotency_key": idempotency_key,
            "owner_epoch": ctx.epoch,
            "running": [],
            "queued_slot_ms": None,
        }
        # A one-off is due at run_at even if that already passed: the API judged the skew.
        after = -1 if isinstance(plan.schedule, OneOffSchedule) else ctx.now_ms - 1
        self._arm(job, plan, bounded_next_slot(
            plan.schedule, after_ms=after, dst=plan.dst,
            start_at_ms=plan.start_at_ms, end_at_ms=plan.end_at_ms))
        due = job["next_run_at_ms"]
        hot = due is not None and due - ctx.now_ms <= HOT_CREATE_MS
        self._save_job(ctx, job, "job.created", cache=hot)
        if hot:
            # Only once the job is written: a create that failed before must not leave its
            # plan under a key that a later create of that id, in the same ms, would read.
            self._plans.put(job, plan)

    def _update(self, cmd: UpdateJobCommand, job: JobRecord, ctx: Context) -> None:
        expected = cmd.get("expected_version")
        if expected is not None and expected != job["version"]:
            raise PermanentError(f"job is at version {job['version']}, not {expected}",
                                 field="expected_version")
        plan = plan_of(cmd["spec"])
        self._check_targets(job["envelope"]["tenant"], cmd["spec"]["target"], plan)
        self._settle_overdue(job, ctx)
        self._disarm(job)
        # Under `allow` the list may hold finished runs (see _finish); another policy reads it.
        self._prune_running(job)
        job["spec"] = cmd["spec"]
        job["version"] += 1
        if job["status"] == JOB_COMPLETED:
            job["status"] = JOB_ACTIVE
        after = job["cursor_ms"] if job["cursor_ms"] is not None else -1
        if not isinstance(plan.schedule, OneOffSchedule):
            after = max(after, ctx.now_ms - 1)
        self._arm(job, plan, bounded_next_slot(
            plan.schedule, after_ms=after, dst=plan.dst,
            start_at_ms=plan.start_at_ms, end_at_ms=plan.end_at_ms))

    def _check_targets(self, tenant: str, target: Any, plan: JobPlan) -> None:
        """The tenant's rights over the job's target, or over each task's of a DAG job, and
        over its alerts' webhook (the same SSRF guard as an HTTP target's URL)."""
        if plan.notify is not None:
            try:
                self._check_target(tenant, {"url": plan.notify.webhook})
            except PermanentError as exc:
                raise PermanentError(f"notify.webhook: {exc.message}",
                                     field="notify.webhook") from None
        if plan.dag is None:
            self._check_target(tenant, target)
            return
        for task in plan.dag.tasks:
            try:
                self._check_target(tenant, task.target)
            except PermanentError as exc:
                raise PermanentError(exc.message, field=f"dag.tasks[{task.index}].{exc.field}"
                                     if exc.field else f"dag.tasks[{task.index}].target") from None

    def _cancel_run(self, cmd: CancelRunCommand, job: JobRecord, ctx: Context) -> None:
        """Cancel a DAG run (its running tasks fenced, the rest skipped) or a plain
        execution that has not ended (its attempt fenced: see _cancel_execution)."""
        run = self._run_of(cmd, job)
        reason = cmd.get("reason") or "run cancelled"
        if not is_run(run):
            self._cancel_execution(run, job, ctx, reason=reason)
            return
        if run["state"] != RUNNING:
            raise PermanentError(f"run {run['exec_id']!r} is {run['state']}, not running",
                                 field="run_id")
        self._runs.cancel(job, run, ctx, reason=reason)

    def _cancel_execution(self, ex: ExecutionRecord, job: JobRecord, ctx: Context, *,
                          reason: str) -> None:
        """A manual cancel of a plain execution that has not ended (queued, running or
        waiting for its retry): the attempt is stopped and fenced as a replace does
        (_cancel), the run ends `cancelled`. An ended one keeps its outcome."""
        if ex["state"] not in CANCELLABLE:
            raise PermanentError(f"run {ex['exec_id']!r} is {ex['state']}: only a queued, "
                                 f"running or retrying run can be cancelled", field="run_id")
        self._cancel(ex["exec_id"], job, ctx, reason=reason)

    def _retry_run(self, cmd: RetryRunCommand, job: JobRecord, ctx: Context) -> None:
        """Retry a DAG run (its tasks that did not succeed), or run a plain execution that
        ended failed, missed or skipped again (see _retry_execution)."""
        run = self._run_of(cmd, job)
        if is_run(run):
            self._runs.retry(job, run, ctx)
            return
        self._retry_execution(run, job, ctx)

    def _retry_execution(self, ex: ExecutionRecord, job: JobRecord, ctx: Context) -> None:
        """The next attempt of a plain execution, as a backfill's rerun makes it (_rerun):
        the same exec id, so the same Idempotency-Key, the attempt and fencing token one
        higher. Not a cancelled one: a cancel was a decision, and the executor remembers
        cancelled ids (streams/engine/backfill.py RERUNNABLE)."""
        if not backfill.may_rerun(ex):
            raise PermanentError(f"run {ex['exec_id']!r} is {ex['state']} after "
                                 f"{ex['attempt']} attempt(s): only a failed, missed or "
                                 f"skipped run can be retried", field="run_id")
        self._rerun(job, self._plan(job), ex, ctx)

    def _run_of(self, cmd: CancelRunCommand | RetryRunCommand,
                job: JobRecord) -> ExecutionRecord:
        """The run the command names: a DAG run or a plain execution of the job, never a
        DAG task instance (its run is what takes commands)."""
        run = self.store.execution(cmd["run_id"])
        if run is None or run["job_id"] != job["job_id"] or is_task(run):
            raise PermanentError(f"no run {cmd['run_id']!r} of job {job['job_id']!r}",
                                 field="run_id")
        return run

    def _pause(self, cmd: PauseJobCommand, job: JobRecord, ctx: Context) -> None:
        # The fire timer stays armed: each slot that falls due while paused is recorded as
        # skipped("paused") when its time comes, so no slot goes silently missing.
        early = [e for e in job["running"] if self._decided_early(e, ctx)]
        if job["status"] == JOB_ACTIVE or early:
            job["status"] = JOB_PAUSED
        # A slot decided ahead whose time has not come is not called: a pause means no
        # scheduled run starts after it. (A one-off is already "completed" once decided.)
        for ex_id in early:
            self._cancel(ex_id, job, ctx, reason="job paused before the slot was due")

    def _decided_early(self, ex_id: str, ctx: Context) -> bool:
        if self.store.known_terminal(ex_id):
            return False
        ex = self.store.execution(ex_id)
        # Decided before its due time (not merely fired at it), and that time still ahead.
        return (ex is not None and ex["state"] == RUNNING and ex["attempt"] == 1
                and ex["trigger"] == BY_SCHEDULE
                and ex["created_at_ms"] < ex["due_at_ms"] and ex["due_at_ms"] > ctx.now_ms)

    def _resume(self, cmd: ResumeJobCommand, job: JobRecord, ctx: Context) -> None:
        if job["status"] == JOB_PAUSED:
            job["status"] = JOB_ACTIVE if job["next_run_at_ms"] is not None else JOB_COMPLETED

    def _settle_overdue(self, job: JobRecord, ctx: Context) -> None:
        """Slots already due are settled first, as the tick that should have come before this
        command would have: disarming must not make them vanish."""
        old = self._plan(job)
        while job["next_run_at_ms"] is not None:
            slot = self._slot_from(old, job["next_run_at_ms"])
            if slot is None or apply_jitter(slot.scheduled_for_ms, jitter_s=old.jitter_s,
                                            job_id=job["job_id"]) > ctx.now_ms:
                break
            ctx.settled.append(self._fire_key(job, slot.scheduled_for_ms, old))
            # Armed before timer lanes, perhaps (_disarm).
            ctx.settled.append(self._fire_key(job, slot.scheduled_for_ms, old, lane=LEGACY_LANE))
            self._fire_scheduled(job, slot, ctx)

    def _delete(self, cmd: DeleteJobCommand, job: JobRecord, ctx: Context) -> None:
        self._settle_overdue(job, ctx)
        self._disarm(job)
        job["status"] = JOB_DELETED
        job["next_run_at_ms"] = None
        if job["queued_slot_ms"] is not None:
            slot = Slot(scheduled_for_ms=job["queued_slot_ms"], dst_outcome=None)
            job["queued_slot_ms"] = None
            self._record_outcome(job, slot, ctx, state=SKIPPED, reason="job deleted")
        for ex_id in list(job["running"]):
            self._cancel(ex_id, job, ctx, reason="job deleted")

    def _trigger(self, cmd: TriggerJobCommand, job: JobRecord, ctx: Context) -> None:
        ex_id = manual_exec_id(job["job_id"], cmd["command_id"])
        self._start_execution(job, self._plan(job), ctx, ex_id=ex_id,
                              slot=Slot(scheduled_for_ms=ctx.now_ms, dst_outcome=None),
                              trigger=BY_MANUAL)

    def _backfill(self, cmd: BackfillCommand, job: JobRecord, ctx: Context) -> None:
        """Every slot of the job's schedule in [from, to], paced (streams.engine.backfill
        has the rules). The first page is armed now, the rest page by page."""
        if cmd["to_ms"] < cmd["from_ms"] or cmd["to_ms"] > ctx.now_ms:
            raise PermanentError("backfill needs from <= to <= now", field="to")
        rate = max(0.01, min(float(cmd.get("max_per_s", 10.0)), 1000.0))
        first = backfill.first_slot(self._plan(job), cmd["from_ms"], cmd["to_ms"])
        self._backfill_page(job, first, to_ms=cmd["to_ms"], rate=rate,
                            rerun=bool(cmd.get("rerun", False)), ref=cmd["command_id"], ctx=ctx)

    def _backfill_page(self, job: JobRecord, slot: Slot | None, *, to_ms: int, rate: float,
                       rerun: bool, ref: str, ctx: Context) -> None:
        """Arm one page of a backfill: a paced FIRE timer for each of BACKFILL_PAGE slots at
        most, from `slot` on, 1/rate apart from now. If the range goes on, a page timer
        (named after the command) is due when the next slot's turn comes: it arms the next
        page then, as this one drains. So every slot of the range is armed, none dropped,
        and a backfill never holds more than a page of timers.

        With `rerun`, a slot whose execution may run again (backfill.may_rerun) carries the
        attempt it has now: it runs again only if it still has that attempt when its turn
        comes (a redelivered timer must not run it twice); a slot running now is not rerun."""
        plan = self._plan(job)
        page = backfill.BACKFILL_PAGE
        for n in range(page + 1):
            if slot is None:
                return
            due = ctx.now_ms + int(n * 1000 / rate)
            if n == page:
                key = timer_key(due_ms=due, kind=TimerKind.FIRE, job_id=job["job_id"],
                                ref=f"{BACKFILL_PAGE_REF}:{ref}", lane=_job_lane(job, plan))
                page_timer: BackfillPageTimer = {
                    "t": BACKFILL_PAGE_REF, "s": slot.scheduled_for_ms, "d": slot.dst_outcome,
                    "to": to_ms, "r": rate, "rerun": rerun, "c": ref}
                self.store.put_timer(key, orjson.dumps(page_timer))
                return
            rerun_of = None
            if rerun:
                ex = self.store.execution(exec_id(job["job_id"], slot.scheduled_for_ms))
                if ex is not None and backfill.may_rerun(ex):
                    rerun_of = ex["attempt"]
            self._put_paced(job, plan, slot, due, BY_BACKFILL, rerun_of=rerun_of)
            slot = backfill.next_slot(plan, slot.scheduled_for_ms, to_ms)

    # --- timers ------------------------------------------------------------------------------

    def _fire_key(self, job: JobRecord, scheduled_for_ms: int, plan: JobPlan, *,
                  lane: Lane | None = None) -> bytes:
        due = apply_jitter(scheduled_for_ms, jitter_s=plan.jitter_s, job_id=job["job_id"])
        return timer_key(due_ms=due, kind=TimerKind.FIRE, job_id=job["job_id"], ref="",
                         lane=_job_lane(job, plan) if lane is None else lane)

    @staticmethod
    def _slot_from(plan: JobPlan, at_ms: int) -> Slot | None:
        """The plan's first slot at or after `at_ms`, within its start and end."""
        return bounded_next_slot(plan.schedule, after_ms=at_ms - 1, dst=plan.dst,
                                 start_at_ms=plan.start_at_ms, end_at_ms=plan.end_at_ms)

    def _arm(self, job: JobRecord, plan: JobPlan, slot: Slot | None) -> None:
        """Exactly one future occurrence per active job sits in the timer table."""
        if slot is None:
            job["next_run_at_ms"] = None
            if job["status"] == JOB_ACTIVE:
                job["status"] = JOB_COMPLETED
            return
        job["next_run_at_ms"] = slot.scheduled_for_ms
        timer: FireTimer = {"s": slot.scheduled_for_ms, "d": slot.dst_outcome, "v": job["version"]}
        if plan.dag is None and (plan.overlap == Overlap.ALLOW
                                 or isinstance(plan.schedule, OneOffSchedule)):
            timer["e"] = 1  # may be decided ahead (fire-ahead); read without the job
        value = orjson.dumps(timer)
        self.store.put_timer(self._fire_key(job, slot.scheduled_for_ms, plan), value)

    def _disarm(self, job: JobRecord) -> None:
        if job["next_run_at_ms"] is not None:
            plan = self._plan(job)
            self.store.delete_timer(self._fire_key(job, job["next_run_at_ms"], plan))
            # Armed before timer lanes, perhaps: its key is then in the legacy lane.
            self.store.delete_timer(self._fire_key(job, job["next_run_at_ms"], plan,
                                                   lane=LEGACY_LANE))
            job["next_run_at_ms"] = None

    def _put_paced(self, job: JobRecord, plan: JobPlan, slot: Slot, due_ms: int,
                   trigger: Trigger, *, rerun_of: int | None = None) -> None:
        key = timer_key(due_ms=due_ms, kind=TimerKind.FIRE, job_id=job["job_id"],
                        ref=f"{trigger}:{slot.scheduled_for_ms}", lane=_job_lane(job, plan))
        data: PacedTimer = {"s": slot.scheduled_for_ms, "d": slot.dst_outcome, "t": trigger}
        if rerun_of is not None:
            data["rr"] = rerun_of  # run the slot's execution again if still at this attempt
        self.store.put_timer(key, orjson.dumps(data))

    def on_tick(self, ctx: Context, *, limit: int = 2000) -> tuple[list[Effect], bool]:
        """Fire the timers due at or before the tick's time, `limit` at most: if more are
        due, the round is shared (streams.engine.lanes.pick: the system lane, then tier by
        tier, the tenants of a tier by weight, each lane in due order). Then, if nothing
        due is left, (fire-ahead) decide the eligible slots due within ctx.fire_ahead_ms.
        Returns (effects, more_due)."""
        due = lanes = self.store.due_lanes(ctx.now_ms)
        try:
            started: list[tuple[bytes, bytes]] = []
            more_waiting = False
            if any(is_waiting(lane) for lane, _ in due):
                started, more_waiting = self._start_waiting(due, limit, ctx)
                lanes = [(lane, reader) for lane, reader in due if not is_waiting(lane)]
                limit -= len(started)
            if not lanes or limit <= 0:
                fired: list[tuple[bytes, bytes]] = []
                more = bool(lanes)
            elif len(lanes) == 1:  # one lane due (one tenant, say): its timers in due order
                fired = list(itertools.islice(lanes[0][1], limit + 1))
                more = len(fired) > limit
                del fired[limit:]
            else:
                if ctx.fair is None:
                    ctx.fair = FairState()
                fired, more = pick(lanes, limit, weight=self._weights, state=ctx.fair,
                                   rotation=ctx.now_ms)
        finally:
            for _, reader in due:
                reader.close()
        for key, value in fired:
            self._on_timer(key, value, ctx)
        more = more or more_waiting
        if ctx.fire_ahead_ms > 0 and not more:
            early, more = self._fire_ahead(ctx, room=limit - len(fired))
            fired += early
        fired += started
        self._flush_leases(ctx)
        # Fired timers go last: the writes of one event reach Kafka without a transaction,
        # and within the timers partition this order means a durable delete implies durable
        # leases. If the worker dies before the deletes are durable, the redelivered tick
        # fires the same timers again, and finds (and repairs) what it started.
        for key, _ in fired:
            self.store.delete_timer(key, read=True)
        return ctx.effects, more

    def _start_waiting(self, lanes: list[tuple[Lane, Any]], limit: int,
                       ctx: Context) -> tuple[list[tuple[bytes, bytes]], bool]:
        """Start the queued executions of the tenants that have room, each tenant's in the
        order their slots were due, before the round's other timers; a lane of a tenant
        still at its cap is not read. Returns the WAIT timers done with (to delete), and
        whether the round's limit, not a tenant's room, left some unread."""
        done: list[tuple[bytes, bytes]] = []
        cut = False
        for lane, reader in lanes:
            if not is_waiting(lane):
                continue
            room = self._gate.room(lane.tenant)
            left = limit - len(done)
            take = left if room is None else min(room, left)
            if take <= 0:
                cut = cut or left <= 0
                continue
            taken = 0
            for key, value in itertools.islice(reader, take):
                taken += 1
                if self._start_queued(key, ctx):
                    done.append((key, value))
            cut = cut or (taken == take == left)
        return done, cut

    def _start_queued(self, key: bytes, ctx: Context) -> bool:
        """A queued execution's turn: it starts if its tenant has room. False if not (its
        timer stays); True when its timer is done with (started, or no longer queued)."""
        tk = decode_timer_key(key)
        ex = self.store.execution(tk.ref)
        job = self.store.job(tk.job_id)
        if ex is None or job is None or ex["state"] != QUEUED:
            return True
        if not self._gate.admit(job["envelope"]["tenant"], ex["exec_id"]):
            return False
        plan = self._plan(job)
        ex["reason"] = None
        if plan.dag is not None:
            self._runs.start(job, plan, ex, ctx)
        else:
            self._begin_attempt(job, plan, ex, ctx)
        return True

    def _queue_for_room(self, job: JobRecord, plan: JobPlan, ex: ExecutionRecord,
                        ctx: Context) -> None:
        """The tenant is at its max_running: the execution waits, recorded `queued`."""
        ex["reason"] = CONCURRENCY_REASON
        self._put_wait_timer(ex, plan)
        self._save_exec(ctx, ex, "execution.queued")

    def _wait_key(self, ex: ExecutionRecord, plan: JobPlan | None = None) -> bytes:
        """A queued execution's WAIT timer: in the waiting lane of its own lane's tier."""
        own = self._exec_lane(ex, plan)
        lane = Lane(WAITING_TIER + own.tier, own.tenant)
        return timer_key(due_ms=ex["scheduled_for_ms"], kind=TimerKind.WAIT,
                         job_id=ex["job_id"], ref=ex["exec_id"], lane=lane)

    def _put_wait_timer(self, ex: ExecutionRecord, plan: JobPlan | None = None) -> None:
        value: AttemptTimer = {"a": ex["attempt"]}
        self.store.put_timer(self._wait_key(ex, plan), orjson.dumps(value))

    def _fire_ahead(self, ctx: Context, *, room: int) -> tuple[list[tuple[bytes, bytes]], bool]:
        """Decide the eligible slots due in (now, now + fire_ahead]; their calls wait for
        the due time in the executor. The window is taken as a round of due timers is
        (lanes.pick: tier by tier, a tier's tenants by weight, each lane in due order), so a
        tenant's spike decided ahead does not put another tenant's slots, or a critical
        one, behind it. Everything else in the window (leases, retries, paced runs, other
        overlap policies, paused jobs) is left for its due time."""
        ahead_from = ctx.ahead_from
        window = self.store.lanes_in(ctx.now_ms, ctx.now_ms + ctx.fire_ahead_ms, ahead_from)
        try:
            # Only FIRE timers may be decided ahead: the tenants' tiers, and the legacy lane
            # (keys from before lanes). Leases and held calls (the system lane), queued
            # executions and housekeeping wait for their time without costing the round.
            lanes = [(lane, reader) for lane, reader in window
                     if Tier.CRITICAL <= lane.tier <= Tier.BATCH or lane == LEGACY_LANE]
            if ctx.fair_ahead is None:
                ctx.fair_ahead = FairState()
            taken, more = pick(lanes, room, weight=self._weights, state=ctx.fair_ahead,
                               rotation=ctx.now_ms)
        finally:
            # Closed however this ends: a RocksDB iterator must not outlive the event (a
            # rebalance may close the DB while a dead-letter send awaits).
            for _, reader in window:
                reader.close()
        fired: list[tuple[bytes, bytes]] = []
        for key, value in taken:
            if self._fire_early(key, value, ctx):
                fired.append((key, value))
            # The next chunk of the tick goes on from the lane's next key.
            ahead_from[cast(bytes, lane_prefix_of(key))] = key + b"\x00"
        return fired, more

    def _fire_early(self, key: bytes, value: bytes, ctx: Context) -> bool:
        tk = decode_timer_key(key)
        if tk.kind != TimerKind.FIRE or tk.ref:
            return False
        data = orjson.loads(value)
        if not data.get("e"):
            return False
        job = self.store.job(tk.job_id)
        if (job is None or job["status"] != JOB_ACTIVE or data["v"] != job["version"]
                or job["next_run_at_ms"] != data["s"]):
            return False
        if job["running"] and self._plan(job).overlap != Overlap.ALLOW:
            return False  # a one-off with a manual run in flight: its policy judges at due
        if self._gate.capped(job["envelope"]["tenant"]):
            return False  # its cap judges at due: a held call must not hold its room
        self._fire_scheduled(job, Slot(scheduled_for_ms=data["s"], dst_outcome=data["d"]),
                             ctx, not_before_ms=tk.due_ms)
        return True

    def _on_timer(self, key: bytes, value: bytes, ctx: Context) -> None:
        tk = decode_timer_key(key)
        data = orjson.loads(value)
        if tk.kind == TimerKind.LEASE:
            self._check_leases(data["l"] if "l" in data else [[tk.ref, data["a"]]], ctx)
            return
        if tk.kind == TimerKind.HELD:
            if data["i"] != ctx.incarnation:
                self._hand_over(data["h"], tk.due_ms, ctx)
            elif ctx.stuck is not None:
                self._recheck_held(data["h"], tk.due_ms, ctx.stuck, ctx)
            return
        if tk.kind == TimerKind.EXPIRE:
            retention.on_expire(self, data, ctx)
            return
        job = self.store.job(tk.job_id)
        if job is None:
            return
        if tk.kind == TimerKind.FIRE:
            slot = Slot(scheduled_for_ms=data["s"], dst_outcome=data["d"])
            if data.get("t") == BACKFILL_PAGE_REF:
                # The rest of a backfill: its next page, under the job's plan now.
                self._backfill_page(job, slot, to_ms=data["to"], rate=data["r"],
                                    rerun=data["rerun"], ref=data["c"], ctx=ctx)
            elif tk.ref:
                self._fire_paced(job, slot, data["t"], ctx, rerun_of=data.get("rr"))
            elif data["v"] == job["version"] and job["next_run_at_ms"] == slot.scheduled_for_ms:
                self._fire_scheduled(job, slot, ctx)
            else:
                self._mend_torn_fire(job, slot, data["v"], ctx)
            return
        ex = self.store.execution(tk.ref)
        if ex is None or ex["attempt"] != data["a"]:
            return
        if tk.kind == TimerKind.RETRY and ex["state"] == RETRY_PENDING:
            self._next_attempt(job, ex, ctx)

    def _mend_torn_fire(self, job: JobRecord, slot: Slot, version: int, ctx: Context) -> None:
        """A FIRE timer that does not name the job's next slot. One event writes the jobs,
        executions and timers partitions without a transaction, so an owner that dies in
        the middle leaves each with some prefix of the event's writes (the fault suite saw a
        fire's timer writes land and its job write not: the job then waited for a slot whose
        timer was gone, and never fired again). Every slot goes through the execution
        check-and-set, so deciding one again starts nothing twice:

        - ahead of next_run_at (the job write was lost): the slots from next_run_at are
          decided again up to this one, then this one fires;
        - behind it (the job write landed, the timer's delete did not): each slot from it up
          to next_run_at whose execution is missing is decided again (the events that
          decided them lost their executions writes), and the job's own timer is put again,
          in case the event's timer put was lost with the delete;
        - of another version (an update whose timer writes were lost): only that re-arm.

        Behind it or of another version, the executions the job lists as running get their
        lease or retry timers again too: lost timer writes leave a started execution
        unwatched."""
        if job["status"] == JOB_DELETED:
            return
        t, nxt = slot.scheduled_for_ms, job["next_run_at_ms"]
        if version == job["version"]:
            if nxt is not None and t > nxt:
                self._catch_up(job, slot, ctx)
            else:
                self._redecide_lost(job, slot, ctx)
            return
        self._rearm_job(job, ctx)

    def _mend_lost_start(self, job_id: str, scheduled_for_ms: int, ctx: Context, *,
                         started: bool) -> None:
        """The lease timer of a slot's first attempt, as a torn event may have left it: its
        timer writes (this lease, then the fired timer's delete, in that order) landed and
        its executions or jobs write did not. Nothing else would bring either back:

        - no execution (`started` False): the slot is decided again now (late: the misfire
          policy judges it);
        - the job still waiting for this slot: deciding it again finds the execution (the
          check-and-set starts nothing) and moves the job on, to its next slot or, for a
          one-off, to completed."""
        job = self.store.job(job_id)
        if job is None or job["status"] == JOB_DELETED:
            return
        nxt = job["next_run_at_ms"]
        if started and nxt != scheduled_for_ms:
            return  # the usual case: the job write landed
        plan = self._plan(job)
        slot = self._slot_from(plan, scheduled_for_ms)
        if slot is None or slot.scheduled_for_ms != scheduled_for_ms:
            return  # not a slot of the job's schedule any more (updated since)
        if nxt == scheduled_for_ms:
            self._fire_scheduled(job, slot, ctx)
        elif nxt is not None and nxt < scheduled_for_ms:
            self._catch_up(job, slot, ctx)
        else:
            self._redecide_lost(job, slot, ctx)

    def _redecide_lost(self, job: JobRecord, slot: Slot, ctx: Context) -> None:
        """Slots from `slot` up to the job's next one that the job counts as decided but that
        have no execution: decided again, without moving the job's next slot."""
        plan = self._plan(job)
        nxt = job["next_run_at_ms"]
        limit = nxt if nxt is not None else max(job["cursor_ms"] or 0, slot.scheduled_for_ms) + 1
        owed: Slot | None = slot
        decided = False
        for _ in range(MAX_LATE_SLOTS):
            if owed is None or owed.scheduled_for_ms >= limit:
                break
            if self.store.execution(exec_id(job["job_id"], owed.scheduled_for_ms)) is None:
                self._decide_again(job, plan, owed, ctx)
                decided = True
            owed = self._slot_from(plan, owed.scheduled_for_ms + 1)
        self._rearm_job(job, ctx)
        if decided:
            self._save_job(ctx, job, "job.slot_fired")

    def _decide_again(self, job: JobRecord, plan: JobPlan, slot: Slot, ctx: Context) -> None:
        """A slot whose decision was lost, judged as _fire_scheduled judges one, except that
        the job's next slot stays where it is."""
        if job["status"] == JOB_PAUSED:
            self._record_outcome(job, slot, ctx, state=SKIPPED, reason="paused")
            return
        due = apply_jitter(slot.scheduled_for_ms, jitter_s=plan.jitter_s, job_id=job["job_id"])
        if ctx.now_ms - max(due, job["created_at_ms"]) > ctx.misfire_grace_ms:
            self._misfire(job, plan, [slot], ctx)
        else:
            self._on_slot(job, plan, slot, ctx, trigger=BY_SCHEDULE)

    def _catch_up(self, job: JobRecord, slot: Slot, ctx: Context) -> None:
        """Decide the slots a lost job write left undecided, then `slot` (see _mend_torn_fire)."""
        plan = self._plan(job)
        for _ in range(MAX_LATE_SLOTS):
            nxt = job["next_run_at_ms"]
            if nxt is None or nxt >= slot.scheduled_for_ms:
                break
            owed = self._slot_from(plan, nxt)
            if owed is None or owed.scheduled_for_ms >= slot.scheduled_for_ms:
                break
            self.store.delete_timer(self._fire_key(job, owed.scheduled_for_ms, plan))
            self._fire_scheduled(job, owed, ctx)
        if job["next_run_at_ms"] == slot.scheduled_for_ms:
            self._fire_scheduled(job, slot, ctx)
        else:
            self._rearm_job(job, ctx)

    def _rearm_job(self, job: JobRecord, ctx: Context) -> None:
        """The job write landed and the timer writes of one or more events did not: put its
        own FIRE timer again, and the lease or retry timer of every execution it started
        (a started execution without its lease timer would wait in `running` forever)."""
        self._rearm_next(job)
        for ex_id in job["running"]:
            if self.store.known_terminal(ex_id):
                continue
            ex = self.store.execution(ex_id)
            if ex is not None:
                self._rearm(ex, ctx)

    def _restart_lost_start(self, job: JobRecord, ctx: Context) -> bool:
        """The execution of the job's cursor slot, listed as running but never recorded: the
        event that started it (an update settling an overdue slot, say) kept its job write
        and lost its executions write. The decision to run it is in the job record, the spec
        that made it may not be, so it starts again as decided, under the job's spec now.
        A read, and nothing more, when state is whole. True if it started one (the caller
        saves the job)."""
        cursor = job["cursor_ms"]
        if cursor is None or job["status"] == JOB_DELETED:
            return False
        ex_id = exec_id(job["job_id"], cursor)
        if (ex_id not in job["running"] or self.store.known_terminal(ex_id)
                or self.store.execution(ex_id) is not None):
            return False
        _discard(job["running"], ex_id)
        self._start_execution(job, self._plan(job), ctx, ex_id=ex_id,
                              slot=Slot(scheduled_for_ms=cursor, dst_outcome=None),
                              trigger=BY_SCHEDULE)
        return True

    def _rearm_next(self, job: JobRecord) -> None:
        """Put the job's own FIRE timer again (the same key: a no-op if it is there)."""
        nxt = job["next_run_at_ms"]
        if nxt is None or job["status"] not in LIVE_JOB:
            return
        plan = self._plan(job)
        owed = self._slot_from(plan, nxt)
        if owed is not None and owed.scheduled_for_ms == nxt:
            self._arm(job, plan, owed)

    # --- leases ------------------------------------------------------------------------------

    def _lease(self, ex: ExecutionRecord, until_ms: int, ctx: Context) -> None:
        """Watch the attempt by a lease timer due at until_ms (its lease_until_ms)."""
        entry: list[Any] = [ex["exec_id"], ex["attempt"]]
        if ex["attempt"] == 1 and ex["trigger"] in SCHEDULE_TRIGGERS and not is_task(ex):
            # The slot too: if the execution's own write is lost and this timer survives, the
            # timer is what is left to decide the slot again by (_mend_lost_start).
            entry += [ex["job_id"], ex["scheduled_for_ms"]]
        ctx.leases.setdefault(until_ms, []).append(entry)

    def _flush_leases(self, ctx: Context) -> list[Effect]:
        """One timer for all the attempts an event leased until the same time, instead of a
        put and a delete per attempt: finished attempts are skipped when it fires. The same
        for the attempts it decided ahead, by due time."""
        retention.flush(self, ctx)
        for due, entries in ctx.leases.items():
            lease: LeaseTimer = {"l": entries}
            self._put_grouped(TimerKind.LEASE, due, lease)
        for due, entries in ctx.held.items():
            # The process that holds the calls: its own tick has nothing to do.
            held: HeldTimer = {"h": entries, "i": ctx.incarnation}
            self._put_grouped(TimerKind.HELD, due, held)
        ctx.leases.clear()
        ctx.held.clear()
        return ctx.effects

    def _put_grouped(self, kind: TimerKind, due_ms: int, data: LeaseTimer | HeldTimer) -> None:
        value = orjson.dumps(data)
        # Named by content: a redelivered event that lists other attempts must not
        # overwrite the timer its first delivery wrote.
        digest = hashlib.blake2b(value, digest_size=8).hexdigest()
        self.store.put_timer(timer_key(due_ms=due_ms, kind=kind, job_id="", ref=digest,
                                       lane=SYSTEM_LANE), value)

    def _rearm(self, ex: ExecutionRecord, ctx: Context) -> None:
        """Make sure a live attempt is watched by its timer. A crash between an event's
        writes can make the execution durable without its lease or retry timer; the event
        redelivered after the crash (or the attempt's lease timer) ends up here. A DAG run
        has no attempt of its own: its tasks' are watched, and the run is mended."""
        if is_run(ex):
            job = self.store.job(ex["job_id"])
            if job is not None:
                self._runs.mend(job, ex, ctx)
        # A running attempt has a lease, a pending retry its time (_begin_attempt and
        # _fail_attempt set them with the state).
        elif ex["state"] == RUNNING:
            self._lease(ex, cast(int, ex["lease_until_ms"]), ctx)
        elif ex["state"] == RETRY_PENDING:
            self._put_exec_timer(ex, TimerKind.RETRY, cast(int, ex["retry_at_ms"]))
        elif ex["state"] == QUEUED:
            self._put_wait_timer(ex)

    def _check_leases(self, entries: list[list[Any]], ctx: Context) -> None:
        for entry in entries:
            ex_id, attempt = entry[0], entry[1]
            if self.store.known_terminal(ex_id, attempt):
                continue  # the common case: it finished long ago, nothing to watch
            ex = self.store.execution(ex_id)
            if len(entry) == 4 and (ex is None or ex["attempt"] == attempt):
                self._mend_lost_start(entry[2], entry[3], ctx, started=ex is not None)
            if ex is None or ex["attempt"] != attempt:
                continue  # retried since: a later timer watches the newer attempt
            if ex["state"] == RUNNING and cast(int, ex["lease_until_ms"]) <= ctx.now_ms:
                self._expire(ex, ctx, why="the worker stopped heartbeating")
            else:
                # Extended by heartbeats: look again then. Retry pending: its retry timer
                # may not have survived a crash. Finished: nothing to do.
                self._rearm(ex, ctx)

    def _recheck_held(self, entries: list[list[Any]], due_ms: int,
                      stuck: Callable[[str, int], bool], ctx: Context) -> None:
        """Our own HELD timer: its calls are ours to make, but those stuck (HELD_RECHECK_MS)
        are looked at again later, by whoever owns the partition then."""
        again = [[ex_id, attempt, rest[0] if rest else due_ms]
                 for ex_id, attempt, *rest in entries if stuck(ex_id, attempt)]
        if again:
            ctx.held.setdefault(ctx.now_ms + HELD_RECHECK_MS, []).extend(again)

    def _hand_over(self, entries: list[list[Any]], due_ms: int, ctx: Context) -> None:
        """Attempts another process decided ahead, now due. Their calls waited in its
        executor; it died, stopped or lost the partition, so each call was never made or
        (dying just after its due time) its outcome is unknown. Waiting for the lease (60 s
        by default, from the due time) would only delay what it decides: each attempt still
        running fails `lease_expired` now and the retry policy takes it from there. A new
        attempt, never the same one again: two calls must not share a fencing token. An
        attempt that started at another time is not the one held (a torn event's slot,
        decided again since by this owner)."""
        for ex_id, attempt, *rest in entries:
            if self.store.known_terminal(ex_id, attempt):
                continue
            ex = self.store.execution(ex_id)
            if (ex is None or ex["attempt"] != attempt or ex["state"] != RUNNING
                    or ex["attempts"][-1]["started_at_ms"] != (rest[0] if rest else due_ms)):
                continue
            self._expire(ex, ctx, why="the worker holding the call stopped before its due time")

    def _expire(self, ex: ExecutionRecord, ctx: Context, *, why: str) -> None:
        """A running attempt whose worker is gone fails `lease_expired`; the retry policy
        decides what follows."""
        job = self.store.job(ex["job_id"])
        if job is not None:
            self._fail_attempt(job, ex, ctx, error_class=ErrorClass.LEASE_EXPIRED,
                               error=f"lease expired: {why}", status_code=None,
                               retry_after_s=None, started_at_ms=None)

    # --- firing ------------------------------------------------------------------------------

    def _fire_scheduled(self, job: JobRecord, slot: Slot, ctx: Context, *,
                        not_before_ms: int = 0) -> None:
        plan = self._plan(job)
        paused = job["status"] == JOB_PAUSED
        # Late is measured from the jittered due time, and never from before the job existed
        # (a one-off created with a past run_at is due, not late: the API judged the skew).
        due = apply_jitter(slot.scheduled_for_ms, jitter_s=plan.jitter_s, job_id=job["job_id"])
        overdue = ctx.now_ms - max(due, job["created_at_ms"]) > ctx.misfire_grace_ms
        late = [slot]
        if overdue:
            late = self._late_slots(plan, slot, ctx.now_ms - ctx.misfire_grace_ms)
        last = late[-1].scheduled_for_ms
        job["cursor_ms"] = advance_cursor(job["cursor_ms"], last)
        # Arm the slot right after the last one handled. If MAX_LATE_SLOTS cut the late
        # enumeration short, it is already due and the next tick judges the rest: skipping
        # ahead to now would lose those slots without a trace.
        nxt = bounded_next_slot(plan.schedule, after_ms=last, dst=plan.dst,
                                start_at_ms=plan.start_at_ms, end_at_ms=plan.end_at_ms)
        more = nxt is not None and nxt.scheduled_for_ms <= ctx.now_ms - ctx.misfire_grace_ms
        self._arm(job, plan, nxt)
        if paused:
            for s in late:
                self._record_outcome(job, s, ctx, state=SKIPPED, reason="paused")
        elif not overdue:
            self._on_slot(job, plan, slot, ctx, trigger=BY_SCHEDULE, not_before_ms=not_before_ms)
        else:
            self._misfire(job, plan, late, ctx, more=more)
        self._save_job(ctx, job, "job.slot_fired")

    def _late_slots(self, plan: JobPlan, first: Slot, cutoff_ms: int) -> list[Slot]:
        """Every slot from `first` that is already overdue, for misfire policy to judge."""
        slots = [first]
        nxt = bounded_next_slot(plan.schedule, after_ms=first.scheduled_for_ms, dst=plan.dst,
                                start_at_ms=plan.start_at_ms, end_at_ms=plan.end_at_ms)
        while (nxt is not None and nxt.scheduled_for_ms <= cutoff_ms
               and len(slots) < MAX_LATE_SLOTS):
            slots.append(nxt)
            nxt = bounded_next_slot(plan.schedule, after_ms=nxt.scheduled_for_ms, dst=plan.dst,
                                    start_at_ms=plan.start_at_ms, end_at_ms=plan.end_at_ms)
        return slots

    def _misfire(self, job: JobRecord, plan: JobPlan, late: list[Slot], ctx: Context, *,
                 more: bool = False) -> None:
        decision = resolve_misfire(late_slots=late, now_ms=ctx.now_ms, policy=plan.misfire)
        fire, missed = decision.fire, decision.missed
        if more and plan.misfire.kind != MisfireKind.SKIP_IF_LATE_BY:
            # Newer late slots follow in the next tick, so none of these is among the newest
            # that fire_once / fire_all keep.
            why = (MissReason.COALESCED if plan.misfire.kind == MisfireKind.FIRE_ONCE
                   else MissReason.FIRE_ALL_CAP)
            fire, missed = [], [(s, str(why)) for s in late]
        for slot, reason in missed:
            self._record_outcome(job, slot, ctx, state=MISSED, reason=reason)
        if plan.misfire.kind == MisfireKind.FIRE_ALL:
            for i, slot in enumerate(fire):
                self._put_paced(job, plan, slot, ctx.now_ms + i * PACE_MS, BY_MISFIRE)
            return
        for slot in fire:
            self._on_slot(job, plan, slot, ctx, trigger=BY_MISFIRE)

    def _fire_paced(self, job: JobRecord, slot: Slot, trigger: Trigger, ctx: Context, *,
                    rerun_of: int | None = None) -> None:
        if job["status"] == JOB_DELETED:
            # Its turn came after the delete: recorded, not silently dropped.
            self._record_outcome(job, slot, ctx, state=SKIPPED, reason="job deleted")
        elif job["status"] == JOB_PAUSED and trigger == BY_MISFIRE:
            # Paused before its paced turn came: it starts no run, like any slot while paused.
            self._record_outcome(job, slot, ctx, state=SKIPPED, reason="paused")
        else:
            self._on_slot(job, self._plan(job), slot, ctx, trigger=trigger, rerun_of=rerun_of)
        self._save_job(ctx, job, "job.slot_fired")

    def _record_outcome(self, job: JobRecord, slot: Slot, ctx: Context, *, state: ExecutionStatus,
                        reason: str) -> None:
        ex_id = exec_id(job["job_id"], slot.scheduled_for_ms)
        if self.store.execution(ex_id) is not None:
            self._suppress(job, ex_id, slot, ctx, f"{state} outcome for a slot already recorded")
            return
        ex = self._new_execution(job, ex_id, slot, ctx, trigger=BY_SCHEDULE)
        ex["state"] = state
        ex["reason"] = reason
        self._save_exec(ctx, ex, f"execution.{state}")
        if state == MISSED:  # the notifier's, and GET /v1/dead-letters' (streams/alerts.py)
            ctx.effects.append(Emit(topic="dead-letters", name="kron.deadletter.DeadLetter",
                                    key=job["job_id"], record=self._alert(
                                        job, ex, ctx, "missed", f"slot missed: {reason}")))

    def _on_slot(self, job: JobRecord, plan: JobPlan, slot: Slot, ctx: Context, *,
                 trigger: Trigger, not_before_ms: int = 0, rerun_of: int | None = None) -> None:
        """Apply the overlap policy to a slot that is due now (a backfill's rerun too)."""
        if job["running"] and plan.overlap != Overlap.ALLOW:
            # An execution whose finish was durable but whose job write was lost (a crash
            # between the two) must not hold the overlap policy forever. Only policies
            # that look at `running` pay for the lookups.
            self._prune_running(job)
        running = job["running"]
        if running and plan.overlap == Overlap.SKIP_IF_RUNNING:
            self._record_outcome(job, slot, ctx, state=SKIPPED, reason="overlap: running")
            return
        if running and plan.overlap == Overlap.QUEUE:
            if job["queued_slot_ms"] is None:
                job["queued_slot_ms"] = slot.scheduled_for_ms
            else:
                self._record_outcome(job, slot, ctx, state=SKIPPED,
                                     reason="overlap: queue full")
            return
        if running and plan.overlap == Overlap.REPLACE:
            for ex_id in list(running):
                self._cancel(ex_id, job, ctx, reason="replaced by a newer slot")
        self._start_execution(job, plan, ctx, ex_id=exec_id(job["job_id"],
                              slot.scheduled_for_ms), slot=slot, trigger=trigger,
                              not_before_ms=not_before_ms, rerun_of=rerun_of)

    def _suppress(self, job: JobRecord, ex_id: str, slot: Slot, ctx: Context, reason: str) -> None:
        """A duplicate trigger changes nothing; it is recorded so audits can count it."""
        self.suppressed += 1
        ctx.effects.append(Emit(topic="signals", name="kron.executions.TriggerSuppressed",
                                key=job["job_id"], record={
            "envelope": make_envelope(
                event_id=event_id(ex_id, "suppressed", ctx.causation_id, ctx.next_seq()),
                event_type="execution.trigger_suppressed", occurred_at_ms=ctx.now_ms,
                tenant=job["envelope"]["tenant"], causation_id=ctx.causation_id,
                correlation_id=job["job_id"], producer=ctx.worker),
            "exec_id": ex_id, "job_id": job["job_id"], "scheduled_for_ms": slot.scheduled_for_ms,
            "owner_epoch": ctx.epoch, "reason": reason}))

    def _new_execution(self, job: JobRecord, ex_id: str, slot: Slot, ctx: Context, *,
                       trigger: Trigger) -> ExecutionRecord:
        plan_jitter = float(job["spec"].get("jitter_s", 0.0))
        return {
            # Replaced by _save_exec's envelope; only the tenant is read from it.
            "envelope": cast(EnvelopeRecord, {"tenant": job["envelope"]["tenant"]}),
            "exec_id": ex_id, "job_id": job["job_id"],
            "scheduled_for_ms": slot.scheduled_for_ms, "owner_epoch": ctx.epoch,
            "state": QUEUED, "trigger": trigger, "attempt": 0, "fencing_token": 0,
            "due_at_ms": apply_jitter(slot.scheduled_for_ms, jitter_s=plan_jitter,
                                      job_id=job["job_id"]),
            "worker": None, "lease_until_ms": None, "retry_at_ms": None,
            "dst_outcome": slot.dst_outcome, "reason": None, "last_error": None,
            "status_code": None, "attempts": [], "created_at_ms": ctx.now_ms,
            "updated_at_ms": ctx.now_ms, "run_id": None, "task_id": None, "dag": None,
        }

    def _start_execution(self, job: JobRecord, plan: JobPlan, ctx: Context, *, ex_id: str,
                         slot: Slot, trigger: Trigger, not_before_ms: int = 0,
                         rerun_of: int | None = None) -> None:
        """The check-and-set that makes a slot fire once: local, because we own the partition.
        A backfill's rerun (`rerun_of`: the attempt the execution had when the backfill armed
        the slot) starts the next attempt of an execution that ended without success."""
        existing = self.store.execution(ex_id)
        if existing is not None:
            if (rerun_of is not None and existing["attempt"] == rerun_of
                    and backfill.may_rerun(existing)):
                self._rerun(job, plan, existing, ctx)
                return
            self._suppress(job, ex_id, slot, ctx, f"{trigger} trigger for a slot already started")
            self._rearm(existing, ctx)
            return
        ex = self._new_execution(job, ex_id, slot, ctx, trigger=trigger)
        if len(job["running"]) >= RUNNING_PRUNE_AT:
            self._prune_running(job)
        job["running"].append(ex_id)
        if not self._gate.admit(job["envelope"]["tenant"], ex_id):
            self._queue_for_room(job, plan, ex, ctx)
            return
        if plan.dag is not None:
            self._runs.start(job, plan, ex, ctx)  # a DAG job's slot is a run of its tasks
            return
        self._begin_attempt(job, plan, ex, ctx, not_before_ms=not_before_ms)

    def _rerun(self, job: JobRecord, plan: JobPlan, ex: ExecutionRecord, ctx: Context) -> None:
        """The next attempt of a finished execution, on a backfill's request: the same exec
        id (so the same Idempotency-Key), the attempt number and fencing token one higher.
        It runs as any attempt does; if it fails, the retry policy judges it by its attempt
        number (a slot that failed all its attempts gets this one; one that was missed or
        skipped gets the policy's full count)."""
        if is_run(ex):
            self._runs.retry(job, ex, ctx)
            return
        ex["reason"] = None
        if len(job["running"]) >= RUNNING_PRUNE_AT:
            self._prune_running(job)
        if ex["exec_id"] not in job["running"]:  # `allow` keeps finished runs listed a while
            job["running"].append(ex["exec_id"])
        self._gate.enter(job["envelope"]["tenant"], ex["exec_id"])
        self._begin_attempt(job, plan, ex, ctx, event_type=backfill.RERUN_STARTED)

    def _prune_running(self, job: JobRecord) -> None:
        """Drop finished executions from `running`: an `allow` job's finish does not write
        the job, and a crash between two writes can leave one behind for any policy."""
        job["running"] = [e for e in job["running"] if not self.store.known_terminal(e)
                          and (x := self.store.execution(e)) is not None
                          and x["state"] not in TERMINAL]

    def _begin_attempt(self, job: JobRecord, plan: JobPlan, ex: ExecutionRecord, ctx: Context, *,
                       not_before_ms: int = 0, event_type: str = "execution.started") -> None:
        """Start an attempt; one decided ahead (not_before_ms) starts, and is leased, from
        its due time."""
        start = max(ctx.now_ms, not_before_ms)
        ex["attempt"] += 1
        ex["fencing_token"] = ex["attempt"]
        ex["state"] = RUNNING
        ex["worker"] = ctx.worker
        ex["retry_at_ms"] = None
        lease_until = ex["lease_until_ms"] = start + int(plan.lease_s * 1000)
        ex["attempts"].append({
            "attempt": ex["attempt"], "fencing_token": ex["fencing_token"],
            "worker": ctx.worker, "started_at_ms": start, "finished_at_ms": None,
            "outcome": None, "status_code": None, "error": None, "output": None,
        })
        self._lease(ex, lease_until, ctx)
        if start > ctx.now_ms:
            ctx.held.setdefault(start, []).append([ex["exec_id"], ex["attempt"]])
        self._save_exec(ctx, ex, event_type)
        task_id = ex["task_id"]
        ctx.effects.append(Dispatch(
            exec_id=ex["exec_id"], job_id=ex["job_id"], tenant=job["envelope"]["tenant"],
            scheduled_for_ms=ex["scheduled_for_ms"], attempt=ex["attempt"],
            fencing_token=ex["fencing_token"],
            target=branch(job["spec"]["target"]) if task_id is None else task_target(plan, task_id),
            lease_s=plan.lease_s, not_before_ms=start if start > ctx.now_ms else 0,
            lease_until_ms=lease_until,
            # A task's end releases the next tasks: it must not wait behind other results.
            result_may_wait=plan.overlap == Overlap.ALLOW and task_id is None,
            run_id=ex["run_id"], task_id=task_id, priority=plan.priority))

    def _exec_lane(self, ex: ExecutionRecord, plan: JobPlan | None = None) -> Lane:
        """The lane of an execution's timers: its tenant's, at its job's tier."""
        if plan is None:
            job = self.store.job(ex["job_id"])
            plan = None if job is None else self._plan(job)
        tier = Tier.NORMAL if plan is None else tier_of(plan)
        return tenant_lane(ex["envelope"]["tenant"], tier)

    def _put_exec_timer(self, ex: ExecutionRecord, kind: TimerKind, due_ms: int,
                        plan: JobPlan | None = None) -> None:
        key = timer_key(due_ms=due_ms, kind=kind, job_id=ex["job_id"], ref=ex["exec_id"],
                        lane=self._exec_lane(ex, plan))
        value: AttemptTimer = {"a": ex["attempt"]}
        self.store.put_timer(key, orjson.dumps(value))

    def _del_exec_timer(self, ex: ExecutionRecord, kind: TimerKind, due_ms: int | None) -> None:
        if due_ms is not None:
            self.store.delete_timer(timer_key(due_ms=due_ms, kind=kind, job_id=ex["job_id"],
                                              ref=ex["exec_id"], lane=self._exec_lane(ex)))

    def _next_attempt(self, job: JobRecord, ex: ExecutionRecord, ctx: Context) -> None:
        self._begin_attempt(job, self._plan(job), ex, ctx)

    def _cancel(self, ex_id: str, job: JobRecord, ctx: Context, *, reason: str) -> None:
        ex = self.store.execution(ex_id)
        if ex is None or ex["state"] in TERMINAL:
            _discard(job["running"], ex_id)
            return
        if is_run(ex):
            self._runs.cancel(job, ex, ctx, reason=reason)
            return
        self._fence(ex, ctx, reason=reason)
        self._finish(job, ex, ctx, "execution.cancelled")

    def _fence(self, ex: ExecutionRecord, ctx: Context, *, reason: str) -> None:
        """Cancel the execution's attempt: the call is stopped, and bumping the token fences
        it (its late report is rejected)."""
        self._del_exec_timer(ex, TimerKind.RETRY, ex["retry_at_ms"])
        if ex["state"] == QUEUED:
            self.store.delete_timer(self._wait_key(ex))
        ctx.effects.append(Cancel(exec_id=ex["exec_id"], fencing_token=ex["fencing_token"]))
        ex["fencing_token"] += 1
        ex["state"] = CANCELLED
        ex["reason"] = reason

    def _stop_attempt(self, ex: ExecutionRecord, ctx: Context, *, reason: str) -> None:
        """Cancel a DAG task instance whose run is being cancelled (the run records it)."""
        self._fence(ex, ctx, reason=reason)
        ex["lease_until_ms"] = None
        self._save_exec(ctx, ex, "execution.cancelled")

    # --- attempt reports ---------------------------------------------------------------------

    def on_report(self, name: str, rep: Mapping[str, Any], ctx: Context) -> list[Effect]:
        """Apply an attempt's report, or a batch of them (AttemptsFinished): a record of the
        kron.executions schema `name` names."""
        kind = name.rsplit(".", 1)[-1]
        if kind == "AttemptsFinished":
            for item in cast(AttemptsFinishedReport, rep)["results"]:
                self._on_report("ExecutionSucceeded" if item["ok"] else "ExecutionFailed",
                                item, ctx)
        else:
            self._on_report(kind, cast(ExecutionReport, rep), ctx)
        return self._flush_leases(ctx)

    def _on_report(self, kind: str, rep: ExecutionReport, ctx: Context) -> None:
        """`kind` names rep's schema; a batched result comes as ExecutionSucceeded or
        ExecutionFailed (its `ok`), with the fields those read."""
        ex = self.store.execution(rep["exec_id"])
        if ex is None or ex["state"] != RUNNING or ex["fencing_token"] != rep["fencing_token"]:
            # A zombie's or a cancelled attempt's word: fenced, never applied.
            self.stale_rejected += 1
            if ex is not None and ex["run_id"] is not None and ex["state"] in TERMINAL:
                # Perhaps the report came again after a crash.
                self._mend_run_of(ex["run_id"], ex["job_id"], ctx)
            return
        job = self.store.job(ex["job_id"])
        if job is None:
            return
        if kind == "ExecutionHeartbeat":
            # Only ever extend: a duplicated or reordered heartbeat must not pull the lease
            # back in and expire a live attempt. The lease timer stays where it is; when it
            # fires it finds the later time and re-arms itself.
            beat = cast(ExecutionHeartbeatReport, rep)
            ex["lease_until_ms"] = max(ex["lease_until_ms"] or 0, beat["lease_until_ms"])
            # Its call waits in the worker (its tenant's dispatch rate), or no longer does.
            # Only the one reason a worker gives: a record on kron.signals is no place for
            # anything else to reach a run's `reason`.
            held_for = HELD_REASON if beat.get("held_for") == HELD_REASON else None
            if held_for is not None or ex["reason"] == HELD_REASON:
                ex["reason"] = held_for
            self._save_exec(ctx, ex, "execution.held" if held_for else "execution.heartbeat")
        elif kind == "ExecutionSucceeded":
            done = cast(SucceededReport, rep)
            _close_attempt(ex, done, OUTCOME_SUCCEEDED)
            ex["state"] = SUCCEEDED
            ex["status_code"] = done.get("status_code")
            self._finish(job, ex, ctx, "execution.succeeded")
        elif kind == "ExecutionFailed":
            failed = cast(FailedReport, rep)
            # Never None in a failure (a batched result whose `ok` is false carries it).
            error_class = ErrorClass(cast(str, failed["error_class"]))
            self._fail_attempt(job, ex, ctx, error_class=error_class,
                               error=failed["error"], status_code=failed.get("status_code"),
                               retry_after_s=failed.get("retry_after_s"),
                               started_at_ms=failed.get("started_at_ms"), report=failed)

    def _mend_run_of(self, run_id: str, job_id: str, ctx: Context) -> None:
        """The run of a task instance whose report came again: see DagRuns.mend."""
        run, job = self.store.execution(run_id), self.store.job(job_id)
        if run is not None and job is not None:
            self._runs.mend(job, run, ctx)

    def _fail_attempt(self, job: JobRecord, ex: ExecutionRecord, ctx: Context, *,
                      error_class: ErrorClass, error: str | None, status_code: int | None,
                      retry_after_s: float | None, started_at_ms: int | None,
                      report: FailedReport | None = None) -> None:
        plan = self._plan(job)
        _close_attempt(ex, report or {"finished_at_ms": ctx.now_ms, "status_code": status_code,
                                      "error": error}, str(error_class))
        ex["last_error"] = error
        ex["status_code"] = status_code
        retry = plan.retry if ex["task_id"] is None else retry_of(plan, ex)
        if should_retry(retry, failed_attempt=ex["attempt"], error_class=error_class):
            delay = retry_delay_s(retry, failed_attempt=ex["attempt"],
                                  rand=_rand(ex["exec_id"], ex["attempt"]),
                                  retry_after_s=retry_after_s)
            ex["state"] = RETRY_PENDING
            retry_at = ex["retry_at_ms"] = ctx.now_ms + int(delay * 1000)
            ex["lease_until_ms"] = None
            self._put_exec_timer(ex, TimerKind.RETRY, retry_at, plan)
            self._save_exec(ctx, ex, "execution.retry_scheduled")
            return
        ex["state"] = FAILED
        self._finish(job, ex, ctx, "execution.failed")
        ctx.effects.append(Emit(topic="dead-letters", name="kron.deadletter.DeadLetter",
                                key=job["job_id"], record=self._failure_alert(job, ex, ctx)))

    def _failure_alert(self, job: JobRecord, ex: ExecutionRecord, ctx: Context) -> Record:
        return self._alert(job, ex, ctx, "failed", f"execution failed after {ex['attempt']} "
                                                   f"attempt(s): {ex['last_error']}")

    @staticmethod
    def _alert(job: JobRecord, ex: ExecutionRecord, ctx: Context, what: str,
               error: str) -> Record:
        """A failed execution's or missed slot's alert; its value carries what the notifier
        sends (streams/alerts.py), so it reads no other topic."""
        return {
            "envelope": make_envelope(
                # A rerun may fail the execution again; "alert" keeps the ids of before.
                event_id=event_id(ex["exec_id"], "alert" if what == "failed" else what,
                                  ex["attempt"]),
                event_type=f"execution.{what}_alert", occurred_at_ms=ctx.now_ms,
                tenant=job["envelope"]["tenant"], causation_id=ctx.causation_id,
                correlation_id=job["job_id"], producer=ctx.worker),
            "source_topic": "executions", "source_partition": -1, "source_offset": -1,
            "key": ex["exec_id"].encode(), "value": alert_value(job, ex),
            "error": error, "error_class": f"execution_{what}",
        }

    def _finish(self, job: JobRecord, ex: ExecutionRecord, ctx: Context, event_type: str) -> None:
        """Terminal state; a queued slot (overlap=queue) starts now, or is skipped if paused.

        An `allow` job whose status does not change is not written: nothing decides on its
        `running` list, which sheds finished runs when it grows (_prune_running). That is
        one Avro encode and one changelog record fewer per execution of a cron job.
        """
        ex["lease_until_ms"] = None
        self._save_exec(ctx, ex, event_type)
        if ex["run_id"] is None:
            self._gate.release(job["envelope"]["tenant"], ex["exec_id"])
        if ex["run_id"] is not None:
            self._runs.task_done(job, ex, ctx)  # a task instance: its run decides what follows
            return
        status = job["status"]
        _discard(job["running"], ex["exec_id"])
        queued = job["queued_slot_ms"]
        if queued is not None and not job["running"] and job["status"] != JOB_DELETED:
            job["queued_slot_ms"] = None
            slot = Slot(scheduled_for_ms=queued, dst_outcome=None)
            if job["status"] == JOB_PAUSED:  # a paused job starts no scheduled run
                self._record_outcome(job, slot, ctx, state=SKIPPED, reason="paused")
            else:
                self._start_execution(job, self._plan(job), ctx,
                                      ex_id=exec_id(job["job_id"], queued), slot=slot,
                                      trigger=BY_SCHEDULE)
        if job["next_run_at_ms"] is None and not job["running"] and job["status"] == JOB_ACTIVE:
            job["status"] = JOB_COMPLETED
        if (queued is None and job["status"] == status
                and self._plan(job).overlap == Overlap.ALLOW):
            return
        self._save_job(ctx, job, "job.execution_finished")


def _close_attempt(ex: ExecutionRecord, rep: Mapping[str, Any], outcome: str) -> None:
    """Close the last attempt as `rep` says it ended: a report (lone or batched: not every
    schema has every field read here), or the core's own verdict (a lease that expired).
    Its output (bounded by the executor) is kept; older attempts' outputs give way to it
    past the execution's budget."""
    attempts = ex["attempts"]
    last = attempts[-1]
    if ex.get("reason") == HELD_REASON:  # called after all (its end came before the word)
        ex["reason"] = None
    last["finished_at_ms"] = rep.get("finished_at_ms")
    last["outcome"] = outcome
    last["status_code"] = rep.get("status_code")
    last["error"] = rep.get("error")
    last["output"] = rep.get("output")
    if rep.get("started_at_ms"):
        last["started_at_ms"] = rep["started_at_ms"]
    if len(attempts) > 1:  # a retry: the first attempt of most executions skips this
        _drop_older_outputs(attempts)


def _drop_older_outputs(attempts: list[AttemptRecord]) -> None:
    """Keep the newest outputs within EXECUTION_OUTPUT_BUDGET bytes, newest always: every
    write of the execution carries them all, and a record must stay well under the
    broker's 1 MB (100 attempts of 4 KiB would be 400 KiB)."""
    left = EXECUTION_OUTPUT_BUDGET - utf8_len(attempts[-1]["output"] or "")
    for attempt in reversed(attempts[:-1]):
        text = attempt["output"]
        if text is None:
            continue
        left -= utf8_len(text)
        if left < 0:
            attempt["output"] = None


def _discard(items: list[str], item: str) -> None:
    if item in items:
        items.remove(item)


def _past(kind: str) -> str:
    return {
        "UpdateJob": "updated", "PauseJob": "paused", "ResumeJob": "resumed",
        "DeleteJob": "deleted", "TriggerJob": "triggered", "BackfillJob": "backfill_requested",
        "CancelRun": "run_cancelled", "RetryRun": "run_retried",
    }[kind]

