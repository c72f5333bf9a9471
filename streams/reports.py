"""Attempt results travel to their partition's owner in batches.

One event per partition every few milliseconds instead of one per attempt: at hundreds of
executions a second the per-event cost (produce, fetch, decode, stream bookkeeping) was paid
once per result. A result waits at most the window; a crash inside it loses results the
owner then recovers by lease expiry, as with any crash before a report.

While the executor has a backlog (a spike's calls still waiting for a runner), results wait
longer, up to DEFER_S and never past half the time left on their attempt's lease: applying
them costs the worker as much as making the calls (decode the execution and the job, write
both), and a call that is late matters more than a status that is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

from kron.clock import Clock
from schemas import codec
from schemas.names import ATTEMPTS_FINISHED, EXECUTION_SUCCEEDED

log = logging.getLogger("kron.reports")

WINDOW_S = 0.005
MAX_BATCH = 500
DEFER_S = 2.0
DEFER_POLL_S = 0.05

Send = Callable[[int, bytes], Awaitable[None]]


def result_item(name: str, record: dict[str, Any]) -> dict[str, Any]:
    """An executor's ExecutionSucceeded/ExecutionFailed record as one AttemptResult."""
    ok = name == EXECUTION_SUCCEEDED
    return {
        "exec_id": record["exec_id"], "job_id": record["job_id"],
        "scheduled_for_ms": record["scheduled_for_ms"], "attempt": record["attempt"],
        "fencing_token": record["fencing_token"], "ok": ok,
        "started_at_ms": record.get("started_at_ms"),
        "finished_at_ms": record["finished_at_ms"], "status_code": record.get("status_code"),
        "error_class": None if ok else record["error_class"],
        "error": None if ok else record["error"],
        "retry_after_s": None if ok else record.get("retry_after_s"),
        "response_excerpt": record.get("response_excerpt") if ok else None,
    }


class ResultBatcher:
    def __init__(self, *, send: Send, clock: Clock, worker_id: str,
                 window_s: float = WINDOW_S, max_batch: int = MAX_BATCH,
                 busy: Callable[[], bool] | None = None, defer_s: float = DEFER_S) -> None:
        self._send = send
        self._busy = busy
        self._defer_s = defer_s
        self._flush_by = math.inf  # monotonic: the earliest any pending result must go
        self._clock = clock
        self._worker = worker_id
        self._window_s = window_s
        self._max = max_batch
        self._pending: dict[int, list[dict[str, Any]]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.batches = 0
        self.results = 0

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._flush()  # what finished before a graceful stop is still reported

    def add(self, partition: int, item: dict[str, Any], *,
            lease_deadline: float | None = None) -> None:
        """`lease_deadline` (monotonic): when the owner will give up on the attempt."""
        now = self._clock.monotonic()
        flush_by = now + self._defer_s
        if lease_deadline is not None:
            flush_by = min(flush_by, now + (lease_deadline - now) / 2)
        self._flush_by = min(self._flush_by, flush_by)
        self._pending.setdefault(partition, []).append(item)
        self._wake.set()

    def deferring(self) -> bool:
        return (self._busy is not None and self._clock.monotonic() < self._flush_by
                and self._busy())

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(self._window_s)  # let this instant's results join
            # Bounded by polls as well as by the clock: a stalled clock can't stall results.
            for _ in range(math.ceil(self._defer_s / DEFER_POLL_S)):
                if not self.deferring():
                    break
                await asyncio.sleep(DEFER_POLL_S)
            self._wake.clear()
            try:
                await self._flush()
            except Exception:  # the owner recovers unreported attempts by lease
                log.exception("reporting attempt results failed")

    async def _flush(self) -> None:
        pending, self._pending = self._pending, {}
        self._flush_by = math.inf
        for partition, items in pending.items():
            for i in range(0, len(items), self._max):
                chunk = items[i:i + self._max]
                await self._send(partition, codec.encode_trusted(
                    ATTEMPTS_FINISHED, self._record(partition, chunk)))
                self.batches += 1
                self.results += len(chunk)

    def _record(self, partition: int, items: list[dict[str, Any]]) -> dict[str, Any]:
        now = self._clock.now_ms()
        return {
            "envelope": {"event_id": f"attempts:{self._worker}:{partition}:{self.batches}:{now}",
                         "event_type": "execution.attempts_finished", "schema_version": 1,
                         "occurred_at_ms": now, "tenant": "", "causation_id": None,
                         "correlation_id": None, "producer": self._worker},
            "results": items,
        }
