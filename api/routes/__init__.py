"""The HTTP routes, by resource: /v1/jobs (jobs.py), a job's actions (actions.py), runs
(runs.py), stats (stats.py), dead letters (dead_letters.py), and /healthz, /readyz
(health.py). Their shared plumbing (who calls, the JSON body, the order of answers) is
base.py; their answers' models responses.py."""

from __future__ import annotations

from fastapi import FastAPI

from api.routes import actions, dead_letters, health, jobs, run_actions, runs, stats
from api.routes.service import Service, new_id

__all__ = ["Service", "include_routes", "new_id"]


def include_routes(app: FastAPI) -> None:
    """Every route, each router included once (a router in a router costs every request a
    second round of matching). They find the Service in app.state.service."""
    for part in (jobs, actions, runs, run_actions, stats, dead_letters):
        app.include_router(part.router, prefix="/v1")
    app.include_router(health.router)
