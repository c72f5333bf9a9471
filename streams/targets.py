"""Running one attempt against its target: HTTP, a Kafka publish, or a subprocess."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import certifi
from aiohttp.abc import AbstractResolver, ResolveResult

from streams.domain.errors import PermanentError
from streams.domain.retry import ErrorClass, classify_http_status, parse_retry_after
from streams.netguard import Resolver, check_url, resolve_pinned, system_resolver

EXCERPT_BYTES = 512


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    ok: bool
    error_class: ErrorClass | None = None
    error: str = ""
    status_code: int | None = None
    retry_after_s: float | None = None
    excerpt: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class AttemptInfo:
    exec_id: str
    job_id: str
    scheduled_for_iso: str
    attempt: int
    fencing_token: int
    now_ms: int


class Runner(Protocol):
    async def run(self, target: dict[str, Any], info: AttemptInfo) -> Outcome: ...


class PinnedResolver(AbstractResolver):
    """aiohttp's resolver hook, asked on every new connection (the connector's DNS cache is
    off): one resolution, every address checked by netguard, and aiohttp then dials exactly
    the addresses returned here while keeping the URL's host name for SNI, the certificate
    check and the Host header. So the check applies to the addresses actually connected to,
    and a DNS answer that changes afterwards (rebinding) is never used."""

    def __init__(self, *, allow_private: bool, resolver: Resolver = system_resolver) -> None:
        self._allow_private = allow_private
        self._resolver = resolver

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        # Raises BlockedAddress (a PermanentError, passed through by aiohttp) or OSError
        # (aiohttp makes it ClientConnectorDNSError: transient).
        addresses = await resolve_pinned(host, port, allow_private=self._allow_private,
                                         resolver=self._resolver)
        return [ResolveResult(hostname=host, host=str(addr), port=port,
                              family=socket.AF_INET6 if addr.version == 6 else socket.AF_INET,
                              proto=0, flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV)
                for addr in addresses]  # in the resolver's order; aiohttp tries each

    async def close(self) -> None:
        pass


class HttpRunner:
    """One aiohttp session (connection pool, keep-alive) for every HTTP attempt."""

    def __init__(self, *, allow_private: bool, max_connections: int = 512,
                 max_per_host: int = 256, resolver: Resolver = system_resolver,
                 verify: ssl.SSLContext | bool = True) -> None:
        self._allow_private = allow_private
        self._max_connections = max_connections
        self._max_per_host = max_per_host
        self._resolver = PinnedResolver(allow_private=allow_private, resolver=resolver)
        # Same trust store as the httpx runner had (certifi), not the OS's.
        self._ssl: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=certifi.where()) if verify is True else verify)
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}

    def _client(self) -> aiohttp.ClientSession:
        # Built on first use: aiohttp binds a session to the running event loop.
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections, limit_per_host=self._max_per_host,
                use_dns_cache=False, resolver=self._resolver, ssl=self._ssl)
            self._session = aiohttp.ClientSession(
                connector=connector,
                # No proxy from the environment (HTTP_PROXY would resolve and connect on
                # our behalf, unchecked) and no .netrc credentials.
                trust_env=False,
                # Jobs of different tenants share the session: no cookies carried between
                # them (and no per-response cookie parsing).
                cookie_jar=aiohttp.DummyCookieJar(),
                # The body goes as given; aiohttp would otherwise add a Content-Type.
                skip_auto_headers=("Content-Type",))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _timeout(self, seconds: float) -> aiohttp.ClientTimeout:
        # Whole attempt: connection wait, DNS, connect, TLS, request and the full body.
        timeout = self._timeouts.get(seconds)
        if timeout is None:
            timeout = self._timeouts.setdefault(seconds, aiohttp.ClientTimeout(total=seconds))
        return timeout

    async def run(self, target: dict[str, Any], info: AttemptInfo) -> Outcome:
        try:
            # No DNS here: the name is resolved once, checked and pinned at connect time.
            check_url(target["url"], allow_private=self._allow_private, resolve=False)
        except PermanentError as exc:
            return Outcome(ok=False, error_class=ErrorClass.PERMANENT, error=str(exc))
        headers = {
            **target.get("headers", {}),
            "Idempotency-Key": info.exec_id,
            "X-Kron-Job-Id": info.job_id,
            "X-Kron-Scheduled-For": info.scheduled_for_iso,
            "X-Kron-Attempt": str(info.attempt),
            "X-Kron-Fencing-Token": str(info.fencing_token),
        }
        body = target.get("body")
        try:
            async with self._client().request(
                    target.get("method", "POST"), target["url"], headers=headers,
                    data=body.encode() if isinstance(body, str) else body,
                    timeout=self._timeout(float(target.get("timeout_s", 30.0))),
                    allow_redirects=False) as resp:
                excerpt = await _read_excerpt(resp)
        except PermanentError as exc:  # PinnedResolver refused the addresses the name has
            return Outcome(ok=False, error_class=ErrorClass.PERMANENT, error=str(exc))
        except TimeoutError as exc:  # before OSError: it is one
            return Outcome(ok=False, error_class=ErrorClass.TIMEOUT,
                           error=f"timed out after {target.get('timeout_s', 30.0)}s: "
                                 f"{type(exc).__name__}")
        except aiohttp.InvalidURL as exc:  # e.g. a legacy IPv4 form aiohttp won't dial
            return Outcome(ok=False, error_class=ErrorClass.PERMANENT,
                           error=f"{type(exc).__name__}: {exc}")
        except (aiohttp.ClientError, OSError) as exc:  # refused, reset, TLS, bad response
            return Outcome(ok=False, error_class=ErrorClass.TRANSIENT,
                           error=f"{type(exc).__name__}: {exc}")
        return _http_outcome(resp.status, resp.headers.get("retry-after"), excerpt, info.now_ms)


async def _read_excerpt(resp: aiohttp.ClientResponse) -> str:
    """The body's first EXCERPT_BYTES. The rest is read and dropped, not left unread: as
    with httpx, a slow body counts against the timeout and the connection stays reusable,
    and memory stays bounded whatever the size."""
    head = b""
    while chunk := await resp.content.readany():
        if len(head) < EXCERPT_BYTES:
            head += chunk[:EXCERPT_BYTES - len(head)]
    return head.decode("utf-8", "replace")


def _http_outcome(status: int, retry_after: str | None, excerpt: str, now_ms: int) -> Outcome:
    error_class = classify_http_status(status)
    if error_class is None:
        return Outcome(ok=True, status_code=status, excerpt=excerpt)
    return Outcome(
        ok=False, error_class=error_class, status_code=status, excerpt=excerpt,
        error=f"HTTP {status}", retry_after_s=parse_retry_after(retry_after, now_ms=now_ms))


class CommandRunner:
    """A subprocess; a container image is just a command template (`docker run IMAGE`)."""

    async def run(self, target: dict[str, Any], info: AttemptInfo) -> Outcome:
        argv = list(target["argv"])
        if target.get("image"):
            argv = ["docker", "run", "--rm", target["image"], *argv]
        env = {**os.environ, **target.get("env", {}),
               "KRON_EXEC_ID": info.exec_id, "KRON_JOB_ID": info.job_id,
               "KRON_ATTEMPT": str(info.attempt),
               "KRON_SCHEDULED_FOR": info.scheduled_for_iso}
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, env=env, cwd=target.get("cwd"), stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL)
        except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
            return Outcome(ok=False, error_class=ErrorClass.PERMANENT, error=str(exc))
        try:
            out, _ = await asyncio.wait_for(proc.communicate(),
                                            float(target.get("timeout_s", 300.0)))
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return Outcome(ok=False, error_class=ErrorClass.TIMEOUT,
                           error=f"command timed out after {target.get('timeout_s')}s")
        excerpt = out[-EXCERPT_BYTES:].decode("utf-8", "replace")
        if proc.returncode == 0:
            return Outcome(ok=True, excerpt=excerpt)
        # 126/127: the shell's "cannot execute"/"not found" — retrying can't help.
        cls = ErrorClass.PERMANENT if proc.returncode in (126, 127) else ErrorClass.TRANSIENT
        return Outcome(ok=False, error_class=cls, excerpt=excerpt,
                       error=f"command exited with {proc.returncode}")


class KafkaRunner:
    """Publishes through a producer the worker already owns."""

    def __init__(self, send: Any) -> None:
        # send(topic, key, value, headers) -> awaitable that resolves when acked.
        self._send = send

    async def run(self, target: dict[str, Any], info: AttemptInfo) -> Outcome:
        headers = {**target.get("headers", {}), "Idempotency-Key": info.exec_id,
                   "X-Kron-Job-Id": info.job_id, "X-Kron-Attempt": str(info.attempt),
                   "X-Kron-Scheduled-For": info.scheduled_for_iso}
        try:
            await self._send(target["topic"], target.get("key"), target.get("value"), headers)
        except Exception as exc:  # broker errors are worth a retry; the policy bounds them
            return Outcome(ok=False, error_class=ErrorClass.TRANSIENT,
                           error=f"publish failed: {type(exc).__name__}: {exc}")
        return Outcome(ok=True)
