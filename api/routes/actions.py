"""POST /v1/jobs/{job_id}:{action}: pause, resume, trigger and backfill a job."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Body, Request
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StrictBool

from api import backfill
from api.problems import Problem
from api.routes import responses
from api.routes.base import ERRORS, Json, KronRoute, ThisCall
from api.routes.render import job_out
from api.routes.service import Call, Service

# The action -> its command. Pause and resume answer 200 once applied; trigger and backfill
# 202 (what they start runs later).
ACTIONS = {"pause": "PauseJob", "resume": "ResumeJob", "trigger": "TriggerJob",
           "backfill": "BackfillJob"}
STARTS_RUNS = frozenset({"trigger", "backfill"})
MAX_BACKFILL_MS = 366 * 86_400_000


class ActionRoute(KronRoute):
    """An unknown action is a 404 before anything else (no key needed, no token taken),
    and only a backfill reads a body: the other actions ignore one."""

    def caller(self, svc: Service, request: Request) -> Call:
        action = request.path_params["action"]
        if action not in ACTIONS:
            raise Problem(404, "not-found", f"no action {action!r}", field="action")
        return super().caller(svc, request)

    def reads_body(self, request: Request) -> bool:
        return bool(request.path_params["action"] == "backfill")


class BackfillRequest(BaseModel):
    """Run the job's slots between `from` and `to` (both in the past, both included), paced:
    every one of them, at most api.backfill.MAX_BACKFILL_SLOTS. A slot already recorded
    stays as it is, unless `rerun` asks to run a failed, missed or skipped one again."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    from_: AwareDatetime = Field(alias="from")
    to: AwareDatetime
    max_per_s: float = Field(default=10.0, gt=0, le=1000, allow_inf_nan=False)
    rerun: StrictBool = Field(default=False, description=(
        "Run slots whose run ended failed, missed or skipped again, as a new attempt of the "
        "same run (same Idempotency-Key, higher X-Kron-Attempt). Running and succeeded "
        "slots are never run again."))


router = APIRouter(tags=["jobs"])


async def job_action(job_id: str, action: str, call: ThisCall,
                     body: Annotated[BackfillRequest | None, Body(
                         description="for :backfill only")] = None) -> Json:
    """`pause`, `resume`, `trigger` (a manual run now) or `backfill` (past slots, paced)."""
    svc = call.svc
    fields: dict[str, Any] = {}
    counts = None
    if action == "backfill":
        fields = _backfill_fields(body, svc.clock.now_ms())
        # Counted (and refused past the limit) before anything is sent.
        counts = await asyncio.to_thread(
            backfill.counts, svc.views, svc.spec_of(call.tenant, job_id), job_id,
            from_ms=fields["from_ms"], to_ms=fields["to_ms"], rerun=fields["rerun"])
    cmd = await svc.send(call.tenant, ACTIONS[action], job_id, **fields)
    after = await svc.applied(job_id, cmd)
    out = job_out(svc.views, after or call.own_job)
    if counts is not None:
        out["backfill"] = counts
    return Json(out, status_code=202 if action in STARTS_RUNS else 200)


router.add_api_route(
    "/jobs/{job_id}:{action}", job_action, methods=["POST"], route_class_override=ActionRoute,
    response_model=responses.JobAfterAction,
    responses={202: {"model": responses.JobAfterAction,
                     "description": "trigger and backfill: the runs come later"}, **ERRORS})


def _backfill_fields(req: BackfillRequest | None, now: int) -> dict[str, Any]:
    if req is None:  # a JSON null
        raise Problem(422, "invalid-input", "a backfill needs a body: {\"from\": ..., "
                                            "\"to\": ...}")
    start = int(req.from_.timestamp() * 1000)
    end = int(req.to.timestamp() * 1000)
    if end < start:
        raise Problem(422, "invalid-input", "`to` must not be before `from`", field="to")
    if end > now:
        raise Problem(422, "invalid-input", "backfill covers past slots only", field="to")
    if end - start > MAX_BACKFILL_MS:
        raise Problem(422, "invalid-input", "a backfill spans at most 366 days", field="from")
    return {"from_ms": start, "to_ms": end, "max_per_s": req.max_per_s, "rerun": req.rerun}
