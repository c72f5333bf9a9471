"""The states an execution, an attempt and a job can be in, and the named sets of them.

Each enum's values are the symbols of its Avro enum (kron.ExecutionStatus, kron.JobStatus,
kron.TriggerKind) or the strings its Avro field holds (an attempt's outcome). Members are
``str``: they compare and hash as their values, so a record decoded from Avro (plain
strings) and one the core just wrote (members) read alike, and the Avro writers write
members of the enum fields as they write the strings. An Avro *string* field must get a plain
``str`` (the compiled writer checks ``type(v) is str``): AttemptOutcome's values go into one,
so write ``AttemptOutcome.X.value`` there.

The sets are frozensets of the plain values (built in the class body, where the names are
still the strings): a membership test of a decoded value against them costs what one
against string literals costs.
"""

from __future__ import annotations

from enum import StrEnum, nonmember


class ExecutionStatus(StrEnum):
    """An execution's ``state`` (kron.ExecutionStatus)."""

    QUEUED = "queued"
    RUNNING = "running"
    RETRY_PENDING = "retry_pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    MISSED = "missed"
    CANCELLED = "cancelled"

    # Over: nothing runs for the execution any more (a backfill's rerun may start it again).
    TERMINAL = nonmember(frozenset({SUCCEEDED, FAILED, SKIPPED, MISSED, CANCELLED}))
    # Not over: an attempt is running, or one is to come.
    ACTIVE = nonmember(frozenset({QUEUED, RUNNING, RETRY_PENDING}))
    # Over after attempts ran: its last attempt has a finish time (the API's finished_at).
    RAN = nonmember(frozenset({SUCCEEDED, FAILED, CANCELLED}))
    # Over without success: a backfill with `rerun` may run it again.
    RERUNNABLE = nonmember(frozenset({FAILED, MISSED, SKIPPED}))


class AttemptOutcome(StrEnum):
    """An attempt's ``outcome`` (an Avro string): succeeded, or the failure's error class
    (streams.domain.retry.ErrorClass, whose values these are)."""

    SUCCEEDED = "succeeded"
    TRANSIENT = "transient"
    PERMANENT = "permanent"
    TIMEOUT = "timeout"
    LEASE_EXPIRED = "lease_expired"
    CANCELLED = "cancelled"

    FAILURES = nonmember(frozenset({TRANSIENT, PERMANENT, TIMEOUT, LEASE_EXPIRED, CANCELLED}))


class JobStatus(StrEnum):
    """A job's ``status`` (kron.JobStatus)."""

    ACTIVE = "active"
    PAUSED = "paused"
    COMPLETED = "completed"
    DELETED = "deleted"

    # Still scheduled: its FIRE timer is armed (a paused job's slots are recorded skipped).
    LIVE = nonmember(frozenset({ACTIVE, PAUSED}))


class Trigger(StrEnum):
    """What started an execution: its ``trigger`` (kron.TriggerKind)."""

    SCHEDULE = "schedule"
    MANUAL = "manual"
    BACKFILL = "backfill"
    MISFIRE = "misfire"

    # A slot of the job's own schedule (not a manual run, not a backfill).
    OWN_SCHEDULE = nonmember(frozenset({SCHEDULE, MISFIRE}))


class QueueReason(StrEnum):
    """Why an execution is `queued` to its user (its ``reason``, an Avro string: write
    ``.value``). CONCURRENCY: recorded queued, its tenant at its max_running
    (streams/engine/running_gate.py). DISPATCH_RATE: recorded running, its call held in the
    worker for its tenant's dispatch rate (the API shows it queued)."""

    CONCURRENCY = "tenant concurrency limit"
    DISPATCH_RATE = "dispatch rate"
