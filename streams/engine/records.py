"""The records the partition core reads and writes, typed as the dicts they are.

Each TypedDict here has exactly the fields of the latest version of its Avro schema (the
schema named in its docstring; tests/unit/test_records_typed.py holds the two together), so
a decoded record of that schema is one of these. They are types only: at run time a record
is the plain dict the codec decoded or the core built, so reading one costs what reading a
dict costs (the store's record cache and copy_record rely on plain dicts, and a dataclass
per read would cost more than a decode's fifth).

Fields with an Avro default are required all the same: a decoded record always has them,
and the core writes every field.

Enum fields are typed as kron's StrEnums (streams.domain.states, streams.domain.dag,
streams.domain.retry). A record decoded from Avro holds the plain strings, which compare and
hash as the members do; write members or plain values alike. An attempt's `outcome` is an
Avro *string*, which the compiled writer takes only as `str` itself: it is typed `str`, and
takes AttemptOutcome.X.value (see streams.domain.states).

A job's `spec` (kron.JobSpec) stays `dict[str, Any]`: a record of named unions (schedule,
target) and nested policies that streams.engine.spec.plan_of parses and checks, and which
the core otherwise only carries (it reads `target` and `jitter_s` through the plan).
"""

from __future__ import annotations

from typing import Any, TypedDict

from schemas.envelope import Envelope
from streams.domain.dag import TaskState
from streams.domain.retry import ErrorClass
from streams.domain.states import ExecutionStatus, JobStatus, Trigger

# kron.Envelope, the first field of every record (schemas.envelope.make_envelope builds one).
EnvelopeRecord = Envelope
# kron.JobSpec: see the module's note.
JobSpec = dict[str, Any]


# --- state ------------------------------------------------------------------------------------


class JobRecord(TypedDict):
    """kron.state.JobState: a job, as the jobs table holds it."""

    envelope: EnvelopeRecord
    job_id: str
    version: int
    status: JobStatus
    spec: JobSpec
    created_at_ms: int
    updated_at_ms: int
    next_run_at_ms: int | None
    cursor_ms: int | None
    applied_command_ids: list[str]
    idempotency_key: str | None
    owner_epoch: int
    running: list[str]
    queued_slot_ms: int | None


class AttemptRecord(TypedDict):
    """kron.Attempt: one attempt of an execution (ExecutionRecord.attempts)."""

    attempt: int
    fencing_token: int
    worker: str
    started_at_ms: int
    finished_at_ms: int | None
    outcome: str | None  # an AttemptOutcome's value, as a plain str (see the module's note)
    status_code: int | None
    error: str | None
    output: str | None  # what the target gave back, bounded (streams.output)


class TaskProgressRecord(TypedDict):
    """kron.TaskProgress: one task's progress in a DAG run (streams.domain.dag)."""

    task_id: str
    state: TaskState
    pending: int
    succeeded: int
    failed: int
    skipped: int
    reason: str | None


class DagRunProgress(TypedDict):
    """kron.DagRunProgress: a DAG run's progress, one entry per task in the DAG's order."""

    tasks: list[TaskProgressRecord]


class ExecutionRecord(TypedDict):
    """kron.executions.ExecutionState: an execution (a slot's run, a DAG run, or a DAG
    task instance), as the executions table holds it."""

    envelope: EnvelopeRecord
    exec_id: str
    job_id: str
    scheduled_for_ms: int
    owner_epoch: int
    state: ExecutionStatus
    trigger: Trigger
    attempt: int
    fencing_token: int
    due_at_ms: int
    worker: str | None
    lease_until_ms: int | None
    retry_at_ms: int | None
    dst_outcome: str | None
    reason: str | None
    last_error: str | None
    status_code: int | None
    attempts: list[AttemptRecord]
    created_at_ms: int
    updated_at_ms: int
    run_id: str | None  # a DAG task instance: its run's exec id, and its task
    task_id: str | None
    dag: DagRunProgress | None  # a DAG run: its tasks' progress


# --- commands ---------------------------------------------------------------------------------


