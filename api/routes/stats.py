"""/v1/stats: the caller's runs by state."""

from __future__ import annotations

from fastapi import APIRouter

from api.routes import responses
from api.routes.base import ERRORS, Json, KronRoute, ThisCall
from api.routes.render import STATES

router = APIRouter(route_class=KronRoute, tags=["stats"])


@router.get("/stats", response_model=responses.Stats, responses=ERRORS)
async def stats(call: ThisCall) -> Json:
    views = call.svc.views
    counts = {s: views.get(f"c/{call.tenant}/{s}".encode()) or 0 for s in STATES}
    return Json({"runs_by_state": counts})
