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


class Run(_Out):
    """One run (an execution) of a job: a slot of its schedule, a manual trigger or a
    backfilled slot, with its latest attempt."""

    run_id: str
    job_id: str
    state: RunState
    trigger: Literal["schedule", "manual", "backfill", "misfire"]
    scheduled_for: datetime
    attempt: int = Field(description="the latest attempt's number, from 1")
    worker: str | None
    started_at: datetime | None
    finished_at: datetime | None
    lateness_ms: int | None = Field(description="first attempt's start minus scheduled_for")
    error: str | None
    reason: str | None
    dst_outcome: str | None


class Attempt(_Out):
    attempt: int
    fencing_token: int
    worker: str
    started_at_ms: int
    finished_at_ms: int | None
    outcome: str | None
    status_code: int | None
    error: str | None
    started_at: datetime
    finished_at: datetime | None


class RunDetail(Run):
    """A run with every attempt."""

    attempts: list[Attempt]
    status_code: int | None = Field(description="the last attempt's HTTP status, if any")


class RunList(_Out):
    runs: list[Run] = Field(description="newest slot first")
    next_cursor: str | None = Field(description="pass as `cursor` for the next page")


class Job(_Out):
    job_id: str
    name: str
    status: JobStatus
    version: int = Field(description="1 at create, +1 at every change of the definition")
    next_run_at: datetime | None
    created_at: datetime
    updated_at: datetime
    idempotency_key: str | None
    definition: JobRequest = Field(description="the job in the canonical request form")
    last_run: Run | None


class CreatedJob(Job):
    upcoming: list[datetime] = Field(description="the next runs (up to 5), as armed")


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


class Stats(_Out):
    runs_by_state: RunsByState


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
