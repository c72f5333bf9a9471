"""A job's failure alerts (``JobSpec.notify``, v5) and a tenant's default ones.

``{"webhook": "https://...", "on": ["failed", "missed"]}``: when an execution of the job
fails for good (``failed``) or one of its slots is recorded missed (``missed``), kron POSTs
a signed JSON event to the webhook (streams/notify/). A job without its own notify uses its
tenant's default from KRON_TENANTS_FILE (``notify_webhook``, ``notify_on``); a job's own
replaces it whole, so ``"on": []`` silences a job whose tenant has a default.

Here only the shape is judged (the same for the API and the worker); what the webhook may
reach is the SSRF guard's to judge (streams/guard.py, streams/netguard.py), as for targets.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from streams.domain.errors import PermanentError

WEBHOOK_MAX: Final = 2048


class NotifyEvent(enum.StrEnum):
    """The outcomes an alert may be sent for (the symbols of enum kron.NotifyEvent)."""

    FAILED = "failed"
    MISSED = "missed"


EVENTS: Final = tuple(e.value for e in NotifyEvent)


@dataclass(frozen=True, kw_only=True, slots=True)
class Notify:
    webhook: str
    on: frozenset[NotifyEvent]

    def covers(self, event: NotifyEvent) -> bool:
        return event in self.on


def parse_notify(raw: Any, *, field: str = "notify") -> Notify | None:
    """A spec's notify (a decoded kron.Notify, or None), its shape checked: a PermanentError
    names the field at fault (``notify.webhook``, ``notify.on[1]``)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise PermanentError(f"{field} must be an object with webhook and on", field=field)
    webhook = raw.get("webhook")
    where = f"{field}.webhook"
    if (not isinstance(webhook, str) or len(webhook) > WEBHOOK_MAX
            or not webhook.lower().startswith(("http://", "https://"))):
        raise PermanentError(f"{where} must be an http(s) URL of at most {WEBHOOK_MAX} "
                             f"characters", field=where)
    return Notify(webhook=webhook, on=parse_events(raw.get("on", ()), field=f"{field}.on"))


def parse_events(raw: Any, *, field: str) -> frozenset[NotifyEvent]:
    if not isinstance(raw, list | tuple):
        raise PermanentError(f"{field} must be a list of: {', '.join(EVENTS)}", field=field)
    events: set[NotifyEvent] = set()
    for i, value in enumerate(raw):
        if value not in EVENTS:
            raise PermanentError(f"{field}[{i}] must be one of: {', '.join(EVENTS)}; got "
                                 f"{value!r}", field=f"{field}[{i}]")
        events.add(NotifyEvent(value))
    return frozenset(events)
