"""DAG runs in the partition core: a run's progress kept, its tasks released and settled.

A DAG run is the execution record of its slot (so overlap, misfire, pause, delete and
backfill treat it as any execution), holding each task's progress (`dag.tasks`, in the DAG's
order). Each task that runs is a task instance: an execution of its own, with the run's
job id (so the same partition and owner), `run_id` and `task_id`, its id derived from both,
and attempts, leases, retries and fencing as any execution has. The rules deciding which
task runs next are streams.domain.dag's; this module only applies its answers to state.

Write order, within one event: the run record goes before the task instances it starts,
and a task instance's end goes before the run record that takes it in. Both live in the
executions changelog (one partition, one producer), so a durable later write implies the
earlier ones. A crash can so leave a run that names a task running with no instance (its
start was lost), or a task instance ended that its run still calls running (the run write
was lost); `mend` finds both when the event comes again, and a redelivered report of the
ended instance (now stale) brings the core here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, cast

from streams.domain import dag
from streams.domain.dag import Changes, TaskState
from streams.domain.errors import PermanentError
from streams.domain.ids import task_exec_id
from streams.domain.policies import RetryPolicy
from streams.domain.schedule import Slot
from streams.domain.states import ExecutionStatus
from streams.engine.records import (
    DagRunProgress,
    ExecutionRecord,
    JobRecord,
    TaskProgressRecord,
)
from streams.engine.spec import JobPlan, branch

if TYPE_CHECKING:
    from streams.engine.core import Context, PartitionCore

RUNNING: Final = ExecutionStatus.RUNNING
SUCCEEDED: Final = ExecutionStatus.SUCCEEDED
FAILED: Final = ExecutionStatus.FAILED
CANCELLED: Final = ExecutionStatus.CANCELLED
TERMINAL: Final = ExecutionStatus.TERMINAL
ACTIVE: Final = ExecutionStatus.ACTIVE
# A task instance's end, as the run's progress records it.
TASK_END: Final = {SUCCEEDED: TaskState.SUCCEEDED, FAILED: TaskState.FAILED,
                   CANCELLED: TaskState.CANCELLED}
# A run that ended this way may be retried (RetryRun, or a backfill's rerun).
RETRYABLE: Final = frozenset({FAILED, CANCELLED})


def is_run(ex: ExecutionRecord) -> bool:
    return ex.get("dag") is not None


def is_task(ex: ExecutionRecord) -> bool:
    return ex.get("run_id") is not None


def task_of(plan: JobPlan, task_id: str) -> dag.DagTask:
    assert plan.dag is not None
    return plan.dag.tasks[plan.dag.index[task_id]]


def task_target(plan: JobPlan, task_id: str) -> Any:
    """The task's target as its Dispatch carries it; the task's timeout_s, if set, wins."""
    task = task_of(plan, task_id)
    target = branch(task.target)
    if task.timeout_s is not None and "topic" not in target:
        target = {**target, "timeout_s": task.timeout_s}
    return target


def retry_of(plan: JobPlan, ex: ExecutionRecord) -> RetryPolicy:
    """A task instance's retry policy: its task's, else the job's."""
    task_id = ex.get("task_id")
    if task_id is None or plan.dag is None or task_id not in plan.dag.index:
        return plan.retry
    return task_of(plan, task_id).retry or plan.retry


