"""The precise layer: wakes when a partition's earliest timer is due and sends it a tick.

It keeps, per owned partition, the due time of the earliest durable timer (one RocksDB
seek) and sleeps until the soonest one. The agent tells it when a write adds an earlier
timer and when a tick has been processed. The tick carries the ticker's clock reading;
the agent fires with that time, so firing is a pure function of the event and the state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from schemas import codec
from streams.engine.faust_store import first_timer_key

if TYPE_CHECKING:
    from streams.app import Engine

log = logging.getLogger("kron.ticker")

# A tick that got no answer (rebalance, recovery) is sent again after this long.
RESEND_S = 5.0
# Even with no notification, re-read the durable index this often.
RESCAN_S = 0.5


def _due_of(key: bytes | None) -> int | None:
    return None if key is None else int.from_bytes(key[:8], "big")


class Ticker:
    def __init__(self, *, engine: Engine) -> None:
        self._engine = engine
        self._next: dict[int, int | None] = {}
        self._outstanding: dict[int, float] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.sent = 0

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def timer_added(self, partition: int, key: bytes) -> None:
        due = _due_of(key)
        current = self._next.get(partition)
        if due is not None and (current is None or due < current):
            self._next[partition] = due
            self._wake.set()

    def ticked(self, partition: int, *, more: bool) -> None:
        self._outstanding.pop(partition, None)
        self._next[partition] = (0 if more else
                                 _due_of(first_timer_key(self._engine.timers, partition)))
        self._wake.set()

    def _owned(self) -> frozenset[int]:
        # Outside the lease we may not be the owner any more: the new one ticks. Watching
        # starts here too, as a worker with timers but no commands gets no other event.
        lease = self._engine.lease
        lease.watch(self._engine.coordinator())
        return self._engine.owned_partitions() if lease.valid() else frozenset()

    def _rescan(self, owned: frozenset[int]) -> None:
        for p in list(self._next):
            if p not in owned:
                del self._next[p]
                self._outstanding.pop(p, None)
        for p in owned:
            with contextlib.suppress(Exception):  # a DB closing under a rebalance
                self._next[p] = _due_of(first_timer_key(self._engine.timers, p))

    async def _run(self) -> None:
        while True:
            try:
                await self._loop()
            except Exception:  # a dead ticker would leave every owned partition silent
                log.exception("ticker failed; starting over")
                await asyncio.sleep(RESCAN_S)

    async def _loop(self) -> None:
        clock = self._engine.clock
        last_scan = 0.0
        while True:
            mono = clock.monotonic()
            owned = self._owned()
            if mono - last_scan >= RESCAN_S:
                self._rescan(owned)
                last_scan = mono
            now = clock.now_ms()
            soonest: int | None = None
            for p in owned:
                due = self._next.get(p)
                if due is None:
                    continue
                if due > now:
                    soonest = due if soonest is None else min(soonest, due)
                elif mono - self._outstanding.get(p, -RESEND_S) >= RESEND_S:
                    self._outstanding[p] = mono
                    await self._send_tick(p, now)
            wait = RESCAN_S if soonest is None else max(0.0, min(RESCAN_S, (soonest - now) / 1000))
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=wait)

    async def _send_tick(self, partition: int, now_ms: int) -> None:
        self.sent += 1
        record = {
            "envelope": {"event_id": f"tick:{partition}:{now_ms}:{self.sent}",
                         "event_type": "engine.ticked", "schema_version": 1,
                         "occurred_at_ms": now_ms, "tenant": "", "causation_id": None,
                         "correlation_id": None,
                         "producer": self._engine.settings.worker_id},
            "partition": partition,
            "now_ms": now_ms,
        }
        await self._engine.signals.send(key=b"tick", value=codec.encode("kron.engine.Tick",
                                        record), partition=partition)
