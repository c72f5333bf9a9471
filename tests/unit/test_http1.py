"""The attempt HTTP client (streams/http1.py) against a scripted server on loopback.

The server is a real asyncio TCP server: each accepted connection answers the requests it
reads with the next canned responses, byte for byte, so framing cases (chunked, a body that
ends with the connection, 1xx, a server that closes) reach the client as a server would send
them. The SSRF and TLS cases are in test_security_http.py.
"""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from streams.domain.errors import PermanentError
from streams.http1 import BadResponse, Http1Client, Slots, Url, request_bytes
from streams.netguard import IPAddress, parse_ip

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
CLOSE = b"<close>"


class Scripted:
    """answer(request_number, raw_request) -> bytes to write, or None to close; bytes
    ending in CLOSE are written and then the connection is closed."""

    def __init__(self, answer: Callable[[int, bytes], bytes | None]) -> None:
        self.answer = answer
        self.requests: list[bytes] = []
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                out = self.answer(len(self.requests), request)
                if out is None:
                    break
                writer.write(out.removesuffix(CLOSE))
                await writer.drain()
                if out.endswith(CLOSE):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()


async def loopback(host: str, port: int) -> list[IPAddress]:
    ip = parse_ip(host)
    assert ip is not None
    return [ip]


Serve = Callable[..., Awaitable[tuple[Scripted, Http1Client]]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    made: list[tuple[Scripted, Http1Client]] = []

    async def make(answer: Callable[[int, bytes], bytes | None],
                   **kw: int) -> tuple[Scripted, Http1Client]:
        server = Scripted(answer)
        await server.start()
        client = Http1Client(resolve=loopback, ssl_context=ssl.create_default_context(),
                             excerpt_bytes=16, **kw)
        made.append((server, client))
        return server, client

    yield make
    for server, client in made:
        await client.close()
        await server.stop()


def url(server: Scripted, path: str = "/hook") -> str:
    return f"http://127.0.0.1:{server.port}{path}"


async def test_keep_alive_reuses_one_connection(serve: Serve) -> None:
    server, client = await serve(lambda n, req: OK)
    for _ in range(5):
        resp = await client.request("POST", url(server), {}, b"{}", 5.0)
        assert (resp.status, resp.excerpt) == (200, b"ok")
    assert server.connections == 1 and len(server.requests) == 5


async def test_chunked_body_is_cut_to_the_excerpt_and_the_rest_drained(serve: Serve) -> None:
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in [b"a" * 10, b"b" * 30, b"c" * 5])
    body = b"HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\nRetry-After: 7\r\n\r\n"
    server, client = await serve(lambda n, req: body + chunks + b"0\r\n\r\n" if n == 1 else OK)
    resp = await client.request("GET", url(server), {}, None, 5.0)
    assert (resp.status, resp.retry_after, resp.excerpt) == (503, "7", b"a" * 10 + b"b" * 6)
    again = await client.request("GET", url(server), {}, None, 5.0)
    assert again.excerpt == b"ok" and server.connections == 1  # fully read, so reusable


async def test_body_ended_by_the_connection_close(serve: Serve) -> None:
    server, client = await serve(
        lambda n, req: b"HTTP/1.0 200 OK\r\n\r\nuntil eof" + CLOSE)
    resp = await client.request("GET", url(server), {}, None, 5.0)
    assert (resp.status, resp.excerpt) == (200, b"until eof")


async def test_interim_100_continue_is_skipped(serve: Serve) -> None:
    server, client = await serve(lambda n, req: b"HTTP/1.1 100 Continue\r\n\r\n" + OK)
    resp = await client.request("POST", url(server), {}, b"x", 5.0)
    assert (resp.status, resp.excerpt) == (200, b"ok")


async def test_server_closing_after_a_response_gets_a_fresh_connection(serve: Serve) -> None:
    close = b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"
    server, client = await serve(lambda n, req: close)
    for _ in range(3):
        assert (await client.request("DELETE", url(server), {}, None, 5.0)).status == 204
    assert server.connections == 3


