"""kron's loopback targets: THE HTTP receiver of the tests, the fault suite and the bench,
and a consumer of the bench's Kafka target topic.

Both record one compact `Hit` per delivery. The bench's lateness is receive time minus the
`X-Kron-Scheduled-For` the worker sent.

`Receiver` is a minimal HTTP/1.1 keep-alive server on asyncio (uvloop when available) in
its own thread: it parses the request head only, answers `200 ok` to any path but the
behaviours below, and keeps up with the bench's thousands of calls a second (a threaded
`http.server` costs a thread and a full request parse per call and fell over at a few
hundred). Paths choose the behaviour:

  /ok, anything else      200
  /status/503,503,200     answers the listed codes in turn, per Idempotency-Key
  /status-ra/<codes>/<ra> the listed codes in turn per key, each non-2xx with Retry-After: <ra>
  /slow/<seconds>         waits, then 200
  /hang                   waits 60 s (longer than any test's timeout_s)
  /retry-after/<seconds>  429 with Retry-After once per key, then 200
  /hold-first/<seconds>   holds the first request per key that long, answers others at once
  /reset                  closes the connection without an answer (recorded with status 0)
  /body/<status>/<n>      <status> with an n-byte body: "body:" then digits, 0123456789...
  /kill-after-2xx/<tag>   200; right after the first response per key is written, SIGKILL
                          the process that made the call (the worker has the 2xx but has
                          not yet reported it)
  /kill-on-arrival/<s>    SIGKILL the caller as soon as the first request per key arrives,
                          then answer after <s> s (nobody reads it)

The two kill paths kill only processes listed in `killable` (pid -> name: the processes the
caller started); each kill is recorded in `kills`.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from http import HTTPStatus
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition


class Headers(dict[str, str]):
    """Request headers under lower-cased names; looked up in any case."""

    __slots__ = ()

    def __getitem__(self, name: str) -> str:
        return super().__getitem__(name.lower())

    def get(self, name: str, default: Any = None) -> Any:
        return super().get(name.lower(), default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(name.lower())


class Hit(NamedTuple):
    job_id: str  # X-Kron-Job-Id
    key: str  # Idempotency-Key: the execution id
    attempt: int  # X-Kron-Attempt
    scheduled_ms: int  # X-Kron-Scheduled-For (0 if absent)
    recv_ms: float  # wall clock at the receiver when the request head was read
    broker_ms: int = 0  # Kafka target only: the record's broker (LogAppendTime) timestamp
    path: str = ""  # HTTP only, like what follows
    status: int = 200  # the status answered; 0: the connection was closed instead
    head: bytes = b""  # the request head as received (unless the receiver drops heads)

    @property
    def received_ms(self) -> int:
        return int(self.recv_ms)

    @property
    def headers(self) -> Headers:
        """The request's headers, parsed from `head` on each access."""
        return Headers(_parse_head(self.head)[1]) if self.head else Headers()


RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"
MAX_HEAD = 64 * 1024
HANG_S = 60.0

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


