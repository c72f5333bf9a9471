"""What the routes share: the process's parts, the caller's jobs, and sending commands.

Writes become Avro commands on kron.commands (acks=all). A create answers once Kafka
acknowledged it (the durable point), and is kept in `Unprojected` so this process's reads see it
until the projection does; other writes wait (bounded) until the projection reflects them."""

from __future__ import annotations

import hashlib
import os
import random
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import Request

from api.auth import READ_METHODS, Authenticator, RateLimiter
from api.batcher import CreateBatcher
from api.problems import Problem
from api.projection import Projector, Unprojected, Views
from api.publisher import BrokerUnavailable, CommandPublisher
from kron.clock import Clock
from kron.settings import Settings
from schemas.envelope import make_envelope

READ_YOUR_WRITES_S = 5.0
# A command's envelope event type: job.<verb>_requested, but a run's commands are run.*.
EVENT_TYPES = {"CancelRun": "run.cancel_requested", "RetryRun": "run.retry_requested"}


@dataclass(frozen=True, slots=True)
class Call:
    """One request's context: the Service, the caller's tenant, the job the path names."""

    svc: Service
    tenant: str
    job: dict[str, Any] | None  # the caller's own, if the path names one

    @property
    def own_job(self) -> dict[str, Any]:
        assert self.job is not None, "the path names a job"
        return self.job


class BrokerCheck(Protocol):
    def check(self, timeout_s: float = 2.0) -> dict[str, object]: ...


@dataclass
class Service:
    settings: Settings
    views: Views
    projector: Projector
    publisher: CommandPublisher
    clock: Clock
    auth: Authenticator
    limiter: RateLimiter
    creates: CreateBatcher | None = None  # None: every create is a CreateJob of its own
    probe: BrokerCheck | None = None  # /healthz's; None answers as a broker that is down

    @property
    def pending(self) -> Unprojected:
        return self.projector.unprojected

    def caller(self, request: Request) -> Call:
        """Who calls (401; 403 for a read key's write: Authenticator.tenant_of), within its
        write rate (429: taken before any lookup, so writes to missing jobs cost a token
        too), and the caller's job the path names (404 for any other)."""
        tenant = self.auth.tenant_of(request)
        if request.method not in READ_METHODS:
            self.limiter.take(tenant)
        job_id = request.path_params.get("job_id")
        job = None if job_id is None else self.own_job(tenant, job_id)
        return Call(svc=self, tenant=tenant, job=job)

    def job(self, tenant: str, job_id: str) -> dict[str, Any] | None:
        """The projected job, else the tenant's acknowledged create not projected yet."""
        job = self.views.job(job_id)
        if job is None:
            pending = self.pending.get(tenant, job_id)
            job = pending.view if pending is not None and pending.acked else None
        return job

    def own_job(self, tenant: str, job_id: str) -> dict[str, Any]:
        job = self.job(tenant, job_id)
        # Another tenant's job answers 404: its existence is not ours to reveal.
        if job is None or job["tenant"] != tenant or job["status"] == "deleted":
            raise Problem(404, "job-not-found", f"no job {job_id!r}", field="job_id")
        return job

    def spec_of(self, tenant: str, job_id: str) -> dict[str, Any]:
        """The job's Avro JobSpec as stored (projected state or pending create)."""
        state = self.views.job_state(job_id)
        if state is not None:
            spec: dict[str, Any] = state["spec"]
            return spec
        pending = self.pending.get(tenant, job_id)
        assert pending is not None, "own_job found the job"
        return pending.spec

    async def send(self, tenant: str, kind: str, job_id: str, *, command_id: str | None = None,
                   **fields: Any) -> str:
        """Publish one command for the job; its id. 503 if Kafka does not acknowledge it."""
        command_id = command_id or new_id()
        record = {
            "envelope": make_envelope(
                event_id=command_id,
                event_type=EVENT_TYPES.get(kind)
                or f"job.{kind.removesuffix('Job').lower()}_requested",
                occurred_at_ms=self.clock.now_ms(), tenant=tenant, producer="api"),
            "command_id": command_id, "job_id": job_id, **fields,
        }
        try:
            await self.publisher.publish(f"kron.commands.{kind}", record, key=job_id)
        except BrokerUnavailable as exc:
            raise not_acknowledged(exc) from exc
        return command_id

    async def create_batched(self, creates: CreateBatcher, tenant: str, job_id: str,
                             spec: dict[str, Any], view: dict[str, Any]) -> None:
        """A keyless create, in its tenant's next CreateJobs record (api/batcher.py)."""
        command_id, acked = creates.add(tenant, job_id, spec)
        view["applied_command_ids"] = [command_id]  # what the worker will record
        try:
            await acked
        except BrokerUnavailable as exc:
            raise not_acknowledged(exc) from exc

    async def applied(self, job_id: str, command_id: str) -> dict[str, Any] | None:
        """Read-your-writes: wait until the projection shows the command applied."""
        def seen() -> bool:
            job = self.views.job(job_id)
            return job is not None and command_id in job["applied_command_ids"]

        await self.projector.wait_async(seen, READ_YOUR_WRITES_S)
        return self.views.job(job_id)

    async def run_applied(self, run: dict[str, Any], command_id: str) -> bool:
        """Read-your-writes for a command on a run (`run`: its view when it was sent): wait
        until its job shows the command applied and the run has changed; whether the job
        shows it applied (a worker that refused it never does)."""
        def applied() -> bool:
            job = self.views.job(run["job_id"])
            return job is not None and command_id in job["applied_command_ids"]

        def seen() -> bool:
            return applied() and self.views.execution(run["exec_id"]) != run

        await self.projector.wait_async(seen, READ_YOUR_WRITES_S)
        return applied()


def not_acknowledged(exc: BrokerUnavailable) -> Problem:
    return Problem(503, "broker-unavailable", f"Kafka did not acknowledge the command: {exc}",
                   headers={"Retry-After": "5"})


_ids = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _ids.seed(os.urandom(32)))  # no shared sequence


def new_id() -> str:
    """128 random bits as hex, like uuid4().hex, without a getrandom() call per id: that call
    releases the GIL, and winning it back from the projector thread took up to a switch
    interval (5 ms) on every create. Ids need uniqueness here, not secrecy."""
    return f"{_ids.getrandbits(128):032x}"


def job_id_for(tenant: str, idempotency_key: str | None) -> str:
    if idempotency_key is None:
        return "j_" + new_id()
    digest = hashlib.blake2b(f"{tenant}\x00{idempotency_key}".encode(), digest_size=12)
    return "j_" + digest.hexdigest()
