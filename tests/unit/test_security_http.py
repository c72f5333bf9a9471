"""HttpRunner's SSRF defences at send time: one DNS resolution, every address checked, the
socket connected to a checked address (DNS pinning), TLS still verified against the host
name, and redirects never followed.

DNS is stubbed (a resolver function passed to HttpRunner): real DNS can't be made to answer
with chosen or changing addresses here. The public addresses the stub hands out can't be
reached from this machine either, so the tests' "network" (the event loop's sock_connect,
the call that dials a socket) records the address it was asked to connect to and then
connects to a local server instead. Everything between (the client's pool, TLS,
the HTTP exchange) is the real code.
"""

from __future__ import annotations

import asyncio
import ipaddress
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from streams.domain.retry import ErrorClass
from streams.netguard import IPAddress
from streams.targets import AttemptInfo, HttpRunner, Outcome

PUBLIC = "93.184.215.14"
INFO = AttemptInfo(exec_id="e1", job_id="j1", tenant="acme",
                   scheduled_for_iso="2026-01-01T00:00:00Z",
                   attempt=1, fencing_token=1, now_ms=0)


class QuietServer(ThreadingHTTPServer):
    """/slow answers after its client timed out and hung up: the broken pipe is the test's
    point, not an error. Printed, it landed 2 s later in another test's captured output."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class Server:
    """Loopback HTTP(S) server: /redirect answers 302 to a loopback URL, /busy 503 with
    Retry-After and a 2000-byte body, /gone 404, /slow 200 after 2s, anything else 200.
    Records (path, Host header), the request headers and the TLS SNI name; closes every
    connection so each attempt opens (and so resolves and connects) afresh."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.hits: list[tuple[str, str]] = []
        self.headers: list[dict[str, str]] = []
        self.sni: list[str | None] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                server.hits.append((self.path, self.headers.get("Host", "")))
                server.headers.append(dict(self.headers.items()))
                body = b""
                if self.path == "/redirect":
                    self.send_response(302)
                    self.send_header("Location", f"http://127.0.0.1:{server.port}/private")
                elif self.path == "/busy":
                    self.send_response(503)
                    self.send_header("Retry-After", "7")
                    body = b"b" * 2000
                elif self.path == "/gone":
                    self.send_response(404)
                else:
                    if self.path == "/slow":
                        time.sleep(2)
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET

        self.httpd = QuietServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        if tls is not None:
            tls.sni_callback = lambda sock, name, ctx: self.sni.append(name)  # type: ignore[assignment]
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class RoutingNetwork(asyncio.SelectorEventLoop):
    """An event loop that records where the runner connects, then connects to the local
    server instead (IPv4 only: the stub's public address is)."""

    def __init__(self, port: int) -> None:
        super().__init__()
        self.port = port
        self.connects: list[tuple[str, int]] = []

    async def sock_connect(self, sock: socket.socket, address: Any) -> None:
        self.connects.append((address[0], address[1]))
        await super().sock_connect(sock, ("127.0.0.1", self.port))


class Dns:
    """A stub resolver answering from a script: answers[i] for the i-th lookup."""

    def __init__(self, *answers: list[str]) -> None:
        self.answers = list(answers)
        self.lookups: list[str] = []

    async def __call__(self, host: str, port: int) -> list[IPAddress]:
        self.lookups.append(host)
        answer = self.answers[min(len(self.lookups), len(self.answers)) - 1]
        return [ipaddress.ip_address(a) for a in answer]


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


def run(runner: HttpRunner, url: str, net: asyncio.AbstractEventLoop | None = None,
        method: str = "GET") -> Outcome:
    async def go() -> Outcome:
        try:
            return await runner.run({"url": url, "method": method, "timeout_s": 10.0}, INFO)
        finally:
            await runner.close()
    with asyncio.Runner(loop_factory=net and (lambda: net)) as loop:
        return loop.run(go())


