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
in flight, else when the one in flight is acknowledged, or when it is full. A lone create
still leaves on the next turn of the event loop, and under load the batches grow with
Kafka's ack latency. One tenant's batches never wait for another's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from schemas import names
from streams.engine.batch import MAX_JOBS, item_command_id, partition_for

log = logging.getLogger("kron.api.batcher")

# (record name, record, key) -> resolved when Kafka acknowledged the record.
Publish = Callable[[str, dict[str, Any], str], Awaitable[Any]]


@dataclass(slots=True)
class _Batch:
    partition: int
    command_id: str
    jobs: list[dict[str, Any]] = field(default_factory=list)
    acked: asyncio.Future[None] | None = None


class CreateBatcher:
    """Used from the event loop's thread only."""

    def __init__(self, publish: Publish, *, partitions: int, new_id: Callable[[], str],
                 now_ms: Callable[[], int], max_jobs: int = 100) -> None:
        if not 1 <= max_jobs <= MAX_JOBS:
            raise ValueError(f"a batch holds 1 to {MAX_JOBS} jobs, not {max_jobs}")
        self._publish = publish
        self._partitions = partitions
        self._new_id = new_id
        self._now_ms = now_ms
        self._max_jobs = max_jobs
        self._open: dict[str, _Batch] = {}
        self._next_partition: dict[str, int] = {}
        self._in_flight: dict[str, int] = {}
        self._sending: set[asyncio.Task[None]] = set()
        self.records = 0  # CreateJobs records sent, for tests and logs

    def job_id(self, tenant: str) -> str:
        """A new random job id on the partition the tenant's next create is batched on."""
        batch = self._open.get(tenant)
        partition = batch.partition if batch else self._next_partition.get(tenant, 0)
        while True:  # 1 in `partitions` draws lands there: ~8 draws of ~3 us each
            job_id = "j_" + self._new_id()
            if partition_for(job_id, self._partitions) == partition:
                return job_id

    def add(self, tenant: str, job_id: str, spec: dict[str, Any]) -> tuple[str, Awaitable[None]]:
        """Puts a create into the tenant's open batch. Returns the command id the worker
        records for it and an awaitable that resolves when Kafka has the batch (or raises
        what the publish raised)."""
        partition = partition_for(job_id, self._partitions)
        batch = self._open.get(tenant)
        if batch is not None and batch.partition != partition:
            self._send(tenant)  # not an id from job_id(): it goes in a batch of its own
            batch = None
        if batch is None:
            batch = self._open[tenant] = _Batch(
                partition=partition, command_id=self._new_id(),
                acked=asyncio.get_running_loop().create_future())
            self._next_partition[tenant] = (partition + 1) % self._partitions
            if not self._in_flight.get(tenant):
                # The next turn of the loop: creates that arrive meanwhile join it.
                asyncio.get_running_loop().call_soon(self._send_open, tenant, batch)
        batch.jobs.append({"job_id": job_id, "idempotency_key": None, "spec": spec})
        command_id = item_command_id(batch.command_id, len(batch.jobs) - 1)
        acked = batch.acked
        assert acked is not None
        if len(batch.jobs) >= self._max_jobs:
            self._send(tenant)
        return command_id, asyncio.shield(acked)

    def _send_open(self, tenant: str, batch: _Batch) -> None:
        if self._open.get(tenant) is batch:  # not sent meanwhile (full, or replaced)
            self._send(tenant)

    def _send(self, tenant: str) -> None:
        batch = self._open.pop(tenant)
        self._in_flight[tenant] = self._in_flight.get(tenant, 0) + 1
        self.records += 1
        record = {
            "envelope": {"event_id": batch.command_id,
                         "event_type": "job.create_many_requested", "schema_version": 1,
                         "occurred_at_ms": self._now_ms(), "tenant": tenant,
                         "causation_id": None, "correlation_id": None, "producer": "api"},
            "command_id": batch.command_id, "jobs": batch.jobs}
        task = asyncio.get_running_loop().create_task(self._deliver(tenant, batch, record))
        self._sending.add(task)  # a task nobody holds may be collected before it ends
        task.add_done_callback(self._sending.discard)

    async def _deliver(self, tenant: str, batch: _Batch, record: dict[str, Any]) -> None:
        acked = batch.acked
        assert acked is not None
        try:
            # Keyed by its first job: the murmur2 partitioner puts it on the jobs' partition.
            await self._publish(names.CREATE_JOBS, record, batch.jobs[0]["job_id"])
        except BaseException as exc:  # every create of the batch gets the error
            if not acked.done():
                acked.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            acked.set_result(None)
        finally:
            self._in_flight[tenant] -= 1
            waiting = self._open.get(tenant)
            if waiting is not None and not self._in_flight[tenant]:
                self._send(tenant)

    async def close(self) -> None:
        """Sends what is open and waits for every batch in flight."""
        for tenant in list(self._open):
            self._send(tenant)
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)
