"""The HTTP routes, by resource: /v1/jobs (jobs.py), a job's actions (actions.py), runs
(runs.py), stats (stats.py), and /healthz, /readyz (health.py). Their shared plumbing (who
calls, the JSON body, the order of answers) is base.py; their answers' models responses.py."""

from __future__ import annotations

from fastapi import APIRouter

from api.routes import actions, health, jobs, runs, stats
from api.routes.service import Service, new_id

__all__ = ["Service", "build_router", "new_id"]


def build_router() -> APIRouter:
    """Every route. They find the Service in app.state.service."""
    router = APIRouter()
    v1 = APIRouter(prefix="/v1")
    for part in (jobs, actions, runs, stats):
        v1.include_router(part.router)
    router.include_router(v1)
    router.include_router(health.router)
    return router
