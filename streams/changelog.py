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

Where the produce and its delivery report run is the writer's choice (KRON_CHANGELOG_WRITER):
`inline` on this thread, as above, or `process` in a child process of the worker
(streams.changelog_child), which leaves this thread a pickled frame per FRAME_WRITES
writes (or loop turn) and one report per batch of acks. The accounting (what the barrier
waits for, the offsets handed on, a failed write being fatal) is the same for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, cast

from confluent_kafka import KafkaError, KafkaException, Producer

from streams.changelog_child import Published, frame, split_frames
from streams.tasks import cancel_and_wait

log = logging.getLogger("kron.changelog")

TP = tuple[str, int]
# Where a Kafka target's message was written: (partition, offset).
Placed = tuple[int, int]
Headers = list[tuple[str, bytes]] | None
_Headers = list[tuple[str, str | bytes | None]]
WriterKind = Literal["inline", "process"]
# Queue full: librdkafka holds this many unsent writes before produce() pushes back.
QUEUE_MAX_MESSAGES = 1_000_000
# How often acks are served: while writes are in flight (at every turn of a busy loop),
# and otherwise (errors, logs).
POLL_BUSY_S = 0.001
POLL_IDLE_S = 0.05
# Frames not yet taken by the writer process beyond this are written blocking, stalling
# the loop as a full librdkafka queue does inline: the broker is away or far behind.
CHILD_BACKLOG_BYTES = 256 << 20
# Writes go to the child in frames of at most this many (else at the end of the loop's
# turn), so it produces them while the loop goes on deciding: a spike's turn of 1,500
# writes handed over whole added ~10 ms to 500/s's median lateness (31.7 ms against 20.6
# inline on 2026-12-03).
FRAME_WRITES = 64
# F_SETPIPE_SZ: room for many frames while the child is busy producing a spike's writes.
_PIPE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class _Message:
    partition: int


@dataclass(frozen=True, slots=True)
class Sent:
    """What Faust's table expects back from a changelog send: the partition written."""

    message: _Message


