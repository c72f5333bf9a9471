"""POST /v1/runs/{run_id}:cancel and :retry: commands on a run (a DAG run or a plain one).

Each is a command (kron.commands.CancelRun / RetryRun) on the run's job, keyed by the job
id as the job's own commands are, so the job's worker applies it in order with them. The
API refuses (409) what the worker would: a DAG task instance (its run takes commands),
cancelling a DAG run that is not running or a plain run that has ended,
retrying a DAG run that is not failed or cancelled or a plain run that is not failed, missed
or skipped (or has made MAX_ATTEMPTS_WITH_RERUNS attempts). The run may still change before
the worker applies the command; the worker then refuses it, and the answer's `applied` says
so (false) after the read-your-writes wait."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Request
from pydantic import BaseModel, ConfigDict, Field

from api.problems import Problem
from api.routes import responses
from api.routes.base import ERRORS, Json, KronRoute, ThisCall
from api.routes.runs import own_run
from api.routes.service import Call, Service
from streams.engine import backfill
from streams.engine.runs import RETRYABLE as DAG_RETRYABLE

# What each action needs the run to be in, as the worker judges it (streams/engine/core.py
# _cancel_run, _retry_run): a DAG run (one with `dag` progress), a plain execution.
Action = Literal["cancel", "retry"]
DAG_CANCELLABLE = frozenset({"running"})
PLAIN_CANCELLABLE = frozenset({"queued", "running", "retry_pending"})


class CancelRunRequest(BaseModel):
    """Optional: why the run is cancelled (its reason, and its unstarted tasks')."""

    model_config = ConfigDict(extra="forbid")
    reason: str | None = Field(default=None, min_length=1, max_length=500)


class RunCommandRoute(KronRoute):
    """The run the path names is the caller's (404 for any other) before a body is read,
    as a job's is for the job's routes; a body may be left out: one is read (and must be
    JSON) only if sent."""

    def caller(self, svc: Service, request: Request) -> Call:
        call = super().caller(svc, request)
        own_run(svc.views, call.tenant, request.path_params["run_id"])
        return call

    def reads_body(self, request: Request) -> bool:
        length = request.headers.get("content-length")
        if length is not None:
            return length.strip() not in ("", "0")
        return "transfer-encoding" in request.headers


router = APIRouter(route_class=RunCommandRoute, tags=["runs"])
ACCEPTED: dict[int | str, dict[str, Any]] = {
    202: {"model": responses.RunCommandAccepted,
          "description": "Kafka has the command; the worker applies it"}, **ERRORS}


@router.post("/runs/{run_id}:cancel", status_code=202,
             response_model=responses.RunCommandAccepted, responses=ACCEPTED)
async def cancel_run(run_id: str, call: ThisCall,
                     body: Annotated[CancelRunRequest | None, Body()] = None) -> Json:
    """Cancel a running run: a plain run's attempt (queued, running, or waiting for its
    retry) is stopped and fenced, so its late result is rejected; a DAG run's running task attempts
    likewise, and its unstarted tasks are skipped. The run ends `cancelled`."""
    reason = body.reason if body is not None else None
    return await _command(call, run_id, "cancel", reason=reason)


@router.post("/runs/{run_id}:retry", status_code=202,
             response_model=responses.RunCommandAccepted, responses=ACCEPTED)
async def retry_run(run_id: str, call: ThisCall) -> Json:
    """Run a failed, missed or skipped run again as its next attempt (the same
    Idempotency-Key, `X-Kron-Attempt` one higher); for a failed or cancelled DAG run, its
    failed, upstream_failed and cancelled tasks (and what depends on them): tasks that
    succeeded keep their result."""
    return await _command(call, run_id, "retry")


async def _command(call: Call, run_id: str, action: Action,
                   **fields: Any) -> Json:
    svc = call.svc
    run = own_run(svc.views, call.tenant, run_id)
    _check(run, action)
    svc.own_job(call.tenant, run["job_id"])  # a deleted job's runs take no commands
    kind = "CancelRun" if action == "cancel" else "RetryRun"
    command_id = await svc.send(call.tenant, kind, run["job_id"], run_id=run_id, **fields)
    applied = await svc.run_applied(run, command_id)
    now = svc.views.execution(run_id) or run
    return Json({"command_id": command_id, "action": action, "run_id": run_id,
                 "job_id": run["job_id"], "applied": applied, "state": now["state"]},
                status_code=202)


def _check(run: dict[str, Any], action: Action) -> None:
    """409 unless the run is a run (not a task instance) in a state the action takes."""
    run_id = run["exec_id"]
    if run.get("run_id") is not None:
        raise Problem(409, "not-a-run", f"{run_id!r} is a task instance of run "
                      f"{run['run_id']!r}: {action} the run", field="run_id")
    kind = "DAG run" if run.get("dag") is not None else "run"
    if action == "cancel" and run["state"] not in _cancellable(run):
        wanted = "running" if kind == "DAG run" else "queued, running or retrying"
        raise Problem(409, "run-not-running", f"run {run_id!r} is {run['state']}: only a "
                      f"{wanted} {kind} can be cancelled", field="run_id", state=run["state"])
    if action == "retry" and not _retryable(run):
        wanted = ("failed or cancelled" if kind == "DAG run"
                  else "failed, missed or skipped")
        raise Problem(409, "run-not-retryable", f"run {run_id!r} is {run['state']} after "
                      f"{run['attempt']} attempt(s): only a {wanted} {kind} can be retried",
                      field="run_id", state=run["state"])


def _cancellable(run: dict[str, Any]) -> frozenset[str]:
    return DAG_CANCELLABLE if run.get("dag") is not None else PLAIN_CANCELLABLE


def _retryable(run: dict[str, Any]) -> bool:
    if run.get("dag") is not None:
        return run["state"] in DAG_RETRYABLE
    return backfill.may_rerun(run)  # failed, missed or skipped, and attempts left
