"""What a webhook gets: the alert as JSON, and which notify, the job's or its tenant's."""

from __future__ import annotations

import orjson

from kron.timefmt import iso
from streams.alerts import Alert
from streams.domain.notify import Notify
from streams.domain.tenants import TenantTable


def notify_for(alert: Alert, tenants: TenantTable) -> Notify | None:
    """The job's own notify, else its tenant's default; None if neither covers the alert."""
    notify = alert.notify if alert.notify is not None else tenants.quotas(alert.tenant).notify
    return notify if notify is not None and notify.covers(alert.event) else None


def event_body(alert: Alert) -> bytes:
    """The POST body. Its `id` is the same on every try (a receiver dedupes on it); no
    secret and nothing of another tenant is in it."""
    return orjson.dumps({
        "id": alert.alert_id, "type": f"execution.{alert.event}", "tenant": alert.tenant,
        "job_id": alert.job_id, "job_name": alert.job_name, "run_id": alert.run_id,
        "task_id": alert.task_id,
        "attempt": alert.attempt, "state": alert.state, "error": alert.error,
        "output": alert.output, "scheduled_for": iso(alert.scheduled_for_ms),
        "occurred_at": iso(alert.occurred_at_ms),
    })