async def test_head_answers_without_waiting_for_a_body(serve: Serve) -> None:
    server, client = await serve(lambda n, req: b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n")
    resp = await client.request("HEAD", url(server), {}, None, 2.0)
    assert resp.status == 200 and resp.excerpt == b""


async def test_reset_and_garbage_are_transient_errors(serve: Serve) -> None:
    server, client = await serve(lambda n, req: None if n == 1 else b"SSH-2.0-OpenSSH\r\n\r\n")
    with pytest.raises(ConnectionResetError):
        await client.request("GET", url(server), {}, None, 5.0)
    with pytest.raises(BadResponse):
        await client.request("GET", url(server), {}, None, 5.0)
    # Refused: nothing listens any more.
    await server.stop()
    with pytest.raises(OSError):
        await client.request("GET", url(server), {}, None, 5.0)


async def test_timeout_covers_a_response_that_never_ends(serve: Serve) -> None:
    server, client = await serve(
        lambda n, req: b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc" if n == 1 else OK)
    with pytest.raises(TimeoutError):
        await client.request("GET", url(server), {}, None, 0.3)
    # That connection was mid-response: it is dropped, not handed to the next request.
    assert (await client.request("GET", url(server), {}, None, 5.0)).excerpt == b"ok"
    assert server.connections == 2


async def test_per_host_limit_bounds_connections(serve: Serve) -> None:
    server, client = await serve(lambda n, req: OK, max_per_host=3)
    out = await asyncio.gather(*(client.request("GET", url(server), {}, None, 5.0)
                                 for _ in range(30)))
    assert all(r.status == 200 for r in out)
    assert server.connections <= 3


def test_request_framing_is_the_clients_own() -> None:
    where = Url.parse("http://user:p%40ss@example.com:8080/a b?q=1 2#frag")
    raw = request_bytes("POST", where, {"Content-Length": "0", "Host": "evil",
                                        "Transfer-Encoding": "chunked", "X-A": "1"}, b"body")
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /a%20b?q=1%202 HTTP/1.1"
    assert b"Host: example.com:8080" in lines and b"Host: evil" not in lines
    assert b"Content-Length: 4" in lines and b"Transfer-Encoding: chunked" not in lines
    assert b"Authorization: Basic dXNlcjpwQHNz" in lines and b"X-A: 1" in lines
    assert body == b"body"
    assert Url.parse("https://[::1]/").host_header == "[::1]"
    with pytest.raises(PermanentError):
        request_bytes("GET", where, {"X-B": "a\r\nHost: evil"}, None)
    with pytest.raises(PermanentError):
        Url.parse("http://example.com:99999/")


async def test_a_pooled_connection_the_server_closed_is_not_reused(serve: Serve) -> None:
    # Keep-alive by the headers, then closed by the server while idle in the pool.
    server, client = await serve(lambda n, req: OK + CLOSE)
    assert (await client.request("GET", url(server), {}, None, 5.0)).excerpt == b"ok"
    assert client._idle_count == 1
    for _ in range(200):  # bounded: the close reaches the protocol within a few loop turns
        if client._idle_count == 0:
            break
        await asyncio.sleep(0.005)
    assert client._idle_count == 0 and not client._idle  # forgotten as soon as it closed
    assert (await client.request("GET", url(server), {}, None, 5.0)).excerpt == b"ok"
    assert server.connections == 2


async def test_slots_hand_over_in_order_and_survive_cancelled_waiters() -> None:
    slots = Slots(1)
    order: list[str] = []
    release = asyncio.Event()

    async def hold(name: str) -> None:
        async with slots:
            order.append(name)
            await release.wait()

    first = asyncio.ensure_future(hold("a"))
    await asyncio.sleep(0)
    waiting = [asyncio.ensure_future(hold(n)) for n in "bcd"]
    await asyncio.sleep(0)
    waiting[0].cancel()  # b gives up while queued
    release.set()
    await asyncio.gather(first, *waiting[1:])
    assert order == ["a", "c", "d"]
    assert slots._free == 1 and not slots._waiters  # nothing leaked, nothing extra
    # Handed a slot and cancelled before it resumed: the slot goes back.
    await slots.__aenter__()
    late = asyncio.ensure_future(hold("f"))
    await asyncio.sleep(0)
    await slots.__aexit__()  # hands the slot to f's waiter; f hasn't run yet
    late.cancel()
    with pytest.raises(asyncio.CancelledError):
        await late
    assert slots._free == 1 and order[-1] == "d"


async def test_a_busy_host_does_not_hold_other_hosts_back(serve: Serve) -> None:
    silent, client = await serve(lambda n, req: b"", max_connections=4, max_per_host=2)
    other = Scripted(lambda n, req: OK)
    await other.start()
    try:
        stuck = [asyncio.ensure_future(client.request("GET", url(silent), {}, None, 3.0))
                 for _ in range(6)]
        await asyncio.sleep(0.05)
        # Queued requests for the silent host must not sit on global slots: this one
        # would time out behind them otherwise.
        resp = await client.request("GET", url(other), {}, None, 1.0)
        assert resp.excerpt == b"ok" and not any(t.done() for t in stuck)
        for task in stuck:
            task.cancel()
        await asyncio.gather(*stuck, return_exceptions=True)
    finally:
        await other.stop()


async def test_bytes_after_an_answer_never_answer_the_next_request(serve: Serve) -> None:
    stray = b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n"
    server, client = await serve(lambda n, req: OK + stray if n == 1 else OK)
    first = await client.request("GET", url(server), {}, None, 5.0)
    second = await client.request("GET", url(server), {}, None, 5.0)
    assert (first.status, second.status) == (200, 200)
    assert server.connections == 2  # the connection that talked out of turn was dropped


@pytest.mark.parametrize(("method", "retried"), [("GET", True), ("PUT", True),
                                                 ("POST", False)])
async def test_a_pooled_connection_closed_under_the_request(
        serve: Serve, method: str, retried: bool) -> None:
    # Request 2 reaches a connection the server closes unanswered (its idle timeout
    # racing ours): an idempotent request goes again on a fresh one, a POST fails.
    server, client = await serve(lambda n, req: None if n == 2 else OK)
    assert (await client.request(method, url(server), {}, b"x", 5.0)).status == 200
    if retried:
        assert (await client.request(method, url(server), {}, b"x", 5.0)).excerpt == b"ok"
        assert len(server.requests) == 3 and server.connections == 2
    else:
        with pytest.raises(ConnectionResetError):
            await client.request(method, url(server), {}, b"x", 5.0)
        assert len(server.requests) == 2


async def test_a_non_chunked_transfer_coding_ends_with_the_connection(serve: Serve) -> None:
    server, client = await serve(
        lambda n, req: b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nzz" + CLOSE)
    assert (await client.request("GET", url(server), {}, None, 5.0)).excerpt == b"zz"


def test_host_names_as_servers_expect_them() -> None:
    dotted = Url.parse("https://Pinned.Example./x")
    assert (dotted.host, dotted.server_name, dotted.host_header) == (
        "pinned.example.", "pinned.example", "pinned.example")
    idn = Url.parse("http://b\u00fccher.example:81/")
    assert idn.host == idn.server_name == "xn--bcher-kva.example"
    assert idn.host_header == "xn--bcher-kva.example:81"
    assert Url.parse("http://h/100%/a%2Fb").target == "/100%25/a%2Fb"
    with pytest.raises(PermanentError):  # a folded or padded name would dodge FRAMING
        request_bytes("GET", idn, {" Transfer-Encoding": "chunked"}, None)
    assert b"Content-Length: 0" in request_bytes("DELETE", idn, {}, None)
    assert b"Content-Length" not in request_bytes("GET", idn, {}, None)


async def test_idle_connections_past_their_time_are_swept(serve: Serve) -> None:
    first, client = await serve(lambda n, req: OK, idle_s=0.05)
    second = Scripted(lambda n, req: OK)
    await second.start()
    try:
        assert (await client.request("GET", url(first), {}, None, 5.0)).excerpt == b"ok"
        assert client._idle_count == 1
        await asyncio.sleep(0.1)  # past idle_s: the next put back sweeps it
        assert (await client.request("GET", url(second), {}, None, 5.0)).excerpt == b"ok"
        assert list(client._idle) == [(False, "127.0.0.1", second.port)]
        assert client._idle_count == 1
    finally:
        await second.stop()


class Blackhole(asyncio.SelectorEventLoop):
    """Connects to BLACKHOLE never complete (a dropped SYN); others go through."""

    BLACKHOLE = "192.0.2.1"  # TEST-NET-1: never dialled for real

    def __init__(self) -> None:
        super().__init__()
        self.tried: list[str] = []

    async def sock_connect(self, sock: Any, address: Any) -> None:
        self.tried.append(address[0])
        if address[0] == self.BLACKHOLE:
            await asyncio.sleep(3600)
        await super().sock_connect(sock, address)


def test_an_address_that_never_answers_costs_a_quarter_second_not_the_timeout() -> None:
    async def go() -> tuple[bytes, list[str]]:
        server = Scripted(lambda n, req: OK)
        await server.start()

        async def answer(host: str, port: int) -> list[IPAddress]:
            return [ipaddress.ip_address(Blackhole.BLACKHOLE),
                    ipaddress.ip_address("127.0.0.1")]
        client = Http1Client(resolve=answer, ssl_context=ssl.create_default_context())
        try:
            # 5 s timeout: trying the addresses one after the other would run out of it.
            resp = await client.request("GET", f"http://example.test:{server.port}/", {},
                                        None, 5.0)
        finally:
            await client.close()
            await server.stop()
        return resp.excerpt, loop.tried

    loop = Blackhole()
    with asyncio.Runner(loop_factory=lambda: loop) as runner:
        excerpt, tried = runner.run(go())
    assert excerpt == b"ok" and tried == [Blackhole.BLACKHOLE, "127.0.0.1"]


async def settle(client: Http1Client) -> None:
    for _ in range(200):
        if not client._warm_tasks:
            return
        await asyncio.sleep(0.01)


async def test_warm_opens_the_connections_calls_due_together_will_take(serve: Serve) -> None:
    """Two paths of one origin, 3 + 2 calls due at once: 5 connections opened ahead (one
    warm per origin, its URLs' calls summed), then 5 calls at once connect nothing."""
    server, client = await serve(lambda n, req: OK)
    client.warm({url(server, "/a"): 3, url(server, "/b"): 2})
    await settle(client)
    assert server.connections == 5
    client.warm({url(server, "/a"): 5})  # as many idle already: nothing more
    await settle(client)
    assert server.connections == 5
    out = await asyncio.gather(*(client.request("POST", url(server), {}, b"{}", 5.0)
                                 for _ in range(5)))
    assert [r.status for r in out] == [200] * 5
    assert server.connections == 5


async def test_warm_keeps_to_the_per_host_limit_and_ignores_failures(serve: Serve) -> None:
    server, client = await serve(lambda n, req: OK, max_per_host=4)
    client.warm({url(server): 100})
    await settle(client)
    assert server.connections == 4
    client.warm({"http://127.0.0.1:1/refused": 2})  # nothing listens: not an outcome
    await settle(client)
    assert not client._warm_tasks and not client._warming


async def test_warm_keeps_to_max_connections_over_origins(serve: Serve) -> None:
    """A tenant's many origins due at once open no more than max_connections ahead."""
    one, client = await serve(lambda n, req: OK, max_connections=6)
    two = Scripted(lambda n, req: OK)
    await two.start()
    try:
        client.warm({url(one): 5, url(two): 5})
        await settle(client)
        assert one.connections + two.connections == 6
        client.warm({url(two): 5})  # full: nothing more
        await settle(client)
        assert one.connections + two.connections == 6
    finally:
        await two.stop()
