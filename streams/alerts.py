"""The facts of a failure alert, carried in its DeadLetter's ``value`` (JSON).

The partition owner writes a ``kron.deadletter.DeadLetter`` to kron.dead-letters when an
execution fails for good (``error_class`` ``execution_failed``) or a slot is recorded missed
(``execution_missed``). Its ``value`` holds this document, so the notifier (streams/notify/)
and the API's dead-letter view need nothing but that record: the job's name and notify as
they were when it happened, the run, its attempt, error and output. A JSON document rather
than new Avro fields keeps DeadLetter at v1 for the poison records it also carries; its
``"v"`` versions the document itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import orjson

from streams.domain.errors import PermanentError
from streams.domain.notify import Notify, NotifyEvent, parse_notify

ALERT_FORMAT: Final = 1
ERROR_CLASSES: Final = {"execution_failed": NotifyEvent.FAILED,
                        "execution_missed": NotifyEvent.MISSED}
OUTPUT_MAX: Final = 4096


@dataclass(frozen=True, kw_only=True, slots=True)
class Alert:
    event: NotifyEvent
    alert_id: str  # the DeadLetter's event id: one per failure, the webhook's dedupe key
    tenant: str
    job_id: str
    job_name: str
    run_id: str  # the run: a DAG task instance's is its DAG run's
    task_id: str | None  # a DAG task instance's task; None for any other execution
    attempt: int
    error: str | None
    output: str | None
    state: str
    scheduled_for_ms: int
    occurred_at_ms: int
    notify: Notify | None  # the job's own; None: the tenant's default applies


def alert_value(job: Any, ex: Any) -> bytes:
    """The document for an alert about execution `ex` of job `job` (a JobRecord and an
    ExecutionRecord; typed loosely because an attempt's `output` arrives with issue 40
    part 3 and is read only if there)."""
    attempts = ex.get("attempts") or []
    # Attempts keep their output only once they record one (issue 40 part 3): else none.
    output = attempts[-1].get("output") if attempts else None
    if isinstance(output, bytes):
        output = output.decode("utf-8", "replace")
    return orjson.dumps({
        "v": ALERT_FORMAT, "job_name": job["spec"]["name"],
        "run_id": ex.get("run_id") or ex["exec_id"], "task_id": ex.get("task_id"),
        "attempt": ex["attempt"], "error": ex.get("last_error") or ex.get("reason"),
        "output": output[:OUTPUT_MAX] if isinstance(output, str) else None,
        "state": str(ex["state"]), "scheduled_for_ms": ex["scheduled_for_ms"],
        "notify": job["spec"].get("notify"),
    })


def read_alert(record: dict[str, Any]) -> Alert | None:
    """The alert a DeadLetter record carries; None for any other dead letter, or a document
    this version can't read (it is listed, never sent)."""
    event = ERROR_CLASSES.get(record.get("error_class", ""))
    value = record.get("value")
    if event is None or value is None:
        return None
    try:
        doc = orjson.loads(value)
        env = record["envelope"]
        return Alert(
            event=event, alert_id=env["event_id"], tenant=env["tenant"],
            job_id=env["correlation_id"] or "", job_name=str(doc["job_name"]),
            run_id=str(doc["run_id"]), task_id=doc.get("task_id"),
            attempt=int(doc["attempt"]), error=doc.get("error"),
            output=doc.get("output"), state=str(doc["state"]),
            scheduled_for_ms=int(doc["scheduled_for_ms"]),
            occurred_at_ms=int(env["occurred_at_ms"]), notify=_notify(doc.get("notify")))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def _notify(raw: Any) -> Notify | None:
    try:
        return parse_notify(raw)
    except PermanentError:
        return None
