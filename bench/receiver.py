"""The bench's targets: a fast loopback HTTP responder and a consumer of the Kafka target topic.

Both record one compact `Hit` per delivery. Lateness is receive time minus the
`X-Kron-Scheduled-For` the worker sent.

The HTTP side is a minimal HTTP/1.1 keep-alive server on asyncio (uvloop when available) in
its own thread: the threaded receiver of the tests costs a thread and a full request parse
per call and falls over at a few hundred calls a second. This one parses only the headers
it records and always answers 200.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from datetime import datetime
from typing import Any, NamedTuple

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition


class Hit(NamedTuple):
    job_id: str
    key: str  # Idempotency-Key: the execution id
    attempt: int
    scheduled_ms: int  # X-Kron-Scheduled-For
    recv_ms: float  # wall clock at the receiver
    broker_ms: int = 0  # Kafka target only: the record's broker (LogAppendTime) timestamp


RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"
MAX_HEAD = 64 * 1024

_iso_cache: dict[str, int] = {}


def iso_ms(text: str) -> int:
    """RFC 3339 -> epoch ms. Many hits share a slot, so parsed values are cached (bounded)."""
    ms = _iso_cache.get(text)
    if ms is None:
        ms = int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
        if len(_iso_cache) > 200_000:
            _iso_cache.clear()
        _iso_cache[text] = ms
    return ms


def _parse_head(head: bytes) -> tuple[dict[str, str], bool]:
    """Headers we need (lower-cased names), and whether the client asked to close."""
    out: dict[str, str] = {}
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            out[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    return out, out.get("connection", "").lower() == "close"


def _hit(headers: dict[str, str], recv_ms: float) -> Hit | None:
    try:
        return Hit(job_id=headers.get("x-kron-job-id", ""),
                   key=headers.get("idempotency-key", ""),
                   attempt=int(headers.get("x-kron-attempt", "0")),
                   scheduled_ms=iso_ms(headers["x-kron-scheduled-for"]), recv_ms=recv_ms)
    except (KeyError, ValueError):
        return None  # not a kron call (a stray probe of the port); answered, not recorded


class HttpReceiver:
    def __init__(self) -> None:
        self.hits: list[Hit] = []  # list.append is atomic under the GIL: no lock needed
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-receiver", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> HttpReceiver:
        self._thread.start()
        if not self._ready.wait(10) or not self.port:
            raise RuntimeError("the bench HTTP receiver did not start")
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        try:
            import uvloop

            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        except ImportError:
            loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            self._server = loop.run_until_complete(asyncio.start_server(
                self._serve, "127.0.0.1", 0, backlog=2048, limit=MAX_HEAD))
            self.port = self._server.sockets[0].getsockname()[1]
            self._ready.set()
            loop.run_forever()
        finally:
            self._ready.set()
            if self._server is not None:
                self._server.close()
            loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                recv_ms = time.time() * 1000
                headers, close = _parse_head(head)
                length = int(headers.get("content-length") or 0)
                if length:
                    await reader.readexactly(length)
                hit = _hit(headers, recv_ms)
                if hit is not None:
                    self.hits.append(hit)
                writer.write(RESPONSE)
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError,
                ValueError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()


class KafkaReceiver:
    """Consumes the Kafka target topic from its start; one Hit per record.

    Two receive clocks are kept: the consumer's wall clock when `poll` returned the record
    (`recv_ms`), and the broker's append time of the record (`broker_ms`; the
    bench creates the topic with `message.timestamp.type=LogAppendTime`).
    """

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.hits: list[Hit] = []
        self.topic = topic
        self._consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": f"bench-target-{time.time_ns()}",
            "enable.auto.commit": False, "fetch.wait.max.ms": 50, "log_level": 3})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-kafka-target",
                                        daemon=True)

    def start(self, partitions: int) -> KafkaReceiver:
        self._consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING)
                               for p in range(partitions)])
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        with contextlib.suppress(Exception):
            self._consumer.close()

    def _run(self) -> None:
        # poll(), not consume(n, timeout): consume waits for n records or the timeout, which
        # would add up to the timeout to every measured receive time.
        while not self._stop.is_set():
            msg = self._consumer.poll(0.2)
            recv_ms = time.time() * 1000
            if msg is None or msg.error():
                continue
            hit = _hit(_kafka_headers(msg.headers()), recv_ms)
            if hit is not None:
                self.hits.append(hit._replace(broker_ms=msg.timestamp()[1]))


def _kafka_headers(raw: Any) -> dict[str, str]:
    """Record headers (a list of (name, bytes) pairs) as a dict with lower-cased names."""
    out: dict[str, str] = {}
    for name, value in raw or ():
        text = value.decode("latin-1") if isinstance(value, bytes) else str(value or "")
        out[str(name).lower()] = text
    return out
