"""Running one attempt against its target: HTTP, a Kafka publish, or a subprocess."""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import httpcore
import httpx

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


class PinnedBackend(httpcore.AsyncNetworkBackend):
    """Resolves the target's name once, checks every address (netguard), and opens the TCP
    connection to a checked address. httpcore still starts TLS with the URL's host name as
    SNI and checks the certificate against it, and the Host header is untouched, so only
    the address the socket goes to changes. `inner` is the real network; tests swap it."""

    def __init__(self, *, allow_private: bool, resolver: Resolver = system_resolver,
                 inner: httpcore.AsyncNetworkBackend | None = None) -> None:
        self._allow_private = allow_private
        self._resolver = resolver
        self._inner = inner or httpcore.AnyIOBackend()

    # The signatures (timeout parameters included) are httpcore's AsyncNetworkBackend's.
    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,  # noqa: ASYNC109
                          local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None,
                          ) -> httpcore.AsyncNetworkStream:
        try:
            addresses = await asyncio.wait_for(resolve_pinned(
                host, port, allow_private=self._allow_private, resolver=self._resolver),
                timeout)
        except (OSError, TimeoutError) as exc:  # DNS failure: worth a retry
            raise httpcore.ConnectError(f"resolving {host!r} failed: {exc}") from exc
        last: Exception | None = None
        for addr in addresses:  # every one was checked; try them in the resolver's order
            try:
                return await self._inner.connect_tcp(str(addr), port, timeout, local_address,
                                                     socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
        assert last is not None
        raise last

    async def connect_unix_socket(self, path: str, timeout: float | None = None,  # noqa: ASYNC109
                                  socket_options: Iterable[Any] | None = None,
                                  ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not job targets")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class PinnedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport with the connection pool built on PinnedBackend."""

    def __init__(self, backend: PinnedBackend, *, limits: httpx.Limits,
                 verify: ssl.SSLContext | bool = True) -> None:
        super().__init__(limits=limits, trust_env=False)
        # httpx has no public hook for the network backend; its transport only calls _pool.
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify, trust_env=False),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry, network_backend=backend)


class HttpRunner:
    def __init__(self, *, allow_private: bool, max_connections: int = 512,
                 resolver: Resolver = system_resolver,
                 network: httpcore.AsyncNetworkBackend | None = None,
                 verify: ssl.SSLContext | bool = True) -> None:
        self._allow_private = allow_private
        limits = httpx.Limits(max_connections=max_connections,
                              max_keepalive_connections=max_connections)
        backend = PinnedBackend(allow_private=allow_private, resolver=resolver, inner=network)
        # A transport of our own also means no proxy from the environment (HTTP_PROXY would
        # otherwise resolve and connect on our behalf, unchecked) and no .netrc credentials.
        self._client = httpx.AsyncClient(
            follow_redirects=False, trust_env=False,
            transport=PinnedTransport(backend, limits=limits, verify=verify))

    async def close(self) -> None:
        await self._client.aclose()

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
        try:
            resp = await self._client.request(
                target.get("method", "POST"), target["url"], headers=headers,
                content=target.get("body"), timeout=float(target.get("timeout_s", 30.0)))
        except PermanentError as exc:  # PinnedBackend refused every address the name has
            return Outcome(ok=False, error_class=ErrorClass.PERMANENT, error=str(exc))
        except httpx.TimeoutException as exc:
            return Outcome(ok=False, error_class=ErrorClass.TIMEOUT,
                           error=f"timed out after {target.get('timeout_s', 30.0)}s: "
                                 f"{type(exc).__name__}")
        except httpx.HTTPError as exc:
            return Outcome(ok=False, error_class=ErrorClass.TRANSIENT,
                           error=f"{type(exc).__name__}: {exc}")
        return _http_outcome(resp, info.now_ms)


def _http_outcome(resp: httpx.Response, now_ms: int) -> Outcome:
    excerpt = resp.content[:EXCERPT_BYTES].decode("utf-8", "replace")
    error_class = classify_http_status(resp.status_code)
    if error_class is None:
        return Outcome(ok=True, status_code=resp.status_code, excerpt=excerpt)
    return Outcome(
        ok=False, error_class=error_class, status_code=resp.status_code, excerpt=excerpt,
        error=f"HTTP {resp.status_code}",
        retry_after_s=parse_retry_after(resp.headers.get("retry-after"), now_ms=now_ms))


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
