"""Audit a recorded history (kron.jobs + kron.executions) against the design's invariants.

A pure function of the records: no Kafka, no clock (``now_ms`` is an argument). It takes the
``JobState`` and ``ExecutionState`` records in offset order (records of one key in order;
interleaving between keys and between the two topics does not matter) and reports:

``duplicate_trigger``
    * an ``execution.started`` record for the same (exec_id, attempt) written twice by
      different events (different ``causation_id``): the slot or attempt fired twice;
      a byte-identical redelivery (same causation) is allowed;
    * a terminal execution (succeeded/failed/skipped/missed/cancelled) that later shows a
      non-terminal state again, unless a backfill's rerun started its next attempt
      (``execution.rerun_started``) after a failed, missed or skipped end;
    * two different exec_ids for one (job_id, scheduled_for_ms) among the schedule, misfire
      and backfill triggers (manual runs are separate executions by design).
``lost_slot``
    A slot of a job's schedule that the job's own history shows was passed, but that has no
    execution record at all. Slots are enumerated between consecutive states of a job, with
    the spec of the earlier state, from its ``next_run_at_ms`` (the armed slot):

    * the next state has the same version and an armed slot: every slot before that one;
    * otherwise (an update changed the spec, or the job completed or was deleted): every slot
      up to the next state's ``cursor_ms``, and every slot whose (jittered) due time was at
      least ``grace_ms`` before that state was written: an update or delete must not
      swallow overdue slots silently.

    The slot a job still has armed is pending, not lost, and so is the slot buffered by
    ``overlap=queue`` while the job lives, and a slot a ``fire_all`` misfire paced until
    ``fire_all_cap * PACE_MS`` after it. Slots after ``now_ms - grace_ms`` are not judged.
    When the first state seen of a job is not its creation (the jobs topic is compacted) and
    still at version 1, the gap from ``created_at_ms`` to it is judged with that spec; an
    earlier version's history is gone, so before a later version nothing is judged. At most
    ``max_slots`` slots are enumerated per job; a job cut short is listed in ``truncated``.
``attempts_over_policy``
    An execution record whose ``attempt`` exceeds ``retry.max_attempts`` of every spec
    version in force between the execution's creation and that record (or the attempt a
    rerun started, if higher: a rerun's failure is retried only within the policy); an attempt
    after one whose outcome was ``permanent``, other than a rerun's.
``stale_token``
    A write whose ``fencing_token`` is lower than one already seen for the execution; an
    attempt outcome recorded (or rewritten) when the previous record was not ``running`` with
    that attempt's token; a terminal state overwritten by a different one.
``cursor_backwards``
    A job's ``cursor_ms`` decreasing (or being cleared) between consecutive states.

DAG jobs (issue 38). A *run* is an execution record with ``dag`` set (its tasks' progress, in
the DAG's order); a *task instance* is one with ``run_id`` and ``task_id`` set. The rules and
dependencies come from the job's spec (a ``kron.DagTarget``) whose task ids are the run's,
the latest written at or before the run record (or any, when compaction took that one).

``dag.rule_held``
    A run record in which a task is running that was not in the run's previous record, while
    its trigger rule (``streams.domain.dag.verdict``), on its parents' states in that same
    record (counted afresh, not read from the stored counts), does not say ``run``.
``dag.final_states``
    A run recorded succeeded, failed or cancelled with a task not final; one succeeded with a
    failed, upstream_failed or cancelled task; one failed with none.
``dag.one_run_per_slot``
    Two run ids for one (job_id, scheduled_for_ms) among the schedule, misfire and backfill
    triggers, or a run of those triggers whose id is not ``exec_id(job_id, scheduled_for_ms)``.
    (Slots whose executions are all runs are judged here, not by ``duplicate_trigger``.)
``dag.no_double_start``
    A task instance's attempt started twice: the same attempt number with another worker or
    start time while open, or open again after it closed (an attempt's report may correct its
    start time once, as it closes it); attempt numbers that are not 1..n, or a record whose
    ``attempt`` is not its last; more attempts than the task's ``retry.max_attempts`` (the job's
    when the task has none) plus the re-runs it got (``execution.rerun_started``). Task
    instances are judged by this bound instead of ``attempts_over_policy``'s.
``dag.orphan_task``
    A task instance whose ``run_id`` names no run record, whose run has no such task, or whose
    id is not ``task_exec_id(run_id, task_id)``.

History retention (``KRON_HISTORY_DAYS``, streams.engine.retention). The owner tombstones
an execution once its window has passed since it ended; compaction then removes its records.
Given ``history_ms``, the audit takes that into account: a slot due before the *horizon*
(``now_ms - history_ms``, plus the fire-ahead bound: nothing due after it can have expired)
that has no execution record is ``expired``, not lost, and so is a slot whose execution's
tombstone it reads (``executions`` may hold tombstone markers, ``tombstone(exec_id)``, in
their place in the log: a record of that id after its tombstone starts a new life, judged
afresh). A task instance whose run is gone by retention is not an orphan. These are counted
in ``expired``; none is a violation.

A run taken from failed or cancelled back to running by ``dag_run.retried`` (RetryRun, or a
backfill's rerun), and a task instance's next attempt started by ``execution.rerun_started``
after it failed or was cancelled, are not duplicate triggers.

One record yields at most one violation of each kind; findings of a kind are merged into its
detail.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

from kron import timefmt
from streams.domain.dag import DagPlan, TaskState, Verdict, parse_dag, verdict
from streams.domain.errors import PermanentError
from streams.domain.ids import exec_id as slot_exec_id
from streams.domain.ids import task_exec_id
from streams.domain.policies import DstPolicy, MisfireKind
from streams.domain.schedule import (
    OneOffSchedule,
    Schedule,
    Slot,
    apply_jitter,
    bounded_next_slot,
)
from streams.domain.states import ExecutionStatus, JobStatus, Trigger
from streams.engine.backfill import RERUN_STARTED, RERUNNABLE
from streams.engine.core import PACE_MS
from streams.engine.spec import JobPlan, plan_of
from streams.engine.store import TERMINAL

Record = dict[str, Any]

DUPLICATE_TRIGGER = "duplicate_trigger"
LOST_SLOT = "lost_slot"
ATTEMPTS_OVER_POLICY = "attempts_over_policy"
STALE_TOKEN = "stale_token"
CURSOR_BACKWARDS = "cursor_backwards"
DAG_RULE_HELD = "dag.rule_held"
DAG_FINAL_STATES = "dag.final_states"
DAG_ONE_RUN_PER_SLOT = "dag.one_run_per_slot"
DAG_NO_DOUBLE_START = "dag.no_double_start"
DAG_ORPHAN_TASK = "dag.orphan_task"
DAG_KINDS = (DAG_RULE_HELD, DAG_FINAL_STATES, DAG_ONE_RUN_PER_SLOT, DAG_NO_DOUBLE_START,
             DAG_ORPHAN_TASK)
KINDS = (DUPLICATE_TRIGGER, LOST_SLOT, ATTEMPTS_OVER_POLICY, STALE_TOKEN, CURSOR_BACKWARDS,
         *DAG_KINDS)

SLOT_TRIGGERS = frozenset({Trigger.SCHEDULE, Trigger.MISFIRE, Trigger.BACKFILL})
# A DAG run's retry (RetryRun, or a backfill's rerun) takes it from one of these to running.
RUN_RETRIED = "dag_run.retried"
RUN_RETRYABLE = frozenset({ExecutionStatus.FAILED, ExecutionStatus.CANCELLED})
RUN_ENDS = frozenset({ExecutionStatus.SUCCEEDED, ExecutionStatus.FAILED,
                      ExecutionStatus.CANCELLED})
DEFAULT_GRACE_MS = 10_000
# A tombstone marker in the executions given to `audit` (see tombstone()).
TOMBSTONE = "__tombstone__"
# The most a slot's execution may be decided before its time (KRON_FIRE_AHEAD_S's bound):
# its end, and so its expiry, may come that much before the slot.
FIRE_AHEAD_MAX_MS = 10_000
MAX_SLOTS_PER_JOB = 100_000


@dataclass(frozen=True, kw_only=True, slots=True)
class Violation:
    kind: str
    job_id: str
    exec_id: str | None
    scheduled_for_ms: int | None
    detail: str


@dataclass(frozen=True, kw_only=True, slots=True)
class AuditReport:
    violations: tuple[Violation, ...] = ()
    jobs: int = 0  # JobState records read
    executions: int = 0  # ExecutionState records read
    slots_checked: int = 0  # distinct (job, slot) judged by the lost-slot check
    truncated: tuple[str, ...] = ()  # job_ids whose slot enumeration hit the limit
    notes: tuple[str, ...] = ()  # what could not be judged, and why
    dag_runs: int = 0  # distinct DAG runs read
    task_instances: int = 0  # distinct DAG task instances read
    expired: int = 0  # slots and task instances whose records history retention removed

    @property
    def ok(self) -> bool:
        return not self.violations

    def of_kind(self, kind: str) -> list[Violation]:
        return [v for v in self.violations if v.kind == kind]

    @property
    def duplicate_triggers(self) -> list[Violation]:
        return self.of_kind(DUPLICATE_TRIGGER)

    @property
    def lost_slots(self) -> list[Violation]:
        return self.of_kind(LOST_SLOT)

    @property
    def attempts_over_policy(self) -> list[Violation]:
        return self.of_kind(ATTEMPTS_OVER_POLICY)

    @property
    def stale_tokens(self) -> list[Violation]:
        return self.of_kind(STALE_TOKEN)

    @property
    def cursors_backwards(self) -> list[Violation]:
        return self.of_kind(CURSOR_BACKWARDS)

    @property
    def counts(self) -> dict[str, int]:
        """Violations per kind: every kind, the DAG ones when the history has DAG runs or
        task instances (or a DAG violation)."""
        dag = self.dag_runs or self.task_instances
        out = dict.fromkeys(KINDS if dag else KINDS[:-len(DAG_KINDS)], 0)
        for v in self.violations:
            out[v.kind] = out.get(v.kind, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "counts": self.counts,
            "violations": [asdict(v) for v in self.violations],
            "executions": self.executions,
            "jobs": self.jobs,
            "slots_checked": self.slots_checked,
            "dag_runs": self.dag_runs,
            "task_instances": self.task_instances,
            "expired": self.expired,
            "truncated": list(self.truncated),
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=False)


def tombstone(exec_id: str) -> Record:
    """The marker of an execution's tombstone, for `audit`'s executions."""
    return {TOMBSTONE: True, "exec_id": exec_id}


@dataclass(slots=True)
class _Retention:
    """What history retention removed, as far as the audit can tell."""

    horizon_ms: int | None  # slots due before it may have expired; None: retention off
    tombstoned: set[str] = field(default_factory=set)
    expired: set[tuple[Any, ...]] = field(default_factory=set)

    def gone(self, ex_id: str, due_ms: int) -> bool:
        return ex_id in self.tombstoned or (self.horizon_ms is not None
                                            and due_ms < self.horizon_ms)


def iso(ms: int | None) -> str:
    """kron.timefmt.iso, for findings: "-" for no time, the number for one out of range."""
    if ms is None:
        return "-"
    try:
        return timefmt.iso(ms)
    except (OverflowError, OSError, ValueError):
        return str(ms)


# --- collecting findings ------------------------------------------------------------------


class _Findings:
    """Violations, merged so one record (or slot) gives at most one per kind."""

    def __init__(self) -> None:
        self._items: dict[tuple[Any, ...], tuple[str, str, str | None, int | None, list[str]]] = {}

    def add(self, where: tuple[Any, ...], kind: str, *, job_id: str, exec_id: str | None,
            scheduled_for_ms: int | None, detail: str) -> None:
        key = (kind, *where)
        item = self._items.get(key)
        if item is None:
            self._items[key] = (kind, job_id, exec_id, scheduled_for_ms, [detail])
        elif detail not in item[4]:
            item[4].append(detail)

    def violations(self) -> tuple[Violation, ...]:
        out = [Violation(kind=k, job_id=j, exec_id=e, scheduled_for_ms=s, detail="; ".join(d))
               for k, j, e, s, d in self._items.values()]
        out.sort(key=lambda v: (v.job_id, v.scheduled_for_ms if v.scheduled_for_ms is not None
                                else -1, KINDS.index(v.kind) if v.kind in KINDS else 99,
                                v.exec_id or ""))
        return tuple(out)


# --- executions ---------------------------------------------------------------------------


@dataclass(slots=True)
class _ExecSeen:
    state: str
    attempt: int
    token: int
    max_token: int
    outcomes: dict[int, tuple[str | None, int]]  # attempt -> (outcome, fencing_token)
    permanent_at: int | None  # the first attempt whose outcome was permanent
    permanent_reported: bool = False
    started_by: dict[int, str | None] = field(default_factory=dict)  # attempt -> causation
    rerun_at: int = 0  # the attempt the last rerun started: outcomes before it are judged


def _outcomes(rec: Record) -> dict[int, tuple[str | None, int]]:
    return {int(a["attempt"]): (a.get("outcome"), int(a["fencing_token"]))
            for a in rec.get("attempts") or ()}


def _restarted(rec: Record, prev_state: str, prev_attempt: int) -> bool:
    """A terminal execution legitimately running again: a backfill's rerun (or a DAG run's
    retry) starting a task instance's or an execution's next attempt, or a DAG run retried."""
    event_type = (rec.get("envelope") or {}).get("event_type")
    if event_type == RERUN_STARTED and int(rec["attempt"]) == prev_attempt + 1:
        return prev_state in RERUNNABLE or (rec.get("run_id") is not None
                                            and prev_state in RUN_RETRYABLE)
    return (event_type == RUN_RETRIED and rec.get("dag") is not None
            and prev_state in RUN_RETRYABLE)


def _check_execution(rec: Record, idx: int, seen: _ExecSeen | None, out: _Findings) -> _ExecSeen:
    ex_id, job_id, slot = rec["exec_id"], rec["job_id"], rec["scheduled_for_ms"]
    state, attempt, token = rec["state"], int(rec["attempt"]), int(rec["fencing_token"])
    env = rec.get("envelope") or {}
    event_type, causation = env.get("event_type"), env.get("causation_id")
    outcomes = _outcomes(rec)
    where = ("exec", idx)

    def report(kind: str, detail: str) -> None:
        out.add(where, kind, job_id=job_id, exec_id=ex_id, scheduled_for_ms=slot,
                detail=detail)

    if seen is None:
        seen = _ExecSeen(state=state, attempt=attempt, token=token, max_token=token,
                         outcomes={}, permanent_at=None)
        prev_state: str | None = None
        prev_token: int | None = None
        prev_attempt: int | None = None
    else:
        prev_state, prev_token, prev_attempt = seen.state, seen.token, seen.attempt
        if prev_state in TERMINAL and state != prev_state:
            if _restarted(rec, prev_state, prev_attempt):
                # A backfill or a DAG run's retry ran it again: a new round, judged apart
                # from the old one.
                seen.rerun_at, seen.permanent_at = attempt, None
            elif state not in TERMINAL:
                report(DUPLICATE_TRIGGER,
                       f"terminal {prev_state} execution went back to {state} ({event_type})")
            else:
                report(STALE_TOKEN, f"terminal {prev_state} overwritten by {state}")
        if token < seen.max_token:
            report(STALE_TOKEN, f"{event_type} written with fencing token {token} after token "
                                f"{seen.max_token} ({state})")

    if event_type in ("execution.started", RERUN_STARTED):
        first = seen.started_by.setdefault(attempt, causation)
        if first != causation:
            what = "slot triggered" if attempt == 1 else f"attempt {attempt} dispatched"
            report(DUPLICATE_TRIGGER, f"{what} twice: by {first!r} and by {causation!r}")

    # An attempt's outcome may only be written by the report (or lease expiry) of the attempt
    # that was running, with its token.
    if prev_state is not None:
        for n, (outcome, tok) in outcomes.items():
            before = seen.outcomes.get(n)
            if outcome is None or (before is not None and before[0] == outcome):
                continue
            if not (prev_state == ExecutionStatus.RUNNING and prev_attempt == n
                    and prev_token == tok):
                report(STALE_TOKEN,
                       f"attempt {n} outcome {outcome!r} (token {tok}) recorded while the "
                       f"execution was {prev_state} with token {prev_token}, attempt "
                       f"{prev_attempt}")

    permanent = [n for n, (o, _) in outcomes.items()
                 if o == "permanent" and n >= seen.rerun_at]
    if permanent:
        p = min(permanent)
        seen.permanent_at = p if seen.permanent_at is None else min(seen.permanent_at, p)
    if seen.permanent_at is not None and not seen.permanent_reported and (
            attempt > seen.permanent_at or any(n > seen.permanent_at for n in outcomes)):
        seen.permanent_reported = True
        report(ATTEMPTS_OVER_POLICY,
               f"attempt {attempt} after attempt {seen.permanent_at} failed permanently")

    seen.state, seen.attempt, seen.token = state, attempt, token
    seen.max_token = max(seen.max_token, token)
    seen.outcomes = outcomes
    return seen


# --- jobs: spec versions in force over time -----------------------------------------------


@dataclass(slots=True)
class _Segment:
    """A run of consecutive job states with one retry policy."""

    since_ms: int
    max_attempts: int | None


class _Policy:
    def __init__(self) -> None:
        self.segments: list[_Segment] = []

    def add(self, updated_at_ms: int, max_attempts: int | None) -> None:
        if self.segments and self.segments[-1].max_attempts == max_attempts:
            return
        self.segments.append(_Segment(since_ms=updated_at_ms, max_attempts=max_attempts))

    def allowed(self, created_ms: int, at_ms: int) -> int | None:
        """The most attempts any policy in force from created_ms to at_ms allowed."""
        segs = self.segments
        if not segs:
            return None
        # The policy in force when the execution was created: the last one from strictly
        # before it (one changed in the same millisecond may have come before or after).
        start = 0
        for i, seg in enumerate(segs):
            if seg.since_ms < created_ms:
                start = i
        values = [s.max_attempts for i, s in enumerate(segs)
                  if i == start or (i > start and s.since_ms <= at_ms)]
        known = [v for v in values if v is not None]
        if len(known) != len(values) or not known:
            return None
        return max(known)


def _max_attempts(job: Record) -> int | None:
    try:
        return int(job["spec"]["retry"]["max_attempts"])
    except (KeyError, TypeError, ValueError):
        return None


# --- slots --------------------------------------------------------------------------------


def _next(plan: JobPlan, after_ms: int) -> Slot | None:
    return _next_slot(plan.schedule, plan.dst, plan.start_at_ms, plan.end_at_ms, after_ms)


@lru_cache(maxsize=65_536)
def _next_slot(schedule: Schedule, dst: DstPolicy, start_at_ms: int | None,
               end_at_ms: int | None, after_ms: int) -> Slot | None:
    # Keyed by what decides the slots, not by the plan: a DAG job's plan holds its tasks'
    # targets (dicts), which do not hash.
    return bounded_next_slot(schedule, after_ms=after_ms, dst=dst, start_at_ms=start_at_ms,
                             end_at_ms=end_at_ms)


class _Plans:
    """plan_of per job state, reused while the spec does not change."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[Any, JobPlan | None]] = {}
        self.bad: set[tuple[str, int]] = set()

    def of(self, job: Record) -> JobPlan | None:
        spec = job.get("spec")
        last = self._last.get(job["job_id"])
        if last is not None and last[0] == spec:
            return last[1]
        try:
            plan: JobPlan | None = plan_of(spec) if isinstance(spec, dict) else None
        except PermanentError:
            plan = None
        if plan is None:
            self.bad.add((job["job_id"], int(job.get("version", 0))))
        self._last[job["job_id"]] = (spec, plan)
        return plan


