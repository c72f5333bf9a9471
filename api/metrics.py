"""The API's Prometheus metrics (issue 40, part 1): /metrics and request durations.

A registry per app, not prometheus_client's global one: tests build several apps in one
process. The route label is the route's template (`/v1/jobs/{job_id}`), never the path, so
ids don't become series; requests no route matched share `unmatched`.
"""

from __future__ import annotations

import time

from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from starlette.convertors import PathConvertor
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kron.settings import Settings

UNMATCHED = "unmatched"
# Any other method a client sends is counted as `other`: it must not become a series.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def install_metrics(app: FastAPI, settings: Settings) -> None:
    """Serves /metrics and times every HTTP request (nothing with KRON_METRICS_ENABLED off)."""
    if not settings.metrics_enabled:
        return
    registry = CollectorRegistry(auto_describe=False)
    durations = Histogram(
        "kron_api_request_duration_seconds", "API requests, from arrival to the end of the "
        "answer, by route template, method and status.", ["route", "method", "status"],
        registry=registry, buckets=BUCKETS)
    app.state.metrics_registry = registry

    # A FastAPI route (not app.add_route): the router names it in the scope as it does
    # every API route, so scrapes are timed under their own template too.
    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(TimeRequests, durations=durations)


class TimeRequests:
    """Pure ASGI (no BaseHTTPMiddleware task per request): the status is read off the
    answer's start, the route off the scope the router filled in."""

    def __init__(self, app: ASGIApp, *, durations: Histogram) -> None:
        self.app = app
        self.durations = durations

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # an exception out of the app is answered 500 further out
        started = time.perf_counter()  # an interval, not the wall clock

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            template = route_template(scope)
            method = scope["method"] if scope["method"] in METHODS else "other"
            self.durations.labels(template, method, str(status)).observe(
                time.perf_counter() - started)


def route_template(scope: Scope) -> str:
    """The matched route's template with the prefix it was included under: FastAPI puts the
    route as declared in the scope (`/jobs/{job_id}` of a router included at `/v1`), and a
    prefix is static, so it is the request path's leading segments beyond the template's."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    if not isinstance(path, str) or not path:
        return UNMATCHED
    convertors = getattr(route, "param_convertors", {})
    if any(isinstance(c, PathConvertor) for c in convertors.values()):
        return path  # a parameter may hold slashes: segments can't tell the prefix
    extra = scope["path"].count("/") - path.count("/")
    if extra <= 0:
        return path
    return "/".join(scope["path"].split("/")[:extra + 1]) + path
