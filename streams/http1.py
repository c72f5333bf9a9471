"""A small HTTP/1.1 client for attempts: keep-alive pools on asyncio protocols.

aiohttp's request path was the largest single cost of a burst after its due time (~35% of
the worker's CPU). An attempt needs little of it: one request, the status, Retry-After and
the body's first bytes. This client does that and no more, with httptools (llhttp, the
parser uvicorn uses) reading the response:

- connections go only to the addresses the `resolve` hook returns, tried in order, while the
  URL's host name stays the Host header, the TLS SNI name and the certificate's subject, so
  the resolver decides where a socket may connect (streams/netguard.py pins them);
- no redirects, no proxies, no cookies, no content decoding (no Accept-Encoding is sent);
- the caller's timeout covers the whole exchange, from waiting for a connection slot to the
  last byte of the body, and the body beyond the excerpt is read and dropped;
- framing headers (Host, Content-Length, Transfer-Encoding, Connection) come from the
  client only: the API refuses them in a job, and a job that reached Kafka another way
  still can't smuggle a second request into a pooled connection.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import re
import ssl
import time
from asyncio import staggered
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import quote, unquote, urlsplit

import httptools

from streams.domain.errors import PermanentError
from streams.netguard import IPAddress

Resolve = Callable[[str, int], Awaitable[list[IPAddress]]]

FRAMING = frozenset({"host", "content-length", "transfer-encoding", "connection",
                     "keep-alive", "proxy-connection", "te", "trailer", "upgrade"})
# Methods sent without a Content-Length when they have no body (aiohttp's set); the
# others say "Content-Length: 0", which servers expect of a bodiless POST or DELETE.
NO_BODY = frozenset({"GET", "HEAD", "OPTIONS", "CONNECT", "TRACE"})
# Sent again on a fresh connection when a pooled one closed before any answer.
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
# yarl's (aiohttp's) set: characters left as they are when a path is requoted.
PATH_SAFE = "/%:@!$&'()*+,;=-._~"
BARE_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
URL_CACHE_MAX = 4096
# Below the 5 s idle timeout of common servers (Node, uvicorn, gunicorn): a connection we
# still think is open is rarely one the server is closing.
IDLE_S = 4.0
HAPPY_EYEBALLS_S = 0.25


class BadResponse(OSError):
    """The server's answer was not HTTP/1.x we can read; transient, like a reset."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Response:
    status: int
    retry_after: str | None
    excerpt: bytes  # the body's first bytes, at most the client's excerpt_bytes
    # The status line's reason phrase (at most ~excerpt_bytes of it) and HTTP version.
    reason: bytes = b""
    version: str = "1.1"


@dataclass(frozen=True, kw_only=True, slots=True)
class Url:
    tls: bool
    host: str  # as the resolver wants it: no brackets, IDNA-encoded
    server_name: str  # for SNI and the certificate check: no trailing dot
    port: int
    origin: tuple[bool, str, int]
    target: str  # path and query, requoted
    host_header: str
    authorization: str | None

    @classmethod
    def parse(cls, url: str) -> Url:
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError as exc:
            raise PermanentError(f"target.url has a bad port: {exc}", field="target.url") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PermanentError("target.url must be an absolute http(s) URL", field="target.url")
        tls = parts.scheme == "https"
        host = parts.hostname
        if not host.isascii():
            try:
                host = host.encode("idna").decode("ascii")
            except UnicodeError as exc:
                raise PermanentError(f"target.url has a bad host name: {exc}",
                                     field="target.url") from None
        default = 443 if tls else 80
        port = default if port is None else port
        name = host.rstrip(".")
        shown = f"[{name}]" if ":" in name else name
        target = _requote(parts.path or "/")
        if parts.query:
            target += "?" + _requote(parts.query, "?")
        auth = None
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            auth = "Basic " + base64.b64encode(pair.encode()).decode()
        return cls(tls=tls, host=host, server_name=name, port=port, origin=(tls, host, port),
                   target=target,
                   host_header=shown if port == default else f"{shown}:{port}",
                   authorization=auth)


def _requote(part: str, safe: str = "") -> str:
    return BARE_PERCENT.sub("%25", quote(part, safe=PATH_SAFE + safe))


