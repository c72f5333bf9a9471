"""Running one attempt against its target: HTTP, a Kafka publish, or a registered command."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import signal
import ssl
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import certifi

from streams import output
from streams.domain.commands import CommandRegistry, Resolved, Runtime
from streams.domain.errors import PermanentError
from streams.domain.retry import ErrorClass, classify_http_status, parse_retry_after
from streams.domain.topics import TopicGrants
from streams.guard import LEGACY_COMMAND
from streams.http1 import Http1Client
from streams.netguard import IPAddress, Resolver, check_url, resolve_pinned, system_resolver


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    ok: bool
    error_class: ErrorClass | None = None
    error: str = ""
    status_code: int | None = None
    retry_after_s: float | None = None
    # What the target gave back, bounded (streams.output); None: nothing came back.
    output: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class AttemptInfo:
    exec_id: str
    job_id: str
    tenant: str
    scheduled_for_iso: str
    attempt: int
    fencing_token: int
    now_ms: int
    # A DAG task instance: its run (the slot's execution id) and task. None otherwise, and
    # then no header or variable names them.
    run_id: str | None = None
    task_id: str | None = None


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
                 verify: ssl.SSLContext | bool = True,
                 output_bytes: int = output.DEFAULT_OUTPUT_BYTES) -> None:
        self._allow_private = allow_private
        # The client keeps no more of a body than the output can hold (0: no output).
        self._output_bytes = output_bytes
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
                excerpt_bytes=self._output_bytes)
        return self._http

    async def _resolve(self, host: str, port: int) -> list[IPAddress]:
        # Raises BlockedAddress (a PermanentError) or OSError (transient).
        return await resolve_pinned(host, port, allow_private=self._allow_private,
                                    resolver=self._resolver)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    def warm(self, calls: dict[str, int]) -> None:
        """`calls[url]` calls are due at once to each URL, later: open their connections
        now (Http1Client.warm). A URL the call itself would refuse is not dialled."""
        ok: dict[str, int] = {}
        for url, n in calls.items():
            try:
                check_url(url, allow_private=self._allow_private, resolve=False)
                self._client().url(url)
            except (PermanentError, ValueError):
                continue
            ok[url] = n
        if ok:
            self._client().warm(ok)

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
        if info.run_id is not None:
            _add_dag(headers, info, "X-Kron-Run-Id", "X-Kron-Task-Id")
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
        limit = self._output_bytes
        text = (output.http(resp.version, resp.status, resp.reason, resp.excerpt, limit)
                if limit else None)
        return _http_outcome(resp.status, resp.retry_after, text, info.now_ms)


def _add_dag(into: dict[str, Any], info: AttemptInfo, run_name: str, task_name: str) -> None:
    """A DAG task instance's run and task, under the target kind's names (the caller
    checks `info.run_id` first: an ordinary attempt pays one comparison)."""
    assert info.run_id is not None
    into[run_name] = info.run_id
    if info.task_id is not None:
        into[task_name] = info.task_id


def _ssl_context(verify: ssl.SSLContext | bool) -> ssl.SSLContext:
    if isinstance(verify, ssl.SSLContext):
        return verify
    # Same trust store as the httpx and aiohttp runners had (certifi), not the OS's.
    context = ssl.create_default_context(cafile=certifi.where())
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _http_outcome(status: int, retry_after: str | None, text: str | None,
                  now_ms: int) -> Outcome:
    error_class = classify_http_status(status)
    if error_class is None:
        return Outcome(ok=True, status_code=status, output=text)
    return Outcome(
        ok=False, error_class=error_class, status_code=status, output=text,
        error=f"HTTP {status}", retry_after_s=parse_retry_after(retry_after, now_ms=now_ms))


class CommandRunner:
    """A registered command (streams.domain.commands), in a sandbox of the worker's making.

    The job names the command and its parameters; the argv, the image and the limits come
    from the operator's registry, checked again here with the attempt's tenant. The child
    gets a minimal environment (never the worker's own), a scratch HOME removed afterwards,
    its own session and process group (a timeout, a cancel or a worker stop kills the whole
    group, grandchildren too), setrlimit limits, no core dumps, and, with
    KRON_COMMAND_USER, another user."""

    def __init__(self, *, registry: CommandRegistry, scratch_dir: Path,
                 user: str | None = None,
                 output_bytes: int = output.DEFAULT_OUTPUT_BYTES) -> None:
        self._registry = registry
        self._scratch = scratch_dir
        self._output_bytes = output_bytes
        # Resolved once, at start: a user that does not exist stops the worker there.
        self._user = pwd.getpwnam(user) if user else None

    async def run(self, target: dict[str, Any], info: AttemptInfo) -> Outcome:
        if "command" not in target:
            return _refused(LEGACY_COMMAND)
        try:
            resolved = self._registry.resolve(info.tenant, target)
        except PermanentError as exc:
            return _refused(str(exc))
        self._scratch.mkdir(parents=True, exist_ok=True)
        home = Path(tempfile.mkdtemp(prefix="attempt-", dir=self._scratch))
        try:
            if self._user is not None:
                os.chown(home, self._user.pw_uid, self._user.pw_gid)
            return await self._spawn(resolved, info, home)
        finally:
            shutil.rmtree(home, ignore_errors=True)

    async def _spawn(self, resolved: Resolved, info: AttemptInfo, home: Path) -> Outcome:
        env = {"PATH": self._registry.path, "LANG": "C.UTF-8", "HOME": str(home),
               **resolved.env, "KRON_EXEC_ID": info.exec_id, "KRON_JOB_ID": info.job_id,
               "KRON_ATTEMPT": str(info.attempt), "KRON_SCHEDULED_FOR": info.scheduled_for_iso}
        if info.run_id is not None:
            _add_dag(env, info, "KRON_RUN_ID", "KRON_TASK_ID")
        try:
            proc = await asyncio.create_subprocess_exec(
                *sandbox_argv(resolved, env, self._user), env=env, cwd=home,
                start_new_session=True, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        except (OSError, ValueError) as exc:  # no such user, no Python: the host's set-up
            return _refused(f"could not start {resolved.command.name!r}: {exc}")
        assert proc.stdout is not None
        kept = Tail(self._output_bytes)
        try:
            await asyncio.wait_for(kept.read(proc.stdout), resolved.timeout_s)
            await proc.wait()
        except TimeoutError:
            # What it wrote before the timeout is kept: it says where it was stuck.
            return Outcome(ok=False, error_class=ErrorClass.TIMEOUT, output=kept.text(),
                           error=f"command {resolved.command.name!r} timed out after "
                                 f"{resolved.timeout_s:g}s; its process group was killed")
        finally:
            # Whatever happened (an exit, a timeout, a cancel, a worker stop), nothing the
            # attempt started outlives it: the group goes, grandchildren included.
            _kill_group(proc.pid)
            if proc.returncode is None:
                await asyncio.shield(proc.wait())
        text = kept.text()
        if proc.returncode == 0:
            return Outcome(ok=True, output=text)
        # 126/127: "cannot execute"/"not found" (also the sandbox's own exec failure).
        cls = ErrorClass.PERMANENT if proc.returncode in (126, 127) else ErrorClass.TRANSIENT
        return Outcome(ok=False, error_class=cls, output=text,
                       error=f"command {resolved.command.name!r} exited with "
                             f"{proc.returncode}")


def _refused(why: str) -> Outcome:
    return Outcome(ok=False, error_class=ErrorClass.PERMANENT, error=f"refused: {why}")


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class Tail:
    """The last `keep` bytes of everything the child writes (stdout and stderr, one pipe,
    in the order written), read to its end: a child that prints gigabytes costs the worker
    `keep` bytes, not gigabytes. Kept outside the read, so a timeout still has them."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._data = b""

    async def read(self, stream: asyncio.StreamReader) -> None:
        keep = self._keep
        while chunk := await stream.read(65_536):
            if keep:
                self._data = (self._data + chunk)[-keep:]

    def text(self) -> str | None:
        """The tail as output (None with KRON_OUTPUT_BYTES=0)."""
        return output.tail(self._data, self._keep) if self._keep else None


# Run by the worker's own Python (-I: no environment variables, no user site; -S: no site)
# between the fork and the program: the limits apply to the program and all it starts.
# setrlimit and the user switch happen here, not in a preexec_fn (unsafe in a threaded
# worker, and uvloop's subprocesses take no `user`).
_SANDBOX = """\
import os, resource as r, sys
if sys.argv[2] != "-":
    uid, gid = map(int, sys.argv[2].split(":"))
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
for k, v in zip((r.RLIMIT_CPU, r.RLIMIT_AS, r.RLIMIT_NOFILE, r.RLIMIT_NPROC),
                map(int, sys.argv[1].split(","))):
    if v >= 0:
        hard = r.getrlimit(k)[1]
        v = v if hard == r.RLIM_INFINITY else min(v, hard)
        r.setrlimit(k, (v, v))
r.setrlimit(r.RLIMIT_CORE, (0, 0))
try:
    os.execvp(sys.argv[3], sys.argv[3:])
except OSError as exc:
    sys.stderr.write(f"kron: cannot run {sys.argv[3]!r}: {exc.strerror}\\n")
    sys.exit(127)
"""


def sandbox_argv(resolved: Resolved, env: dict[str, str],
                 user: pwd.struct_passwd | None = None) -> list[str]:
    """The worker's exec: the sandbox, its limits, then the registered program (or the
    registered image under the operator's container runtime)."""
    limits = resolved.command.limits
    values = (limits.cpu_s, None if limits.address_space_mb is None
              else limits.address_space_mb * 1024 * 1024, limits.open_files, limits.processes)
    encoded = ",".join("-1" if v is None else str(v) for v in values)
    program = list(resolved.argv)
    command = resolved.command
    if command.runtime is not Runtime.HOST:
        assert command.image is not None
        # `-e NAME` passes the variable's value from the client's (minimal) environment.
        passed = [arg for name in env if name not in ("PATH", "HOME")
                  for arg in ("-e", name)]
        program = [command.runtime.value, "run", "--rm", "--init", *passed, "--",
                   command.image, *program]
    who = "-" if user is None else f"{user.pw_uid}:{user.pw_gid}"
    return [sys.executable, "-I", "-S", "-c", _SANDBOX, encoded, who, *program]


class KafkaRunner:
    """Publishes through a producer the worker already owns, only to a topic ``grants``
    allows the attempt's tenant (streams/domain/topics.py): the check at create time may
    have been made under other grants, or skipped by a direct producer."""

    def __init__(self, send: Any, grants: TopicGrants,
                 output_bytes: int = output.DEFAULT_OUTPUT_BYTES) -> None:
        # send(topic, key, value, headers) -> awaitable that resolves when acked, to the
        # record's (partition, offset) (or None where the sender can't tell).
        self._send = send
        self._grants = grants
        self._output_bytes = output_bytes

    async def run(self, target: dict[str, Any], info: AttemptInfo) -> Outcome:
        try:
            self._grants.check(info.tenant, target["topic"])
        except PermanentError as exc:  # nothing is published; retrying cannot help
            return Outcome(ok=False, error_class=ErrorClass.PERMANENT,
                           error=f"publish refused: {exc.message}")
        headers = {**target.get("headers", {}), "Idempotency-Key": info.exec_id,
                   "X-Kron-Job-Id": info.job_id, "X-Kron-Attempt": str(info.attempt),
                   "X-Kron-Scheduled-For": info.scheduled_for_iso}
        if info.run_id is not None:
            _add_dag(headers, info, "X-Kron-Run-Id", "X-Kron-Task-Id")
        topic = target["topic"]
        try:
            where = await self._send(topic, target.get("key"), target.get("value"), headers)
        except Exception as exc:  # broker errors are worth a retry; the policy bounds them
            return Outcome(ok=False, error_class=ErrorClass.TRANSIENT,
                           error=f"publish failed: {type(exc).__name__}: {exc}")
        if where is None or not self._output_bytes:
            return Outcome(ok=True)
        partition, offset = where
        return Outcome(ok=True, output=output.kafka(topic, partition, offset,
                                                    self._output_bytes))
