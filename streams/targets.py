"""Running one attempt against its target: HTTP, a Kafka publish, or a subprocess."""

from __future__ import annotations

import asyncio
import os
import ssl
from dataclasses import dataclass
from typing import Any, Protocol

import certifi

from streams.domain.errors import PermanentError
from streams.domain.retry import ErrorClass, classify_http_status, parse_retry_after
from streams.http1 import Http1Client
from streams.netguard import IPAddress, Resolver, check_url, resolve_pinned, system_resolver

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
    tenant: str
    scheduled_for_iso: str
    attempt: int
    fencing_token: int
    now_ms: int


class Runner(Protocol):
    async def run(self, target: dict[str, Any], info: AttemptInfo) -> Outcome: ...


class HttpRunner:
    """Every HTTP attempt goes through one keep-alive client (streams/http1.py). Each new
    connection asks netguard for the host's addresses: one resolution, every address
    checked, and the socket dials exactly those while the URL's host name stays the SNI
    name, the certificate's subject and the Host header. So the check applies to the
    addresses actually connected to, and a DNS answer that changes afterwards (rebinding)
    is never used."""

    def __init__(self, *, allow_private: bool, max_connections: int = 512,
                 max_per_host: int = 256, resolver: Resolver = system_resolver,
                 verify: ssl.SSLContext | bool = True) -> None:
        self._allow_private = allow_private
        self._max_connections = max_connections
        self._max_per_host = max_per_host
        self._resolver = resolver
        self._ssl = _ssl_context(verify)
        self._http: Http1Client | None = None

    def _client(self) -> Http1Client:
        # Built on first use, and afresh after close().
        if self._http is None:
            self._http = Http1Client(
                resolve=self._resolve, ssl_context=self._ssl,
                max_connections=self._max_connections, max_per_host=self._max_per_host,
                excerpt_bytes=EXCERPT_BYTES)
        return self._http

    async def _resolve(self, host: str, port: int) -> list[IPAddress]:
        # Raises BlockedAddress (a PermanentError) or OSError (transient).
        return await resolve_pinned(host, port, allow_private=self._allow_private,
                                    resolver=self._resolver)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

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
        timeout_s = float(target.get("timeout_s", 30.0))
        try:
            resp = await self._client().request(
                target.get("method", "POST"), target["url"], headers,
                body.encode() if isinstance(body, str) else body, timeout_s)
        except PermanentError as exc:  # refused addresses, a URL that can't be dialled
            return Outcome(ok=False, error_class=ErrorClass.PERMANENT, error=str(exc))
        except TimeoutError as exc:  # before OSError: it is one
            return Outcome(ok=False, error_class=ErrorClass.TIMEOUT,
                           error=f"timed out after {target.get('timeout_s', 30.0)}s: "
                                 f"{type(exc).__name__}")
        except OSError as exc:  # refused, reset, TLS, a response that isn't HTTP
            return Outcome(ok=False, error_class=ErrorClass.TRANSIENT,
                           error=f"{type(exc).__name__}: {exc}")
        return _http_outcome(resp.status, resp.retry_after,
                             resp.excerpt.decode("utf-8", "replace"), info.now_ms)


def _ssl_context(verify: ssl.SSLContext | bool) -> ssl.SSLContext:
    if isinstance(verify, ssl.SSLContext):
        return verify
    # Same trust store as the httpx and aiohttp runners had (certifi), not the OS's.
    context = ssl.create_default_context(cafile=certifi.where())
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


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
