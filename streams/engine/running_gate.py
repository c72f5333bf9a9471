"""A tenant's executions running at once: its `max_running` (KRON_TENANTS_FILE), held by
each worker for the partitions it owns.

A slot of a capped tenant starts only if the tenant has room in this worker; otherwise its
execution is recorded `queued` ("tenant concurrency limit") and started, in the order its
slots were due, as the tenant's running executions end (PartitionCore). "Running" is an
execution admitted and not yet ended: an attempt in flight or a retry pending (a DAG run
counts once, however many of its tasks run).

The cap is split like the dispatch rate: a worker owning `owned` of the `partitions` gets
ceil(max_running * owned / partitions) of it, so one worker owning every partition holds
the tenant to exactly max_running, and n workers to at most max_running + n - 1.

The counts live in this process only: they are the executions this process admitted.
After a partition moves, its new owner does not count the executions the old owner started
and that still run (they end within their lease); documented in docs/operations.md. The
gate only ever delays a start, so a miscount can't lose or duplicate an execution.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection

from streams.domain.states import QueueReason
from streams.domain.tenants import TenantTable
from streams.domain.timer import tenant_hash

# The reason a queued execution shows (ExecutionState.reason) while it waits.
CONCURRENCY_REASON = QueueReason.CONCURRENCY.value


class RunningGate:
    """Admits a tenant's executions up to its share of max_running in this worker."""

    def __init__(self, table: TenantTable, *, partitions: int) -> None:
        self._table = table
        self._partitions = max(1, partitions)
        self._owned = self._partitions
        # partition -> tenant -> the exec ids admitted and not yet ended.
        self._active: dict[int, dict[str, set[str]]] = {}
        self._by_hash = {tenant_hash(t): t for t in table.tenants}
        # Told when a capped tenant's running execution ends: its queued executions, in any
        # partition this worker owns, may start (the worker ticks those partitions).
        self.on_room: Callable[[str], None] | None = None

    def set_owned(self, owned: Collection[int]) -> None:
        """The partitions this worker owns now: the share follows, and the counts of the
        partitions it no longer owns are dropped (their new owner counts its own)."""
        self._owned = max(1, len(owned))
        for partition in list(self._active):
            if partition not in owned:
                del self._active[partition]

    def share(self, tenant: str) -> int:
        """The tenant's cap in this worker; 0: unlimited."""
        cap = self._table.quotas(tenant).max_running
        if cap <= 0:
            return 0
        return max(1, math.ceil(cap * self._owned / self._partitions))

    def capped(self, tenant: str) -> bool:
        return self._table.quotas(tenant).max_running > 0

    def running(self, tenant: str) -> int:
        return sum(len(by.get(tenant, ())) for by in self._active.values())

    def room(self, lane_tenant: int) -> int | None:
        """How many more of the tenant whose lane hash this is may start now (None:
        unlimited). A hint for how many queued executions to read; admit decides."""
        tenant = self._by_hash.get(lane_tenant)
        if tenant is None:  # not listed, nothing admitted here yet: the defaults' cap
            cap = self._table.defaults.max_running
            return None if cap <= 0 else max(1, math.ceil(cap * self._owned / self._partitions))
        share = self.share(tenant)
        return None if share == 0 else max(0, share - self.running(tenant))

    def admit(self, partition: int, tenant: str, exec_id: str) -> bool:
        """Count the execution as running if the tenant has room (or it is counted already)."""
        share = self.share(tenant)
        if share == 0:
            return True
        by = self._active.setdefault(partition, {}).setdefault(tenant, set())
        if exec_id in by:
            return True
        if self.running(tenant) >= share:
            return False
        by.add(exec_id)
        self._by_hash.setdefault(tenant_hash(tenant), tenant)
        return True

    def enter(self, partition: int, tenant: str, exec_id: str) -> None:
        """Count an execution that starts whatever the room (a backfill's rerun)."""
        if self.capped(tenant):
            self._active.setdefault(partition, {}).setdefault(tenant, set()).add(exec_id)
            self._by_hash.setdefault(tenant_hash(tenant), tenant)

    def release(self, partition: int, tenant: str, exec_id: str) -> None:
        by = self._active.get(partition, {}).get(tenant)
        if by is not None and exec_id in by:
            by.discard(exec_id)
            if self.on_room is not None:
                self.on_room(tenant)


class PartitionGate:
    """The gate as one partition's core sees it."""

    __slots__ = ("_gate", "partition")

    def __init__(self, gate: RunningGate, partition: int) -> None:
        self._gate = gate
        self.partition = partition

    def capped(self, tenant: str) -> bool:
        return self._gate.capped(tenant)

    def room(self, lane_tenant: int) -> int | None:
        return self._gate.room(lane_tenant)

    def admit(self, tenant: str, exec_id: str) -> bool:
        return self._gate.admit(self.partition, tenant, exec_id)

    def enter(self, tenant: str, exec_id: str) -> None:
        self._gate.enter(self.partition, tenant, exec_id)

    def release(self, tenant: str, exec_id: str) -> None:
        self._gate.release(self.partition, tenant, exec_id)


def ungated() -> PartitionGate:
    """A gate that admits everything: no tenant is capped (tests, benchmarks, no file)."""
    return PartitionGate(RunningGate(TenantTable(), partitions=1), 0)
