"""The rules of a backfill, shared by the partition core and the API that previews it.

A backfill runs the slots of a job's own schedule between `from` and `to` (both inclusive,
both in the past) again, paced at `max_per_s`. Every slot of the range is armed, however many
there are: the core arms them page by page (BACKFILL_PAGE at a time), so none is dropped and
no more than a page waits at once. A slot that already has an execution keeps it: it is
counted as already recorded and not run again, unless the backfill asks for `rerun` and the
execution ended without success (RERUNNABLE): then it runs once more as a new attempt of the
same execution (same exec id, so the same Idempotency-Key; attempt + 1). A slot that is still
running, retrying or succeeded is never run again, and an execution stops taking reruns at
MAX_ATTEMPTS_WITH_RERUNS attempts.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from streams.domain.policies import MAX_ATTEMPTS_LIMIT
from streams.domain.schedule import Slot, bounded_next_slot
from streams.domain.states import ExecutionStatus
from streams.engine.spec import JobPlan

# Slots one event arms for a backfill; the rest of the range waits in a page timer. The same
# bound as the late slots one tick may judge (core.MAX_LATE_SLOTS).
BACKFILL_PAGE = 10_000
# Final states a backfill with `rerun` runs again. Not `cancelled`: a cancel was a decision
# (a delete, a replace, a pause), and the executor remembers cancelled ids.
RERUNNABLE = ExecutionStatus.RERUNNABLE
# An execution holds every attempt it made; reruns stop adding attempts here (retries and
# reruns together): twice what a retry policy may allow.
MAX_ATTEMPTS_WITH_RERUNS = 2 * MAX_ATTEMPTS_LIMIT
# The event type of the execution record a rerun starts (an attempt, like
# "execution.started", after a final state: audits tell a rerun from a duplicate by it).
RERUN_STARTED = "execution.rerun_started"


def first_slot(plan: JobPlan, from_ms: int, to_ms: int) -> Slot | None:
    """The first slot of the plan in [from_ms, to_ms], within its start and end."""
    return next_slot(plan, from_ms - 1, to_ms)


def next_slot(plan: JobPlan, after_ms: int, to_ms: int) -> Slot | None:
    """The plan's first slot after `after_ms`, up to `to_ms`, within its start and end."""
    end = to_ms if plan.end_at_ms is None else min(to_ms, plan.end_at_ms)
    return bounded_next_slot(plan.schedule, after_ms=after_ms, dst=plan.dst,
                             start_at_ms=plan.start_at_ms, end_at_ms=end)


def slots(plan: JobPlan, from_ms: int, to_ms: int) -> Iterator[Slot]:
    """Every slot of the plan in [from_ms, to_ms], in order."""
    slot = first_slot(plan, from_ms, to_ms)
    while slot is not None:
        yield slot
        slot = next_slot(plan, slot.scheduled_for_ms, to_ms)


def may_rerun(execution: Mapping[str, Any]) -> bool:
    """Whether a backfill with `rerun` runs this execution (an ExecutionState record, or the
    API's view of one) again."""
    return bool(execution["state"] in RERUNNABLE
                and execution["attempt"] < MAX_ATTEMPTS_WITH_RERUNS)
