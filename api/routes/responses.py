"""What the /v1 routes answer, as pydantic models: they document /openapi.json. The routes
render these bodies by hand (routes/render.py) and return them as they are, so the
integration tests check real answers against these models (tests/integration/test_api_openapi.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from api.models import JobRequest

RunState = Literal["queued", "running", "retry_pending", "succeeded", "failed", "skipped",
                   "missed", "cancelled"]
JobStatus = Literal["active", "paused", "completed", "deleted"]


class _Out(BaseModel):
    # A field an answer has and its model lacks is an error (in the tests that check them).
    model_config = ConfigDict(extra="forbid")


OUTPUT_DOC = (
    "what the target gave back, at most KRON_OUTPUT_BYTES bytes of UTF-8 (bytes that are "
    "not UTF-8 read as U+FFFD): for HTTP the status line, a newline and the start of the "
    "body; for a command the tail of its stdout and stderr; for a Kafka target the "
    "partition and offset of its record. null when nothing came back (a timeout, a refused "
    "connection), for attempts made before outputs were kept, and for older attempts of an "
    "execution whose outputs passed 64 KiB in all")

TaskState = Literal["pending", "running", "succeeded", "failed", "skipped", "upstream_failed",
                    "cancelled"]
TriggerRule = Literal["all_success", "all_failed", "all_done", "one_success", "one_failed",
                      "none_failed", "always"]


class _RunFields(_Out):
    run_id: str = Field(description=(
        "the run's id (its execution id), what /v1/runs/{run_id} takes; for a DAG task "
        "instance, the id of the DAG run it belongs to (`exec_id` is the instance's own)"))
    job_id: str
    state: RunState
    trigger: Literal["schedule", "manual", "backfill", "misfire"]
    scheduled_for: datetime
    attempt: int = Field(description="the latest attempt's number, from 1 (0 for a DAG run)")
    worker: str | None
    started_at: datetime | None = Field(
        description="the first attempt's start (a DAG run: its first task attempt's)")
    finished_at: datetime | None
    lateness_ms: int | None = Field(description=(
        "first attempt's start minus scheduled_for (a DAG run: its first task attempt's)"))
    error: str | None
    reason: str | None
    dst_outcome: str | None


class TaskCounts(_Out):
    """A DAG run's tasks by state (every state, 0 included)."""

    pending: int
    running: int
    succeeded: int
    failed: int
    skipped: int
    upstream_failed: int
    cancelled: int


class Run(_RunFields):
    """One run (an execution) of a job: a slot of its schedule, a manual trigger or a
    backfilled slot, with its latest attempt. A DAG job's run is one run however many tasks
    it has: its tasks' instances are not runs of the job."""

    tasks: TaskCounts | None = Field(default=None,
                                     description="a DAG run only: its tasks by state")


class Attempt(_Out):
    attempt: int
    fencing_token: int
    worker: str
    started_at_ms: int
    finished_at_ms: int | None
    outcome: str | None
    status_code: int | None
    error: str | None
    output: str | None = Field(description=OUTPUT_DOC)
    started_at: datetime
    finished_at: datetime | None


class TaskAttempt(_Out):
    """One attempt of a DAG task (its task instance's)."""

    attempt: int
    started_at: datetime
    finished_at: datetime | None
    outcome: str | None = Field(description="succeeded, or the failure's class")
    status_code: int | None
    error: str | None
    output: str | None = Field(description=OUTPUT_DOC)


class Task(_Out):
    """A task of a DAG run: its state in the run, its place in the DAG and its attempts."""

    task_id: str
    state: TaskState
    depends_on: list[str] = Field(description="from the job's DAG ([] if it lacks the task)")
    trigger_rule: TriggerRule | None = Field(
        description="from the job's DAG (null if it no longer has the task)")
    reason: str | None = Field(description="why it was skipped, upstream_failed or cancelled")
    attempts: list[TaskAttempt] = Field(description="[] for a task that never ran")


class RunDetail(_RunFields):
    """A run with every attempt; a DAG run with its tasks; or a DAG task instance (an
    execution of one task of a DAG run) with `exec_id`, `run_id` and `task_id`."""

    attempts: list[Attempt] = Field(description="[] for a DAG run (its tasks have them)")
    status_code: int | None = Field(description="the last attempt's HTTP status, if any")
    tasks: list[Task] | None = Field(default=None, description=(
        "a DAG run only: its tasks in dependency order (each after the tasks it depends "
        "on; the DAG's own order where that leaves a choice)"))
    exec_id: str | None = Field(default=None,
                                description="a task instance only: its own execution id")
    task_id: str | None = Field(default=None,
                                description="a task instance only: its task's id in the DAG")