def request_bytes(method: str, url: Url, headers: Mapping[str, str], body: bytes | None) -> bytes:
    lines = [f"{method} {url.target} HTTP/1.1", f"Host: {url.host_header}"]
    given = set()
    for name, value in headers.items():
        lower = name.lower()
        if lower in FRAMING:
            continue
        if not TOKEN.fullmatch(name):  # " Transfer-Encoding" would slip past FRAMING
            raise PermanentError(f"header name {name!r} is not an RFC 7230 token",
                                 field=f"target.headers.{name}")
        given.add(lower)
        lines.append(f"{name}: {value}")
    if url.authorization is not None and "authorization" not in given:
        lines.append(f"Authorization: {url.authorization}")
    if "user-agent" not in given:
        lines.append("User-Agent: kron")
    if "accept" not in given:
        lines.append("Accept: */*")
    if body is not None or method not in NO_BODY:
        lines.append(f"Content-Length: {len(body or b'')}")
    head = "\r\n".join(lines)
    # One pass for the whole head instead of one per header: only the separators may
    # break a line, so a CR, LF or NUL inside a name or value shows as a count mismatch.
    breaks = len(lines) - 1
    if head.count("\n") != breaks or head.count("\r") != breaks or "\x00" in head:
        raise PermanentError("header names and values can't hold CR, LF or NUL",
                             field="target.headers")
    return (head + "\r\n\r\n").encode() + (body or b"")


