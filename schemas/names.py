"""Full names of the top-level kron records, so callers get a NameError instead of a typo."""

from __future__ import annotations

from typing import Final

CREATE_JOB: Final = "kron.commands.CreateJob"
CREATE_JOBS: Final = "kron.commands.CreateJobs"
UPDATE_JOB: Final = "kron.commands.UpdateJob"
PAUSE_JOB: Final = "kron.commands.PauseJob"
RESUME_JOB: Final = "kron.commands.ResumeJob"
DELETE_JOB: Final = "kron.commands.DeleteJob"
TRIGGER_JOB: Final = "kron.commands.TriggerJob"
BACKFILL_JOB: Final = "kron.commands.BackfillJob"
CANCEL_RUN: Final = "kron.commands.CancelRun"
RETRY_RUN: Final = "kron.commands.RetryRun"

JOB_STATE: Final = "kron.state.JobState"

EXECUTION_QUEUED: Final = "kron.executions.ExecutionQueued"
EXECUTION_STARTED: Final = "kron.executions.ExecutionStarted"
EXECUTION_HEARTBEAT: Final = "kron.executions.ExecutionHeartbeat"
EXECUTION_SUCCEEDED: Final = "kron.executions.ExecutionSucceeded"
EXECUTION_FAILED: Final = "kron.executions.ExecutionFailed"
ATTEMPTS_FINISHED: Final = "kron.executions.AttemptsFinished"
EXECUTION_RETRY_SCHEDULED: Final = "kron.executions.ExecutionRetryScheduled"
EXECUTION_SKIPPED: Final = "kron.executions.ExecutionSkipped"
EXECUTION_MISSED: Final = "kron.executions.ExecutionMissed"
TRIGGER_SUPPRESSED: Final = "kron.executions.TriggerSuppressed"
EXECUTION_STATE: Final = "kron.executions.ExecutionState"

TICK: Final = "kron.engine.Tick"
CIRCUIT_OPENED: Final = "kron.engine.CircuitOpened"
CIRCUIT_CLOSED: Final = "kron.engine.CircuitClosed"

DEAD_LETTER: Final = "kron.deadletter.DeadLetter"

COMMANDS: Final = (
    CREATE_JOB,
    CREATE_JOBS,
    UPDATE_JOB,
    PAUSE_JOB,
    RESUME_JOB,
    DELETE_JOB,
    TRIGGER_JOB,
    BACKFILL_JOB,
    CANCEL_RUN,
    RETRY_RUN,
)
EXECUTION_EVENTS: Final = (
    EXECUTION_QUEUED,
    EXECUTION_STARTED,
    EXECUTION_HEARTBEAT,
    EXECUTION_SUCCEEDED,
    EXECUTION_FAILED,
    ATTEMPTS_FINISHED,
    EXECUTION_RETRY_SCHEDULED,
    EXECUTION_SKIPPED,
    EXECUTION_MISSED,
    TRIGGER_SUPPRESSED,
)
ALL_RECORDS: Final = (
    *COMMANDS,
    JOB_STATE,
    *EXECUTION_EVENTS,
    EXECUTION_STATE,
    TICK,
    CIRCUIT_OPENED,
    CIRCUIT_CLOSED,
    DEAD_LETTER,
)