@dataclass(slots=True)
class _SlotCheck:
    job_id: str
    slots: dict[tuple[str, int], set[str]]
    now_ms: int
    grace_ms: int
    max_slots: int
    final: Record
    findings: _Findings
    retention: _Retention
    checked: set[int] = field(default_factory=set)
    reported: set[int] = field(default_factory=set)
    enumerated: int = 0
    truncated: bool = False

    def judge_pair(self, plan: JobPlan, a: Record, b: Record) -> None:
        """Slots of a's spec that the transition to b shows were passed."""
        start = a.get("next_run_at_ms")
        if start is None or a.get("status") not in JobStatus.LIVE:
            return
        b_next: int | None = b.get("next_run_at_ms")
        # Same spec and still armed: the series goes on from b's armed slot.
        same_series = b.get("version") == a.get("version") and b_next is not None
        cursor = b.get("cursor_ms")
        changed_at = int(b.get("updated_at_ms", 0))
        paced_until: int | None = None
        if (same_series and (b.get("envelope") or {}).get("event_type") == "job.slot_fired"
                and plan.misfire.kind == MisfireKind.FIRE_ALL):
            paced_until = changed_at + plan.misfire.fire_all_cap * PACE_MS
        slot = _next(plan, int(start) - 1)
        while slot is not None and not self.truncated:
            s = slot.scheduled_for_ms
            if b_next is not None and same_series:
                if s >= b_next:
                    break
            else:
                due = apply_jitter(s, jitter_s=plan.jitter_s, job_id=self.job_id)
                by_cursor = cursor is not None and s <= cursor
                by_time = due <= changed_at - self.grace_ms
                if not by_cursor and not by_time:
                    if (cursor is None or s > cursor) and s > changed_at - self.grace_ms:
                        break
                    slot = _next(plan, s)
                    continue
            if s > self.now_ms - self.grace_ms:
                break
            self._judge(s, paced_until, b)
            slot = _next(plan, s)

    def _judge(self, s: int, paced_until: int | None, b: Record) -> None:
        self.enumerated += 1
        if self.enumerated > self.max_slots:
            self.truncated = True
            return
        self.checked.add(s)
        if self.slots.get((self.job_id, s)) or s in self.reported:
            return
        if self.retention.gone(slot_exec_id(self.job_id, s), s):
            self.retention.expired.add(("slot", self.job_id, s))
            return  # its record was removed by history retention, not lost
        alive = self.final.get("status") != JobStatus.DELETED
        if alive and self.final.get("queued_slot_ms") == s:
            return  # buffered by overlap=queue; starts when the running one finishes
        if alive and paced_until is not None and self.now_ms < paced_until + self.grace_ms:
            return  # a fire_all misfire paced it; its timer may not have fired yet
        self.reported.add(s)
        b_env = b.get("envelope") or {}
        self.findings.add(("slot", self.job_id, s), LOST_SLOT, job_id=self.job_id,
                          exec_id=None, scheduled_for_ms=s,
                          detail=f"no execution record; the job passed it with "
                                 f"{b_env.get('event_type')} at {iso(b.get('updated_at_ms'))} "
                                 f"(version {b.get('version')})")


