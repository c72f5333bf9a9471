"""The API process. `create_app(settings)` builds everything; nothing is built at import."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.auth import Authenticator, RateLimiter
from api.batcher import MAX_PARTITIONS, CreateBatcher
from api.models import InvalidField
from api.problems import Problem, on_http, on_invalid_field, on_problem, on_validation
from api.projection import Projector, Views
from api.publisher import CommandPublisher
from api.routes import Service, include_routes, new_id
from api.routes.responses import Problem as ProblemDoc
from kron.clock import Clock, SystemClock
from kron.settings import Settings
from kron.topics import admin_client

log = logging.getLogger("kron.api")

# What is read and dropped of a body the answer came before (a 413, a 401...), at most.
DRAIN_MAX_BYTES = 16 * 1024 * 1024
DRAIN_MAX_S = 5.0


class DrainUnreadBody:
    """Lets a client still sending its body read an answer given before the body ended.

    A 413 is answered after max_body_bytes, with the rest of the body unread. uvicorn then
    closes the connection (at once if the client asked for `Connection: close`, as
    urllib.request does), and a close with unread bytes resets the connection: a client
    that sends its whole body before it reads (most do) sees the reset, not the answer.
    So the answer's bytes are written, then the rest of the body is read and dropped (up to
    DRAIN_MAX_BYTES or DRAIN_MAX_S, whichever comes first), then the response ends and the
    connection is closed (the answer says `Connection: close`). A client still sending past
    those bounds may then see a reset, seconds after its answer went out. Requests whose
    body was read to its end pass untouched.
    """

    def __init__(self, app: ASGIApp, *, max_bytes: int = DRAIN_MAX_BYTES,
                 max_s: float = DRAIN_MAX_S) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_s = max_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _has_body(scope):
            await self.app(scope, receive, send)
            return
        ended = False  # the client sent all of the body (or went away)
        asked = False  # the app asked for the body at least once

        async def receive_body() -> Message:
            nonlocal ended, asked
            asked = True
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                ended = True
            return message

        async def drain() -> None:
            nonlocal ended
            dropped = 0
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.max_s):
                    while not ended and dropped <= self.max_bytes:
                        dropped += len((await receive_body()).get("body", b""))

        draining = False

        async def send_answer(message: Message) -> None:
            nonlocal draining
            if message["type"] == "http.response.start" and not ended and (
                    asked or not _expects_continue(scope)):
                # A client that waits for `100 Continue` before its body has sent nothing:
                # there is nothing to drain, and reading would send it the 100 too late.
                draining = True
                message = {**message, "headers": [*message.get("headers", ()),
                                                  (b"connection", b"close")]}
            elif (draining and message["type"] == "http.response.body"
                  and not message.get("more_body", False)):
                await send({**message, "more_body": True})  # the answer goes out first
                await drain()
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app(scope, receive_body, send_answer)


def _has_body(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return value.strip() not in (b"", b"0")
        if name == b"transfer-encoding":
            return True
    return False


def _expects_continue(scope: Scope) -> bool:
    return any(name == b"expect" and value.lower() == b"100-continue"
               for name, value in scope["headers"])


class BrokerProbe:
    """Answers "can we reach Kafka?" with a real metadata request, bounded in time."""

    def __init__(self, settings: Settings) -> None:
        self._admin = admin_client(settings)
        self._topic = settings.topic("commands")

    def check(self, timeout_s: float = 2.0) -> dict[str, object]:
        try:
            md = self._admin.list_topics(timeout=timeout_s)
        except Exception as exc:  # KafkaException while the broker is unreachable
            return {"ok": False, "error": str(exc)}
        return {"ok": True, "brokers": len(md.brokers), "commands_topic": self._topic in md.topics}


@dataclass
class Components:
    settings: Settings
    views: Views
    projector: Projector
    publisher: CommandPublisher
    probe: BrokerProbe


def build_components(settings: Settings, views_dir: Path | None = None) -> Components:
    views = Views(views_dir or settings.data_dir / "api-views")
    return Components(settings=settings, views=views, projector=Projector(settings, views),
                      publisher=CommandPublisher(settings), probe=BrokerProbe(settings))


def create_app(settings: Settings, *, components: Components | None = None,
               clock: Clock | None = None) -> FastAPI:
    parts = components or build_components(settings)
    clock = clock or SystemClock()
    creates = None
    if settings.api_create_batch > 1 and settings.partitions <= MAX_PARTITIONS:
        creates = CreateBatcher(
            lambda name, record, key: parts.publisher.publish(name, record, key=key),
            partitions=settings.partitions, new_id=new_id, now_ms=clock.now_ms,
            max_jobs=settings.api_create_batch)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        parts.projector.start()
        if creates is not None and not await asyncio.to_thread(_partitions_match, settings):
            service.creates = None  # every create a CreateJob of its own, as with batch=1
        try:
            yield
        finally:
            if creates is not None:
                await creates.close()
            parts.projector.stop()
            parts.publisher.close()
            parts.views.close()

    app = FastAPI(
        title="kron", version="0.1.0", lifespan=lifespan,
        description="Schedule jobs once or on cron; read their runs. Authenticate with "
                    "`Authorization: Bearer <key>` or `X-API-Key: <key>`.",
        # A job's `definition` is shown in the request's own form: one JobRequest schema.
        separate_input_output_schemas=False,
    )
    app.add_exception_handler(Problem, on_problem)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(InvalidField, on_invalid_field)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_middleware(DrainUnreadBody)

    service = Service(settings=settings, views=parts.views, projector=parts.projector,
                      publisher=parts.publisher, clock=clock,
                      auth=Authenticator(settings.api_key_entries),
                      limiter=RateLimiter(clock=clock, tenants=settings.tenants),
                      creates=creates, probe=parts.probe)
    app.state.service = service
    include_routes(app)
    _document_problems(app)
    return app


def _partitions_match(settings: Settings) -> bool:
    """False if the commands topic has another partition count than KRON_PARTITIONS: the
    batcher draws each job's id for a partition by that count, so the worker would refuse
    jobs of a batch. True when it cannot tell (no broker yet, no topic)."""
    topic = settings.topic("commands")
    try:
        meta = admin_client(settings).list_topics(topic, timeout=5).topics.get(topic)
    except Exception as exc:  # the broker may come later; the worker checks its topics too
        log.warning("could not read %s's partitions: %r", topic, exc)
        return True
    if meta is None or meta.error is not None or not meta.partitions:
        return True
    if len(meta.partitions) != settings.partitions:
        log.warning("%s has %d partitions but KRON_PARTITIONS is %d: creates are not batched",
                    topic, len(meta.partitions), settings.partitions)
        return False
    return True


def _document_problems(app: FastAPI) -> None:
    """The Problem schema the routes' error answers refer to (routes/base.py ERRORS)."""
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version,
                                 description=app.description, routes=app.routes,
                                 separate_input_output_schemas=False)
            schema.setdefault("components", {}).setdefault("schemas", {})["Problem"] = (
                ProblemDoc.model_json_schema())
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def run_api(settings: Settings) -> None:
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(message)s")
    # One process: read-your-writes for creates comes from this process's memory (Unprojected).
    # uvloop and httptools, not "auto": a missing one should fail here rather than silently
    # fall back to asyncio's loop and h11, both slower.
    uvicorn.run(create_app(settings), host=settings.api_host, port=settings.api_port,
                log_level=settings.log_level.lower(), access_log=False, loop="uvloop",
                http="httptools", server_header=False)
