"""Changelog writes through librdkafka instead of Faust's per-record producer path.

Faust sends a table write as a FutureMessage queued on the event loop, drained by a task
into aiokafka's Python batch builder, with a callback per record: 15-20% of a worker's
CPU at 1,500 executions/s (py-spy), and a dispatch barrier that waited ~250 ms behind that
queue. Here a write is one produce() into librdkafka's C queue; batching and sending happen
on librdkafka's threads.

Acks are served on the event loop (poll(0) at every turn of the loop while writes are in
flight), not by a thread of our own. confluent-kafka takes the GIL for every delivery
report, and a thread that needs the GIL while the loop is busy gets it once per switch
interval (5 ms): while the worker decided a spike, its acks, and so the dispatch barrier
and every call behind it, waited for the decisions to end (at 4,000/s the median call
left ~500 ms after its second began, with most decisions made by ~250 ms).

The dispatch barrier snapshots how many writes each partition has been given and waits
until as many are acknowledged: the producer is idempotent, so acks arrive in order within
a partition and a count proves every earlier write durable. The acked offsets become
Faust's persisted offsets (where a restart with local state resumes reading), as Faust's
own send callback would have set them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka import KafkaError, KafkaException, Producer

from streams.tasks import cancel_and_wait

log = logging.getLogger("kron.changelog")

TP = tuple[str, int]
_Headers = list[tuple[str, str | bytes | None]]
# Queue full: librdkafka holds this many unsent writes before produce() pushes back.
QUEUE_MAX_MESSAGES = 1_000_000
# How often acks are served: while writes are in flight (at every turn of a busy loop),
# and otherwise (errors, logs).
POLL_BUSY_S = 0.001
POLL_IDLE_S = 0.05


@dataclass(frozen=True, slots=True)
class _Message:
    partition: int


@dataclass(frozen=True, slots=True)
class Sent:
    """What Faust's table expects back from a changelog send: the partition written."""

    message: _Message


