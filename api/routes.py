"""The /v1 endpoints. Writes become Avro commands on kron.commands (acks=all).

A create answers once Kafka acknowledged it (the durable point): the API validated it as the
worker will, and keeps it in `Unprojected` so its own reads see it until the projection does.
Other writes wait (bounded) until the projection reflects the caller's command."""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StrictBool, ValidationError

from api import backfill, models
from api.auth import Authenticator, RateLimiter
from api.batcher import CreateBatcher
from api.problems import Problem
from api.projection import ACTIVE_JOB as ACTIVE
from api.projection import PendingJob, Projector, Unprojected, Views, jsonable
from api.publisher import BrokerUnavailable, CommandPublisher
from kron.clock import Clock
from kron.settings import Settings

MAX_DEPTH = 32
READ_YOUR_WRITES_S = 5.0
STATES = ("queued", "running", "retry_pending", "succeeded", "failed", "skipped", "missed",
          "cancelled")


class Json(JSONResponse):
    """orjson: several times faster than json.dumps for the job bodies."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


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


@dataclass
class Service:
    settings: Settings
    views: Views
    projector: Projector
    publisher: CommandPublisher
    clock: Clock
    auth: Authenticator
    limiter: RateLimiter
    creates: CreateBatcher | None = None  # None: every create is a CreateJob of its own

    @property
    def pending(self) -> Unprojected:
        return self.projector.unprojected

    # --- request plumbing --------------------------------------------------------------------

    async def body(self, request: Request) -> Any:
        """The JSON body, after the checks that must come before parsing it."""
        ctype = request.headers.get("content-type", "")
        if ctype.split(";")[0].strip().lower() != "application/json":
            raise Problem(415, "unsupported-media-type", "send application/json")
        raw = b""
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > self.settings.max_body_bytes:
                raise Problem(413, "body-too-large",
                              f"the body is over {self.settings.max_body_bytes} bytes")
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise Problem(400, "malformed-json", f"the body is not valid JSON: {exc}") from exc
        if _depth(data, MAX_DEPTH) > MAX_DEPTH:
            raise Problem(400, "json-too-deep", f"JSON nesting is limited to {MAX_DEPTH}")
        return data

    def tenant(self, request: Request, *, write: bool = False) -> str:
        tenant = self.auth.tenant_of(request)
        if write:
            self.limiter.take(tenant)
        return tenant

    def job(self, tenant: str, job_id: str) -> dict[str, Any] | None:
        """The projected job, else the tenant's acknowledged create not projected yet."""
        job = self.views.job(job_id)
        if job is None:
            pending = self.pending.get(tenant, job_id)
            job = pending.view if pending is not None and pending.acked else None
        return job

    def spec_of(self, tenant: str, job_id: str) -> dict[str, Any]:
        """The job's Avro JobSpec as stored (projected state or pending create)."""
        state = self.views.job_state(job_id)
        if state is not None:
            return state["spec"]  # type: ignore[no-any-return]
        pending = self.pending.get(tenant, job_id)
        assert pending is not None, "own_job found the job"
        return pending.spec

    def own_job(self, tenant: str, job_id: str) -> dict[str, Any]:
        job = self.job(tenant, job_id)
        # Another tenant's job answers 404: its existence is not ours to reveal.
        if job is None or job["tenant"] != tenant or job["status"] == "deleted":
            raise Problem(404, "job-not-found", f"no job {job_id!r}", field="job_id")
        return job

    async def send(self, tenant: str, kind: str, job_id: str, *, command_id: str | None = None,
                   **fields: Any) -> str:
        command_id = command_id or new_id()
        record = {
            "envelope": {"event_id": command_id,
                         "event_type": f"job.{kind.removesuffix('Job').lower()}_requested",
                         "schema_version": 1, "occurred_at_ms": self.clock.now_ms(),
                         "tenant": tenant, "causation_id": None, "correlation_id": None,
                         "producer": "api"},
            "command_id": command_id, "job_id": job_id, **fields,
        }
        try:
            await self.publisher.publish(f"kron.commands.{kind}", record, key=job_id)
        except BrokerUnavailable as exc:
            raise _not_acknowledged(exc) from exc
        return command_id

    async def create_batched(self, creates: CreateBatcher, tenant: str, job_id: str,
                             spec: dict[str, Any], view: dict[str, Any]) -> None:
        """A keyless create, in its tenant's next CreateJobs record (api/batcher.py)."""
        command_id, acked = creates.add(tenant, job_id, spec)
        view["applied_command_ids"] = [command_id]  # what the worker will record
        try:
            await acked
        except BrokerUnavailable as exc:
            raise _not_acknowledged(exc) from exc

    async def applied(self, job_id: str, command_id: str) -> dict[str, Any] | None:
        """Read-your-writes: wait until the projection shows the command applied."""
        def seen() -> bool:
            job = self.views.job(job_id)
            return job is not None and command_id in job["applied_command_ids"]

        await self.projector.wait_async(seen, READ_YOUR_WRITES_S)
        return self.views.job(job_id)

    # --- views -------------------------------------------------------------------------------

    def job_out(self, job: dict[str, Any], *, now_ms: int) -> dict[str, Any]:
        nxt = job.get("next_run_at_ms")
        return {
            "job_id": job["job_id"], "name": job["spec"]["name"], "status": job["status"],
            "version": job["version"], "next_run_at": models.iso(nxt) if nxt else None,
            "created_at": models.iso(job["created_at_ms"]),
            "updated_at": models.iso(job["updated_at_ms"]),
            "idempotency_key": job.get("idempotency_key"),
            "definition": job["spec"], "last_run": self.run_summary(job.get("last_run")),
        }

    def run_summary(self, last: dict[str, Any] | None) -> dict[str, Any] | None:
        if last is None:
            return None
        ex = self.views.execution(last["exec_id"])
        return self.run_out(ex, full=False) if ex else None

    @staticmethod
    def run_out(ex: dict[str, Any], *, full: bool) -> dict[str, Any]:
        out = {
            "run_id": ex["exec_id"], "job_id": ex["job_id"], "state": ex["state"],
            "trigger": ex["trigger"], "scheduled_for": models.iso(ex["scheduled_for_ms"]),
            "attempt": ex["attempt"], "worker": ex["worker"],
            "started_at": models.iso(ex["started_at_ms"]) if ex["started_at_ms"] else None,
            "finished_at": models.iso(ex["finished_at_ms"]) if ex["finished_at_ms"] else None,
            "lateness_ms": ex["lateness_ms"], "error": ex["last_error"],
            "reason": ex["reason"], "dst_outcome": ex["dst_outcome"],
        }
        if full:
            out["attempts"] = [
                {**a, "started_at": models.iso(a["started_at_ms"]),
                 "finished_at": models.iso(a["finished_at_ms"]) if a["finished_at_ms"] else None}
                for a in ex["attempts"]]
            out["status_code"] = ex["status_code"]
        return out