class DagRuns:
    """The core's DAG-run decisions. Holds no state: everything is in the store."""

    def __init__(self, core: PartitionCore) -> None:
        self._core = core
        self._store = core.store

    # --- a run starts, moves on and ends ----------------------------------------------------

    def start(self, job: JobRecord, plan: JobPlan, run: ExecutionRecord, ctx: Context) -> None:
        """A new run (its record not saved yet): release its roots."""
        assert plan.dag is not None
        run["state"] = RUNNING
        run["worker"] = ctx.worker
        progress = dag.new_progress(plan.dag)
        self._apply(job, plan, run, progress, dag.start_run(plan.dag, progress), ctx,
                    event_type="dag_run.started")

    def task_done(self, job: JobRecord, task: ExecutionRecord, ctx: Context) -> None:
        """A task instance ended (its record saved): the run takes it in."""
        # A task instance names its run and its task (see _start_task).
        run_id, task_id = cast(str, task["run_id"]), cast(str, task["task_id"])
        run = self._store.execution(run_id)
        plan = self._core._plan(job)
        if run is None or run["state"] != RUNNING or plan.dag is None:
            return  # the run ended first (cancelled): the task's end changes nothing
        progress = _progress(run)
        if task["state"] == FAILED and run["last_error"] is None:
            run["last_error"] = f"task {task_id}: {task['last_error']}"
        changes = dag.task_finished(plan.dag, progress, task_id,
                                    TASK_END[task["state"]], task["reason"])
        self._apply(job, plan, run, progress, changes, ctx, event_type="dag_run.progressed")

    def cancel(self, job: JobRecord, run: ExecutionRecord, ctx: Context, *, reason: str) -> None:
        """Cancel a running run: its running task instances are cancelled and fenced, its
        unstarted tasks skipped with the reason, the run ends `cancelled`."""
        plan = self._core._plan(job)
        if plan.dag is None or run["dag"] is None:
            return
        progress = _progress(run)
        running, _ = dag.cancel_run(plan.dag, progress, reason)
        for task_id in running:
            task = self._store.execution(task_exec_id(run["exec_id"], task_id))
            if task is not None and task["state"] in ACTIVE:
                self._core._stop_attempt(task, ctx, reason=reason)
        _keep_progress(run, progress)
        run["state"] = CANCELLED
        run["reason"] = reason
        self._core._finish(job, run, ctx, "dag_run.cancelled")

    def retry(self, job: JobRecord, run: ExecutionRecord, ctx: Context) -> None:
        """Run a finished run's failed, upstream_failed and cancelled tasks again, and those
        downstream of them; tasks that succeeded keep their result."""
        plan = self._core._plan(job)
        if plan.dag is None or run["dag"] is None or run["state"] not in RETRYABLE:
            raise PermanentError(f"run {run['exec_id']!r} is {run['state']}: only a failed or "
                                 f"cancelled DAG run can be retried", field="run_id")
        progress = _progress(run)
        changes = dag.retry_run(plan.dag, progress)
        run["state"] = RUNNING
        run["reason"] = None
        run["last_error"] = None
        if run["exec_id"] not in job["running"]:
            job["running"].append(run["exec_id"])
        self._apply(job, plan, run, progress, changes, ctx, event_type="dag_run.retried")

    def _apply(self, job: JobRecord, plan: JobPlan, run: ExecutionRecord,
               progress: list[dict[str, Any]], changes: Changes, ctx: Context, *,
               event_type: str) -> None:
        """Save the run with its progress, then start what the rules released (see the
        module's note on order)."""
        _keep_progress(run, progress)
        outcome = dag.run_state(progress)
        if outcome is not None:
            run["state"] = SUCCEEDED if outcome == TaskState.SUCCEEDED else FAILED
            self._core._finish(job, run, ctx, f"dag_run.{run['state']}")
        else:
            self._core._save_exec(ctx, run, event_type)
        for task_id in changes.start:
            self._start_task(job, plan, run, task_id, ctx)

    def _start_task(self, job: JobRecord, plan: JobPlan, run: ExecutionRecord, task_id: str,
                    ctx: Context) -> None:
        """The check-and-set of a task instance: a new one starts its first attempt; one
        running already (the event came again) keeps running, watched; one that ended starts
        its next attempt (the same Idempotency-Key).

        A released task was pending in the run's durable record, so an instance of it that
        ended did so in an earlier round of the run: a retry of the run reset it. It can't
        be this round's end that a crash kept from the run: the run write that released
        the task comes before the instance's start in the changelog, so an instance started
        this round implies a durable run record that calls the task running (`mend` takes
        such an end in)."""
        ex_id = task_exec_id(run["exec_id"], task_id)
        task = self._store.execution(ex_id)
        if task is None:
            slot = Slot(scheduled_for_ms=run["scheduled_for_ms"], dst_outcome=run["dst_outcome"])
            task = self._core._new_execution(job, ex_id, slot, ctx, trigger=run["trigger"])
            task["due_at_ms"] = run["due_at_ms"]
            task["run_id"] = run["exec_id"]
            task["task_id"] = task_id
            self._core._begin_attempt(job, plan, task, ctx)
        elif task["state"] in ACTIVE:
            self._core._rearm(task, ctx)
        else:
            task["reason"] = None
            self._core._begin_attempt(job, plan, task, ctx, event_type="execution.rerun_started")

    # --- repair ------------------------------------------------------------------------------

    def mend(self, job: JobRecord, run: ExecutionRecord, ctx: Context) -> None:
        """A running run whose event came again, or whose task's report came again: start
        each task it calls running that has no instance, and take in each instance that
        ended without the run knowing (see the module's note). Nothing when state is whole."""
        plan = self._core._plan(job)
        if plan.dag is None or run["state"] != RUNNING or run["dag"] is None:
            return
        progress = _progress(run)
        missing: list[str] = []
        ended: list[tuple[str, tuple[TaskState, str | None]]] = []
        for entry in progress:
            if entry["state"] != TaskState.RUNNING:
                continue
            task = self._store.execution(task_exec_id(run["exec_id"], entry["task_id"]))
            if task is None:
                missing.append(entry["task_id"])
            elif task["state"] in TASK_END:
                ended.append((entry["task_id"], (TASK_END[task["state"]], task["reason"])))
            else:
                self._core._rearm(task, ctx)
        for task_id in missing:
            self._start_task(job, plan, run, task_id, ctx)
        if ended:
            changes = [dag.task_finished(plan.dag, progress, t, *end) for t, end in ended]
            merged = Changes(start=tuple(t for c in changes for t in c.start),
                             settled=tuple(s for c in changes for s in c.settled))
            self._apply(job, plan, run, progress, merged, ctx, event_type="dag_run.progressed")


# A run's progress is a list of kron.TaskProgress records (TaskProgressRecord) in its
# execution record, and the list of mutable dicts that streams.domain.dag changes: the same
# objects, typed one way or the other at these two functions.


def _progress(run: ExecutionRecord) -> list[dict[str, Any]]:
    """A copy of the run's progress to change: saved records are never changed in place
    (streams.engine.store.copy_record says why)."""
    # A DAG run's record holds its progress (runs.start wrote it before anything ran).
    tasks = cast(DagRunProgress, run["dag"])["tasks"]
    return [dict(entry) for entry in tasks]


def _keep_progress(run: ExecutionRecord, progress: list[dict[str, Any]]) -> None:
    """Put the changed progress in the run's record (the caller saves it)."""
    run["dag"] = {"tasks": cast("list[TaskProgressRecord]", progress)}