def _virtual_creation(first: Record, plan: JobPlan) -> Record | None:
    """The creation state of a job whose first visible state is a later one (compaction)."""
    if first.get("version") != 1 or (first.get("envelope") or {}).get("event_type") == \
            "job.created":
        return None
    created = int(first["created_at_ms"])
    after = -1 if isinstance(plan.schedule, OneOffSchedule) else created - 1
    slot = _next(plan, after)
    return {**first, "status": JobStatus.ACTIVE, "cursor_ms": None, "updated_at_ms": created,
            "next_run_at_ms": slot.scheduled_for_ms if slot else None,
            "envelope": {**(first.get("envelope") or {}), "event_type": "job.created"}}


# --- DAG runs and task instances ----------------------------------------------------------


def _dag_raw(target: Any) -> Any:
    """The ``kron.DagTarget`` record of a job's target; None for any other target."""
    if isinstance(target, tuple):
        return target[1] if str(target[0]).endswith("DagTarget") else None
    return target if isinstance(target, dict) and "tasks" in target else None


@dataclass(slots=True)
class _DagSpec:
    since_ms: int
    plan: DagPlan | None  # None: not a DAG then, or a DAG that does not parse
    ids: tuple[str, ...]


class _DagSpecs:
    """Each DAG job's DAG over time (parsed once per change), and each task's retry limit."""

    def __init__(self) -> None:
        self._specs: dict[str, list[_DagSpec]] = defaultdict(list)
        self._last: dict[str, tuple[Any, Any]] = {}
        self.policy: dict[tuple[str, str], _Policy] = defaultdict(_Policy)
        self.bad: set[tuple[str, int]] = set()

    def add(self, job: Record) -> None:
        spec = job.get("spec")
        raw = _dag_raw(spec.get("target")) if isinstance(spec, dict) else None
        job_id = job["job_id"]
        if raw is None and job_id not in self._last:
            return  # never a DAG job: one look at its target
        key = (raw, spec.get("retry") if isinstance(spec, dict) else None)
        if self._last.get(job_id) == key:
            return
        self._last[job_id] = key
        since = int(job.get("updated_at_ms", 0))
        plan = self._parse(job, raw)
        ids = tuple(t.task_id for t in plan.tasks) if plan is not None else ()
        self._specs[job_id].append(_DagSpec(since_ms=since, plan=plan, ids=ids))
        if plan is not None:
            job_max = _max_attempts(job)
            for t in plan.tasks:
                limit = t.retry.max_attempts if t.retry is not None else job_max
                self.policy[(job_id, t.task_id)].add(since, limit)

    def _parse(self, job: Record, raw: Any) -> DagPlan | None:
        if raw is None:
            return None
        try:
            return parse_dag(raw)
        except (PermanentError, KeyError, TypeError, ValueError):
            self.bad.add((job["job_id"], int(job.get("version", 0))))
            return None

    def plan_for(self, job_id: str, ids: tuple[str, ...], at_ms: int) -> DagPlan | None:
        """The DAG with these task ids written last at or before at_ms, else any with them."""
        fallback: DagPlan | None = None
        for spec in reversed(self._specs.get(job_id, ())):
            if spec.plan is None or spec.ids != ids:
                continue
            if spec.since_ms <= at_ms:
                return spec.plan
            fallback = spec.plan
        return fallback


