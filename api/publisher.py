"""Produces job commands to kron.commands with acks=all: success means Kafka has them."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from kron.kafka_security import confluent_config
from kron.settings import Settings
from schemas import codec


class BrokerUnavailable(Exception):
    """Kafka did not acknowledge in time. The API answers 503 with Retry-After."""


class CommandPublisher:
    def __init__(self, settings: Settings) -> None:
        self._topic = settings.topic("commands")
        self._producer = Producer(confluent_config(settings, {
            "acks": "all",
            "enable.idempotence": True,
            # Java's partitioner: a job's commands land on one partition whichever client
            # (API, Java service, Faust) produced them.
            "partitioner": "murmur2_random",
            "linger.ms": 2,
            "message.timeout.ms": 10_000,
            "log_level": 2,
        }))
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="kron-producer", daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)

    def close(self) -> None:
        self._stop.set()
        self._poller.join(2)
        self._producer.flush(5)

    def publish_sync(self, name: str, record: dict[str, Any], *, key: str,
                     timeout_s: float = 10.0) -> tuple[int, int]:
        """Blocks until acked; returns (partition, offset)."""
        done = threading.Event()
        result: list[Any] = []

        def on_delivery(err: KafkaError | None, msg: Any) -> None:
            result.append(err or (msg.partition(), msg.offset()))
            done.set()

        self._produce(name, record, key, on_delivery)
        if not done.wait(timeout_s) or isinstance(result[0], KafkaError):
            raise BrokerUnavailable(str(result[0]) if result else "no ack from Kafka")
        return result[0]  # type: ignore[no-any-return]

    async def publish(self, name: str, record: dict[str, Any], *, key: str,
                      topic: str | None = None) -> tuple[int, int]:
        """Acknowledged by Kafka (acks=all): on kron.commands, or `topic` (a redrive's mark
        goes to kron.dead-letters)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[int, int]] = loop.create_future()

        def on_delivery(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                loop.call_soon_threadsafe(_fail, fut, BrokerUnavailable(str(err)))
            else:
                loop.call_soon_threadsafe(_ok, fut, (msg.partition(), msg.offset()))

        self._produce(name, record, key, on_delivery, topic)
        return await fut

    def _produce(self, name: str, record: dict[str, Any], key: str, cb: Any,
                 topic: str | None = None) -> None:
        try:
            self._producer.produce(topic or self._topic, key=key.encode(),
                                   value=codec.encode(name, record), on_delivery=cb)
        except BufferError as exc:
            raise BrokerUnavailable("the producer queue is full") from exc
        except KafkaException as exc:
            raise BrokerUnavailable(str(exc)) from exc


def _ok(fut: asyncio.Future[tuple[int, int]], value: tuple[int, int]) -> None:
    if not fut.done():
        fut.set_result(value)


def _fail(fut: asyncio.Future[tuple[int, int]], exc: Exception) -> None:
    if not fut.done():
        fut.set_exception(exc)
