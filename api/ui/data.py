"""The dashboard's own read routes, under /ui/api: what no /v1 route gives.

- GET /ui/api/jobs: the jobs search (name, metadata label, status, kind);
- GET /ui/api/jobs/{job_id}/upcoming: a job's next slots (GET /v1/jobs/{id} has only the
  next one);
- GET /ui/api/runs: recent runs across the tenant's jobs (the failures page);
- GET /ui/api/activity: the last hour's executions and lateness per minute (the overview).

Keyed and tenant-scoped exactly as /v1 is (KronRoute: 401 without a key, another tenant's
job is a 404), reading the same Views. Not in /openapi.json: they serve the dashboard, not
a public contract. The scans across jobs are bounded (MAX_JOBS, MAX_RUNS); an answer that
hit a bound says so (`truncated`)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter

from api import models
from api.problems import Problem
from api.projection import INVERT, Views
from api.routes.base import Json, KronRoute, ThisCall
from api.routes.render import STATES, job_out, run_out, upcoming_out
from api.routes.service import Service
from api.ui.pages import HEADERS
from api.ui.query import KINDS, MINUTE_MS, JobSearch, RunSample, activity, parse_label
from kron.timefmt import iso

router = APIRouter(route_class=KronRoute, prefix="/ui/api", include_in_schema=False)

MAX_JOBS = 5_000   # jobs of a tenant a scan across jobs reads at most
MAX_RUNS = 20_000  # run index entries a scan across jobs reads at most


@router.get("/jobs")
async def search_jobs(call: ThisCall, name: str | None = None, label: str | None = None,
                      status: str | None = None, kind: str | None = None, limit: int = 100,
                      cursor: str | None = None) -> Json:
    if not 1 <= limit <= 500:
        raise Problem(422, "invalid-input", "limit must be in 1..500", field="limit")
    if kind and kind not in KINDS:
        raise Problem(422, "invalid-input", f"kind must be one of {', '.join(KINDS)}",
                      field="kind")
    search = JobSearch(name=name or None, label=parse_label(label), status=status or None,
                       kind=kind or None)
    found = await asyncio.to_thread(_search, call.svc, call.tenant, search, limit, cursor)
    return Json(found, headers=HEADERS)


@router.get("/jobs/{job_id}/upcoming")
async def upcoming(job_id: str, call: ThisCall, count: int = 5) -> Json:
    """The job's next `count` slots from now, as the engine would arm them (jitter aside);
    none for a job that is completed."""
    if not 1 <= count <= 20:
        raise Problem(422, "invalid-input", "count must be in 1..20", field="count")
    svc, job = call.svc, call.own_job
    slots: list[int] = []
    if job["status"] in ("active", "paused"):
        slots = models.upcoming(svc.spec_of(call.tenant, job_id), now_ms=svc.clock.now_ms(),
                                count=count)
    schedule = job["spec"].get("schedule") or {}
    return Json({"job_id": job_id, "status": job["status"],
                 "upcoming": upcoming_out(job["spec"], slots),  # in the job's zone
                 "timezone": schedule.get("timezone", "UTC")}, headers=HEADERS)


@router.get("/runs")
async def recent_runs(call: ThisCall, state: str | None = None, since_minutes: int = 1440,
                      limit: int = 100) -> Json:
    """The tenant's runs whose slot is within the last `since_minutes`, newest slot first,
    each with its job's name; only those in `state` if given."""
    if state is not None and state not in STATES:
        raise Problem(422, "invalid-input", f"state must be one of {', '.join(STATES)}",
                      field="state")
    if not 1 <= since_minutes <= 7 * 1440:
        raise Problem(422, "invalid-input", "since_minutes must be in 1..10080",
                      field="since_minutes")
    if not 1 <= limit <= 500:
        raise Problem(422, "invalid-input", "limit must be in 1..500", field="limit")
    since = call.svc.clock.now_ms() - since_minutes * MINUTE_MS
    found = await asyncio.to_thread(_recent, call.svc.views, call.tenant, since, state, limit)
    return Json(found, headers=HEADERS)