def run_twice(runner: HttpRunner, url: str,
              net: asyncio.AbstractEventLoop) -> tuple[Outcome, Outcome]:
    async def go() -> tuple[Outcome, Outcome]:
        try:
            target = {"url": url, "method": "GET", "timeout_s": 10.0}
            return await runner.run(target, INFO), await runner.run(target, INFO)
        finally:
            await runner.close()
    with asyncio.Runner(loop_factory=lambda: net) as loop:
        return loop.run(go())


def test_dns_rebinding_connects_only_to_the_checked_address(server: Server) -> None:
    # First answer public, every later one loopback: the classic rebinding attack on a
    # check-then-connect design, where the client's own lookup would get 127.0.0.1.
    dns = Dns([PUBLIC], ["127.0.0.1"])
    net = RoutingNetwork(server.port)
    runner = HttpRunner(allow_private=False, resolver=dns)
    first, second = run_twice(runner, "http://rebind.example:8080/hook", net)
    assert first.ok, first
    assert dns.lookups == ["rebind.example", "rebind.example"]  # one lookup per connection
    assert net.connects == [(PUBLIC, 8080)]  # the checked address; never the name
    assert server.hits == [("/hook", "rebind.example:8080")]  # Host header is the name
    # The second connection's lookup answered loopback: refused, nothing connected.
    assert not second.ok and second.error_class is ErrorClass.PERMANENT
    assert "private address" in second.error


def test_any_private_address_in_the_answer_refuses_the_target(server: Server) -> None:
    net = RoutingNetwork(server.port)
    out = run(HttpRunner(allow_private=False, resolver=Dns([PUBLIC, "::ffff:10.0.0.1"])),
              "http://mixed.example/", net)
    assert out.error_class is ErrorClass.PERMANENT
    assert net.connects == [] and server.hits == []


def test_redirect_to_a_private_address_is_recorded_not_followed(server: Server) -> None:
    runner = HttpRunner(allow_private=False, resolver=Dns([PUBLIC]))
    out = run(runner, "http://public.example/redirect", RoutingNetwork(server.port))
    assert out.status_code == 302 and not out.ok
    assert out.error_class is ErrorClass.PERMANENT  # 3xx fails at once, no retry
    assert [path for path, _ in server.hits] == ["/redirect"]  # /private never requested


def test_names_are_refused_before_any_lookup() -> None:
    dns = Dns([PUBLIC])
    for url in ("http://localhost:1/", "http://0x7f.0.0.1/", "http://[::ffff:127.0.0.1]/",
                "http://2130706433/", "http://169.254.169.254/latest/meta-data/"):
        out = run(HttpRunner(allow_private=False, resolver=dns), url)
        assert out.error_class is ErrorClass.PERMANENT, url
    assert dns.lookups == []


def test_allow_private_reaches_loopback_through_the_real_resolver(server: Server) -> None:
    # Real DNS and real sockets: "localhost" may answer ::1 first, where nothing listens;
    # the runner tries the next pinned address.
    out = run(HttpRunner(allow_private=True), f"http://localhost:{server.port}/ok")
    assert out.ok, out
    refused = run(HttpRunner(allow_private=False), f"http://localhost:{server.port}/ok")
    assert refused.error_class is ErrorClass.PERMANENT


# --- TLS: the socket goes to the pinned IP, SNI and the certificate check use the name ------

def _cert(tmp: Path, name: str) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp / f"{name}.pem", tmp / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", f"/CN={name}", "-addext", f"subjectAltName=DNS:{name}",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[Server, ssl.SSLContext]]:
    cert, key = _cert(tmp_path, "pinned.example")
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=str(cert))  # trusts only the test cert
    s = Server(tls=server_ctx)
    yield s, client_ctx
    s.close()


def test_tls_uses_the_name_for_sni_and_certificate_check(
        tls_server: tuple[Server, ssl.SSLContext]) -> None:
    server, client_ctx = tls_server
    net = RoutingNetwork(server.port)
    runner = HttpRunner(allow_private=False, resolver=Dns([PUBLIC]), verify=client_ctx)
    out = run(runner, "https://pinned.example/hook", net)
    assert out.ok, out
    assert net.connects == [(PUBLIC, 443)]
    assert server.sni == ["pinned.example"]
    assert server.hits == [("/hook", "pinned.example")]


