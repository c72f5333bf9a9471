"""/v1/stats: the caller's runs by state, its executions running and queued, and its
quotas."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter

from api.routes import responses
from api.routes.base import ERRORS, Json, KronRoute, ThisCall
from api.routes.render import STATES
from streams.domain.tenants import RULES

router = APIRouter(route_class=KronRoute, tags=["stats"])


@router.get("/stats", response_model=responses.Stats, responses=ERRORS)
async def stats(call: ThisCall) -> Json:
    views, tenant = call.svc.views, call.tenant
    counts = {s: views.get(f"c/{tenant}/{s}".encode()) or 0 for s in STATES}
    # Executions: the runs (c/, a DAG run among them) and DAG task instances (ct/).
    tasks = {s: views.get(f"ct/{tenant}/{s}".encode()) or 0 for s in ("running", "queued")}
    return Json({"runs_by_state": counts, "tenant": tenant,
                 "running": counts["running"] + tasks["running"],
                 "queued": counts["queued"] + tasks["queued"],
                 "quotas": {k: v for k, v in asdict(call.svc.settings.tenants.quotas(tenant))
                            .items() if k in RULES}})
