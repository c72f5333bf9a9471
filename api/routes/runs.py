"""/v1/jobs/{job_id}/runs (also at /executions) and /v1/runs/{run_id}: a job's runs;
/v1/runs: the tenant's runs across its jobs (deleted jobs' too), by state and time.

A DAG job's run is one run (its slot's execution) whose tasks are listed with it: counted by
state in lists, in full (with each task's place in the DAG and its attempts) in
/v1/runs/{run_id}. A task instance's own id also answers there, as the execution it is."""

from __future__ import annotations

import heapq
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import APIRouter

from api.models import parse_time
from api.problems import Problem
from api.projection import INVERT, Views, tenant_runs_prefix
from api.routes import responses
from api.routes.base import ERRORS, Json, KronRoute, ThisCall
from api.routes.render import STATES, run_detail, run_out
from kron.timefmt import iso

router = APIRouter(route_class=KronRoute, tags=["runs"])

# A /v1/runs cursor: the last run's place in the tenant's index (projection.tenant_run_suffix).
TENANT_CURSOR = re.compile(r"[0-9]{19}/[^/]+")
TASK_STATES = ("pending", "running", "succeeded", "failed", "skipped", "upstream_failed",
               "cancelled")


async def list_runs(job_id: str, call: ThisCall, status: str | None = None, limit: int = 50,
                    cursor: str | None = None) -> Json:
    """The job's runs, newest slot first (KronRoute has checked the job is the caller's)."""
    if status is not None and status not in STATES:
        raise Problem(422, "invalid-input", f"status must be one of {', '.join(STATES)}",
                      field="status")
    if not 1 <= limit <= 500:
        raise Problem(422, "invalid-input", "limit must be in 1..500", field="limit")
    prefix = f"r/{job_id}/".encode()
    start = prefix + cursor.encode() + b"\x00" if cursor else None
    items: list[dict[str, Any]] = []
    next_cursor = None
    views = call.svc.views
    for key, entry in views.prefix(prefix, start=start):
        if status and entry["state"] != status:
            continue
        if len(items) == limit:
            break
        ex = views.execution(key.rsplit(b"/", 1)[-1].decode())
        if ex is not None:
            items.append(run_item(ex))
            next_cursor = key[len(prefix):].decode()
    else:
        next_cursor = None
    return Json({"runs": items, "next_cursor": next_cursor})


for _path in ("/jobs/{job_id}/runs", "/jobs/{job_id}/executions"):
    router.add_api_route(_path, list_runs, methods=["GET"], response_model=responses.RunList,
                         responses=ERRORS)


@router.get("/runs", response_model=responses.RunList, responses=ERRORS)
async def list_tenant_runs(call: ThisCall, state: str | None = None, since: str | None = None,
                           limit: int = 50, cursor: str | None = None) -> Json:
    """The tenant's runs across all its jobs, deleted jobs' included, newest slot first:
    those in `state`, scheduled at or after `since` (RFC 3339 with an offset). DAG runs
    are listed with their tasks counted; task instances are not runs."""
    _check_page(state, limit)
    since_ms = parse_time(since, "since") if since is not None else None
    if cursor is not None and not TENANT_CURSOR.fullmatch(cursor):
        raise Problem(422, "invalid-input", "cursor is not one this list gave",
                      field="cursor")
    prefix = tenant_runs_prefix(call.tenant, state)
    # Keys hold INVERT - scheduled_for_ms: runs scheduled before `since` sort after this.
    last = None if since_ms is None else f"{INVERT - since_ms:019d}".encode()
    start = prefix + cursor.encode() + b"\x00" if cursor else None
    views = call.svc.views
    items: list[dict[str, Any]] = []
    last_cursor = next_cursor = None
    for key, _ in views.prefix(prefix, start=start):
        suffix = key[len(prefix):]
        if last is not None and suffix[:19] > last:
            break
        if len(items) == limit:  # one more run exists: the page ends at the last one shown
            next_cursor = last_cursor
            break
        ex = views.execution(suffix.rsplit(b"/", 1)[-1].decode())
        if ex is not None:
            items.append(run_item(ex))
            last_cursor = suffix.decode()
    return Json({"runs": items, "next_cursor": next_cursor})


def _check_page(state: str | None, limit: int) -> None:
    if state is not None and state not in STATES:
        raise Problem(422, "invalid-input", f"state must be one of {', '.join(STATES)}",
                      field="state")
    if not 1 <= limit <= 500:
        raise Problem(422, "invalid-input", "limit must be in 1..500", field="limit")


