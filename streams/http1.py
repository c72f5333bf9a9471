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
import ssl
import time
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
# Methods whose request carries a body even when empty: servers expect the length.
WITH_BODY = frozenset({"POST", "PUT", "PATCH"})
# yarl's (aiohttp's) set: characters left as they are when a path is requoted.
PATH_SAFE = "/%:@!$&'()*+,;=-._~"
URL_CACHE_MAX = 4096


class BadResponse(OSError):
    """The server's answer was not HTTP/1.x we can read; transient, like a reset."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Response:
    status: int
    retry_after: str | None
    excerpt: bytes


@dataclass(frozen=True, kw_only=True, slots=True)
class Url:
    tls: bool
    host: str  # as the resolver and the certificate check want it: no brackets
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
        default = 443 if tls else 80
        port = default if port is None else port
        shown = f"[{host}]" if ":" in host else host
        target = quote(parts.path or "/", safe=PATH_SAFE)
        if parts.query:
            target += "?" + quote(parts.query, safe=PATH_SAFE + "?")
        auth = None
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            auth = "Basic " + base64.b64encode(pair.encode()).decode()
        return cls(tls=tls, host=host, port=port, origin=(tls, host, port), target=target,
                   host_header=shown if port == default else f"{shown}:{port}",
                   authorization=auth)


def request_bytes(method: str, url: Url, headers: Mapping[str, str], body: bytes | None) -> bytes:
    lines = [f"{method} {url.target} HTTP/1.1", f"Host: {url.host_header}"]
    given = set()
    for name, value in headers.items():
        lower = name.lower()
        if lower in FRAMING:
            continue
        if any(c in name or c in value for c in "\r\n\x00"):
            raise PermanentError("header names and values can't hold CR, LF or NUL",
                                 field=f"target.headers.{name}")
        given.add(lower)
        lines.append(f"{name}: {value}")
    if url.authorization is not None and "authorization" not in given:
        lines.append(f"Authorization: {url.authorization}")
    if "user-agent" not in given:
        lines.append("User-Agent: kron")
    if "accept" not in given:
        lines.append("Accept: */*")
    if body is not None or method in WITH_BODY:
        lines.append(f"Content-Length: {len(body or b'')}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


class Connection(asyncio.Protocol):
    """One socket, one exchange at a time. httptools calls the on_* methods."""

    def __init__(self, excerpt_bytes: int) -> None:
        self._limit = excerpt_bytes
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = False
        self._waiter: asyncio.Future[Response] | None = None
        self._head = False
        self._reset()

    def _reset(self) -> None:
        self._status = 0
        self._retry_after: str | None = None
        self._framed = False  # a Content-Length or chunked body: EOF doesn't end it
        self._headers_done = False
        self._body = bytearray()

    # --- asyncio -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports aren't asyncio.Transport subclasses, only alike.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            self.close()  # nothing was asked: a server talking out of turn isn't reused
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.reusable = False
        except httptools.HttpParserError as exc:
            self._fail(BadResponse(f"bad HTTP response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._headers_done and not self._framed and self._status not in (204, 304):
            self._finish(keep_alive=False)  # a body delimited by the connection's end
        else:
            self._fail(ConnectionResetError("connection closed before the response ended"))

    # --- httptools ------------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower == b"retry-after":
            self._retry_after = value.decode("latin-1")
        elif lower in (b"content-length", b"transfer-encoding"):
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
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(payload)
        return self._waiter

    def _finish(self, *, keep_alive: bool) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            self.reusable = keep_alive and not self.closed
            waiter.set_result(Response(status=self._status, retry_after=self._retry_after,
                                       excerpt=bytes(self._body)))

    def _fail(self, exc: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        self.close()
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class Http1Client:
    """Keep-alive pools per origin, bounded like aiohttp's connector was: at most
    `max_connections` exchanges at once and `max_per_host` per origin."""

    def __init__(self, *, resolve: Resolve, ssl_context: ssl.SSLContext,
                 max_connections: int = 512, max_per_host: int = 256,
                 idle_s: float = 15.0, excerpt_bytes: int = 512) -> None:
        self._resolve = resolve
        self._ssl = ssl_context
        self._max_per_host = max_per_host
        self._slots = asyncio.Semaphore(max_connections)
        self._host_slots: dict[tuple[bool, str, int], asyncio.Semaphore] = {}
        self._idle: dict[tuple[bool, str, int], list[tuple[Connection, float]]] = {}
        self._idle_count = 0
        self._idle_max = max_connections
        self._idle_s = idle_s
        self._excerpt = excerpt_bytes
        self._urls: dict[str, Url] = {}

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
            host_slots = self._host_slots[where.origin] = asyncio.Semaphore(self._max_per_host)
        async with asyncio.timeout(timeout_s), self._slots, host_slots:
            conn = self._take_idle(where.origin) or await self._connect(where)
            try:
                response = await conn.send(payload, head=method == "HEAD")
            finally:
                if conn.reusable:
                    self._put_idle(where.origin, conn)
                else:
                    conn.close()
            return response

    async def close(self) -> None:
        # Exchanges in flight close their own connections when they end or time out.
        for pool in self._idle.values():
            for conn, _ in pool:
                conn.close()
        self._idle.clear()
        self._idle_count = 0

    def _take_idle(self, origin: tuple[bool, str, int]) -> Connection | None:
        pool = self._idle.get(origin)
        now = time.monotonic()
        while pool:
            conn, since = pool.pop()
            self._idle_count -= 1
            if not conn.closed and now - since < self._idle_s:
                return conn
            conn.close()
        return None

    def _put_idle(self, origin: tuple[bool, str, int], conn: Connection) -> None:
        if self._idle_count >= self._idle_max:
            conn.close()
            return
        self._idle.setdefault(origin, []).append((conn, time.monotonic()))
        self._idle_count += 1

    async def _connect(self, where: Url) -> Connection:
        # The resolver's addresses, in its order; the name never reaches the socket layer.
        addresses = await self._resolve(where.host, where.port)
        loop = asyncio.get_running_loop()
        error: OSError = OSError(f"{where.host!r} resolved to no address")
        for address in addresses:
            try:
                _, conn = await loop.create_connection(
                    lambda: Connection(self._excerpt), host=str(address), port=where.port,
                    ssl=self._ssl if where.tls else None,
                    server_hostname=where.host if where.tls else None)
            except OSError as exc:  # refused, unreachable, TLS: the next address may do
                error = exc
                continue
            return conn
        raise error
