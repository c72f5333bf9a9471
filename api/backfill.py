"""What a backfill will do, counted before it is sent: the answer to POST /v1/jobs/{id}:backfill.

The worker arms every slot of the range (streams.engine.backfill has the rules); this counts
them against the projection of the job's executions, so the caller learns how many slots the
range holds, how many will run (new ones, and reruns when asked) and how many are already
recorded and stay as they are. The counts are as of the request: a slot that finishes or
fails between it and its turn is judged by the worker then.
"""

from __future__ import annotations

from typing import Any

from api.problems import Problem
from api.projection import INVERT, Views
from streams.domain.ids import exec_id
from streams.engine import backfill
from streams.engine.spec import plan_of

# The most slots one backfill through the API may hold: ten of the worker's pages, and ~1 s
# of slot enumeration to count them. A longer range is refused (422), never cut: send it as
# several backfills. (Kafka producers are not bound by it: the worker pages through any range.)
MAX_BACKFILL_SLOTS = 100_000


def counts(views: Views, spec: dict[str, Any], job_id: str, *, from_ms: int, to_ms: int,
           rerun: bool, limit: int = MAX_BACKFILL_SLOTS) -> dict[str, int]:
    """{"slots", "armed", "rerun", "already_recorded"} for a backfill of [from_ms, to_ms];
    slots == armed + already_recorded. Raises a 422 Problem past `limit` slots."""
    recorded = _recorded(views, job_id, from_ms, to_ms)
    plan = plan_of(spec)
    slots = new = reruns = 0
    for slot in backfill.slots(plan, from_ms, to_ms):
        slots += 1
        if slots > limit:
            raise Problem(
                422, "backfill-too-large",
                f"the range holds more than {limit:,} slots of this job's schedule (counting "
                f"stopped at {slots:,}); a backfill takes at most {limit:,}: split the range",
                field="from", slots_at_least=slots, limit=limit)
        ex_id = recorded.get(slot.scheduled_for_ms)
        if ex_id is None:
            new += 1
        elif rerun and _may_rerun(views, ex_id):
            reruns += 1
    return {"slots": slots, "armed": new + reruns, "rerun": reruns,
            "already_recorded": slots - new - reruns}


def _recorded(views: Views, job_id: str, from_ms: int, to_ms: int) -> dict[int, str]:
    """Slot time -> exec id of the job's slot executions in the range, from the run index
    (newest first: one range scan). Manual runs have ids of their own and are left out."""
    prefix = f"r/{job_id}/".encode()
    start = prefix + f"{INVERT - to_ms:019d}".encode()
    out: dict[int, str] = {}
    for key, _entry in views.prefix(prefix, start=start):
        inverted, ex_id = key[len(prefix):].decode().split("/", 1)
        slot_ms = INVERT - int(inverted)
        if slot_ms < from_ms:
            break
        if ex_id == exec_id(job_id, slot_ms):
            out[slot_ms] = ex_id
    return out


def _may_rerun(views: Views, ex_id: str) -> bool:
    ex = views.execution(ex_id)
    return ex is not None and backfill.may_rerun(ex)