def producer_config(config: dict[str, Any]) -> dict[str, Any]:
    return {
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


class Changelog:
    """What was written and what Kafka acknowledged; a subclass moves the records."""

    def __init__(self, *, on_offsets: Callable[[dict[TP, int]], None],
                 on_fatal: Callable[[str], None]) -> None:
        self._on_offsets = on_offsets
        self._on_fatal = on_fatal
        # All on the event loop's thread.
        self._produced: dict[TP, int] = {}
        self._acked: dict[TP, int] = {}
        self._offsets: dict[TP, int] = {}  # acked offsets not yet handed on
        self._waiters: list[tuple[dict[TP, int], asyncio.Future[None]]] = []
        self._failure: str | None = None
        # Immutable, so one per partition serves every write's return value.
        self._sent: dict[int, Sent] = {}
        self.writes = 0
        # Told how long each flush that had to wait waited for its acks (streams/metrics.py).
        self.on_ack_wait: Callable[[float], None] | None = None

    def produce(self, topic: str, partition: int, key: bytes, value: bytes | None,
                headers: Headers) -> Sent:
        self._write(topic, partition, key, value, headers)
        tp = (topic, partition)
        self._produced[tp] = self._produced.get(tp, 0) + 1
        self.writes += 1
        sent = self._sent.get(partition)
        if sent is None:
            sent = self._sent[partition] = Sent(message=_Message(partition=partition))
        return sent

    def _write(self, topic: str, partition: int, key: bytes, value: bytes | None,
               headers: Headers) -> None:
        raise NotImplementedError

    def publish(self, topic: str, key: bytes | None, value: bytes | None,
                headers: list[tuple[str, bytes]]) -> asyncio.Future[Placed]:
        """A Kafka target's message: resolved when acked, to where it was written (the
        attempt's output), failed (not fatal) if it can't be. Not counted by the barrier.
        Keyed messages land where a Java producer puts them."""
        raise NotImplementedError

    def poll(self) -> None:
        """Serve the acks that arrived, then settle what they decide."""
        raise NotImplementedError

    def _ack(self, tp: TP, count: int, offset: int) -> None:
        self._acked[tp] = self._acked.get(tp, 0) + count
        self._offsets[tp] = offset

    def _fail(self, why: str) -> None:
        # Local state already holds the write and Kafka never will: only a restart (which
        # rebuilds local state from Kafka) makes the two agree again.
        self._failure = self._failure or why

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

    @property
    def unacknowledged(self) -> bool:
        """Is a write produced that Kafka has not acknowledged yet?"""
        self.poll()
        return not self._acked_all(self._produced)

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
        if self.on_ack_wait is None:
            await fut
            return
        started = time.monotonic()  # an interval, not the wall clock
        await fut
        self.on_ack_wait(time.monotonic() - started)

    def start(self) -> None:
        """Start producing now, not at the first write: the connection to the broker (and a
        writer process's start) is then under way while the worker joins its group, and
        not in the way of the first decisions' acks."""
        raise NotImplementedError

    async def close(self, timeout_s: float = 30.0) -> None:
        """Wait for every write, hand on the final offsets, stop serving acks."""
        raise NotImplementedError

    def abandon(self) -> None:
        """The process is about to be replaced (a restart): drop what is unsent."""


class ChangelogProducer(Changelog):
    """librdkafka on the event loop's thread: produce() and the delivery reports."""

    def __init__(self, config: dict[str, Any], *,
                 on_offsets: Callable[[dict[TP, int]], None],
                 on_fatal: Callable[[str], None]) -> None:
        super().__init__(on_offsets=on_offsets, on_fatal=on_fatal)
        # Every write's report goes to _delivered; a publish passes its own callback.
        self._config = {**producer_config(config), "on_delivery": self._delivered}
        self._producer: Producer | None = None
        self._in_flight = 0  # writes and publishes without a delivery report yet
        self._pumping: asyncio.Task[None] | None = None
        self._busy = asyncio.Event()  # set by the first write after an idle spell

    def start(self) -> None:
        if self._producer is None:
            self._start()

    def _start(self) -> Producer:
        """Built on the event loop (at start, or the first write): nothing runs before the
        worker does."""
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
        if self._producer is not None and self._producer.poll(0):
            self._settle()

    def _write(self, topic: str, partition: int, key: bytes, value: bytes | None,
               headers: Headers) -> None:
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

    def publish(self, topic: str, key: bytes | None, value: bytes | None,
                headers: list[tuple[str, bytes]]) -> asyncio.Future[Placed]:
        producer = self._producer or self._start()
        fut: asyncio.Future[Placed] = asyncio.get_running_loop().create_future()

        def delivered(err: KafkaError | None, msg: Any) -> None:
            self._in_flight -= 1
            _resolve(fut, None if err is None else str(err), (msg.partition(), msg.offset()))

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

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        self._in_flight -= 1
        if err is not None:
            self._fail(f"changelog write failed: {err}")
            return
        self._ack((msg.topic(), msg.partition()), 1, msg.offset())

    async def close(self, timeout_s: float = 30.0) -> None:
        if self._producer is None:
            return
        try:
            await asyncio.wait_for(self.flush(), timeout_s)
        finally:
            self._settle()
            await cancel_and_wait(self._pumping)


def _resolve(fut: asyncio.Future[Placed], error: str | None,
             placed: Placed = (-1, -1)) -> None:
    if fut.done():
        return
    if error is None:
        fut.set_result(placed)
    else:
        fut.set_exception(RuntimeError(error))


class ChildChangelogProducer(Changelog):
    """librdkafka in a child process (streams.changelog_child); this side keeps the books.

    Writes leave in frames of FRAME_WRITES, the rest at the end of the loop's turn; reports
    are read when the loop finds them readable (at every turn of a busy loop too, as the inline pump
    serves acks). The child's end, however it comes, is fatal, as a failed write is.
    """

    def __init__(self, config: dict[str, Any], *,
                 on_offsets: Callable[[dict[TP, int]], None],
                 on_fatal: Callable[[str], None]) -> None:
        super().__init__(on_offsets=on_offsets, on_fatal=on_fatal)
        self._config = producer_config(config)
        self._max_bytes = int(self._config.get("message.max.bytes", 1_000_000))
        # Values shorter than this fit with any key and headers the engine writes.
        self._check_from = self._max_bytes - (64 << 10)
        self._child: subprocess.Popen[bytes] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writes: list[tuple[Any, ...]] = []
        self._publishes: list[tuple[Any, ...]] = []
        self._futures: dict[int, asyncio.Future[Placed]] = {}
        self._token = 0
        self._send_scheduled = False
        self._out = bytearray()  # frames the child has not taken yet
        self._in = bytearray()  # a report not yet whole
        self._closed: asyncio.Future[None] | None = None
        self._eof = False
        self._stopped = False
        self._readable = select.poll()

    def _start(self) -> subprocess.Popen[bytes]:
        self._loop = asyncio.get_running_loop()
        child = subprocess.Popen(
            [sys.executable, "-m", "streams.changelog_child", str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert child.stdin is not None and child.stdout is not None
        with contextlib.suppress(OSError):  # an older kernel keeps its default size
            fcntl.fcntl(child.stdin.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
        os.set_blocking(child.stdin.fileno(), False)
        os.set_blocking(child.stdout.fileno(), False)
        self._child = child
        self._out += frame(self._config)
        self._readable.register(child.stdout.fileno(), select.POLLIN)
        self._loop.add_reader(child.stdout.fileno(), self.poll)
        return child

    def start(self) -> None:
        if self._child is None and not self._stopped:
            self._schedule_send()  # the config frame goes at the loop's next turn

    def _schedule_send(self) -> None:
        if self._child is None:
            if self._stopped:
                raise RuntimeError("changelog writer closed")
            self._start()
        if not self._send_scheduled:
            self._send_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._send)

    def _write(self, topic: str, partition: int, key: bytes, value: bytes | None,
               headers: Headers) -> None:
        if value is not None and len(value) > self._check_from:
            self._check_size(key, value, headers)
        self._writes.append((topic, partition, key, value, headers))
        if len(self._writes) >= FRAME_WRITES:
            self._send()
        elif not self._send_scheduled:
            self._schedule_send()

    def _check_size(self, key: bytes, value: bytes, headers: Headers) -> None:
        """librdkafka's one refusal at produce() that is the record's fault, made here too:
        the caller dead-letters the command (nothing was written locally yet), where a
        failure reported later by the child could only restart the worker."""
        size = len(key) + len(value) + sum(len(n) + len(v) + 10 for n, v in headers or ())
        if size > self._max_bytes:
            raise KafkaException(KafkaError(
                KafkaError.MSG_SIZE_TOO_LARGE,
                f"a {size}-byte record is over message.max.bytes ({self._max_bytes})"))

    def publish(self, topic: str, key: bytes | None, value: bytes | None,
                headers: list[tuple[str, bytes]]) -> asyncio.Future[Placed]:
        fut: asyncio.Future[Placed] = asyncio.get_running_loop().create_future()
        self._token += 1
        self._futures[self._token] = fut
        self._publishes.append((self._token, topic, key, value, headers))
        if not self._send_scheduled:
            self._schedule_send()
        return fut

    def _send(self, *, close: bool = False) -> None:
        self._send_scheduled = False
        if self._writes or self._publishes or close:
            self._out += frame((self._writes, self._publishes, close))
            self._writes, self._publishes = [], []
        self._drain()
        if len(self._out) > CHILD_BACKLOG_BYTES:
            self._drain(block=True)

    def _drain(self, *, block: bool = False) -> None:
        child = self._child
        if child is None or child.stdin is None or not self._out:
            return
        fd = child.stdin.fileno()
        if block:
            os.set_blocking(fd, True)
        try:
            while self._out:
                n = os.write(fd, self._out)
                del self._out[:n]
        except BlockingIOError:
            pass
        except OSError as exc:  # the child is gone; its end is reported by poll()
            self._fail(f"changelog writer process unreachable: {exc}")
            self._out.clear()
        finally:
            if block:
                os.set_blocking(fd, False)
        assert self._loop is not None
        if self._out:
            self._loop.add_writer(fd, self._drain)
        else:
            self._loop.remove_writer(fd)

    def poll(self) -> None:
        child = self._child
        if child is None or child.stdout is None or self._eof:
            return
        fd = child.stdout.fileno()
        if not self._readable.poll(0):  # what flush() mostly finds: cheaper than a raise
            return
        ended = False
        try:
            while chunk := os.read(fd, 1 << 20):
                self._in += chunk
            ended = True
        except BlockingIOError:
            pass
        # Its last reports first: a child that reported `closed` and exited is no failure.
        for report in split_frames(self._in):
            self._apply(*report)
        if ended:
            self._ended()
        self._settle()

    def _apply(self, acked: dict[TP, list[int]], published: list[Published],
               failure: str | None, closed: bool) -> None:
        for tp, (count, offset) in acked.items():
            self._ack(tp, count, offset)
        for token, error, partition, offset in published:
            fut = self._futures.pop(token, None)
            if fut is not None:
                _resolve(fut, error, (partition, offset))
        if failure is not None:
            self._fail(failure)
        if closed and self._closed is not None and not self._closed.done():
            self._closed.set_result(None)

    def _ended(self) -> None:
        """The child's output ended: it exited (or was killed)."""
        assert self._child is not None and self._child.stdout is not None and self._loop
        self._eof = True
        self._loop.remove_reader(self._child.stdout.fileno())
        if self._closed is None or not self._closed.done():
            self._fail(f"changelog writer process ended (exit {self._child.poll()})")
        for fut in self._futures.values():
            _resolve(fut, "changelog writer process ended")
        self._futures.clear()
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)

    async def close(self, timeout_s: float = 30.0) -> None:
        child = self._child
        if child is None:
            return
        self._closed = asyncio.get_running_loop().create_future()
        if self._eof:  # already gone (and already a failure): nothing to wait for
            self._closed.set_result(None)
        self._send(close=True)
        try:
            await asyncio.wait_for(asyncio.shield(self._closed), timeout_s)
            self.poll()
            if self._failure is not None:
                raise RuntimeError(self._failure)
            if not self._acked_all(dict(self._produced)):  # the child flushes before closed
                raise RuntimeError("changelog writer closed with writes unacknowledged")
        finally:
            self._settle()
            self._stop_child(child)

    def abandon(self) -> None:
        # Reaped here: the process image that replaces this one would never wait for it.
        if self._child is not None:
            self._stop_child(self._child, grace_s=1.0)

    def _stop_child(self, child: subprocess.Popen[bytes], *, grace_s: float = 5.0) -> None:
        assert self._loop is not None and child.stdin is not None and child.stdout is not None
        self._stopped, self._child = True, None
        self._loop.remove_writer(child.stdin.fileno())
        self._loop.remove_reader(child.stdout.fileno())
        with contextlib.suppress(OSError):  # a child already gone leaves a broken pipe
            child.stdin.close()
        try:
            child.wait(grace_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        child.stdout.close()


def changelog_producer(config: dict[str, Any], *, writer: WriterKind,
                       on_offsets: Callable[[dict[TP, int]], None],
                       on_fatal: Callable[[str], None]) -> Changelog:
    kind = ChildChangelogProducer if writer == "process" else ChangelogProducer
    return kind(config, on_offsets=on_offsets, on_fatal=on_fatal)
