"""The notifier: alerts in, signed POSTs out, never in the executions' way.

`offer` is synchronous and never waits: it puts the alert on a bounded queue or, when the
queue is full, drops it (counted in `counts.dropped`, and logged). A pool of `concurrency`
tasks takes deliveries from the queue and makes one try each; a try that fails with a
retryable error is put back on the queue after its backoff by a timer, so a webhook that
keeps failing (or hangs up to its timeout) holds a runner for one try at a time, never for
its whole retry schedule. Nothing here runs on the partition owner's path: the alerts come
from kron.dead-letters (consumer.py), which the core writes anyway.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, Final, Protocol

from kron.clock import Clock
from kron.timefmt import iso
from streams.alerts import Alert
from streams.domain.retry import ErrorClass
from streams.domain.tenants import TenantTable
from streams.notify.backoff import Backoff
from streams.notify.event import event_body, notify_for
from streams.notify.signing import HEADER, sign
from streams.targets import AttemptInfo, Outcome

log = logging.getLogger("kron.notify")

TIMEOUT_S: Final = 10.0
# A Retry-After may lengthen a wait up to this, never more (a webhook can't park alerts).
RETRY_AFTER_MAX_S: Final = 300.0
DEFAULT_BACKOFF: Final = Backoff()


class Sender(Protocol):
    """streams.targets.HttpRunner: the SSRF guard at every connection, no redirects."""

    async def run(self, target: dict[str, Any], info: AttemptInfo) -> Outcome: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class Delivery:
    alert: Alert
    webhook: str
    body: bytes
    attempt: int = 1


@dataclass(kw_only=True, slots=True)
class NotifyCounts:
    sent: int = 0
    failed: int = 0  # gave up: a permanent answer, or the last attempt failed
    retried: int = 0
    dropped: int = 0  # the queue was full
    unsigned: int = 0  # the tenant has no key: never sent unsigned


class Notifier:
    def __init__(self, *, sender: Sender, keys: Mapping[str, bytes], tenants: TenantTable,
                 clock: Clock, backoff: Backoff = DEFAULT_BACKOFF, queue_size: int = 1000,
                 concurrency: int = 8, rand: Callable[[], float] = random.random) -> None:
        self._sender = sender
        self._keys = keys
        self._tenants = tenants
        self._clock = clock
        self._backoff = backoff
        self._queue: asyncio.Queue[Delivery] = asyncio.Queue(maxsize=queue_size)
        self._concurrency = concurrency
        self._rand = rand
        self._tasks: list[asyncio.Task[None]] = []
        # Retries waiting for their time: bounded like the queue, so a flood of failing
        # alerts can't pile up timers.
        self._waiting = 0
        self._max_waiting = queue_size
        self.counts = NotifyCounts()

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    def outcomes(self) -> dict[str, int]:
        """The counts by outcome, for /metrics (kron_alerts_total)."""
        return asdict(self.counts)

    def offer(self, alert: Alert) -> bool:
        """Queue the alert's delivery if its notify covers it; never waits. False if it is
        not to be sent, or was dropped."""
        notify = notify_for(alert, self._tenants)
        if notify is None:
            return False
        if alert.tenant not in self._keys:
            self.counts.unsigned += 1
            log.warning("alert %s of tenant %r not sent: KRON_NOTIFY_KEYS has no key for it",
                        alert.alert_id, alert.tenant)
            return False
        return self._enqueue(Delivery(alert=alert, webhook=notify.webhook,
                                      body=event_body(alert)))

    def _enqueue(self, delivery: Delivery) -> bool:
        try:
            self._queue.put_nowait(delivery)
        except asyncio.QueueFull:
            self.counts.dropped += 1
            log.warning("alert %s dropped (attempt %d): the notifier's queue is full "
                        "(%d dropped so far)", delivery.alert.alert_id, delivery.attempt,
                        self.counts.dropped)
            return False
        return True

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._runner(), name=f"kron-notify-{i}")
                       for i in range(self._concurrency)]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        close = getattr(self._sender, "close", None)
        if close is not None:  # the HttpRunner's connections
            await close()

    async def _runner(self) -> None:
        while True:
            delivery = await self._queue.get()
            try:
                await self.deliver(delivery)
            except Exception:  # one bad delivery must not stop the runner
                log.exception("alert %s: delivery failed", delivery.alert.alert_id)

    async def deliver(self, delivery: Delivery) -> None:
        """One try; a retry is scheduled, not awaited."""
        outcome = await self._sender.run(self._target(delivery), self._info(delivery))
        alert = delivery.alert
        if outcome.ok:
            self.counts.sent += 1
            return
        delay = (None if outcome.error_class == ErrorClass.PERMANENT
                 else self._backoff.delay_s(delivery.attempt, self._rand()))
        if delay is None:
            self.counts.failed += 1
            log.warning("alert %s of job %s not delivered after %d attempt(s): %s",
                        alert.alert_id, alert.job_id, delivery.attempt, outcome.error)
            return
        delay = max(delay, min(outcome.retry_after_s or 0.0, RETRY_AFTER_MAX_S))
        if self._waiting >= self._max_waiting:
            self.counts.dropped += 1
            log.warning("alert %s dropped: %d retries wait already", alert.alert_id,
                        self._waiting)
            return
        self.counts.retried += 1
        self._waiting += 1
        asyncio.get_running_loop().call_later(
            delay, self._retry, replace(delivery, attempt=delivery.attempt + 1))

    def _retry(self, delivery: Delivery) -> None:
        self._waiting -= 1
        self._enqueue(delivery)

    def _target(self, delivery: Delivery) -> dict[str, Any]:
        # Signed at each try: its time is the try's, so a receiver's tolerance holds.
        t = self._clock.now_ms() // 1000
        key = self._keys[delivery.alert.tenant]
        return {"method": "POST", "url": delivery.webhook, "body": delivery.body,
                "timeout_s": TIMEOUT_S,
                "headers": {"Content-Type": "application/json",
                            HEADER: sign(key, delivery.body, t)}}

    def _info(self, delivery: Delivery) -> AttemptInfo:
        alert = delivery.alert
        return AttemptInfo(exec_id=alert.alert_id, job_id=alert.job_id, tenant=alert.tenant,
                           scheduled_for_iso=iso(alert.scheduled_for_ms),
                           attempt=delivery.attempt, fencing_token=0,
                           now_ms=self._clock.now_ms())