_ids = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _ids.seed(os.urandom(32)))  # no shared sequence


def _not_acknowledged(exc: BrokerUnavailable) -> Problem:
    return Problem(503, "broker-unavailable", f"Kafka did not acknowledge the command: {exc}",
                   headers={"Retry-After": "5"})


def new_id() -> str:
    """128 random bits as hex, like uuid4().hex, without a getrandom() call per id: that call
    releases the GIL, and winning it back from the projector thread took up to a switch
    interval (5 ms) on every create. Ids need uniqueness here, not secrecy."""
    return f"{_ids.getrandbits(128):032x}"


def job_id_for(tenant: str, idempotency_key: str | None) -> str:
    if idempotency_key is None:
        return "j_" + new_id()
    digest = hashlib.blake2b(f"{tenant}\x00{idempotency_key}".encode(), digest_size=12)
    return "j_" + digest.hexdigest()


def build_router(svc: Service) -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["jobs"])

    @router.post("/jobs", status_code=201, openapi_extra=_body_doc(models.JobRequest))
    async def create_job(request: Request) -> JSONResponse:
        tenant = svc.tenant(request, write=True)
        req = _invalid_as_422(models.parse_request, await svc.body(request))
        now = svc.clock.now_ms()
        key = req.idempotency_key
        creates = svc.creates if key is None else None  # a keyed create's id is the key's
        job_id = creates.job_id(tenant) if creates is not None else job_id_for(tenant, key)
        existing = svc.job(tenant, job_id)
        # A replayed create may come after its run_at passed: judge it without "now" checks.
        spec = _spec_or_problem(req, now, svc.settings, check_times=existing is None,
                                tenant=tenant)
        if existing is not None and existing["status"] != "deleted":
            if _fingerprint(svc, tenant, existing) != models.spec_fingerprint(spec):
                raise Problem(422, "idempotency-key-reused",
                              "this idempotency key was used with a different body",
                              field="idempotency_key")
            stored = svc.spec_of(tenant, job_id)
            return Json(_created(svc, existing, now, _upcoming(existing, stored, now)),
                        status_code=200)
        if svc.pending.get(tenant, job_id) is not None:  # reserved, Kafka has not acked yet
            raise Problem(409, "idempotency-key-in-flight",
                          "a request with this idempotency key is in progress",
                          field="idempotency_key")
        upcoming = models.upcoming(spec, now_ms=now)  # once: it re-runs plan_of
        pending = _reserve(svc, tenant, job_id, key, spec, now, upcoming)
        try:
            if creates is not None:
                await svc.create_batched(creates, tenant, job_id, spec, pending.view)
            else:
                await svc.send(tenant, "CreateJob", job_id, idempotency_key=key, spec=spec,
                               command_id=pending.view["applied_command_ids"][0])
        except BaseException:
            svc.pending.drop(job_id)
            raise
        if existing is not None:
            # The key's job was deleted; the projection already has it (as deleted), so
            # there is nothing the views lack to fill in.
            svc.pending.drop(job_id)
            return Json(_created(svc, existing, now, []), status_code=201,
                        headers={"Location": f"/v1/jobs/{job_id}"})
        pending.acked = True
        return Json(_created(svc, pending.view, now, upcoming), status_code=201,
                    headers={"Location": f"/v1/jobs/{job_id}"})

    @router.get("/jobs")
    async def list_jobs(request: Request, status: str | None = None, name: str | None = None,
                        limit: int = 50, cursor: str | None = None) -> JSONResponse:
        tenant = svc.tenant(request)
        if not 1 <= limit <= 500:
            raise Problem(422, "invalid-input", "limit must be in 1..500", field="limit")
        items: list[dict[str, Any]] = []
        next_cursor = None
        for job_id, entry, view in _tenant_jobs(svc, tenant, cursor):
            if entry["status"] == "deleted" or (status and entry["status"] != status):
                continue
            if name and name not in entry["name"]:
                continue
            if len(items) == limit:
                next_cursor = items[-1]["job_id"]
                break
            job = view or svc.views.job(job_id)
            if job is not None:
                items.append(svc.job_out(job, now_ms=svc.clock.now_ms()))
        return Json({"jobs": items, "next_cursor": next_cursor})

    @router.get("/jobs/{job_id}")
    async def get_job(request: Request, job_id: str) -> JSONResponse:
        tenant = svc.tenant(request)
        return Json(svc.job_out(svc.own_job(tenant, job_id), now_ms=svc.clock.now_ms()))

    @router.patch("/jobs/{job_id}", openapi_extra=_body_doc(models.JobPatch))
    async def update_job(request: Request, job_id: str) -> JSONResponse:
        tenant = svc.tenant(request, write=True)
        job = svc.own_job(tenant, job_id)
        patch = _invalid_as_422(models.parse_patch, await svc.body(request))
        now = svc.clock.now_ms()
        spec = _invalid_as_422(models.merge_patch, svc.spec_of(tenant, job_id), patch, now_ms=now,
                               allow_private=svc.settings.allow_private_targets,
                               topic_prefix=svc.settings.topic_prefix, tenant=tenant,
                               topic_grants=svc.settings.topic_grants,
                               commands=svc.settings.commands)
        cmd = await svc.send(tenant, "UpdateJob", job_id, spec=spec, expected_version=None)
        updated = await svc.applied(job_id, cmd)
        return Json(svc.job_out(updated or job, now_ms=now))

    @router.delete("/jobs/{job_id}")
    async def delete_job(request: Request, job_id: str) -> JSONResponse:
        tenant = svc.tenant(request, write=True)
        job = svc.own_job(tenant, job_id)
        cmd = await svc.send(tenant, "DeleteJob", job_id)
        deleted = await svc.applied(job_id, cmd)
        return Json(svc.job_out(deleted or job, now_ms=svc.clock.now_ms()))

    @router.post("/jobs/{job_id}:{action}", openapi_extra=_body_doc(BackfillRequest))
    async def job_action(request: Request, job_id: str, action: str) -> JSONResponse:
        kinds = {"pause": "PauseJob", "resume": "ResumeJob", "trigger": "TriggerJob",
                 "backfill": "BackfillJob"}
        if action not in kinds:
            raise Problem(404, "not-found", f"no action {action!r}", field="action")
        tenant = svc.tenant(request, write=True)
        job = svc.own_job(tenant, job_id)
        fields: dict[str, Any] = {}
        counts = None
        if action == "backfill":
            try:
                req = BackfillRequest.model_validate(await svc.body(request))
            except ValidationError as exc:
                err = exc.errors()[0]
                raise Problem(422, "invalid-input", err["msg"], field=".".join(
                    str(p) for p in err["loc"]) or None) from exc
            fields = _backfill_fields(req, svc.clock.now_ms())
            # Counted (and refused past the limit) before anything is sent.
            counts = await asyncio.to_thread(
                backfill.counts, svc.views, svc.spec_of(tenant, job_id), job_id,
                from_ms=fields["from_ms"], to_ms=fields["to_ms"], rerun=fields["rerun"])
        cmd = await svc.send(tenant, kinds[action], job_id, **fields)
        after = await svc.applied(job_id, cmd)
        out = svc.job_out(after or job, now_ms=svc.clock.now_ms())
        if counts is not None:
            out["backfill"] = counts
        return Json(out, status_code=202 if action in ("trigger", "backfill") else 200)

    async def runs(request: Request, job_id: str, status: str | None = None,
                   limit: int = 50, cursor: str | None = None) -> JSONResponse:
        tenant = svc.tenant(request)
        svc.own_job(tenant, job_id)
        if status is not None and status not in STATES:
            raise Problem(422, "invalid-input", f"status must be one of {', '.join(STATES)}",
                          field="status")
        if not 1 <= limit <= 500:
            raise Problem(422, "invalid-input", "limit must be in 1..500", field="limit")
        prefix = f"r/{job_id}/".encode()
        start = prefix + cursor.encode() + b"\x00" if cursor else None
        items: list[dict[str, Any]] = []
        next_cursor = None
        for key, entry in svc.views.prefix(prefix, start=start):
            if status and entry["state"] != status:
                continue
            if len(items) == limit:
                break
            ex = svc.views.execution(key.rsplit(b"/", 1)[-1].decode())
            if ex is not None:
                items.append(svc.run_out(ex, full=False))
                next_cursor = key[len(prefix):].decode()
        else:
            next_cursor = None
        return Json({"runs": items, "next_cursor": next_cursor})

    router.add_api_route("/jobs/{job_id}/runs", runs, methods=["GET"])
    router.add_api_route("/jobs/{job_id}/executions", runs, methods=["GET"])

    @router.get("/runs/{run_id}")
    async def get_run(request: Request, run_id: str) -> JSONResponse:
        tenant = svc.tenant(request)
        ex = svc.views.execution(run_id)
        if ex is None or ex["tenant"] != tenant:
            raise Problem(404, "run-not-found", f"no run {run_id!r}", field="run_id")
        return Json(svc.run_out(ex, full=True))

    @router.get("/stats")
    async def stats(request: Request) -> JSONResponse:
        tenant = svc.tenant(request)
        counts = {s: svc.views.get(f"c/{tenant}/{s}".encode()) or 0 for s in STATES}
        return Json({"runs_by_state": counts})

    return router