@dataclass(slots=True)
class _RunSeen:
    job_id: str
    scheduled_for_ms: int
    states: dict[str, str]


@dataclass(slots=True)
class _AttemptSeen:
    worker: str | None
    started_at_ms: int | None
    closed: bool


@dataclass(slots=True)
class _TaskSeen:
    run_id: str
    task_id: str
    job_id: str
    scheduled_for_ms: int
    attempts: dict[int, _AttemptSeen] = field(default_factory=dict)
    reruns: set[int] = field(default_factory=set)
    over_reported: bool = False


def _count_parents(plan: DagPlan, i: int, states: dict[str, str]) -> dict[str, int]:
    counts = {"pending": 0, "succeeded": 0, "failed": 0, "skipped": 0}
    for p in plan.parents[i]:
        s = states.get(plan.tasks[p].task_id)
        if s == TaskState.SUCCEEDED or s == TaskState.SKIPPED:
            counts[s] += 1
        elif s in TaskState.BAD:
            counts["failed"] += 1
        else:
            counts["pending"] += 1
    return counts


class _DagCheck:
    """The DAG checks, fed every execution record in order; the cross-record ones at the
    end (a task instance may be read before its run: their keys interleave freely)."""

    def __init__(self, specs: _DagSpecs, findings: _Findings) -> None:
        self._specs = specs
        self._out = findings
        self.runs: dict[str, _RunSeen] = {}
        self._tasks: dict[str, _TaskSeen] = {}
        self._slot_runs: dict[tuple[str, int], set[str]] = defaultdict(set)
        self.notes: list[str] = []
        self._noted: set[str] = set()

    @property
    def task_count(self) -> int:
        return len(self._tasks)

    def forget(self, ex_id: str) -> None:
        """A tombstone (history retention): a later record of the id starts afresh. The
        run's task instances stay known for the orphan check (their run was seen)."""
        self._tasks.pop(ex_id, None)

    def see(self, rec: Record, idx: int) -> None:
        if rec.get("dag") is not None:
            self._run(rec, idx)
        elif rec.get("run_id") is not None:
            self._task(rec, idx)

    def _add(self, where: tuple[Any, ...], kind: str, rec: Record | _TaskSeen | _RunSeen,
             ex_id: str | None, detail: str) -> None:
        if isinstance(rec, dict):
            job_id, slot = rec["job_id"], rec["scheduled_for_ms"]
        else:
            job_id, slot = rec.job_id, rec.scheduled_for_ms
        self._out.add(where, kind, job_id=job_id, exec_id=ex_id, scheduled_for_ms=slot,
                      detail=detail)

    # --- runs ---------------------------------------------------------------------------

    def _run(self, rec: Record, idx: int) -> None:
        ex_id, job_id, slot = rec["exec_id"], rec["job_id"], int(rec["scheduled_for_ms"])
        states = {t["task_id"]: str(t["state"]) for t in rec["dag"].get("tasks") or ()}
        prev = self.runs.get(ex_id)
        before = prev.states if prev is not None else {}
        started = [t for t, s in states.items()
                   if s == TaskState.RUNNING and before.get(t) != TaskState.RUNNING]
        if started:
            self._judge_rules(rec, idx, states, started)
        if rec["state"] in RUN_ENDS:
            self._judge_end(rec, states)
        if rec.get("trigger") in SLOT_TRIGGERS:
            self._slot_runs[(job_id, slot)].add(ex_id)
            if ex_id != slot_exec_id(job_id, slot):
                self._add(("run-id", ex_id), DAG_ONE_RUN_PER_SLOT, rec, ex_id,
                          f"a {rec.get('trigger')} run's id is not the slot's execution id "
                          f"{slot_exec_id(job_id, slot)!r}")
        self.runs[ex_id] = _RunSeen(job_id=job_id, scheduled_for_ms=slot, states=states)

    def _judge_rules(self, rec: Record, idx: int, states: dict[str, str],
                     started: list[str]) -> None:
        """Each newly running task's trigger rule on its parents in this same record."""
        plan = self._specs.plan_for(rec["job_id"], tuple(states), int(rec["updated_at_ms"]))
        if plan is None:
            self._note(rec["job_id"], f"{rec['job_id']}: no DAG in the job's recorded specs "
                       f"has the tasks of run {rec['exec_id']} (and maybe others); their "
                       "trigger rules were not judged")
            return
        for task_id in started:
            i = plan.index[task_id]
            task = plan.tasks[i]
            counts = _count_parents(plan, i, states)
            said = verdict(task.rule, total=len(task.depends_on), **counts)
            if said != Verdict.RUN:
                parents = ", ".join(f"{p}={states.get(p)}" for p in task.depends_on)
                event_type = (rec.get("envelope") or {}).get("event_type")
                self._add(("exec", idx), DAG_RULE_HELD, rec, rec["exec_id"],
                          f"task {task_id!r} started ({event_type}) while its parents were "
                          f"{parents}: trigger rule {task.rule} says {said}")

    def _judge_end(self, rec: Record, states: dict[str, str]) -> None:
        state = rec["state"]
        where = ("run-end", rec["exec_id"])
        open_ = [f"{t}={s}" for t, s in states.items() if s not in TaskState.FINAL]
        bad = [f"{t}={s}" for t, s in states.items() if s in TaskState.BAD]
        if open_:
            self._add(where, DAG_FINAL_STATES, rec, rec["exec_id"],
                      f"run ended {state} with tasks not final: {', '.join(open_)}")
        if state == ExecutionStatus.SUCCEEDED and bad:
            self._add(where, DAG_FINAL_STATES, rec, rec["exec_id"],
                      f"run ended succeeded with {', '.join(bad)}")
        if state == ExecutionStatus.FAILED and not bad and not open_:
            self._add(where, DAG_FINAL_STATES, rec, rec["exec_id"],
                      "run ended failed but no task failed, was upstream_failed or cancelled")

    def _note(self, key: str, text: str) -> None:
        if key not in self._noted:
            self._noted.add(key)
            self.notes.append(text)

    # --- task instances -------------------------------------------------------------------

    def _task(self, rec: Record, idx: int) -> None:
        ex_id = rec["exec_id"]
        seen = self._tasks.get(ex_id)
        if seen is None:
            seen = self._tasks[ex_id] = _TaskSeen(
                run_id=rec["run_id"], task_id=str(rec.get("task_id")), job_id=rec["job_id"],
                scheduled_for_ms=int(rec["scheduled_for_ms"]))
        attempt = int(rec["attempt"])
        if (rec.get("envelope") or {}).get("event_type") == RERUN_STARTED:
            seen.reruns.add(attempt)
        problems = [p for a in rec.get("attempts") or () if (p := _restart(seen, a))]
        numbers = [int(a["attempt"]) for a in rec.get("attempts") or ()]
        if numbers != list(range(1, len(numbers) + 1)) or attempt != len(numbers):
            problems.append(f"attempt numbers {numbers} with attempt {attempt}: not 1..n")
        if not seen.over_reported:
            allowed = self._specs.policy[(rec["job_id"], seen.task_id)].allowed(
                int(rec["created_at_ms"]), int(rec["updated_at_ms"]))
            if allowed is not None and attempt > allowed + len(seen.reruns):
                seen.over_reported = True
                problems.append(f"attempt {attempt} but task {seen.task_id!r} allows {allowed} "
                                f"(retry.max_attempts) + {len(seen.reruns)} re-run(s)")
        for detail in problems:
            self._add(("exec", idx), DAG_NO_DOUBLE_START, rec, ex_id, detail)

    # --- across records -------------------------------------------------------------------

    def finish(self, retention: _Retention) -> None:
        for (job_id, s), ids in self._slot_runs.items():
            if len(ids) > 1:
                self._out.add(("slot", job_id, s), DAG_ONE_RUN_PER_SLOT, job_id=job_id,
                              exec_id=None, scheduled_for_ms=s,
                              detail=f"{len(ids)} runs for one slot: {sorted(ids)}")
        for ex_id, task in self._tasks.items():
            run = self.runs.get(task.run_id)
            if run is None and retention.gone(task.run_id, task.scheduled_for_ms):
                retention.expired.add(("task", ex_id))
                continue  # its run went by history retention (first: see retention.py)
            if run is None:
                why = f"run_id {task.run_id!r} names no DAG run record"
            elif task.task_id not in run.states:
                why = f"run {task.run_id!r} has no task {task.task_id!r}"
            elif ex_id != task_exec_id(task.run_id, task.task_id):
                why = f"its id is not task_exec_id({task.run_id!r}, {task.task_id!r})"
            else:
                continue
            self._add(("orphan", ex_id), DAG_ORPHAN_TASK, task, ex_id, why)