class Slots:
    """A counting limit, first come first served. asyncio.Semaphore (3.11) scans its
    waiters on every acquire and release: with 1,024 executor tasks queued behind one
    host's 256 connections, that scan was 8% of the worker in a burst. Here both are O(1):
    a release hands its slot straight to the oldest waiter still waiting."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._free = size
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def __aenter__(self) -> None:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # handed a slot, then cancelled
                self._release()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._release()

    def unused(self) -> bool:
        return not self._waiters and self._free == self._size

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():  # a cancelled waiter's future is done: skipped
                waiter.set_result(None)
                return
        self._free += 1


class Connection(asyncio.Protocol):
    """One socket, one exchange at a time. httptools calls the on_* methods."""

    def __init__(self, excerpt_bytes: int, on_lost: Callable[[Connection], None]) -> None:
        self._limit = excerpt_bytes
        self._on_lost = on_lost
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = False
        self.answered = False  # any byte of a response to the current request
        self._waiter: asyncio.Future[Response] | None = None
        self._head = False
        # The server's HTTP version, read once per connection: it does not change on one,
        # and httptools formats it afresh (str.format) at every call.
        self._version: str | None = None
        self._reset()

    def _reset(self) -> None:
        self._status = 0
        self._retry_after: str | None = None
        self._framed = False  # a Content-Length or chunked body: EOF doesn't end it
        self._headers_done = False
        self._body = bytearray()
        self._reason = b""

    # --- asyncio -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports aren't asyncio.Transport subclasses, only alike.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:
            self.close()  # nothing was asked: a server talking out of turn isn't reused
            return
        self.answered = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.close()
        except httptools.HttpParserError as exc:
            self._fail(BadResponse(f"bad HTTP response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        self._on_lost(self)
        if self._headers_done and not self._framed and self._status not in (204, 304):
            self._finish(keep_alive=False)  # a body delimited by the connection's end
        else:
            self._fail(ConnectionResetError("connection closed before the response ended"))

    # --- httptools ------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._waiter is None:
            # Bytes after the answer, in the same read: whatever they are, they'd be taken
            # for the next request's answer on a pooled connection.
            self.close()

    def on_status(self, reason: bytes) -> None:
        # Kept for the attempt's output; llhttp may hand a long phrase over in pieces.
        if len(self._reason) < self._limit:
            self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._headers_done:  # a trailer: the answer's headers are settled
            return
        lower = name.lower()
        if lower == b"retry-after":
            self._retry_after = value.decode("latin-1")
        elif lower == b"content-length" or (lower == b"transfer-encoding"
                                            and b"chunked" in value.lower()):
            self._framed = True

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        if self._status >= 200 or self._status == 101:
            self._headers_done = True
            if self._head:  # no body follows, whatever Content-Length says
                self._finish(keep_alive=False)

    def on_body(self, body: bytes) -> None:
        room = self._limit - len(self._body)
        if room > 0:
            self._body += body[:room]

    def on_message_complete(self) -> None:
        if not self._headers_done:  # 100 Continue and friends: the answer is still to come
            self._reset()
            return
        self._finish(keep_alive=self._parser.should_keep_alive())

    # --- the exchange ---------------------------------------------------------------------

    def send(self, payload: bytes, *, head: bool) -> asyncio.Future[Response]:
        assert self.transport is not None
        self._reset()
        self._head = head
        self.reusable = False
        self.answered = False
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(payload)
        return self._waiter

    def _finish(self, *, keep_alive: bool) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            self.reusable = keep_alive and not self.closed and not self._head
            version = self._version
            if version is None:
                version = self._version = self._parser.get_http_version()
            waiter.set_result(Response(status=self._status, retry_after=self._retry_after,
                                       excerpt=bytes(self._body), reason=self._reason,
                                       version=version))

    def _fail(self, exc: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        self.close()
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def transport_closing(self) -> bool:
        return self.closed or self.transport is None or self.transport.is_closing()

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


Origin = tuple[bool, str, int]


class Http1Client:
    """Keep-alive pools per origin, bounded like aiohttp's connector was: at most
    `max_per_host` exchanges at once per origin and `max_connections` in all."""

    def __init__(self, *, resolve: Resolve, ssl_context: ssl.SSLContext,
                 max_connections: int = 512, max_per_host: int = 256,
                 idle_s: float = IDLE_S, excerpt_bytes: int = 512) -> None:
        self._resolve = resolve
        self._ssl = ssl_context
        self._max_per_host = max_per_host
        self._slots = Slots(max_connections)
        self._host_slots: dict[Origin, Slots] = {}
        # Per origin, in the order put back (the newest is reused first); a connection
        # leaves its pool when taken, when it closes, or when a sweep finds it expired.
        self._idle: dict[Origin, dict[Connection, float]] = {}
        self._where: dict[Connection, Origin] = {}
        self._idle_count = 0
        self._idle_max = max_connections
        self._idle_s = idle_s
        self._swept = time.monotonic()
        self._excerpt = excerpt_bytes
        self._urls: dict[str, Url] = {}
        self._closed = False
        self._warming: dict[Origin, int] = {}  # connections being opened ahead, per origin
        self._warm_tasks: set[asyncio.Task[None]] = set()

    def url(self, url: str) -> Url:
        parsed = self._urls.get(url)
        if parsed is None:
            if len(self._urls) >= URL_CACHE_MAX:
                self._urls.clear()
            parsed = self._urls[url] = Url.parse(url)
        return parsed

    async def request(self, method: str, url: str, headers: Mapping[str, str],
                      body: bytes | None, timeout_s: float) -> Response:
        where = self.url(url)
        payload = request_bytes(method, where, headers, body)
        host_slots = self._host_slots.get(where.origin)
        if host_slots is None:
            host_slots = self._host_slots[where.origin] = Slots(self._max_per_host)
        try:
            # The host's limit first: requests queued behind one busy host must not hold
            # the global slots other hosts' requests need.
            async with asyncio.timeout(timeout_s), host_slots, self._slots:
                return await self._exchange(method, where, payload)
        finally:
            if host_slots.unused():
                self._host_slots.pop(where.origin, None)

    def warm(self, calls: Mapping[str, int]) -> None:
        """Open connections to the URLs' origins ahead of `calls[url]` calls due there at
        once (decided ahead, streams/executor.py), up to max_per_host idle ones an origin
        and max_connections in all: at their due time they need no connect, which takes a
        few turns of a loop that may be busy with another tenant's calls (kron bench noisy:
        a tenant's first calls after a quiet minute went out 200 ms after their time beside
        another's spike, 29 ms alone). A connection that fails here is not an outcome: the
        call connects itself."""
        if self._closed:
            return
        per_origin: dict[Origin, tuple[Url, int]] = {}
        for url, n in calls.items():
            where = self.url(url)
            seen = per_origin.get(where.origin)
            per_origin[where.origin] = (where, n + (seen[1] if seen else 0))
        # Warm connections count against max_connections (idle ones are capped by it too):
        # a tenant's many origins due at once cannot open more than that ahead.
        room = self._idle_max - self._idle_count - sum(self._warming.values())
        for origin, (where, n) in per_origin.items():
            have = len(self._idle.get(origin, ())) + self._warming.get(origin, 0)
            want = min(min(n, self._max_per_host) - have, room)
            if want <= 0:
                continue
            room -= want
            self._warming[origin] = self._warming.get(origin, 0) + want
            task = asyncio.ensure_future(self._warm(where, want))
            self._warm_tasks.add(task)
            task.add_done_callback(self._warm_tasks.discard)

    async def _warm(self, where: Url, want: int) -> None:
        try:
            opened = await asyncio.gather(*(self._connect(where) for _ in range(want)),
                                          return_exceptions=True)
        finally:
            left = self._warming.get(where.origin, 0) - want
            if left > 0:
                self._warming[where.origin] = left
            else:
                self._warming.pop(where.origin, None)
        for conn in opened:
            if isinstance(conn, Connection):
                if self._closed:
                    conn.close()
                else:
                    self._put_idle(where.origin, conn)

    async def _exchange(self, method: str, where: Url, payload: bytes) -> Response:
        conn = self._take_idle(where.origin)
        if conn is not None:
            try:
                return await self._send(conn, where, payload, method == "HEAD")
            except ConnectionError:
                # A pooled connection the server closed as the request went out (its idle
                # timeout raced ours): nothing was answered, so an idempotent request goes
                # again on a fresh connection, as aiohttp did. Others fail as sent.
                if conn.answered or method not in IDEMPOTENT:
                    raise
        conn = await self._connect(where)
        return await self._send(conn, where, payload, method == "HEAD")

    async def _send(self, conn: Connection, where: Url, payload: bytes, head: bool) -> Response:
        try:
            return await conn.send(payload, head=head)
        finally:
            if conn.reusable and not self._closed:
                self._put_idle(where.origin, conn)
            else:
                conn.close()

    async def close(self) -> None:
        # Exchanges in flight close their own connections when they end or time out.
        self._closed = True
        for task in list(self._warm_tasks):
            task.cancel()
        for pool in list(self._idle.values()):
            for conn in list(pool):
                conn.close()
        self._idle.clear()
        self._where.clear()
        self._idle_count = 0

    def _take_idle(self, origin: Origin) -> Connection | None:
        pool = self._idle.get(origin)
        now = time.monotonic()
        while pool:
            conn, since = pool.popitem()
            self._idle_count -= 1
            del self._where[conn]
            if not pool:
                del self._idle[origin]
            if now - since < self._idle_s and not conn.transport_closing():
                return conn
            conn.close()
        return None

    def _put_idle(self, origin: Origin, conn: Connection) -> None:
        now = time.monotonic()
        if now - self._swept > self._idle_s:
            self._sweep(now)
        if self._idle_count >= self._idle_max:
            conn.close()
            return
        self._idle.setdefault(origin, {})[conn] = now
        self._where[conn] = origin
        self._idle_count += 1

    def _forget(self, conn: Connection) -> None:
        """A connection closed (by either side): out of its pool at once, so the idle cap
        counts only connections that can still be used."""
        origin = self._where.pop(conn, None)
        if origin is None:
            return
        pool = self._idle[origin]
        del pool[conn]
        self._idle_count -= 1
        if not pool:
            del self._idle[origin]

    def _sweep(self, now: float) -> None:
        self._swept = now
        for pool in list(self._idle.values()):
            for conn, since in list(pool.items()):
                if now - since >= self._idle_s:
                    conn.close()  # connection_lost, soon, takes it out of the pool
                    self._forget(conn)

    async def _connect(self, where: Url) -> Connection:
        # The resolver's addresses, in its order; the name never reaches the socket layer.
        # As aiohttp did (RFC 8305), the next address is tried if one hasn't connected
        # within HAPPY_EYEBALLS_S, racing it: a blackholed IPv6 address costs 0.25 s.
        addresses = await self._resolve(where.host, where.port)
        if not addresses:
            raise OSError(f"{where.host!r} resolved to no address")
        loop = asyncio.get_running_loop()

        def factory() -> Connection:
            return Connection(self._excerpt, self._forget)

        attempts = [functools.partial(
            loop.create_connection, factory, host=str(address), port=where.port,
            ssl=self._ssl if where.tls else None,
            server_hostname=where.server_name if where.tls else None)
            for address in addresses]
        won, _, errors = await staggered.staggered_race(attempts, HAPPY_EYEBALLS_S)
        if won is None:
            error = next((e for e in reversed(errors) if e is not None), None)
            if isinstance(error, OSError):
                raise error
            raise OSError(f"no address of {where.host!r} could be reached: {error!r}")
        return cast(Connection, won[1])