def _invalid_as_422(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except models.InvalidField as exc:
        title: dict[str, Any] = {"title": exc.title} if exc.title else {}
        raise Problem(422, exc.kind, exc.message, field=exc.field, **title) from exc


def _spec_or_problem(req: Any, now: int, settings: Settings, *,
                     check_times: bool, tenant: str) -> dict[str, Any]:
    return _invalid_as_422(  # type: ignore[no-any-return]
        models.build_spec, req, now_ms=now, allow_private=settings.allow_private_targets,
        topic_prefix=settings.topic_prefix, check_times=check_times, tenant=tenant,
        topic_grants=settings.topic_grants, commands=settings.commands)


def _created(svc: Service, job: dict[str, Any], now: int, upcoming: list[int]
             ) -> dict[str, Any]:
    out = svc.job_out(job, now_ms=now)
    out["upcoming"] = [models.iso(t) for t in upcoming] if job["status"] in ACTIVE else []
    return out


def _upcoming(job: dict[str, Any], spec: dict[str, Any], now: int) -> list[int]:
    return models.upcoming(spec, now_ms=now) if job["status"] in ACTIVE else []


def _fingerprint(svc: Service, tenant: str, job: dict[str, Any]) -> str:
    # A pending create computes it only when a retry asks (most creates have no key).
    return job.get("fingerprint") or models.spec_fingerprint(svc.spec_of(tenant, job["job_id"]))


def _reserve(svc: Service, tenant: str, job_id: str, key: str | None, spec: dict[str, Any],
             now: int, upcoming: list[int]) -> PendingJob:
    """Check the quota and hold the create's place in `Unprojected` in one step (no await
    between them), so concurrent creates can't all pass the same count."""
    with svc.pending.lock:
        # Projected active jobs plus creates not projected yet (in flight ones included).
        active = (svc.views.get(f"a/{tenant}".encode()) or 0) + svc.pending.count(tenant)
    if active >= svc.settings.tenant_max_active_jobs:
        raise Problem(429, "quota-exceeded",
                      f"this tenant has {active} active jobs, the limit", headers={
                          "Retry-After": "60"})
    pending = PendingJob(tenant=tenant, job_id=job_id, spec=spec,
                         view=_pending_view(tenant, job_id, key, spec, now, upcoming))
    if not svc.pending.reserve(pending):
        raise Problem(503, "projection-lagging",
                      f"{len(svc.pending)} accepted jobs wait for the worker; try again soon",
                      headers={"Retry-After": "5"})
    return pending


def _pending_view(tenant: str, job_id: str, key: str | None, spec: dict[str, Any],
                  now: int, upcoming: list[int]) -> dict[str, Any]:
    """The job as the projection will show it once the worker created it: the worker runs
    the same plan_of and next-slot search, so status and next run are known now; its
    created_at/updated_at (the worker's clock) replace this one's when projected. No
    fingerprint: `_fingerprint` computes it if a retry with the key comes."""
    return {
        "job_id": job_id, "tenant": tenant, "version": 1,
        "status": "active" if upcoming else "completed",
        "spec": jsonable(models.request_of(spec)), "fingerprint": None,
        "created_at_ms": now, "updated_at_ms": now,
        "next_run_at_ms": upcoming[0] if upcoming else None, "cursor_ms": None,
        "idempotency_key": key, "applied_command_ids": [new_id()], "last_run": None,
    }


def _tenant_jobs(svc: Service, tenant: str, cursor: str | None,
                 ) -> Iterator[tuple[str, dict[str, Any], dict[str, Any] | None]]:
    """(job_id, index entry, full view or None to read) by job_id after `cursor`: the
    projected index merged with the tenant's acknowledged creates not projected yet."""
    # Pending first: a job projected between the two reads is then in both (deduplicated
    # below) rather than in neither.
    pending = [(p.job_id, 1, p) for p in svc.pending.acked_of(tenant, cursor)]
    prefix = f"t/{tenant}/".encode()
    start = prefix + cursor.encode() + b"\x00" if cursor else None
    projected = ((key[len(prefix):].decode(), 0, entry)
                 for key, entry in svc.views.prefix(prefix, start=start))
    last = None
    for job_id, source, item in heapq.merge(projected, pending, key=lambda t: t[:2]):
        if job_id == last:
            continue
        last = job_id
        if source == 0:
            yield job_id, item, None
        else:
            view = item.view
            yield job_id, {"status": view["status"], "name": view["spec"]["name"]}, view


class BackfillRequest(BaseModel):
    """Run the job's slots between `from` and `to` (both in the past, both included), paced:
    every one of them, at most api.backfill.MAX_BACKFILL_SLOTS. A slot already recorded
    stays as it is, unless `rerun` asks to run a failed, missed or skipped one again."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    from_: AwareDatetime = Field(alias="from")
    to: AwareDatetime
    max_per_s: float = Field(default=10.0, gt=0, le=1000, allow_inf_nan=False)
    rerun: StrictBool = Field(default=False, description=(
        "Run slots whose run ended failed, missed or skipped again, as a new attempt of the "
        "same run (same Idempotency-Key, higher X-Kron-Attempt). Running and succeeded "
        "slots are never run again."))


MAX_BACKFILL_MS = 366 * 86_400_000


def _backfill_fields(req: BackfillRequest, now: int) -> dict[str, Any]:
    start = int(req.from_.timestamp() * 1000)
    end = int(req.to.timestamp() * 1000)
    if end < start:
        raise Problem(422, "invalid-input", "`to` must not be before `from`", field="to")
    if end > now:
        raise Problem(422, "invalid-input", "backfill covers past slots only", field="to")
    if end - start > MAX_BACKFILL_MS:
        raise Problem(422, "invalid-input", "a backfill spans at most 366 days", field="from")
    return {"from_ms": start, "to_ms": end, "max_per_s": req.max_per_s, "rerun": req.rerun}


REF = "#/components/schemas/{model}"
BODY_MODELS: list[type[BaseModel]] = []


def _body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """Bodies are parsed by hand (size, depth, media type first), so document them here."""
    BODY_MODELS.append(model)
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": REF.format(model=model.__name__)}}}}}


def body_schemas() -> dict[str, Any]:
    """Component schemas for the hand-parsed bodies, $defs included."""
    out: dict[str, Any] = {}
    for model in BODY_MODELS:
        schema = model.model_json_schema(ref_template=REF)
        out.update(schema.pop("$defs", {}))
        out[model.__name__] = schema
    return out