def _restart(seen: _TaskSeen, a: Record) -> str | None:
    """What is wrong with this view of one attempt, given the earlier views of it."""
    n, worker, started = int(a["attempt"]), a.get("worker"), a.get("started_at_ms")
    is_open = a.get("outcome") is None
    before = seen.attempts.get(n)
    if before is None:
        seen.attempts[n] = _AttemptSeen(worker=worker, started_at_ms=started,
                                        closed=not is_open)
        return None
    problem = None
    if worker != before.worker or (started != before.started_at_ms
                                   and (is_open or before.closed)):
        problem = (f"attempt {n} started twice: by {before.worker} at "
                   f"{iso(before.started_at_ms)} and by {worker} at {iso(started)}")
    elif is_open and before.closed:
        problem = f"attempt {n} open again after it ended"
    if not is_open and not before.closed:  # its report closes it, and may set its start
        before.closed, before.started_at_ms = True, started
    return problem


# --- the audit ----------------------------------------------------------------------------


def audit(jobs: Iterable[Record], executions: Iterable[Record], *, now_ms: int,
          grace_ms: int = DEFAULT_GRACE_MS, max_slots: int = MAX_SLOTS_PER_JOB,
          history_ms: int = 0) -> AuditReport:
    """`history_ms`: the deployment's history window (KRON_HISTORY_DAYS); 0 when retention
    is off, and then every missing record counts (see the module's note)."""
    findings = _Findings()
    retention = _Retention(horizon_ms=now_ms - history_ms + FIRE_AHEAD_MAX_MS
                           if history_ms else None)
    # Jobs first: the lost-slot check needs every execution, so it runs last.
    dags = _DagSpecs()
    states, policy, n_jobs = _read_jobs(jobs, findings, dags)
    dag = _DagCheck(dags, findings)
    slots, n_execs = _read_executions(executions, policy, findings, dag, retention)
    dag.finish(retention)
    for (job_id, s), ids in slots.items():
        # Two DAG runs for a slot are dag.one_run_per_slot's.
        if len(ids) > 1 and not all(i in dag.runs for i in ids):
            findings.add(("slot", job_id, s), DUPLICATE_TRIGGER, job_id=job_id, exec_id=None,
                         scheduled_for_ms=s,
                         detail=f"{len(ids)} executions for one slot: {sorted(ids)}")
    checked, truncated, notes = _judge_slots(states, slots, findings, now_ms=now_ms,
                                             grace_ms=grace_ms, max_slots=max_slots,
                                             retention=retention)
    notes += dag.notes
    notes += [f"{job_id}: the DAG of spec version {version} does not parse; its runs' trigger "
              "rules were not judged" for job_id, version in sorted(dags.bad)]
    return AuditReport(violations=findings.violations(), jobs=n_jobs, executions=n_execs,
                       slots_checked=checked, truncated=tuple(truncated), notes=tuple(notes),
                       dag_runs=len(dag.runs), task_instances=dag.task_count,
                       expired=len(retention.expired))


