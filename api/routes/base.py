"""The plumbing every /v1 route shares: who calls, the JSON body, the JSON answer.

FastAPI reads a request's body before it solves the route's dependencies, so a 401 or a
read key's 403 would come after a 413, and a body would be read for a job that does not
exist. `KronRoute` answers in kron's order instead:

1. the caller and the job the path names (`Service.caller`: 401, 403, 429, 404);
2. the body (`read_json`: 415 unless application/json, 413 past max_body_bytes, read as it
   streams in; 400 for malformed or too deeply nested JSON), parsed once, with orjson;
3. FastAPI validates the parsed body against the route's pydantic model (a 422 problem naming
   the field: api/problems.py on_validation) and calls the endpoint, which gets the Service,
   the caller and its job through one dependency, `ThisCall`.

The dependencies are `async def`: FastAPI runs a plain `def` dependency in a worker thread.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any

import orjson
from fastapi import Depends, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from api.problems import Problem
from api.routes.service import Call, Service

MAX_DEPTH = 32

# Every error answer is a problem (api/problems.py); the schema is added by api/server.py.
PROBLEM_REF = "#/components/schemas/Problem"
ERRORS: dict[int | str, dict[str, Any]] = {"4XX": {
    "description": "A problem (RFC 9457): `type` names the case, `field` the bad input",
    "content": {"application/problem+json": {"schema": {"$ref": PROBLEM_REF}}}}}


class Json(JSONResponse):
    """orjson: several times faster than json.dumps for the job bodies. The routes return
    these (documented by their response models, not validated against them on the way out)."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


class ParsedRequest(Request):
    """A request whose body `read_json` has read and parsed: FastAPI's body parsing gets
    the parsed value instead of reading and parsing the body a second time."""

    def __init__(self, request: Request, raw: bytes, data: Any) -> None:
        super().__init__(request.scope, request.receive)
        self._raw = raw
        self._data = data

    async def body(self) -> bytes:
        return self._raw

    async def json(self) -> Any:
        return self._data


Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class KronRoute(APIRoute):
    """A /v1 route: the caller first, then the body, then FastAPI (see the module's doc)."""

    def get_route_handler(self) -> Handler:
        handle = super().get_route_handler()
        takes_body = self.body_field is not None

        async def guarded(request: Request) -> Response:
            svc = service(request)
            request.state.call = self.caller(svc, request)
            if takes_body:
                raw, data = (await read_json(svc, request) if self.reads_body(request)
                             else (b"", None))  # FastAPI then takes the body as absent
                request = ParsedRequest(request, raw, data)
            return await handle(request)

        return guarded

    def caller(self, svc: Service, request: Request) -> Call:
        return svc.caller(request)

    def reads_body(self, request: Request) -> bool:
        return True


async def read_json(svc: Service, request: Request) -> tuple[bytes, Any]:
    """The body and its JSON, after the checks that must come before parsing it."""
    ctype = request.headers.get("content-type", "")
    if ctype.split(";")[0].strip().lower() != "application/json":
        raise Problem(415, "unsupported-media-type", "send application/json")
    limit = svc.settings.max_body_bytes
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise Problem(413, "body-too-large", f"the body is over {limit} bytes")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise Problem(400, "malformed-json", f"the body is not valid JSON: {exc}") from exc
    if _depth(data, MAX_DEPTH) > MAX_DEPTH:
        raise Problem(400, "json-too-deep", f"JSON nesting is limited to {MAX_DEPTH}")
    return raw, data


def _depth(value: Any, limit: int) -> int:
    stack = [(value, 1)]
    deepest = 0
    while stack:
        item, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        if isinstance(item, dict):
            stack.extend((v, d + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, d + 1) for v in item)
    return deepest


async def service_dep(request: Request) -> Service:
    """`service` as a dependency: async, so FastAPI calls it inline (a plain def goes to a
    worker thread, which cost a create more than the rest of its work)."""
    return service(request)


def service(request: Request) -> Service:
    """The app's Service (api/server.py puts it in app.state)."""
    svc = request.app.state.service
    assert isinstance(svc, Service)
    return svc


async def call(request: Request) -> Call:
    """The request's Call: the caller KronRoute found before the body was read."""
    found = request.state.call
    assert isinstance(found, Call)
    return found


Svc = Annotated[Service, Depends(service_dep)]
# One dependency per route: each costs a create a few microseconds.
ThisCall = Annotated[Call, Depends(call)]
