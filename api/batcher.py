"""Concurrent keyless creates of one tenant, sent as CreateJobs records.

A CreateJob record of its own cost the worker ~0.46 ms and the broker ~0.52 ms of CPU per
create in `kron bench api` (2026-12-03 host), most of it per record: the Faust event, the
produce with acks=all, the fetch. A CreateJobs batch (streams/engine/batch.py) pays that once
for all its jobs, and each job is still applied, refused and dead-lettered as its own
CreateJob, with a command id derived from the batch's.

A batch holds jobs of one partition. A keyless create's job id is random, so the batcher
draws it on the partition of the tenant's open batch (`job_id`), and the next batch of the
tenant goes to the next partition: the partitions stay evenly used. A create with an
idempotency key has its id fixed by the key and is not batched.

When a batch leaves, like Nagle's algorithm: at once when none of the tenant's batches is
in flight, else when the one in flight is acknowledged, or when it is full (by jobs, or by
an upper bound of its bytes: a record must fit the broker's message.max.bytes). A lone
create still leaves on the next turn of the event loop, and under load the batches grow
with Kafka's ack latency. One tenant's batches never wait for another's. A batch that does
not encode is sent again job by job, as the CreateJob each stands for, so a bad job fails
its own request only.

The API's KRON_PARTITIONS must be the commands topic's partition count (the server checks
at start and sends every create alone if not): a job drawn for partition P under a wrong
count lands elsewhere, and the worker refuses it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from schemas import names
from schemas.envelope import make_envelope
from schemas.errors import EncodeError
from streams.engine.batch import MAX_JOBS, item_command, item_command_id, partition_for

log = logging.getLogger("kron.api.batcher")

# (record name, record, key) -> resolved when Kafka acknowledged the record.
Publish = Callable[[str, dict[str, Any], str], Awaitable[Any]]

# Half the broker's default message.max.bytes (1 MB), against an upper bound of the bytes.
MAX_BATCH_BYTES = 512 * 1024
# Above this many partitions a keyless id takes too many draws (1 in `partitions` lands on
# the open batch's partition), and a tenant's batches spread too thin to fill.
MAX_PARTITIONS = 64


@dataclass(slots=True)
class _Batch:
    partition: int
    command_id: str
    jobs: list[dict[str, Any]] = field(default_factory=list)
    waiters: list[asyncio.Future[None]] = field(default_factory=list)
    size: int = 0


def size_bound(value: Any) -> int:
    """At least the bytes of `value` in Avro: every length, count, union index or number as
    a 10-byte varint or an 8-byte double, strings at 3 bytes a character (UTF-8 of the
    Basic Multilingual Plane; 4 only for a surrogate pair, 2 characters)."""
    if isinstance(value, str):
        return 10 + 3 * len(value)
    if isinstance(value, bytes | bytearray):
        return 10 + len(value)
    if isinstance(value, dict):
        return 10 + sum(size_bound(k) + size_bound(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return 10 + sum(size_bound(v) for v in value)
    return 10


class CreateBatcher:
    """Used from the event loop's thread only."""

    def __init__(self, publish: Publish, *, partitions: int, new_id: Callable[[], str],
                 now_ms: Callable[[], int], max_jobs: int = 100,
                 max_bytes: int = MAX_BATCH_BYTES) -> None:
        if not 1 <= max_jobs <= MAX_JOBS:
            raise ValueError(f"a batch holds 1 to {MAX_JOBS} jobs, not {max_jobs}")
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise ValueError(f"batches need 1 to {MAX_PARTITIONS} partitions, not {partitions}")
        self._publish = publish
        self._partitions = partitions
        self._new_id = new_id
        self._now_ms = now_ms
        self._max_jobs = max_jobs
        self._max_bytes = max_bytes
        self._open: dict[str, _Batch] = {}
        self._next_partition: dict[str, int] = {}
        self._in_flight: dict[str, int] = {}
        self._sending: set[asyncio.Task[None]] = set()

    def job_id(self, tenant: str) -> str:
        """A new random job id on the partition the tenant's next create is batched on."""
        batch = self._open.get(tenant)
        partition = batch.partition if batch else self._next_partition.get(tenant, 0)
        while True:  # 1 in `partitions` draws lands there
            job_id = "j_" + self._new_id()
            if partition_for(job_id, self._partitions) == partition:
                return job_id

    def add(self, tenant: str, job_id: str, spec: dict[str, Any]) -> tuple[str, Awaitable[None]]:
        """Puts a create into the tenant's open batch. Returns the command id the worker
        records for it and an awaitable that resolves when Kafka has it (or raises what
        its publish raised)."""
        job = {"job_id": job_id, "idempotency_key": None, "spec": spec}
        size = size_bound(job)
        partition = partition_for(job_id, self._partitions)
        batch = self._open.get(tenant)
        if batch is not None and (batch.partition != partition
                                  or batch.size + size > self._max_bytes):
            self._send(tenant)  # an id not from job_id(), or no room: a batch of its own
            batch = None
        if batch is None:
            batch = self._open[tenant] = _Batch(partition=partition,
                                                command_id=self._new_id())
            self._next_partition[tenant] = (partition + 1) % self._partitions
            if not self._in_flight.get(tenant):
                # The next turn of the loop: creates that arrive meanwhile join it.
                asyncio.get_running_loop().call_soon(self._send_open, tenant, batch)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Read its outcome even if the request gave up waiting (no "never retrieved" noise).
        done.add_done_callback(_retrieve)
        batch.jobs.append(job)
        batch.waiters.append(done)
        batch.size += size
        command_id = item_command_id(batch.command_id, len(batch.jobs) - 1)
        if len(batch.jobs) >= self._max_jobs:
            self._send(tenant)
        return command_id, asyncio.shield(done)

    def _send_open(self, tenant: str, batch: _Batch) -> None:
        if self._open.get(tenant) is batch:  # not sent meanwhile (full, or replaced)
            self._send(tenant)

    def _send(self, tenant: str) -> None:
        batch = self._open.pop(tenant)
        self._in_flight[tenant] = self._in_flight.get(tenant, 0) + 1
        task = asyncio.get_running_loop().create_task(self._deliver(tenant, batch))
        self._sending.add(task)  # a task nobody holds may be collected before it ends
        task.add_done_callback(self._sending.discard)

    async def _deliver(self, tenant: str, batch: _Batch) -> None:
        record = {
            "envelope": make_envelope(event_id=batch.command_id,
                                      event_type="job.create_many_requested",
                                      occurred_at_ms=self._now_ms(), tenant=tenant,
                                      producer="api"),
            "command_id": batch.command_id, "jobs": batch.jobs}
        try:
            # Keyed by its first job: the murmur2 partitioner puts it on the jobs' partition.
            await self._publish(names.CREATE_JOBS, record, batch.jobs[0]["job_id"])
        except EncodeError:
            await self._one_by_one(record, batch.waiters)
        except Exception as exc:  # every create of the batch gets the error
            for done in batch.waiters:
                _settle(done, exc)
        except BaseException:  # cancelled (the API stops): no request waits forever
            for done in batch.waiters:
                done.cancel()
            raise
        else:
            for done in batch.waiters:
                _settle(done, None)
        finally:
            self._in_flight[tenant] -= 1
            if not self._in_flight[tenant]:
                del self._in_flight[tenant]
                if tenant in self._open:
                    self._send(tenant)

    async def _one_by_one(self, record: dict[str, Any],
                          waiters: list[asyncio.Future[None]]) -> None:
        """Each job as the CreateJob the worker would have applied for it (the same command
        id), so only a job that does not encode fails, with its own error."""
        log.warning("a batch of %d creates did not encode; sending them one by one",
                    len(waiters))

        async def one(index: int, done: asyncio.Future[None]) -> None:
            command = item_command(record, index)
            try:
                await self._publish(names.CREATE_JOB, command, command["job_id"])
            except Exception as exc:
                _settle(done, exc)
            else:
                _settle(done, None)

        await asyncio.gather(*(one(i, done) for i, done in enumerate(waiters)))

    async def close(self) -> None:
        """Sends what is open and waits until nothing is in flight."""
        while self._open or self._sending:
            for tenant in list(self._open):
                if not self._in_flight.get(tenant):
                    self._send(tenant)
            if self._sending:
                await asyncio.gather(*self._sending, return_exceptions=True)


def _settle(done: asyncio.Future[None], exc: Exception | None) -> None:
    if done.done():
        return
    if exc is None:
        done.set_result(None)
        return
    # One exception object raised in many requests would collect all their tracebacks.
    try:
        own = type(exc)(*exc.args)
    except Exception:
        own = exc
    done.set_exception(own)


def _retrieve(done: asyncio.Future[None]) -> None:
    if not done.cancelled():
        done.exception()
