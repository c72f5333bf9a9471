"""application/problem+json (RFC 9457): one stable `type` per case, naming the bad field."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from api import models

BASE = "https://kron.dev/problems/"
TITLES = {
    400: "Malformed request", 401: "Unauthorized", 403: "Forbidden", 404: "Not found",
    405: "Method not allowed", 409: "Conflict", 413: "Request too large",
    415: "Unsupported media type", 422: "Invalid input", 429: "Too many requests",
    503: "Service unavailable",
}


class Problem(Exception):
    def __init__(self, status: int, kind: str, detail: str, *, field: str | None = None,
                 headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.kind = kind
        self.detail = detail
        self.field = field
        self.headers = headers or {}
        self.extra = extra


def problem_response(p: Problem) -> JSONResponse:
    body: dict[str, Any] = {"type": BASE + p.kind, "title": TITLES.get(p.status, "Error"),
                            "status": p.status, "detail": p.detail}
    if p.field is not None:
        body["field"] = p.field
    body.update(p.extra)
    return JSONResponse(body, status_code=p.status, headers=p.headers,
                        media_type="application/problem+json")


async def on_problem(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Problem)
    return problem_response(exc)


async def on_validation(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's 422 (a body that does not fit the route's model, a bad query parameter) as a
    problem naming the first bad field. A job body's errors are worded as models.invalid_of
    words them (the field path into the body, "did you mean"...)."""
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    model = _body_model(request)
    body = [{**e, "loc": tuple(e["loc"][1:])} for e in errors if e["loc"][:1] == ("body",)]
    if body and model in models.BODY_MODELS:
        assert model is not None
        return problem_response(_invalid_input(models.invalid_of(body, model)))
    first = errors[0] if errors else {"loc": (), "msg": "invalid"}
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path")]
    return problem_response(Problem(422, "invalid-input", str(first.get("msg")),
                                    field=".".join(loc) or None))


async def on_invalid_field(request: Request, exc: Exception) -> JSONResponse:
    """A body that fits its model but not kron's rules (models.build_spec, merge_patch)."""
    assert isinstance(exc, models.InvalidField)
    return problem_response(_invalid_input(exc))


def _invalid_input(exc: models.InvalidField) -> Problem:
    title: dict[str, Any] = {"title": exc.title} if exc.title else {}
    return Problem(422, exc.kind, exc.message, field=exc.field, **title)


def _body_model(request: Request) -> type[BaseModel] | None:
    """The pydantic model of the matched route's request body, if it has one."""
    route = request.scope.get("route")
    field = route.body_field if isinstance(route, APIRoute) else None
    model = field.field_info.annotation if field is not None else None
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


async def on_http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    kinds = {404: "not-found", 405: "method-not-allowed"}
    return problem_response(Problem(exc.status_code, kinds.get(exc.status_code, "http-error"),
                                    str(exc.detail)))