class _JobCommand(TypedDict):
    """The fields every command on one job opens with."""

    envelope: EnvelopeRecord
    command_id: str
    job_id: str


class CreateJobCommand(_JobCommand):
    """kron.commands.CreateJob"""

    idempotency_key: str | None
    spec: JobSpec


class UpdateJobCommand(_JobCommand):
    """kron.commands.UpdateJob"""

    spec: JobSpec
    expected_version: int | None


class PauseJobCommand(_JobCommand):
    """kron.commands.PauseJob"""


class ResumeJobCommand(_JobCommand):
    """kron.commands.ResumeJob"""


class DeleteJobCommand(_JobCommand):
    """kron.commands.DeleteJob"""


class TriggerJobCommand(_JobCommand):
    """kron.commands.TriggerJob"""


class BackfillCommand(_JobCommand):
    """kron.commands.BackfillJob"""

    from_ms: int
    to_ms: int
    max_per_s: float
    rerun: bool


class CancelRunCommand(_JobCommand):
    """kron.commands.CancelRun: cancel a running DAG run."""

    run_id: str
    reason: str | None


class RetryRunCommand(_JobCommand):
    """kron.commands.RetryRun: run a failed or cancelled DAG run's failures again."""

    run_id: str


JobCommand = (CreateJobCommand | UpdateJobCommand | PauseJobCommand | ResumeJobCommand
              | DeleteJobCommand | TriggerJobCommand | BackfillCommand | CancelRunCommand
              | RetryRunCommand)


class JobToCreate(TypedDict):
    """kron.JobToCreate: one job of a CreateJobs batch."""

    job_id: str
    idempotency_key: str | None
    spec: JobSpec


class CreateJobsCommand(TypedDict):
    """kron.commands.CreateJobs: many creates in one record (streams.engine.batch)."""

    envelope: EnvelopeRecord
    command_id: str
    jobs: list[JobToCreate]


# --- attempt reports ----------------------------------------------------------------------------


class _AttemptReport(TypedDict):
    """The fields an executor's report on one attempt opens with."""

    envelope: EnvelopeRecord
    exec_id: str
    job_id: str
    scheduled_for_ms: int
    owner_epoch: int
    attempt: int
    fencing_token: int


class ExecutionSucceededReport(_AttemptReport):
    """kron.executions.ExecutionSucceeded"""

    started_at_ms: int
    finished_at_ms: int
    status_code: int | None
    output: str | None


class ExecutionFailedReport(_AttemptReport):
    """kron.executions.ExecutionFailed"""

    error_class: ErrorClass
    error: str
    final: bool
    started_at_ms: int | None
    finished_at_ms: int
    status_code: int | None
    retry_after_s: float | None
    output: str | None


class ExecutionHeartbeatReport(_AttemptReport):
    """kron.executions.ExecutionHeartbeat: the attempt is alive until lease_until_ms."""

    lease_until_ms: int
    # v2: why the call still waits in the worker ("dispatch rate"); None once called.
    held_for: str | None


class AttemptResult(TypedDict):
    """kron.executions.AttemptResult: one finished attempt of an AttemptsFinished batch."""

    exec_id: str
    job_id: str
    scheduled_for_ms: int
    attempt: int
    fencing_token: int
    ok: bool
    started_at_ms: int | None
    finished_at_ms: int
    status_code: int | None
    error_class: ErrorClass | None
    error: str | None
    retry_after_s: float | None
    output: str | None


class AttemptsFinishedReport(TypedDict):
    """kron.executions.AttemptsFinished: finished attempts, as one executor batched them."""

    envelope: EnvelopeRecord
    results: list[AttemptResult]


# What the core's per-attempt report handling reads: a lone report, or one batched result.
ExecutionReport = (ExecutionSucceededReport | ExecutionFailedReport | ExecutionHeartbeatReport
                   | AttemptResult)
# An attempt's success or failure, lone or batched.
SucceededReport = ExecutionSucceededReport | AttemptResult
FailedReport = ExecutionFailedReport | AttemptResult