def test_tls_certificate_for_another_name_is_refused(
        tls_server: tuple[Server, ssl.SSLContext]) -> None:
    # Same pinned IP, same certificate; only the URL's name differs. Were the check made
    # against the IP (or skipped), both hosts would be treated alike.
    server, client_ctx = tls_server
    runner = HttpRunner(allow_private=False, resolver=Dns([PUBLIC]), verify=client_ctx)
    out = run(runner, "https://impostor.example/hook", RoutingNetwork(server.port))
    assert not out.ok and "CERTIFICATE_VERIFY_FAILED" in out.error
    assert server.hits == []


# --- Outcomes: what the executor is told about each kind of answer -----------------------

def test_outcomes_headers_and_timeout(server: Server) -> None:
    base = f"http://127.0.0.1:{server.port}"
    ok = run(HttpRunner(allow_private=True), f"{base}/ok")
    assert ok == Outcome(ok=True, status_code=200, output="HTTP/1.1 200 OK")
    sent = server.headers[-1]
    assert (sent["Idempotency-Key"], sent["X-Kron-Job-Id"], sent["X-Kron-Attempt"],
            sent["X-Kron-Scheduled-For"], sent["X-Kron-Fencing-Token"]) == (
        "e1", "j1", "1", "2026-01-01T00:00:00Z", "1")
    busy = run(HttpRunner(allow_private=True), f"{base}/busy")
    assert busy == Outcome(ok=False, error_class=ErrorClass.TRANSIENT, status_code=503,
                           error="HTTP 503", retry_after_s=7.0,
                           output="HTTP/1.1 503 Service Unavailable\n" + "b" * 2000)
    gone = run(HttpRunner(allow_private=True), f"{base}/gone")
    assert gone.error_class is ErrorClass.PERMANENT and gone.status_code == 404

    async def slow() -> Outcome:
        runner = HttpRunner(allow_private=True)
        try:
            return await runner.run({"url": f"{base}/slow", "timeout_s": 0.3}, INFO)
        finally:
            await runner.close()
    timed_out = asyncio.run(slow())
    assert timed_out.error_class is ErrorClass.TIMEOUT
    assert timed_out.error.startswith("timed out after 0.3s")


def test_environment_proxy_is_not_used(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy would resolve and connect on the runner's behalf, past every check above.
    for var in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")  # discard port: nothing listens
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    out = run(HttpRunner(allow_private=True), f"http://127.0.0.1:{server.port}/direct")
    assert out.ok, out
    assert [path for path, _ in server.hits] == ["/direct"]


def test_warm_dials_only_what_a_call_would(server: Server) -> None:
    """Connections opened ahead of held calls (HttpRunner.warm) take the call's path: a
    private address, a name that resolves to one, a bad scheme and a loopback name are not
    dialled; a public answer is, and only to the checked address."""
    lookups: list[str] = []

    async def dns(host: str, port: int) -> list[IPAddress]:
        lookups.append(host)
        return [ipaddress.ip_address("10.0.0.7" if host == "inward.example" else PUBLIC)]

    net = RoutingNetwork(server.port)
    runner = HttpRunner(allow_private=False, resolver=dns)

    async def go() -> None:
        try:
            runner.warm({f"http://127.0.0.1:{server.port}/": 3, "http://inward.example/": 2,
                         "file:///etc/passwd": 1, f"http://localhost:{server.port}/": 1})
            for _ in range(200):
                await asyncio.sleep(0.01)
            assert net.connects == []
            runner.warm({"http://public.example:8080/": 2})
            for _ in range(200):
                if len(net.connects) == 2:
                    break
                await asyncio.sleep(0.01)
            assert net.connects == [(PUBLIC, 8080)] * 2
        finally:
            await runner.close()

    with asyncio.Runner(loop_factory=lambda: net) as loop:
        loop.run(go())
    assert set(lookups) == {"inward.example", "public.example"}
