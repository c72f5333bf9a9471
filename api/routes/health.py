"""/healthz and /readyz: for orchestrators, without a key."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from api.routes import responses
from api.routes.base import Svc

router = APIRouter(tags=["ops"])


@router.get("/healthz", response_model=responses.Health,
            responses={503: {"model": responses.Health, "description": "Kafka unreachable"}})
async def healthz(svc: Svc) -> JSONResponse:
    """Whether Kafka answers a metadata request (bounded in time)."""
    broker = (await asyncio.to_thread(svc.probe.check) if svc.probe is not None
              else {"ok": False, "error": "no broker probe"})
    status = 200 if broker["ok"] else 503
    return JSONResponse({"status": "ok" if status == 200 else "degraded", "broker": broker},
                        status_code=status)


@router.get("/readyz", response_model=responses.Ready,
            responses={503: {"model": responses.Ready, "description": "catching up"}})
async def readyz(svc: Svc) -> JSONResponse:
    """Whether the projection has caught up with the log."""
    ready = svc.projector.caught_up
    return JSONResponse({"ready": ready, "projected_records": svc.projector.applied,
                         # creates Kafka has that the views don't show yet: worker lag
                         "unprojected_creates": len(svc.projector.unprojected)},
                        status_code=200 if ready else 503)