class ChangelogProducer:
    def __init__(self, config: dict[str, Any], *,
                 on_offsets: Callable[[dict[TP, int]], None],
                 on_fatal: Callable[[str], None]) -> None:
        self._config = {
            **config,
            "acks": "all",
            # In-order acks per partition (the barrier counts on it) and no duplicates when
            # librdkafka retries.
            "enable.idempotence": True,
            "linger.ms": 2,
            "queue.buffering.max.messages": QUEUE_MAX_MESSAGES,
            "queue.buffering.max.kbytes": 1 << 20,
            "message.timeout.ms": 60_000,
            "partitioner": "murmur2_random",
            "log_level": 3,
            # Every write's report goes here; a publish passes its own callback.
            "on_delivery": self._delivered,
        }
        self._on_offsets = on_offsets
        self._on_fatal = on_fatal
        self._producer: Producer | None = None
        # All on the event loop's thread, delivery reports included (see _pump).
        self._produced: dict[TP, int] = {}
        self._acked: dict[TP, int] = {}
        self._offsets: dict[TP, int] = {}  # acked offsets not yet handed on
        self._waiters: list[tuple[dict[TP, int], asyncio.Future[None]]] = []
        self._failure: str | None = None
        self._in_flight = 0  # writes and publishes without a delivery report yet
        self._pumping: asyncio.Task[None] | None = None
        self._busy = asyncio.Event()  # set by the first write after an idle spell
        # Immutable, so one per partition serves every write's return value.
        self._sent: dict[int, Sent] = {}
        self.writes = 0

    def _start(self) -> Producer:
        """Built on the first write, on the event loop: nothing runs before the worker does."""
        self._producer = Producer(self._config)
        self._pumping = asyncio.get_running_loop().create_task(self._pump())
        return self._producer

    async def _pump(self) -> None:
        while True:
            try:
                self.poll()
            except Exception:  # a dead pump would leave the barrier waiting forever
                log.exception("serving changelog acks failed")
            if self._in_flight:
                await asyncio.sleep(POLL_BUSY_S)
                continue
            # Idle: a write wakes it at once, or a spread-out load would wait up to the
            # idle period for each ack.
            self._busy.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._busy.wait(), POLL_IDLE_S)

    def poll(self) -> None:
        """Serve the delivery reports that arrived, then settle what they decide."""
        if self._producer is not None and self._producer.poll(0):
            self._settle()

    def produce(self, topic: str, partition: int, key: bytes, value: bytes | None,
                headers: list[tuple[str, bytes]] | None) -> Sent:
        producer = self._producer or self._start()
        while True:
            try:
                producer.produce(topic, value=value, key=key, partition=partition,
                                 headers=cast(_Headers, headers))
                break
            except BufferError:  # a million writes unsent: the broker is away or slow
                if producer.poll(0.05):
                    self._settle()
        self._count_in_flight()
        tp = (topic, partition)
        self._produced[tp] = self._produced.get(tp, 0) + 1
        self.writes += 1
        sent = self._sent.get(partition)
        if sent is None:
            sent = self._sent[partition] = Sent(message=_Message(partition=partition))
        return sent

    def publish(self, topic: str, key: bytes | None, value: bytes | None,
                headers: list[tuple[str, bytes]]) -> asyncio.Future[None]:
        """A Kafka target's message: resolved when acked, failed (not fatal) if it can't be.
        Not counted by the barrier. Keyed messages land where a Java producer puts them."""
        producer = self._producer or self._start()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def delivered(err: KafkaError | None, _msg: Any) -> None:
            self._in_flight -= 1
            if fut.done():
                return
            if err is None:
                fut.set_result(None)
            else:
                fut.set_exception(RuntimeError(str(err)))

        try:
            producer.produce(topic, value=value, key=key, headers=cast(_Headers, headers),
                             on_delivery=delivered)
        except (BufferError, KafkaException) as exc:
            fut.set_exception(RuntimeError(f"publish refused: {exc}"))
        else:
            self._count_in_flight()
        return fut

    def _count_in_flight(self) -> None:
        if not self._in_flight:
            self._busy.set()
        self._in_flight += 1

    # --- acks ---------------------------------------------------------------------------------

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        self._in_flight -= 1
        if err is not None:
            # Local state already holds this write and Kafka never will: only a restart
            # (which rebuilds local state from Kafka) makes the two agree again.
            self._failure = self._failure or f"changelog write failed: {err}"
            return
        tp = (msg.topic(), msg.partition())
        self._acked[tp] = self._acked.get(tp, 0) + 1
        self._offsets[tp] = msg.offset()

    # --- the event loop's side ---------------------------------------------------------------

    def _settle(self) -> None:
        offsets, self._offsets = self._offsets, {}
        if offsets:
            self._on_offsets(offsets)
        if self._failure is not None:
            for _, fut in self._waiters:
                if not fut.done():
                    fut.set_exception(RuntimeError(self._failure))
            self._waiters = []
            self._on_fatal(self._failure)
            return
        pending = []
        for want, fut in self._waiters:
            if self._acked_all(want):
                if not fut.done():
                    fut.set_result(None)
            else:
                pending.append((want, fut))
        self._waiters = pending

    def _acked_all(self, want: dict[TP, int]) -> bool:
        return all(self._acked.get(tp, 0) >= n for tp, n in want.items())

    async def flush(self) -> None:
        """Returns once every write produced before the call is acknowledged."""
        want = dict(self._produced)
        self.poll()  # acks that already arrived count without waiting for the next turn
        if self._failure is not None:
            raise RuntimeError(self._failure)
        if self._acked_all(want):
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((want, fut))
        await fut

    async def close(self, timeout_s: float = 30.0) -> None:
        """Wait for every write, hand on the final offsets, stop serving acks."""
        if self._producer is None:
            return
        try:
            await asyncio.wait_for(self.flush(), timeout_s)
        finally:
            self._settle()
            await cancel_and_wait(self._pumping)
