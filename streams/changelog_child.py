"""The worker's changelog writer process: librdkafka's produce and delivery reports, off the
worker's event loop.

One worker's event-loop thread bounds its throughput (bench/README.md, Where the time goes), while
the machine's other core is not full: in `kron bench steady --target kafka --rate 3000` on
2026-12-03 the worker used 1.05 cores, the broker 0.2-0.5 and the bench 0.05. Each state
write cost that thread a produce() (3.1-4.4 us) and a delivery report (1-2.5 us), five
writes and a Kafka target's message per execution. Here the worker hands its writes over
in pickled frames of up to 64 (0.2-0.3 us a record) and reads back one report per batch
of delivery reports: per partition, how many writes were acknowledged and the last offset,
which is all its dispatch barrier and Faust's persisted offsets need (the producer is
idempotent, so acks arrive in order within a partition).

    python -m streams.changelog_child      # started by streams.changelog, never by hand

Frames both ways are a 4-byte big-endian length and a pickle. The first frame in is the
producer's config; then (writes, publishes, close) frames: writes are (topic, partition,
key, value, headers), publishes (token, topic, key, value, headers). Out go
(acked, published, failure, closed) reports: acked maps (topic, partition) to [count,
last offset], published lists (token, error or None, partition, offset).

The process ends when its input ends: at once (nothing flushed, as when a worker process
dies with librdkafka's queue) unless a close frame came first, which flushes every write
and sends a last report with `closed` set. It ignores SIGINT: the worker stops it.

It also dies with the worker (the kernel's parent-death signal, SIGKILL), without first
reading what is left in its input: a worker killed with `kill -9` loses its unsent writes
at once, as an inline writer does, and none of them reaches Kafka later, after its
partitions' next owner may have read their changelogs.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import struct
import sys
import threading
import time
from typing import Any, BinaryIO

from confluent_kafka import KafkaError, KafkaException, Producer

_LENGTH = struct.Struct(">I")
POLL_S = 0.05
CLOSE_TIMEOUT_S = 30.0

TP = tuple[str, int]
# A Kafka target's message as reported: (token, error or None, partition, offset).
Published = tuple[int, str | None, int, int]


def frame(obj: Any) -> bytes:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(body)) + body


def read_frame(stream: BinaryIO) -> Any | None:
    """The next frame, or None at the end of the input."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    (n,) = _LENGTH.unpack(head)
    body = stream.read(n)
    if len(body) < n:
        return None
    return pickle.loads(body)


def split_frames(buffer: bytearray) -> list[Any]:
    """The whole frames at the start of `buffer`, removed from it."""
    out: list[Any] = []
    at = 0
    while len(buffer) - at >= _LENGTH.size:
        (n,) = _LENGTH.unpack_from(buffer, at)
        end = at + _LENGTH.size + n
        if end > len(buffer):
            break
        out.append(pickle.loads(memoryview(buffer)[at + _LENGTH.size:end]))
        at = end
    del buffer[:at]
    return out


class Writer:
    """The producer and what its delivery reports told, until the next report is sent."""

    def __init__(self, config: dict[str, Any], out: BinaryIO) -> None:
        self._producer = Producer({**config, "on_delivery": self._delivered})
        self._out = out
        self._lock = threading.Lock()
        self._acked: dict[TP, list[int]] = {}
        self._published: list[Published] = []
        self._failure: str | None = None
        self._stop = threading.Event()

    # --- delivery reports (any thread that polls) ---------------------------------------------

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        with self._lock:
            if err is not None:
                self._failure = self._failure or f"changelog write failed: {err}"
                return
            entry = self._acked.setdefault((msg.topic(), msg.partition()), [0, -1])
            entry[0] += 1
            entry[1] = msg.offset()

    def _on_published(self, token: int) -> Any:
        def delivered(err: KafkaError | None, msg: Any) -> None:
            with self._lock:
                if err is None:  # where it landed: the attempt's output
                    self._published.append((token, None, msg.partition(), msg.offset()))
                else:
                    self._published.append((token, str(err), -1, -1))
        return delivered

    def report(self, *, closed: bool = False) -> None:
        # Written under the lock: reports leave in the order their contents were taken.
        with self._lock:
            if not (self._acked or self._published or self._failure or closed):
                return
            body = memoryview(frame((self._acked, self._published, self._failure, closed)))
            while body:  # an unbuffered write may take part of it
                body = body[self._out.write(body) or 0:]
            self._acked, self._published, self._failure = {}, [], None

    def serve(self) -> None:
        """The poller thread: delivery reports as they arrive, one report per batch."""
        while not self._stop.is_set():
            self._producer.poll(POLL_S)
            self.report()

    # --- what the worker hands over -----------------------------------------------------------

    def apply(self, writes: list[tuple[Any, ...]], publishes: list[tuple[Any, ...]]) -> None:
        for topic, partition, key, value, headers in writes:
            try:
                self._produce(topic, value=value, key=key, partition=partition,
                              headers=headers)
            except KafkaException as exc:  # the worker checked the size: not the record's
                with self._lock:
                    self._failure = self._failure or f"changelog write refused: {exc}"
        for token, topic, key, value, headers in publishes:
            try:
                self._produce(topic, value=value, key=key, headers=headers,
                              on_delivery=self._on_published(token))
            except KafkaException as exc:
                with self._lock:
                    self._published.append((token, f"publish refused: {exc}", -1, -1))

    def _produce(self, topic: str, **kw: Any) -> None:
        while True:
            try:
                self._producer.produce(topic, **kw)
                return
            except BufferError:  # a million writes unsent: the broker is away or slow
                time.sleep(0.01)  # the poller thread serves the reports that make room

    def close(self, poller: threading.Thread) -> None:
        """Every write acknowledged (or the close's failure), then the last report."""
        remaining = self._producer.flush(CLOSE_TIMEOUT_S)
        self._stop.set()
        poller.join()
        if remaining:
            with self._lock:
                self._failure = self._failure or (
                    f"changelog close: {remaining} writes not acknowledged")
        self.report(closed=True)


_PR_SET_PDEATHSIG = 1


def die_with(parent: int) -> None:
    """Have the kernel SIGKILL this process when `parent` ends (Linux; elsewhere the end
    of the input still ends it), and end now if it already has. The kernel sends it when
    the thread that started this process ends: the worker's event-loop thread, which lasts
    as long as the worker."""
    prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # A parent gone before the call sends no signal: we have been adopted by then.
    if os.getppid() != parent:
        os._exit(0)


def main() -> None:
    if len(sys.argv) > 1:
        die_with(int(sys.argv[1]))
    # Ctrl-C reaches the whole process group; the worker's graceful stop then closes this
    # process after flushing, which it could not do had the signal ended it first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The frames go to the worker on what was stdout; anything printed goes to stderr.
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    source = sys.stdin.buffer
    config = read_frame(source)
    if config is None:
        return
    writer = Writer(config, out)
    poller = threading.Thread(target=writer.serve, name="changelog-acks", daemon=True)
    poller.start()
    while True:
        message = read_frame(source)
        if message is None:
            # The worker is gone without closing: end as its own librdkafka queue would.
            os._exit(0)
        writes, publishes, close = message
        writer.apply(writes, publishes)
        if close:
            writer.close(poller)
            return


if __name__ == "__main__":
    main()