class RunCommandAccepted(_Out):
    """A :cancel or :retry the worker will apply (Kafka has it)."""

    command_id: str
    action: Literal["cancel", "retry"]
    run_id: str
    job_id: str
    applied: bool = Field(description=(
        "the run shows the command applied already (the answer waits a few seconds for "
        "that); false: it comes later, or the worker refused it (the run changed meanwhile)"))
    state: RunState = Field(description="the run's state as the views show it now")


class RunList(_Out):
    runs: list[Run] = Field(description="newest slot first")
    next_cursor: str | None = Field(description="pass as `cursor` for the next page")


class Job(_Out):
    job_id: str
    name: str
    status: JobStatus
    version: int = Field(description="1 at create, +1 at every change of the definition")
    next_run_at: datetime | None = Field(
        description="in the job's time zone, with its UTC offset then "
                    "(2026-10-11T02:00:00.000+05:30 for Asia/Kolkata); UTC for a one-off")
    created_at: datetime
    updated_at: datetime
    idempotency_key: str | None
    definition: JobRequest = Field(description="the job in the canonical request form")
    last_run: Run | None


class CreatedJob(Job):
    upcoming: list[datetime] = Field(description="the next runs (up to 5), as armed, in the "
                                                 "job's time zone as next_run_at is")


class BackfillCounts(_Out):
    """What a backfill does, counted at the request (api/backfill.py)."""

    slots: int = Field(description="slots of the schedule in from..to")
    armed: int = Field(description="slots that will run: new ones and reruns")
    rerun: int = Field(description="failed, missed or skipped slots run again (`rerun`)")
    already_recorded: int = Field(description="slots recorded already, left as they are")


class JobAfterAction(Job):
    backfill: BackfillCounts | None = Field(default=None, description="for :backfill only")


class JobList(_Out):
    jobs: list[Job] = Field(description="by job_id")
    next_cursor: str | None = Field(description="pass as `cursor` for the next page")


class RunsByState(_Out):
    queued: int
    running: int
    retry_pending: int
    succeeded: int
    failed: int
    skipped: int
    missed: int
    cancelled: int


class Quotas(_Out):
    """The tenant's quotas (KRON_TENANTS_FILE: its section, else [defaults])."""

    weight: int = Field(description="its share of each decision and dispatch round")
    max_running: int = Field(description="its executions running at once")
    dispatch_rate_per_s: float = Field(description="dispatches a second per worker; 0: "
                                                   "unlimited")
    create_rate_per_s: float = Field(description="API writes a second (429 over it)")
    create_burst: int = Field(description="API writes at once before the rate applies")
    max_active_jobs: int = Field(description="active and paused jobs (429 over it)")


class Stats(_Out):
    runs_by_state: RunsByState = Field(description="the tenant's runs (a DAG run is one)")
    tenant: str = Field(description="the caller's tenant: every count is its own")
    running: int = Field(description=(
        "the tenant's executions running now: runs and DAG task instances (a DAG run in "
        "progress counts as well as its running tasks)"))
    queued: int = Field(description=(
        "the tenant's executions queued, made and not started yet: runs and DAG task "
        "instances"))
    quotas: Quotas


class BrokerStatus(_Out):
    ok: bool
    brokers: int | None = None
    commands_topic: bool | None = Field(default=None,
                                        description="the commands topic exists")
    error: str | None = None


class Health(_Out):
    status: Literal["ok", "degraded"]
    broker: BrokerStatus


class Ready(_Out):
    ready: bool = Field(description="the projection has caught up with the log")
    projected_records: int
    unprojected_creates: int = Field(description="creates Kafka has that the views lack")


class Problem(BaseModel):
    """application/problem+json (RFC 9457). Some problems carry more members (a backfill
    too large: `slots_at_least`, `limit`)."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(description="https://kron.dev/problems/<case>, one per case")
    title: str
    status: int
    detail: str
    field: str | None = Field(default=None, description="the bad input's path, if one is")