@router.get("/activity")
async def recent_activity(call: ThisCall, minutes: int = 60) -> Json:
    """Per minute of the last `minutes`: executions started and their lateness."""
    if not 1 <= minutes <= 180:
        raise Problem(422, "invalid-input", "minutes must be in 1..180", field="minutes")
    now = call.svc.clock.now_ms()
    found = await asyncio.to_thread(_activity, call.svc.views, call.tenant, now, minutes)
    return Json(found, headers=HEADERS)


# --- the scans ------------------------------------------------------------------------------


def _search(svc: Service, tenant: str, search: JobSearch, limit: int,
            cursor: str | None) -> dict[str, Any]:
    """The tenant's matching jobs by job_id after `cursor`: the projected index, and the
    tenant's acknowledged creates the projection does not show yet (as GET /v1/jobs)."""
    pending = {p.job_id: p.view for p in svc.pending.acked_of(tenant, cursor)}
    prefix = f"t/{tenant}/".encode()
    start = prefix + cursor.encode() + b"\x00" if cursor else None
    index: dict[str, dict[str, Any]] = {}
    truncated = False
    for key, entry in svc.views.prefix(prefix, start=start):
        if len(index) >= MAX_JOBS:
            truncated = True
            break
        index[key[len(prefix):].decode()] = entry
    for job_id, acked in pending.items():
        index.setdefault(job_id, {"status": acked["status"], "name": acked["spec"]["name"]})
    jobs: list[dict[str, Any]] = []
    next_cursor = None
    for job_id in sorted(index):
        if not search.matches_index(index[job_id]):
            continue
        view = svc.views.job(job_id) or pending.get(job_id)
        if view is None or (search.needs_definition and not search.matches(view["spec"])):
            continue
        if len(jobs) == limit:
            next_cursor = jobs[-1]["job_id"]
            break
        jobs.append(job_out(svc.views, view))
    return {"jobs": jobs, "next_cursor": next_cursor, "truncated": truncated}


@dataclass
class _Scan:
    """A bounded walk over the tenant's runs whose slot is at or after `since_ms`."""

    views: Views
    tenant: str
    since_ms: int
    read: int = 0
    truncated: bool = False
    names: dict[str, str] = field(default_factory=dict)

    def entries(self) -> Iterator[tuple[str, int, str, str]]:
        """(job_id, scheduled_for_ms, exec_id, state) of each run in the window, job by job,
        newest slot first within a job."""
        prefix = f"t/{self.tenant}/".encode()
        for n, (key, entry) in enumerate(self.views.prefix(prefix)):
            if n >= MAX_JOBS:
                self.truncated = True
                return
            job_id = key[len(prefix):].decode()
            self.names[job_id] = entry["name"]
            runs = f"r/{job_id}/".encode()
            for run_key, run in self.views.prefix(runs):
                inverted, _, exec_id = run_key[len(runs):].decode().partition("/")
                scheduled = INVERT - int(inverted)
                if scheduled < self.since_ms:
                    break
                if self.read >= MAX_RUNS:
                    self.truncated = True
                    return
                self.read += 1
                yield job_id, scheduled, exec_id, run["state"]


def _recent(views: Views, tenant: str, since_ms: int, state: str | None,
            limit: int) -> dict[str, Any]:
    scan = _Scan(views, tenant, since_ms)
    found = sorted(((scheduled, job_id, exec_id) for job_id, scheduled, exec_id, st
                    in scan.entries() if state is None or st == state), reverse=True)
    runs = []
    for _, job_id, exec_id in found[:limit]:
        ex = views.execution(exec_id)
        if ex is not None and ex["tenant"] == tenant:
            runs.append({**run_out(ex), "job_name": scan.names.get(job_id)})
    return {"runs": runs, "matched": len(found), "truncated": scan.truncated,
            "since": iso(since_ms)}


def _activity(views: Views, tenant: str, now_ms: int, minutes: int) -> dict[str, Any]:
    scan = _Scan(views, tenant, now_ms - minutes * MINUTE_MS)
    samples = []
    for _, _, exec_id, _ in scan.entries():
        ex = views.execution(exec_id)
        if ex is not None:
            samples.append(RunSample(scheduled_for_ms=ex["scheduled_for_ms"],
                                     started_at_ms=ex["started_at_ms"], state=ex["state"],
                                     lateness_ms=ex["lateness_ms"]))
    return {"minutes": activity(samples, now_ms=now_ms, minutes=minutes),
            "runs": len(samples), "truncated": scan.truncated}