@router.get("/runs/{run_id}", response_model=responses.RunDetail, responses=ERRORS)
async def get_run(run_id: str, call: ThisCall) -> Json:
    """A run with its attempts; a DAG run with its tasks; a DAG task instance."""
    views = call.svc.views
    return Json(run_view(views, own_run(views, call.tenant, run_id)))


def own_run(views: Views, tenant: str, run_id: str) -> dict[str, Any]:
    """The tenant's execution `run_id` (a run or a task instance); 404 for any other."""
    ex = views.execution(run_id)
    if ex is None or ex["tenant"] != tenant:
        raise Problem(404, "run-not-found", f"no run {run_id!r}", field="run_id")
    return ex


def run_item(ex: dict[str, Any]) -> dict[str, Any]:
    """A run in lists (`responses.Run`): a DAG run with its tasks counted by state."""
    out = run_out(ex)
    if ex.get("dag") is not None:
        counts = dict.fromkeys(TASK_STATES, 0)
        for task in ex["dag"]["tasks"]:
            counts[task["state"]] += 1
        out["tasks"] = counts
    return out


def run_view(views: Views, ex: dict[str, Any]) -> dict[str, Any]:
    """One execution as /v1/runs/{run_id} shows it (`responses.RunDetail`)."""
    out = run_detail(ex)
    if ex.get("run_id") is not None:  # a task instance
        out.update(exec_id=ex["exec_id"], run_id=ex["run_id"], task_id=ex["task_id"])
    elif ex.get("dag") is not None:
        out["tasks"] = dag_tasks(views, ex)
    return out


def dag_tasks(views: Views, run: dict[str, Any]) -> list[dict[str, Any]]:
    """A DAG run's tasks (`responses.Task`) in dependency order: the state, reason and order
    from the run's progress, depends_on and trigger_rule from the job's DAG, attempts from
    each task's instance (read under the run: views.task_instances)."""
    progress: list[dict[str, Any]] = run["dag"]["tasks"]
    spec = _spec_tasks(views, run["job_id"])
    instances = views.task_instances(run["exec_id"])
    out = []
    for entry in dependency_order(progress, spec):
        task_id = entry["task_id"]
        declared = spec.get(task_id, {})
        found = instances.get(task_id)
        instance = views.execution(found["exec_id"]) if found is not None else None
        out.append({
            "task_id": task_id, "state": entry["state"],
            "depends_on": list(declared.get("depends_on", ())),
            "trigger_rule": declared.get("trigger_rule"),
            "reason": entry["reason"] or (instance or {}).get("reason"),
            "attempts": [task_attempt(a) for a in (instance or {}).get("attempts", ())],
        })
    return out


def task_attempt(a: Mapping[str, Any]) -> dict[str, Any]:
    """`responses.TaskAttempt`."""
    return {"attempt": a["attempt"], "started_at": iso(a["started_at_ms"]),
            "finished_at": iso(a["finished_at_ms"]) if a["finished_at_ms"] else None,
            "outcome": a["outcome"], "status_code": a["status_code"], "error": a["error"],
            "output": a.get("output")}


def _spec_tasks(views: Views, job_id: str) -> dict[str, dict[str, Any]]:
    """The job's DAG tasks by id, as its state holds them ({} if it has no DAG now)."""
    state = views.job_state(job_id)
    target = state["spec"]["target"] if state is not None else None
    if isinstance(target, tuple):  # a union branch, as the codec reads it
        target = target[1]
    if not isinstance(target, dict) or not isinstance(target.get("tasks"), list):
        return {}
    return {t["id"]: t for t in target["tasks"]}


def dependency_order(progress: Sequence[dict[str, Any]],
                     spec: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The run's progress entries, each after those it depends on; among tasks ready
    together, the DAG's own order (Kahn's algorithm, lowest position first: the DAG's
    order itself when that is already one). Dependencies the run lacks are ignored."""
    position = {e["task_id"]: i for i, e in enumerate(progress)}
    waiting = [0] * len(progress)
    children: list[list[int]] = [[] for _ in progress]
    for i, entry in enumerate(progress):
        for parent in spec.get(entry["task_id"], {}).get("depends_on", ()):
            if parent in position:
                waiting[i] += 1
                children[position[parent]].append(i)
    ready = [i for i, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for child in children[i]:
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, child)
    placed = set(order)
    order += [i for i in range(len(progress)) if i not in placed]  # a cycle: as they are
    return [progress[i] for i in order]
