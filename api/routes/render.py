"""Views as the API shows them: the dicts routes/responses.py documents, built by hand (they
are on every answer's path; validating them on the way out would cost more than they do)."""

from __future__ import annotations

from typing import Any

from api.projection import Views
from kron.timefmt import iso, iso_in
from streams.domain.states import QueueReason

STATES = ("queued", "running", "retry_pending", "succeeded", "failed", "skipped", "missed",
          "cancelled")


def job_out(views: Views, job: dict[str, Any]) -> dict[str, Any]:
    """A job (`responses.Job`)."""
    nxt = job.get("next_run_at_ms")
    return {
        "job_id": job["job_id"], "name": job["spec"]["name"], "status": job["status"],
        "version": job["version"],
        "next_run_at": iso_in(nxt, job_zone(job["spec"])) if nxt else None,
        "created_at": iso(job["created_at_ms"]),
        "updated_at": iso(job["updated_at_ms"]),
        "idempotency_key": job.get("idempotency_key"),
        "definition": job["spec"], "last_run": run_summary(views, job.get("last_run")),
    }


def job_zone(spec: dict[str, Any]) -> str | None:
    """The zone a job's owner reads its next run times in: its cron schedule's (None for a
    one-off, whose `run_at` they gave with an offset of their choice: shown in UTC)."""
    schedule = spec.get("schedule")
    return schedule.get("timezone") if isinstance(schedule, dict) else None


def upcoming_out(spec: dict[str, Any], times_ms: list[int]) -> list[str]:
    """A job's next run times (`upcoming`), in its zone as `next_run_at` is."""
    zone = job_zone(spec)
    return [iso_in(t, zone) for t in times_ms]


def run_summary(views: Views, last: dict[str, Any] | None) -> dict[str, Any] | None:
    if last is None:
        return None
    ex = views.execution(last["exec_id"])
    return run_out(ex) if ex else None


def shown_state(ex: dict[str, Any]) -> str:
    """A running execution whose call waits in the worker for its tenant's dispatch rate
    (the worker reports it held) is queued to its user."""
    state = str(ex["state"])
    return ("queued" if state == "running" and ex["reason"] == QueueReason.DISPATCH_RATE
            else state)


def run_out(ex: dict[str, Any]) -> dict[str, Any]:
    """A run in lists (`responses.Run`)."""
    return {
        "run_id": ex["exec_id"], "job_id": ex["job_id"], "state": shown_state(ex),
        "trigger": ex["trigger"], "scheduled_for": iso(ex["scheduled_for_ms"]),
        "attempt": ex["attempt"], "worker": ex["worker"],
        "started_at": iso(ex["started_at_ms"]) if ex["started_at_ms"] else None,
        "finished_at": iso(ex["finished_at_ms"]) if ex["finished_at_ms"] else None,
        "lateness_ms": ex["lateness_ms"], "error": ex["last_error"],
        "reason": ex["reason"], "dst_outcome": ex["dst_outcome"],
    }


def run_detail(ex: dict[str, Any]) -> dict[str, Any]:
    """A run with its attempts (`responses.RunDetail`)."""
    out = run_out(ex)
    out["attempts"] = [
        {**a, "started_at": iso(a["started_at_ms"]),
         "finished_at": iso(a["finished_at_ms"]) if a["finished_at_ms"] else None,
         # A view projected before attempts kept their output has none.
         "output": a.get("output")}
        for a in ex["attempts"]]
    out["status_code"] = ex["status_code"]
    return out