def _read_jobs(jobs: Iterable[Record], findings: _Findings, dags: _DagSpecs
               ) -> tuple[dict[str, list[Record]], dict[str, _Policy], int]:
    """Each job's history in order, its retry policy over time; a cursor that moved back."""
    states: dict[str, list[Record]] = defaultdict(list)
    policy: dict[str, _Policy] = defaultdict(_Policy)
    n_jobs = 0
    for idx, job in enumerate(jobs):
        n_jobs += 1
        job_id = job["job_id"]
        history = states[job_id]
        if history:
            prev = history[-1]["cursor_ms"]
            cur = job.get("cursor_ms")
            if prev is not None and (cur is None or cur < prev):
                findings.add(("job", idx), CURSOR_BACKWARDS, job_id=job_id, exec_id=None,
                             scheduled_for_ms=cur,
                             detail=f"cursor moved back from {iso(prev)} to {iso(cur)} "
                                    f"({(job.get('envelope') or {}).get('event_type')})")
        history.append(job)
        policy[job_id].add(int(job.get("updated_at_ms", 0)), _max_attempts(job))
        dags.add(job)
    return states, policy, n_jobs


def _read_executions(executions: Iterable[Record], policy: dict[str, _Policy],
                     findings: _Findings, dag: _DagCheck, retention: _Retention
                     ) -> tuple[dict[tuple[str, int], set[str]], int]:
    """Every execution's transitions checked; the executions of each slot (a DAG task
    instance shares its run's slot and is not one); attempts past the job's retry policy (a
    rerun's own attempt allowed; a task instance's are judged by its task's, in _DagCheck)."""
    seen: dict[str, _ExecSeen] = {}
    slots: dict[tuple[str, int], set[str]] = defaultdict(set)
    over_policy: set[str] = set()
    reruns: dict[str, int] = {}  # exec_id -> the attempt its last rerun started
    n_execs = 0
    for idx, rec in enumerate(executions):
        ex_id = rec["exec_id"]
        if rec.get(TOMBSTONE):
            # Gone by retention: a record of the id after this is a new life.
            retention.tombstoned.add(ex_id)
            seen.pop(ex_id, None)
            reruns.pop(ex_id, None)
            over_policy.discard(ex_id)
            dag.forget(ex_id)
            continue
        n_execs += 1
        seen[ex_id] = _check_execution(rec, idx, seen.get(ex_id), findings)
        dag.see(rec, idx)
        if rec.get("run_id") is not None:
            continue
        if rec.get("trigger") in SLOT_TRIGGERS:
            slots[(rec["job_id"], int(rec["scheduled_for_ms"]))].add(ex_id)
        if (rec.get("envelope") or {}).get("event_type") == RERUN_STARTED:
            reruns[ex_id] = int(rec["attempt"])
        if ex_id not in over_policy and rec["job_id"] in policy:
            allowed = policy[rec["job_id"]].allowed(int(rec["created_at_ms"]),
                                                    int(rec["updated_at_ms"]))
            if allowed is not None:
                allowed = max(allowed, reruns.get(ex_id, 0))
            if allowed is not None and int(rec["attempt"]) > allowed:
                over_policy.add(ex_id)
                findings.add(("exec", idx), ATTEMPTS_OVER_POLICY, job_id=rec["job_id"],
                             exec_id=ex_id, scheduled_for_ms=rec["scheduled_for_ms"],
                             detail=f"attempt {rec['attempt']} but retry.max_attempts is "
                                    f"{allowed}")
    return slots, n_execs


