"""/v1/dead-letters: the caller's dead letters and failure alerts, and redrives.

A listed dead letter is the tenant's own: a command it (or a producer in its name) sent
that the worker refused, or an alert of one of its jobs (a failed execution, a missed
slot). Another tenant's id answers 404, as if it did not exist. A redrive sends a mended
command in its place: the body is the job's definition, checked as `POST /v1/jobs` checks
it, sent as the refused command's kind (a CreateJob with the job id the producer chose, or
an UpdateJob of that job). The redrive is recorded on kron.dead-letters (the view marks the
dead letter), and a dead letter is redriven once (409 after).
"""

from __future__ import annotations

import re
from typing import Any, Final

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict

from api import models
from api.dead_letters import REDRIVEN, index_prefix
from api.models import JobRequest
from api.problems import Problem
from api.publisher import BrokerUnavailable
from api.routes.base import ERRORS, Json, KronRoute, ThisCall
from api.routes.jobs import _publish, _reserve, _rules
from api.routes.service import Call, Service, new_id, not_acknowledged
from kron.timefmt import iso
from schemas.envelope import make_envelope

router = APIRouter(route_class=KronRoute, tags=["dead-letters"])
_ID = re.compile(r"dl_[0-9a-f]{32}")
_CURSOR = re.compile(r"[0-9]{19}/dl_[0-9a-f]{32}")
REDRIVABLE: Final = frozenset({"CreateJob", "UpdateJob"})
# Redrives this process sent that the view does not show yet: a second one is a 409 too.
_IN_FLIGHT: set[str] = set()


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DeadLetter(_Out):
    id: str
    kind: str  # "command": a refused command; "alert": a failed execution or missed slot
    error_class: str
    error: str
    occurred_at: str
    command: dict[str, Any] | None
    alert: dict[str, Any] | None
    redriven: dict[str, Any] | None


class DeadLetterList(_Out):
    dead_letters: list[DeadLetter]
    next_cursor: str | None


class Redriven(_Out):
    dead_letter_id: str
    command: str
    command_id: str
    job_id: str


@router.get("/dead-letters", response_model=DeadLetterList, responses=ERRORS)
async def list_dead_letters(call: ThisCall, limit: int = 50,
                            cursor: str | None = None) -> Json:
    """The tenant's dead letters, newest first; `next_cursor` pages on."""
    if not 1 <= limit <= 500:
        raise Problem(422, "invalid-input", "limit must be in 1..500", field="limit")
    if cursor is not None and not _CURSOR.fullmatch(cursor):
        raise Problem(422, "invalid-input", "cursor is not one this API gave", field="cursor")
    prefix = index_prefix(call.tenant)
    start = None if cursor is None else prefix + cursor.encode() + b"\x00"
    items: list[dict[str, Any]] = []
    next_cursor = None
    for key, view in call.svc.views.prefix(prefix, start=start):
        if len(items) == limit:
            next_cursor = items[-1]["_key"]
            break
        items.append({**_rendered(view), "_key": key[len(prefix):].decode()})
    for item in items:
        del item["_key"]
    return Json({"dead_letters": items, "next_cursor": next_cursor})


class RedriveRoute(KronRoute):
    """Another tenant's (or no) dead letter is a 404 before the body is read, as a job
    route answers for another tenant's job."""

    def caller(self, svc: Service, request: Request) -> Call:
        call = super().caller(svc, request)
        _own(svc, call.tenant, request.path_params["dl_id"])
        return call


