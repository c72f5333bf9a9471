"""ResultBatcher: results go in batches, and wait while the executor still has calls queued,
but never past their deadline (DEFER_S, or half the time left on the attempt's lease).

Time is a ManualClock; the batcher's own polls are real but short (DEFER_POLL_S)."""

from __future__ import annotations

import asyncio
from typing import Any

from kron.clock import ManualClock
from schemas import codec
from streams.reports import ResultBatcher


class Sink:
    def __init__(self) -> None:
        self.sent: list[tuple[int, list[str]]] = []
        self.arrived = asyncio.Event()

    async def __call__(self, partition: int, value: bytes) -> None:
        record = codec.decode(value).record
        self.sent.append((partition, [r["exec_id"] for r in record["results"]]))
        self.arrived.set()


def item(exec_id: str) -> dict[str, Any]:
    return {"exec_id": exec_id, "job_id": "j", "scheduled_for_ms": 0, "attempt": 1,
            "fencing_token": 1, "ok": True, "started_at_ms": 0, "finished_at_ms": 1,
            "status_code": 200, "error_class": None, "error": None, "retry_after_s": None,
            "response_excerpt": ""}


async def settle(sink: Sink, within_s: float = 2.0) -> bool:
    try:
        await asyncio.wait_for(sink.arrived.wait(), within_s)
    except TimeoutError:
        return False
    return True


def batcher(sink: Sink, clock: ManualClock, busy: list[bool],
            defer_s: float = 10.0) -> ResultBatcher:
    b = ResultBatcher(send=sink, clock=clock, worker_id="w", busy=lambda: busy[0],
                      defer_s=defer_s)
    b.start()
    return b


async def test_not_busy_means_one_batch_per_window() -> None:
    sink, clock = Sink(), ManualClock()
    b = batcher(sink, clock, [False])
    for n in range(3):
        b.add(n % 2, item(f"e{n}"), lease_deadline=60.0)
    assert await settle(sink)
    assert sorted(sink.sent) == [(0, ["e0", "e2"]), (1, ["e1"])]
    await b.stop()


async def test_results_wait_while_calls_are_queued_then_go_when_the_queue_drains() -> None:
    sink, clock, busy = Sink(), ManualClock(), [True]
    b = batcher(sink, clock, busy)
    b.add(0, item("e1"), lease_deadline=60.0)
    assert not await settle(sink, 0.3)  # a few polls: still held
    assert b.deferring()
    busy[0] = False
    assert await settle(sink)
    assert sink.sent == [(0, ["e1"])]
    await b.stop()


async def test_deferral_ends_at_defer_s_or_half_the_lease_left() -> None:
    sink, clock = Sink(), ManualClock()
    b = batcher(sink, clock, [True])
    b.add(0, item("e1"), lease_deadline=60.0)  # by DEFER_S: 10 s
    clock.advance(9.9)
    assert not await settle(sink, 0.2)
    clock.advance(0.2)
    assert await settle(sink)
    sink.arrived.clear()
    # A short lease: 1 s left, so the result goes within 0.5 s whatever DEFER_S says.
    b.add(0, item("e2"), lease_deadline=clock.monotonic() + 1.0)
    clock.advance(0.4)
    assert not await settle(sink, 0.2)
    clock.advance(0.2)
    assert await settle(sink)
    assert sink.sent == [(0, ["e1"]), (0, ["e2"])]
    await b.stop()


async def test_a_stalled_clock_cannot_hold_results_forever() -> None:
    sink, clock = Sink(), ManualClock()
    b = batcher(sink, clock, [True], defer_s=0.2)  # the clock never moves
    b.add(0, item("e1"))
    assert await settle(sink)  # after DEFER_S worth of polls
    await b.stop()


async def test_stop_reports_what_was_held() -> None:
    sink, clock = Sink(), ManualClock()
    b = batcher(sink, clock, [True])
    b.add(3, item("e1"), lease_deadline=60.0)
    await b.stop()
    assert sink.sent == [(3, ["e1"])]