def _parse_head(head: bytes) -> tuple[str, dict[str, str]]:
    """The request's path, and its headers under lower-cased names."""
    lines = head.split(b"\r\n")
    target = lines[0].split(b" ", 2)
    out: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            out[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    return (target[1].decode("latin-1") if len(target) > 1 else "/"), out


def _hit(headers: dict[str, str], recv_ms: float) -> Hit | None:
    """A kron call's Hit from headers under lower-cased names; None if not a kron call."""
    try:
        return Hit(job_id=headers.get("x-kron-job-id", ""),
                   key=headers.get("idempotency-key", ""),
                   attempt=int(headers.get("x-kron-attempt", "0")),
                   scheduled_ms=iso_ms(headers["x-kron-scheduled-for"]), recv_ms=recv_ms)
    except (KeyError, ValueError):
        return None


def _http_hit(path: str, headers: dict[str, str], head: bytes, recv_ms: float,
              status: int) -> Hit:
    """Every request is recorded, a kron call or not (a test's own GET, a stray probe)."""
    try:
        attempt = int(headers.get("x-kron-attempt", "0"))
    except ValueError:
        attempt = 0
    try:
        scheduled = iso_ms(headers.get("x-kron-scheduled-for", ""))
    except ValueError:
        scheduled = 0
    return Hit(headers.get("x-kron-job-id", ""), headers.get("idempotency-key", ""), attempt,
               scheduled, recv_ms, 0, path, status, head)


def _response(status: int, extra: dict[str, str], body: bytes = b"ok") -> bytes:
    if status == 200 and not extra and body == b"ok":
        return RESPONSE
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Status"
    head = "".join(f"{k}: {v}\r\n" for k, v in extra.items())
    return (f"HTTP/1.1 {status} {phrase}\r\nContent-Length: {len(body)}\r\n"
            f"Content-Type: text/plain\r\n{head}\r\n").encode("latin-1") + body


def numbered_body(n: int) -> bytes:
    """/body's n bytes: its start and how far it got are easy to tell apart."""
    digits = b"0123456789" * (n // 10 + 1)
    return (b"body:" + digits)[:n]


# --- which process holds a loopback connection --------------------------------------------


def _socket_inodes(local_port: int, remote_port: int) -> set[str]:
    """Inodes of 127.0.0.1 TCP sockets with this local and remote port (/proc/net/tcp)."""
    out: set[str] = set()
    with contextlib.suppress(OSError), open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            parts = line.split()
            local, remote, inode = parts[1], parts[2], parts[9]
            if (int(local.split(":")[1], 16) == local_port
                    and int(remote.split(":")[1], 16) == remote_port):
                out.add(inode)
    return out


def pid_of_peer(peer_port: int, server_port: int, candidates: list[int]) -> int | None:
    """Which of `candidates` (pids the caller started) owns the client end of a connection."""
    inodes = _socket_inodes(peer_port, server_port)
    if not inodes:
        return None
    wanted = {f"socket:[{i}]" for i in inodes}
    for pid in candidates:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                        return pid
    return None


@dataclass
class KillEvent:
    point: str
    pid: int
    key: str
    at_ms: int


# Paths with a behaviour: the first path segment. Any other path is answered 200 at once.
BEHAVIOURS = frozenset({"status", "status-ra", "slow", "hang", "retry-after", "hold-first",
                        "reset", "kill-after-2xx", "kill-on-arrival", "body"})


class Receiver:
    """The loopback HTTP target (module docstring). `with Receiver() as r:` or
    `r = Receiver().start() ... r.stop()`."""

    def __init__(self, *, keep_heads: bool = True) -> None:
        self.hits: list[Hit] = []  # list.append is atomic under the GIL: no lock needed
        self.port = 0
        # Hits keep their request's head (so `Hit.headers`), a few hundred bytes each; the
        # bench, which records hundreds of thousands and reads none, drops them.
        self.keep_heads = keep_heads
        self.killable: dict[int, str] = {}
        self.kills: list[KillEvent] = []
        self._counts: dict[tuple[str, str], int] = defaultdict(int)  # the loop's thread only
        self._killed: set[tuple[str, str]] = set()
        self._kill_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loopback-receiver", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Receiver:
        self._thread.start()
        if not self._ready.wait(10) or not self.port:
            raise RuntimeError("the loopback HTTP receiver did not start")
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is not None and loop.is_running():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
        if self._thread.is_alive():
            self._thread.join(5)

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # what it saw

    def hits_for(self, job_id: str) -> list[Hit]:
        return [h for h in list(self.hits) if h.job_id == job_id]

    def wait_for(self, job_id: str, count: int, timeout_s: float) -> list[Hit]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            hits = self.hits_for(job_id)
            if len(hits) >= count:
                return hits
            time.sleep(0.05)
        return self.hits_for(job_id)

    # the server

    def _run(self) -> None:
        try:
            import uvloop

            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        except ImportError:
            loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            # A backlog in the thousands, as real servers have: when a broker outage ends,
            # the calls held back connect at once, and socketserver's default of 5 dropped
            # handshakes (no answer within 40 s for 22 of 100 on a busy machine).
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

    async def _shutdown(self) -> None:
        """Stops listening, ends the connections still open (a /hang), stops the loop."""
        if self._server is not None:
            self._server.close()
        me = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not me]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        asyncio.get_running_loop().stop()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hits, keep = self.hits, self.keep_heads
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                recv_ms = time.time() * 1000
                path, headers = _parse_head(head)
                length = int(headers.get("content-length") or 0)
                if length:
                    await reader.readexactly(length)
                kind = path.split("/", 2)[1] if path.startswith("/") else ""
                if kind in BEHAVIOURS:
                    if not await self._behave(kind, path, headers, head if keep else b"",
                                              recv_ms, writer):
                        break
                else:
                    hits.append(_http_hit(path, headers, head if keep else b"", recv_ms, 200))
                    writer.write(RESPONSE)
                    await writer.drain()
                if headers.get("connection", "").lower() == "close":
                    break
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError,
                ValueError, IndexError):  # IndexError: a behaviour's path without its value
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _behave(self, kind: str, path: str, headers: dict[str, str], head: bytes,
                      recv_ms: float, writer: asyncio.StreamWriter) -> bool:
        """Answers a path with a behaviour; False: the connection is to close now."""
        key = headers.get("idempotency-key", "")
        n = self._counts[(path, key)]
        self._counts[(path, key)] = n + 1
        parts = path.strip("/").split("/")
        status, delay, extra, body = 200, 0.0, {}, b"ok"
        if kind == "reset":
            self.hits.append(_http_hit(path, headers, head, recv_ms, 0))
            return False
        if kind == "status":
            codes = [int(c) for c in parts[1].split(",")]
            status = codes[min(n, len(codes) - 1)]
        elif kind == "status-ra":
            codes = [int(c) for c in parts[1].split(",")]
            status = codes[min(n, len(codes) - 1)]
            extra = {"Retry-After": parts[2]} if status >= 300 else {}
        elif kind == "slow":
            delay = float(parts[1])
        elif kind == "hang":
            delay = HANG_S
        elif kind == "hold-first":
            delay = float(parts[1]) if n == 0 else 0.0
        elif kind == "retry-after" and n == 0:
            status, extra = 429, {"Retry-After": parts[1]}
        elif kind == "kill-on-arrival" and n == 0:
            delay = float(parts[1])
        elif kind == "body":
            status, body = int(parts[1]), numbered_body(int(parts[2]))
        peer = writer.get_extra_info("peername")
        peer_port = int(peer[1]) if peer else 0
        if kind == "kill-on-arrival":
            threading.Thread(target=self._kill_caller, args=(peer_port, "during_call", key),
                             daemon=True).start()
        self.hits.append(_http_hit(path, headers, head, recv_ms, status))
        if delay:
            await asyncio.sleep(delay)
        writer.write(_response(status, extra, body))
        await writer.drain()
        if kind == "kill-after-2xx":
            self._kill_caller(peer_port, "after_2xx", key)
        return True

    def _kill_caller(self, peer_port: int, point: str, key: str) -> None:
        """SIGKILL the `killable` process at the other end of the connection, once per
        (point, key)."""
        with self._kill_lock:
            if (point, key) in self._killed:
                return
            self._killed.add((point, key))
        pid = pid_of_peer(peer_port, self.port, list(self.killable))
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self.kills.append(KillEvent(point=point, pid=pid, key=key,
                                        at_ms=time.time_ns() // 1_000_000))


class ReceiverProcess:
    """A Receiver in a process of its own (multiprocessing, spawned): one tenant's target
    whose receive times do not wait behind another tenant's calls in the bench process's
    receiver (its one event loop, and the GIL it shares with the bench). Reading `hits`
    brings over the hits the process saw since the last read."""

    def __init__(self) -> None:
        self._hits: list[Hit] = []
        self._conn: Connection | None = None
        self._proc: Any = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return int(self._proc.pid) if self._proc is not None else 0

    @property
    def hits(self) -> list[Hit]:
        if self._conn is not None:
            self._conn.send(len(self._hits))
            self._hits.extend(self._conn.recv())
        return self._hits

    def start(self) -> ReceiverProcess:
        ctx = multiprocessing.get_context("spawn")  # the bench has threads: no fork
        ours, theirs = ctx.Pipe()
        self._proc = ctx.Process(target=_receive_in_process, args=(theirs,),
                                 name="bench-receiver", daemon=True)
        self._proc.start()
        theirs.close()
        if not ours.poll(30):
            self._proc.kill()
            raise RuntimeError("the receiver process did not start")
        self.port = ours.recv()
        self._conn = ours
        return self

    def stop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.send(None)
            conn.close()
        if self._proc is not None:
            self._proc.join(5)
            if self._proc.is_alive():
                self._proc.kill()

    def __enter__(self) -> ReceiverProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _receive_in_process(conn: Connection) -> None:
    """ReceiverProcess's child: serves until told None (or the pipe closes); each other
    message is how many hits the parent has, answered with the rest."""
    with Receiver(keep_heads=False) as receiver:
        conn.send(receiver.port)
        while True:
            try:
                upto = conn.recv()
            except EOFError:
                return
            if upto is None:
                return
            conn.send(receiver.hits[upto:])


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