async def redrive(dl_id: str, req: JobRequest, call: ThisCall) -> Json:
    """Send the mended command in the dead letter's place (its kind, its job id)."""
    svc, tenant = call.svc, call.tenant
    view = _own(svc, tenant, dl_id)
    if view["redriven"] is not None or dl_id in _IN_FLIGHT:
        raise Problem(409, "already-redriven", f"dead letter {dl_id} was redriven already",
                      field="dl_id")
    command = view["command"]
    if view["kind"] != "command" or command["name"] not in REDRIVABLE:
        raise Problem(422, "not-redrivable", "only a refused CreateJob or UpdateJob can be "
                                             "redriven", field="dl_id")
    _IN_FLIGHT.add(dl_id)
    try:
        command_id = await _send(svc, tenant, command["name"], command["job_id"], req)
        await _mark(svc, tenant, dl_id, command_id)
        await svc.projector.wait_async(lambda: _redriven(svc, tenant, dl_id), 5.0)
    finally:
        _IN_FLIGHT.discard(dl_id)
    return Json({"dead_letter_id": dl_id, "command": command["name"],
                 "command_id": command_id, "job_id": command["job_id"]}, status_code=202)


router.add_api_route("/dead-letters/{dl_id}:redrive", redrive, methods=["POST"],
                     status_code=202, response_model=Redriven, responses=ERRORS,
                     route_class_override=RedriveRoute)


def _own(svc: Service, tenant: str, dl_id: str) -> dict[str, Any]:
    where = svc.views.get(f"dx/{dl_id}".encode()) if _ID.fullmatch(dl_id) else None
    view = None if where is None or where["tenant"] != tenant else svc.views.get(
        where["key"].encode())
    if view is None:  # another tenant's: its existence is not ours to reveal
        raise Problem(404, "dead-letter-not-found", f"no dead letter {dl_id!r}", field="dl_id")
    return view  # type: ignore[no-any-return]


def _redriven(svc: Service, tenant: str, dl_id: str) -> bool:
    try:
        return _own(svc, tenant, dl_id)["redriven"] is not None
    except Problem:
        return False


async def _send(svc: Service, tenant: str, name: str, job_id: str, req: JobRequest) -> str:
    """The mended command, checked as the API checks a create or a change."""
    now = svc.clock.now_ms()
    spec = models.build_spec(req, now_ms=now, **_rules(svc.settings, tenant))
    if name == "UpdateJob":
        svc.own_job(tenant, job_id)  # 404 if it is gone
        return await svc.send(tenant, "UpdateJob", job_id, spec=spec, expected_version=None)
    existing = svc.job(tenant, job_id)
    if (existing is not None and existing["status"] != "deleted") or svc.pending.get(
            tenant, job_id) is not None:
        raise Problem(409, "job-exists", f"job {job_id!r} exists already", field="job_id")
    upcoming = models.upcoming(spec, now_ms=now)
    pending = _reserve(svc, tenant, job_id, None, spec, now, upcoming)
    await _publish(svc, None, pending)
    pending.acked = True
    return str(pending.view["applied_command_ids"][0])


async def _mark(svc: Service, tenant: str, dl_id: str, command_id: str) -> None:
    """The redrive, on kron.dead-letters, for the view (and a rebuild) to mark it."""
    record = {
        "envelope": make_envelope(
            event_id=new_id(), event_type="deadletter.redriven",
            occurred_at_ms=svc.clock.now_ms(), tenant=tenant, causation_id=dl_id,
            correlation_id=command_id, producer="api"),
        "source_topic": "api", "source_partition": -1, "source_offset": -1,
        "key": dl_id.encode(), "value": None,
        "error": f"redriven as command {command_id}", "error_class": REDRIVEN}
    try:
        await svc.publisher.publish("kron.deadletter.DeadLetter", record, key=dl_id,
                                    topic=svc.settings.topic("dead-letters"))
    except BrokerUnavailable as exc:
        raise not_acknowledged(exc) from exc


def _rendered(view: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in view.items() if k != "occurred_at_ms"}
    out["occurred_at"] = iso(view["occurred_at_ms"])
    if view.get("alert") is not None:
        alert = {k: v for k, v in view["alert"].items() if k != "scheduled_for_ms"}
        at = view["alert"]["scheduled_for_ms"]
        alert["scheduled_for"] = None if at is None else iso(at)
        out["alert"] = alert
    if view.get("redriven") is not None:
        out["redriven"] = {"command_id": view["redriven"]["command_id"],
                           "at": iso(view["redriven"]["at_ms"])}
    return out
