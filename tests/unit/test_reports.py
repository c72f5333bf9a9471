"""ResultBatcher: results go in batches; successful results of `allow` jobs wait while the
executor still has calls queued, but never past DEFER_S or half the owner's lease left less
a margin; a failed send keeps its results.

Time is a ManualClock; the batcher's own polls are real but short (DEFER_POLL_S)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from kron.clock import ManualClock
from schemas import codec
from streams.domain.retry import ErrorClass
from streams.engine.core import Dispatch
from streams.executor import Executor
from streams.reports import ResultBatcher
from streams.targets import AttemptInfo, Outcome


class Sink:
    def __init__(self, *, fail_first: int = 0, block_first: bool = False) -> None:
        self.sent: list[tuple[int, list[str]]] = []
        self.arrived = asyncio.Event()
        self.calls = 0
        self._fail_first = fail_first
        self._block_first = block_first
        self.blocked = asyncio.Event()

    async def __call__(self, partition: int, value: bytes) -> None:
        self.calls += 1
        if self.calls <= self._fail_first:
            raise OSError("broker unreachable")
        if self._block_first and self.calls == 1:
            self.blocked.set()
            await asyncio.sleep(3600)  # cancelled by stop()
        record = codec.decode(value).record
        self.sent.append((partition, [r["exec_id"] for r in record["results"]]))
        self.arrived.set()


def item(exec_id: str) -> dict[str, Any]:
    return {"exec_id": exec_id, "job_id": "j", "scheduled_for_ms": 0, "attempt": 1,
            "fencing_token": 1, "ok": True, "started_at_ms": 0, "finished_at_ms": 1,
            "status_code": 200, "error_class": None, "error": None, "retry_after_s": None,
            "output": ""}


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
        b.add(n % 2, item(f"e{n}"), wait_until_lease_ms=60_000)
    assert await settle(sink)
    assert sorted(sink.sent) == [(0, ["e0", "e2"]), (1, ["e1"])]
    await b.stop()


async def test_results_wait_while_calls_are_queued_then_go_when_the_queue_drains() -> None:
    sink, clock, busy = Sink(), ManualClock(), [True]
    b = batcher(sink, clock, busy)
    b.add(0, item("e1"), wait_until_lease_ms=60_000)
    assert not await settle(sink, 0.3)  # a few polls: still held
    assert b.deferring()
    busy[0] = False
    assert await settle(sink)
    assert sink.sent == [(0, ["e1"])]
    await b.stop()


async def held_for(sink: Sink, clock: ManualClock, seconds: float) -> None:
    """Still held 0.1 s before `seconds` have passed, sent 0.1 s after."""
    clock.advance(seconds - 0.1)
    assert not await settle(sink, 0.2)
    clock.advance(0.2)
    assert await settle(sink)
    sink.arrived.clear()


async def test_deferral_ends_at_defer_s_or_half_the_lease_left_less_a_margin() -> None:
    sink, clock = Sink(), ManualClock()
    b = batcher(sink, clock, [True])
    b.add(0, item("e1"), wait_until_lease_ms=60_000)  # by DEFER_S: 10 s
    await held_for(sink, clock, 10.0)
    # 4 s of lease left: 4 / 2 - 1 = 1 s of waiting, whatever DEFER_S says.
    b.add(0, item("e2"), wait_until_lease_ms=clock.now_ms() + 4_000)
    await held_for(sink, clock, 1.0)
    # 2 s left: no waiting at all. And a result that may not wait (a failure, a job whose
    # overlap policy looks at what runs) takes every held one with it.
    b.add(0, item("e3"), wait_until_lease_ms=clock.now_ms() + 2_000)
    assert await settle(sink)
    sink.arrived.clear()
    b.add(0, item("e4"), wait_until_lease_ms=60_000 + clock.now_ms())
    b.add(0, item("e5"))
    assert await settle(sink)
    assert sink.sent == [(0, ["e1"]), (0, ["e2"]), (0, ["e3"]), (0, ["e4", "e5"])]
    await b.stop()


async def test_a_stalled_clock_cannot_hold_results_forever() -> None:
    sink, clock = Sink(), ManualClock()
    b = batcher(sink, clock, [True], defer_s=0.2)  # the clock never moves
    b.add(0, item("e1"), wait_until_lease_ms=60_000)
    assert await settle(sink)  # after DEFER_S worth of polls
    await b.stop()


async def test_stop_reports_what_was_held() -> None:
    sink, clock = Sink(), ManualClock()
    b = batcher(sink, clock, [True])
    b.add(3, item("e1"), wait_until_lease_ms=60_000)
    await b.stop()
    assert sink.sent == [(3, ["e1"])]


async def test_a_failed_send_keeps_its_results_in_order() -> None:
    sink, clock = Sink(fail_first=1), ManualClock()
    b = batcher(sink, clock, [False])
    b.add(0, item("e1"))
    for _ in range(100):  # bounded: the first send fails at once
        if sink.calls:
            break
        await asyncio.sleep(0.01)
    b.add(0, item("e2"))  # newer: goes after the ones put back
    assert await settle(sink)  # after RETRY_SEND_S
    assert sink.sent == [(0, ["e1", "e2"])]
    await b.stop()


async def test_stop_sends_a_batch_its_cancel_cut_short() -> None:
    sink, clock = Sink(block_first=True), ManualClock()
    b = batcher(sink, clock, [False])
    b.add(1, item("e1"))
    await asyncio.wait_for(sink.blocked.wait(), 2)
    await b.stop()
    assert sink.sent == [(1, ["e1"])]


class Scripted:
    """A stand-in runner: this test is about what the executor tells the batcher, not
    about calls (the real runners are tested against real targets elsewhere)."""

    def __init__(self, outcomes: dict[str, Outcome]) -> None:
        self.outcomes = outcomes

    async def run(self, target: dict[str, Any], info: AttemptInfo) -> Outcome:
        return self.outcomes[info.exec_id]


async def test_the_executor_lets_only_successes_of_allow_jobs_wait() -> None:
    told: dict[str, int | None] = {}

    async def report(partition: int, name: str, record: dict[str, Any], /, *,
                     wait_until_lease_ms: int | None = None) -> None:
        told[record["exec_id"]] = wait_until_lease_ms

    ok, failed = Outcome(ok=True, status_code=200), Outcome(ok=False, error="HTTP 500",
                                                            error_class=ErrorClass.TRANSIENT)
    runner = Scripted({"ok": ok, "failed": failed, "skip": ok})
    ex = Executor(runners={"http": runner}, report=report, clock=ManualClock(now_ms=1),
                  worker_id="w", concurrency=2)
    ex.start()
    for exec_id, may_wait in (("ok", True), ("failed", True), ("skip", False)):
        ex.submit(Dispatch(exec_id=exec_id, job_id="j", tenant="t", scheduled_for_ms=0,
                           attempt=1, fencing_token=1, lease_s=60.0,
                           target={"url": "http://x.example/"}, lease_until_ms=60_001,
                           result_may_wait=may_wait), 0)
    for _ in range(200):  # bounded: three calls to a stand-in
        if len(told) == 3:
            break
        await asyncio.sleep(0.005)
    await ex.stop()
    assert told == {"ok": 60_001, "failed": None, "skip": None}


async def test_batches_for_owned_partitions_are_applied_here_and_the_rest_sent() -> None:
    """The engine's `apply` takes a batch (returns True) or declines it (False): only the
    declined ones become signals, each result exactly once either way."""
    sink, clock = Sink(), ManualClock()
    applied: list[tuple[int, list[str]]] = []

    async def apply(partition: int, record: dict[str, Any]) -> bool:
        if partition != 0:
            return False  # not ours
        applied.append((partition, [r["exec_id"] for r in record["results"]]))
        return True

    b = ResultBatcher(send=sink, clock=clock, worker_id="w", apply=apply)
    b.start()
    for n in range(4):
        b.add(n % 2, item(f"e{n}"))
    assert await settle(sink)
    await b.stop()
    assert applied == [(0, ["e0", "e2"])] and sink.sent == [(1, ["e1", "e3"])]
    assert (b.applied, b.batches, b.results) == (1, 2, 4)


async def test_the_calls_get_a_turn_between_batches_applied_here() -> None:
    """Applying a batch here runs without suspending; a flush of many batches must still
    let the event loop's other tasks (the executor's runners) run between them."""
    sink, clock = Sink(), ManualClock()
    turns = 0
    seen: list[int] = []

    async def apply(partition: int, record: dict[str, Any]) -> bool:
        seen.append(turns)
        return True

    async def runner() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    b = ResultBatcher(send=sink, clock=clock, worker_id="w", apply=apply, max_batch=2)
    for n in range(8):
        b.add(0, item(f"e{n}"))
    task = asyncio.ensure_future(runner())
    await asyncio.sleep(0)
    await b.stop()  # flushes what is pending: four batches
    task.cancel()
    assert len(seen) == 4
    assert all(later > earlier for earlier, later in itertools.pairwise(seen)), seen
