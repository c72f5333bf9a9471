"""Changelog writes through librdkafka instead of Faust's per-record producer path.

Faust sends a table write as a FutureMessage queued on the event loop, drained by a task
into aiokafka's Python batch builder, with a callback per record: 15-20% of a worker's
CPU at 1,500 executions/s (py-spy), and a dispatch barrier that waited ~250 ms behind that
queue. Here a write is one produce() into librdkafka's C queue; batching, sending and acks
happen on librdkafka's threads, and a poller thread counts acks per partition.

The dispatch barrier snapshots how many writes each partition has been given and waits
until as many are acknowledged: the producer is idempotent, so acks arrive in order within
a partition and a count proves every earlier write durable. The acked offsets become
Faust's persisted offsets (where a restart with local state resumes reading), as Faust's
own send callback would have set them.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka import KafkaError, KafkaException, Producer

log = logging.getLogger("kron.changelog")

TP = tuple[str, int]
_Headers = list[tuple[str, str | bytes | None]]
# Queue full: librdkafka holds this many unsent writes before produce() pushes back.
QUEUE_MAX_MESSAGES = 1_000_000


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
        }
        self._on_offsets = on_offsets
        self._on_fatal = on_fatal
        self._producer: Producer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._produced: dict[TP, int] = {}  # written on the event loop
        self._acked: dict[TP, int] = {}  # written by the poller thread
        self._offsets: dict[TP, int] = {}  # acked offsets not yet handed on
        self._lock = threading.Lock()
        self._signalled = False
        self._waiters: list[tuple[dict[TP, int], asyncio.Future[None]]] = []
        self._failure: str | None = None
        self._published: list[tuple[asyncio.Future[None], str | None]] = []
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self.writes = 0

    def _start(self) -> Producer:
        """Built on the first write, on the event loop: nothing runs before the worker does."""
        self._loop = asyncio.get_running_loop()
        self._producer = Producer(self._config)
        self._poller = threading.Thread(target=self._poll, name="kron-changelog", daemon=True)
        self._poller.start()
        return self._producer

    def produce(self, topic: str, partition: int, key: bytes, value: bytes | None,
                headers: list[tuple[str, bytes]] | None) -> Sent:
        producer = self._producer or self._start()
        while True:
            try:
                producer.produce(topic, value=value, key=key, partition=partition,
                                 headers=cast(_Headers, headers), on_delivery=self._delivered)
                break
            except BufferError:  # a million writes unsent: the broker is away or slow
                # Acks served here, on the loop's thread, must settle waiters too: the
                # poller thread may see nothing more to signal.
                if producer.poll(0.05):
                    self._settle()
        tp = (topic, partition)
        self._produced[tp] = self._produced.get(tp, 0) + 1
        self.writes += 1
        return Sent(message=_Message(partition=partition))

    def publish(self, topic: str, key: bytes | None, value: bytes | None,
                headers: list[tuple[str, bytes]]) -> asyncio.Future[None]:
        """A Kafka target's message: resolved when acked, failed (not fatal) if it can't be.
        Not counted by the barrier. Keyed messages land where a Java producer puts them."""
        producer = self._producer or self._start()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def delivered(err: KafkaError | None, _msg: Any) -> None:
            with self._lock:
                self._published.append((fut, None if err is None else str(err)))

        try:
            producer.produce(topic, value=value, key=key, headers=cast(_Headers, headers),
                             on_delivery=delivered)
        except (BufferError, KafkaException) as exc:
            fut.set_exception(RuntimeError(f"publish refused: {exc}"))
        return fut

    # --- acks (poller thread) ----------------------------------------------------------------

    def _poll(self) -> None:
        assert self._producer is not None
        while not self._stop.is_set():
            if self._producer.poll(0.05) and not self._signalled and self._loop is not None:
                self._signalled = True
                self._loop.call_soon_threadsafe(self._settle)

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            # Local state already holds this write and Kafka never will: only a restart
            # (which rebuilds local state from Kafka) makes the two agree again.
            with self._lock:
                self._failure = self._failure or f"changelog write failed: {err}"
            return
        tp = (msg.topic(), msg.partition())
        with self._lock:
            self._acked[tp] = self._acked.get(tp, 0) + 1
            self._offsets[tp] = msg.offset()

    # --- the event loop's side ---------------------------------------------------------------

    def _settle(self) -> None:
        self._signalled = False
        with self._lock:
            offsets, self._offsets = self._offsets, {}
            published, self._published = self._published, []
            acked = dict(self._acked)
            failure = self._failure
        for fut, err in published:
            if fut.done():
                continue
            if err is None:
                fut.set_result(None)
            else:
                fut.set_exception(RuntimeError(err))
        if offsets:
            self._on_offsets(offsets)
        if failure is not None:
            for _, fut in self._waiters:
                if not fut.done():
                    fut.set_exception(RuntimeError(failure))
            self._waiters = []
            self._on_fatal(failure)
            return
        pending = []
        for want, fut in self._waiters:
            if all(acked.get(tp, 0) >= n for tp, n in want.items()):
                if not fut.done():
                    fut.set_result(None)
            else:
                pending.append((want, fut))
        self._waiters = pending

    async def flush(self) -> None:
        """Returns once every write produced before the call is acknowledged."""
        want = dict(self._produced)
        with self._lock:
            if self._failure is not None:
                raise RuntimeError(self._failure)
            if all(self._acked.get(tp, 0) >= n for tp, n in want.items()):
                return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((want, fut))
        await fut

    async def close(self, timeout_s: float = 30.0) -> None:
        """Wait for every write, hand on the final offsets, stop the poller."""
        if self._producer is None:
            return
        try:
            await asyncio.wait_for(self.flush(), timeout_s)
        finally:
            self._settle()
            self._stop.set()
            if self._poller is not None:
                self._poller.join(2)
