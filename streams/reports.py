"""Attempt results travel to their partition's owner in batches.

One event per partition every few milliseconds instead of one per attempt: at hundreds of
executions a second the per-event cost (produce, fetch, decode, stream bookkeeping) was paid
once per result. A result waits at most the window; a crash inside it loses results the
owner then recovers by lease expiry, as with any crash before a report.

While the executor has a backlog (a spike's calls still waiting for a runner) or the
ticker is deciding due slots (the engine's `busy`), successful results of `allow` jobs wait
longer: up to DEFER_S, and at most half the time left on the owner's lease less
LEASE_MARGIN_S, so a lease with under ~2 s left sends at once. Applying
results costs the worker as much as making the calls (decode the execution and the job,
write both), and a call that is late matters more than a status that is. Failures, and jobs
whose next decision looks at what is running (skip, queue, replace), never wait: their
retries and overlap decisions would move.

A batch for a partition this process owns is applied here, by the engine, instead of
making a round trip through kron.signals to the same process: encoding it, producing,
fetching, Faust's stream and decoding it again were 7-10% of the worker's event loop at
4,000 executions/s (py-spy). Its effect is the same execution records, written to the
executions changelog before anything else depends on them, and a crash loses the same
results either way: those finished but not yet acknowledged by Kafka (the changelog's ack
here, the signal's ack there), which their leases recover. A result for a partition owned
elsewhere (a rebalance moved it, or our lease lapsed) still travels as an event.

A send that fails puts its results back in front of newer ones, and stop() sends what is
left, including a batch cut short by the cancel (sent twice at worst: the owner ignores a
result for an attempt it already closed).

Results carry their attempts' output (up to KRON_OUTPUT_BYTES each), so a batch sent as an
event is cut in halves until each record is at most MAX_SEND_BYTES, well within the
broker's 1 MB message.max.bytes: 500 results of 4 KiB would be 2 MB. A batch applied here
is never encoded, and is not cut.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

from kron.clock import Clock
from schemas import codec
from schemas.envelope import make_envelope
from schemas.names import ATTEMPTS_FINISHED, EXECUTION_SUCCEEDED
from streams.tasks import cancel_and_wait

log = logging.getLogger("kron.reports")

WINDOW_S = 0.005
MAX_BATCH = 500
DEFER_S = 2.0
DEFER_POLL_S = 0.05
LEASE_MARGIN_S = 1.0
RETRY_SEND_S = 0.5
# Half the broker's default message.max.bytes, as api/batcher.py's CreateJobs.
MAX_SEND_BYTES = 512 * 1024

Send = Callable[[int, bytes], Awaitable[None]]
# (partition, AttemptsFinished record) -> whether it was applied (see Engine).
Apply = Callable[[int, dict[str, Any]], Awaitable[bool]]


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
        "output": record.get("output"),
    }


class ResultBatcher:
    """Gathers attempt results per partition into AttemptsFinished batches.

    `apply` (the engine's) takes a batch whose partition this process owns and applies it
    at once; a batch it declines goes to the partition's signals, for whoever owns it.
    """

    def __init__(self, *, send: Send, clock: Clock, worker_id: str,
                 window_s: float = WINDOW_S, max_batch: int = MAX_BATCH,
                 busy: Callable[[], bool] | None = None, defer_s: float = DEFER_S,
                 apply: Apply | None = None) -> None:
        self._send = send
        self._apply = apply
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
        self.applied = 0  # batches applied here, not sent
        self.results = 0

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        await self._flush()  # what finished before a graceful stop is still reported

    def add(self, partition: int, item: dict[str, Any], *,
            wait_until_lease_ms: int | None = None) -> None:
        """`wait_until_lease_ms`: the owner's lease end (wall clock) of a result that may
        wait; None sends it with the next batch."""
        now = self._clock.monotonic()
        hold_s = 0.0
        if wait_until_lease_ms is not None:
            left_s = (wait_until_lease_ms - self._clock.now_ms()) / 1000
            hold_s = max(0.0, min(self._defer_s, left_s / 2 - LEASE_MARGIN_S))
        self._flush_by = min(self._flush_by, now + hold_s)
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
            except Exception:  # kept for the next try; past that, the lease recovers them
                log.exception("reporting attempt results failed")
                await asyncio.sleep(RETRY_SEND_S)

    async def _flush(self) -> None:
        pending, self._pending = self._pending, {}
        self._flush_by = math.inf
        try:
            for partition, items in pending.items():
                while items:
                    chunk = items[:self._max]
                    record = self._record(partition, chunk)
                    if self._apply is not None and await self._apply(partition, record):
                        self.applied += 1
                    else:
                        await self._send_record(partition, record)
                    del items[:len(chunk)]
                    self.batches += 1
                    self.results += len(chunk)
                    # Applying a batch here never awaits anything that suspends: without
                    # a turn between batches, a spike's ~20,000 deferred results held
                    # every call still queued for ~1 s (bench burst).
                    await asyncio.sleep(0)
        finally:
            self._put_back(pending)

    async def _send_record(self, partition: int, record: dict[str, Any]) -> None:
        """Send one AttemptsFinished, cut in halves (event ids `...:a`, `...:b`) while its
        bytes are over MAX_SEND_BYTES. A half that fails leaves the whole chunk to be
        sent again: the owner ignores the results it already applied."""
        data = codec.encode_trusted(ATTEMPTS_FINISHED, record)
        items = record["results"]
        if len(data) <= MAX_SEND_BYTES or len(items) < 2:
            await self._send(partition, data)
            return
        half = len(items) // 2
        event_id = record["envelope"]["event_id"]
        for suffix, some in (("a", items[:half]), ("b", items[half:])):
            envelope = {**record["envelope"], "event_id": f"{event_id}:{suffix}"}
            await self._send_record(partition, {"envelope": envelope, "results": some})

    def _put_back(self, unsent: dict[int, list[dict[str, Any]]]) -> None:
        for partition, items in unsent.items():
            if items:
                self._pending[partition] = items + self._pending.get(partition, [])
                self._flush_by = self._clock.monotonic()  # no more waiting for these
                self._wake.set()

    def _record(self, partition: int, items: list[dict[str, Any]]) -> dict[str, Any]:
        now = self._clock.now_ms()
        return {
            "envelope": make_envelope(
                event_id=f"attempts:{self._worker}:{partition}:{self.batches}:{now}",
                event_type="execution.attempts_finished", occurred_at_ms=now, tenant="",
                producer=self._worker),
            "results": items,
        }
