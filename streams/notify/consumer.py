"""Feeds the notifier from kron.dead-letters: its own consumer group and thread.

Every worker runs one, in the group ``<prefix>-notifier``, so each alert is handled by the
worker that holds its partition. A thread polls (librdkafka) and decodes; only alerts go to
the event loop, where `Notifier.offer` queues them without waiting. Offsets are committed
automatically: an alert is handled at most about once (a crash may lose or repeat the
last few seconds' alerts; a receiver dedupes repeats on the event id). A new group starts
at the beginning of the topic, and alerts older than ``max_age_s`` are not sent, so a first
start (or a notifier that was down for long) doesn't flood webhooks with old news.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Final

from confluent_kafka import Consumer

from kron.clock import Clock
from kron.kafka_security import confluent_config
from kron.settings import Settings
from schemas import codec
from schemas.errors import DecodeError
from streams.alerts import ERROR_CLASSES, Alert, read_alert
from streams.notify.notifier import Notifier

log = logging.getLogger("kron.notify")

POLL_S: Final = 0.2


class AlertFeed:
    def __init__(self, settings: Settings, notifier: Notifier, clock: Clock) -> None:
        self._settings = settings
        self.notifier = notifier
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.too_old = 0

    async def started(self) -> None:
        """A Faust task at the app's start: the runners, then the consuming thread."""
        self._loop = asyncio.get_running_loop()
        self.notifier.start()
        self._thread = threading.Thread(target=self._run, name="kron-notify-feed",
                                        daemon=True)
        self._thread.start()

    async def shutdown(self, app: Any = None, /, *args: Any, **kw: Any) -> None:
        """At the worker's graceful stop (Faust's on_before_shutdown): the consumer leaves
        its group at once (its partitions go to the other workers without a session's
        wait), then the runners stop; deliveries not made are not sent."""
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5.0)
        await self.notifier.stop()

    def _consumer(self) -> Consumer:
        s = self._settings
        consumer = Consumer(confluent_config(s, {
            "group.id": f"{s.topic_prefix}-notifier", "auto.offset.reset": "earliest",
            "enable.auto.commit": True, "log_level": 3, "fetch.wait.max.ms": 100}))
        consumer.subscribe([s.topic("dead-letters")])
        return consumer

    def _run(self) -> None:
        consumer: Consumer | None = None
        while not self._stop.is_set():
            try:
                consumer = consumer or self._consumer()
                msg = consumer.poll(POLL_S)
                if msg is not None and not msg.error():
                    self._handle(msg.value())
            except Exception:  # the broker may be down: keep trying, never die
                log.exception("alert feed error; retrying")
                self._stop.wait(1.0)
        if consumer is not None:
            consumer.close()

    def _handle(self, value: Any) -> None:
        alert = alert_of(value)
        if alert is None:
            return
        max_age_ms = self._settings.notify_max_age_s * 1000
        if self._clock.now_ms() - alert.occurred_at_ms > max_age_ms:
            self.too_old += 1
            return
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.notifier.offer, alert)


def alert_of(value: bytes | None) -> Alert | None:
    """The alert a dead-letters record carries, if it is one."""
    if value is None:
        return None
    try:
        record = codec.decode(value).record
    except DecodeError:
        return None
    if record.get("error_class") not in ERROR_CLASSES:
        return None
    return read_alert(record)
