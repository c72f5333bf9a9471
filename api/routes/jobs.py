"""/v1/jobs: create, list, read, change and delete jobs."""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter

from api import models
from api.batcher import CreateBatcher
from api.models import JobPatch, JobRequest
from api.problems import Problem
from api.projection import ACTIVE_JOB as ACTIVE
from api.projection import PendingJob
from api.routes import responses
from api.routes.base import ERRORS, Json, KronRoute, ThisCall
from api.routes.render import job_out, upcoming_out
from api.routes.service import Service, job_id_for, new_id
from kron.settings import Settings
from schemas.jsonable import jsonable

router = APIRouter(route_class=KronRoute, tags=["jobs"])
REPLAYED: dict[int | str, dict[str, Any]] = {200: {"model": responses.CreatedJob,
                  "description": "The same create again (its idempotency_key): its job"}}


@router.post("/jobs", status_code=201, response_model=responses.CreatedJob,
             responses={**REPLAYED, **ERRORS})
async def create_job(req: JobRequest, call: ThisCall) -> Json:
    """Answered once Kafka has the CreateJob (acks=all). The API validated it as the worker
    will, and keeps it in `Unprojected` so its own reads see it until the projection does."""
    svc, tenant, key = call.svc, call.tenant, req.idempotency_key
    now = svc.clock.now_ms()
    creates = svc.creates if key is None else None  # a keyed create's id is the key's
    job_id = creates.job_id(tenant) if creates is not None else job_id_for(tenant, key)
    existing = svc.job(tenant, job_id)
    # A replayed create may come after its run_at passed: judge it without "now" checks.
    spec = models.build_spec(req, now_ms=now, check_times=existing is None,
                             **_rules(svc.settings, tenant))
    if existing is not None and existing["status"] != "deleted":
        return _replayed(svc, tenant, existing, spec, now)
    if svc.pending.get(tenant, job_id) is not None:  # reserved, Kafka has not acked yet
        raise Problem(409, "idempotency-key-in-flight",
                      "a request with this idempotency key is in progress",
                      field="idempotency_key")
    upcoming = models.upcoming(spec, now_ms=now)  # once: it re-runs plan_of
    pending = _reserve(svc, tenant, job_id, key, spec, now, upcoming)
    await _publish(svc, creates, pending)
    location = {"Location": f"/v1/jobs/{job_id}"}
    if existing is not None:
        # The key's job was deleted; the projection already has it (as deleted), so
        # there is nothing the views lack to fill in.
        svc.pending.drop(job_id)
        return Json(_created(svc, existing, now, []), status_code=201, headers=location)
    pending.acked = True
    return Json(_created(svc, pending.view, now, upcoming), status_code=201, headers=location)


@router.get("/jobs", response_model=responses.JobList, responses=ERRORS)
async def list_jobs(call: ThisCall, status: str | None = None, name: str | None = None,
                    limit: int = 50, cursor: str | None = None) -> Json:
    if not 1 <= limit <= 500:
        raise Problem(422, "invalid-input", "limit must be in 1..500", field="limit")
    svc = call.svc
    items: list[dict[str, Any]] = []
    next_cursor = None
    for job_id, entry, view in _tenant_jobs(svc, call.tenant, cursor):
        if entry["status"] == "deleted" or (status and entry["status"] != status):
            continue
        if name and name not in entry["name"]:
            continue
        if len(items) == limit:
            next_cursor = items[-1]["job_id"]
            break
        job = view or svc.views.job(job_id)
        if job is not None:
            items.append(job_out(svc.views, job))
    return Json({"jobs": items, "next_cursor": next_cursor})


@router.get("/jobs/{job_id}", response_model=responses.Job, responses=ERRORS)
async def get_job(job_id: str, call: ThisCall) -> Json:
    return Json(job_out(call.svc.views, call.own_job))