def _judge_slots(states: dict[str, list[Record]], slots: dict[tuple[str, int], set[str]],
                 findings: _Findings, *, now_ms: int, grace_ms: int, max_slots: int,
                 retention: _Retention) -> tuple[int, list[str], list[str]]:
    """Every slot each job's specs made due, judged against the executions found."""
    notes: list[str] = []
    plans = _Plans()
    checked = 0
    truncated: list[str] = []
    for job_id, history in states.items():
        check = _SlotCheck(job_id=job_id, slots=slots, now_ms=now_ms, grace_ms=grace_ms,
                           max_slots=max_slots, final=history[-1], findings=findings,
                           retention=retention)
        first_plan = plans.of(history[0])
        virtual = _virtual_creation(history[0], first_plan) if first_plan else None
        if virtual is not None and first_plan is not None:
            check.judge_pair(first_plan, virtual, history[0])
        elif history[0].get("version") != 1 and \
                (history[0].get("envelope") or {}).get("event_type") != "job.created":
            notes.append(f"{job_id}: history before version {history[0].get('version')} is "
                         "compacted away; its slots were not judged")
        for a, b in _pairs(history):
            plan = plans.of(a)
            if plan is not None:
                check.judge_pair(plan, a, b)
        checked += len(check.checked)
        if check.truncated:
            truncated.append(job_id)
    for job_id, version in sorted(plans.bad):
        notes.append(f"{job_id}: spec of version {version} does not parse; its slots were "
                     "not judged")
    return checked, truncated, notes


def _pairs(history: list[Record]) -> Iterator[tuple[Record, Record]]:
    for i in range(1, len(history)):
        yield history[i - 1], history[i]


__all__ = ["DAG_KINDS", "KINDS", "TOMBSTONE", "AuditReport", "Violation", "audit", "iso",
           "tombstone"]

