"""/v1/jobs/{job_id}/runs (also at /executions) and /v1/runs/{run_id}: a job's runs."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.problems import Problem
from api.routes import responses
from api.routes.base import ERRORS, Json, KronRoute, ThisCall
from api.routes.render import STATES, run_detail, run_out

router = APIRouter(route_class=KronRoute, tags=["runs"])


async def list_runs(job_id: str, call: ThisCall, status: str | None = None, limit: int = 50,
                    cursor: str | None = None) -> Json:
    """The job's runs, newest slot first (KronRoute has checked the job is the caller's)."""
    if status is not None and status not in STATES:
        raise Problem(422, "invalid-input", f"status must be one of {', '.join(STATES)}",
                      field="status")
    if not 1 <= limit <= 500:
        raise Problem(422, "invalid-input", "limit must be in 1..500", field="limit")
    prefix = f"r/{job_id}/".encode()
    start = prefix + cursor.encode() + b"\x00" if cursor else None
    items: list[dict[str, Any]] = []
    next_cursor = None
    views = call.svc.views
    for key, entry in views.prefix(prefix, start=start):
        if status and entry["state"] != status:
            continue
        if len(items) == limit:
            break
        ex = views.execution(key.rsplit(b"/", 1)[-1].decode())
        if ex is not None:
            items.append(run_out(ex))
            next_cursor = key[len(prefix):].decode()
    else:
        next_cursor = None
    return Json({"runs": items, "next_cursor": next_cursor})


for _path in ("/jobs/{job_id}/runs", "/jobs/{job_id}/executions"):
    router.add_api_route(_path, list_runs, methods=["GET"], response_model=responses.RunList,
                         responses=ERRORS)


@router.get("/runs/{run_id}", response_model=responses.RunDetail, responses=ERRORS)
async def get_run(run_id: str, call: ThisCall) -> Json:
    ex = call.svc.views.execution(run_id)
    if ex is None or ex["tenant"] != call.tenant:
        raise Problem(404, "run-not-found", f"no run {run_id!r}", field="run_id")
    return Json(run_detail(ex))