@router.patch("/jobs/{job_id}", response_model=responses.Job, responses=ERRORS)
async def update_job(job_id: str, patch: JobPatch, call: ThisCall) -> Json:
    """A JSON merge patch over the job's definition; answers once the projection shows it."""
    svc, tenant = call.svc, call.tenant
    spec = models.merge_patch(svc.spec_of(tenant, job_id), patch, now_ms=svc.clock.now_ms(),
                              **_rules(svc.settings, tenant))
    cmd = await svc.send(tenant, "UpdateJob", job_id, spec=spec, expected_version=None)
    updated = await svc.applied(job_id, cmd)
    return Json(job_out(svc.views, updated or call.own_job))


@router.delete("/jobs/{job_id}", response_model=responses.Job, responses=ERRORS)
async def delete_job(job_id: str, call: ThisCall) -> Json:
    svc = call.svc
    cmd = await svc.send(call.tenant, "DeleteJob", job_id)
    deleted = await svc.applied(job_id, cmd)
    return Json(job_out(svc.views, deleted or call.own_job))


def _rules(settings: Settings, tenant: str) -> dict[str, Any]:
    """build_spec's and merge_patch's settings: what a job of `tenant` may target."""
    return {"allow_private": settings.allow_private_targets,
            "topic_prefix": settings.topic_prefix, "tenant": tenant,
            "topic_grants": settings.topic_grants, "commands": settings.commands,
            "dag_max_tasks": settings.dag_max_tasks, "dag_max_edges": settings.dag_max_edges}


def _replayed(svc: Service, tenant: str, existing: dict[str, Any], spec: dict[str, Any],
              now: int) -> Json:
    """The answer to a create whose idempotency key made a job already: that job (200), if
    the body is the same; else a 422."""
    # A pending create computes its fingerprint only when a retry asks (most have no key).
    fingerprint = existing.get("fingerprint") or models.spec_fingerprint(
        svc.spec_of(tenant, existing["job_id"]))
    if fingerprint != models.spec_fingerprint(spec):
        raise Problem(422, "idempotency-key-reused",
                      "this idempotency key was used with a different body",
                      field="idempotency_key")
    stored = svc.spec_of(tenant, existing["job_id"])
    upcoming = models.upcoming(stored, now_ms=now) if existing["status"] in ACTIVE else []
    return Json(_created(svc, existing, now, upcoming), status_code=200)


def _created(svc: Service, job: dict[str, Any], now: int, upcoming: list[int]
             ) -> dict[str, Any]:
    out = job_out(svc.views, job)
    out["upcoming"] = upcoming_out(job["spec"], upcoming) if job["status"] in ACTIVE else []
    return out


async def _publish(svc: Service, creates: CreateBatcher | None, pending: PendingJob) -> None:
    """The CreateJob (or its place in a CreateJobs batch), acknowledged by Kafka; the
    reservation is dropped if it is not."""
    try:
        if creates is not None:
            await svc.create_batched(creates, pending.tenant, pending.job_id, pending.spec,
                                     pending.view)
        else:
            await svc.send(pending.tenant, "CreateJob", pending.job_id,
                           idempotency_key=pending.view["idempotency_key"], spec=pending.spec,
                           command_id=pending.view["applied_command_ids"][0])
    except BaseException:
        svc.pending.drop(pending.job_id)
        raise


def _reserve(svc: Service, tenant: str, job_id: str, key: str | None, spec: dict[str, Any],
             now: int, upcoming: list[int]) -> PendingJob:
    """Check the quota and hold the create's place in `Unprojected` in one step (no await
    between them), so concurrent creates can't all pass the same count."""
    with svc.pending.lock:
        # Projected active jobs plus creates not projected yet (in flight ones included).
        active = (svc.views.get(f"a/{tenant}".encode()) or 0) + svc.pending.count(tenant)
    if active >= svc.settings.tenants.quotas(tenant).max_active_jobs:
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
    fingerprint: `_replayed` computes it if a retry with the key comes."""
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
