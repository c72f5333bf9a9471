"""Attempts decided ahead of their slot (fire-ahead): the executor holds each until its due
time, and a cancel while held means it is never called. Real HTTP runner, real loopback
server, the system clock: the test asserts order in time, not speed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from kron.clock import SystemClock
from streams.engine.core import Dispatch
from streams.executor import Executor
from streams.targets import HttpRunner


@asynccontextmanager
async def receiver() -> AsyncIterator[tuple[str, dict[str, int]]]:
    """Answers 200 and records when each path arrived (wall-clock ms)."""
    arrivals: dict[str, int] = {}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        path = line.split()[1].decode().lstrip("/")
        arrivals[path] = time.time_ns() // 1_000_000
        if path.startswith("hang"):
            await asyncio.sleep(3600)
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", arrivals
    finally:
        server.close()


clock = SystemClock()


def dispatch(base: str, exec_id: str, not_before_ms: int) -> Dispatch:
    return Dispatch(exec_id=exec_id, job_id="j", tenant="t", scheduled_for_ms=not_before_ms,
                    attempt=1, fencing_token=1, lease_s=10.0, not_before_ms=not_before_ms,
                    target={"url": f"{base}/{exec_id}", "timeout_s": 10})


def started_executor(reports: list[tuple[str, dict[str, Any]]], *,
                     concurrency: int) -> tuple[Executor, HttpRunner]:
    """A running pool whose reports land in `reports`; stop it and close the runner."""
    async def report(partition: int, name: str, record: dict[str, Any], /,
                     **_: Any) -> None:
        reports.append((name, record))

    runner = HttpRunner(allow_private=True)
    ex = Executor(runners={"http": runner}, report=report, clock=clock, worker_id="w",
                  concurrency=concurrency)
    ex.start()
    return ex, runner


def test_held_attempts_go_out_at_their_due_time_and_a_cancelled_one_never() -> None:
    reports: list[tuple[str, dict[str, Any]]] = []

    async def run() -> dict[str, int]:
        async with receiver() as (base, arrivals):
            ex, runner = started_executor(reports, concurrency=4)
            now = clock.now_ms()
            due = {"late": now + 600, "soon": now + 300, "past": now - 50, "gone": now + 400}
            for exec_id, at in due.items():
                ex.submit(dispatch(base, exec_id, at), 0)
            assert ex.held == 3  # "past" went straight to the queue
            ex.cancel("gone")
            assert ex.held == 2
            for _ in range(300):
                if len(reports) == 3:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)  # "gone" would have been called by now
            await ex.stop()
            await runner.close()
            for exec_id in arrivals:
                assert arrivals[exec_id] >= due[exec_id], (exec_id, arrivals, due)
            return arrivals

    arrivals = asyncio.run(run())
    assert sorted(arrivals) == ["late", "past", "soon"]
    assert arrivals["past"] <= arrivals["soon"] <= arrivals["late"]
    assert sorted(r["exec_id"] for _, r in reports) == ["late", "past", "soon"]
    assert all(name == "kron.executions.ExecutionSucceeded" for name, _ in reports)
    # Each attempt's reported start is its call, not its decision.
    starts = {r["exec_id"]: r["started_at_ms"] for _, r in reports}
    assert starts["soon"] >= starts["past"] and starts["late"] >= starts["soon"]


def test_an_attempt_cancelled_while_queued_is_never_called() -> None:
    """The pool's one runner is busy with a call that never answers; the next attempt
    waits in the queue when the owner cancels it (a pause or delete just after its due
    time): it must not go out once the runner is free."""
    reports: list[tuple[str, dict[str, Any]]] = []

    async def run() -> dict[str, int]:
        async with receiver() as (base, arrivals):
            ex, runner = started_executor(reports, concurrency=1)
            now = clock.now_ms()
            ex.submit(dispatch(base, "hang", now - 10), 0)
            ex.submit(dispatch(base, "queued", now - 10), 0)
            for _ in range(300):
                if "hang" in arrivals:
                    break
                await asyncio.sleep(0.01)
            assert ex.backlog == 1
            ex.cancel("queued")
            ex.cancel("hang")  # frees the runner
            for _ in range(50):
                await asyncio.sleep(0.01)
            await ex.stop()
            await runner.close()
            return arrivals

    arrivals = asyncio.run(run())
    assert sorted(arrivals) == ["hang"]
    assert [(r["exec_id"], r["error_class"]) for _, r in reports] == [("hang", "cancelled")]


def test_a_held_spike_is_released_in_chunks_with_a_critical_call_first() -> None:
    """5,000 of tenant A's calls and one of B's critical call held for the same time: the
    runner's first call is B's (higher tiers first within a release bucket, RELEASE_CHUNK
    a turn of the loop), and no call is made before its due time."""
    from streams.domain.policies import Priority

    calls: list[tuple[str, int, int]] = []  # (exec id, at ms, attempts still held)

    class Recorder:
        async def run(self, target: dict[str, Any], info: Any) -> Any:
            from streams.targets import Outcome
            calls.append((info.exec_id, clock.now_ms(), ex.held))
            return Outcome(ok=True)

    async def noop(*_: Any, **__: Any) -> None:
        return None

    async def run() -> None:
        global ex
        ex = Executor(runners={"http": Recorder()}, report=noop,  # type: ignore[dict-item]
                      clock=clock, worker_id="w", concurrency=1)
        ex.start()
        puts: list[str] = []
        put = ex._queue.put

        def spy(tenant: str, job: Any, tier: str) -> None:
            puts.append(job.dispatch.exec_id)
            put(tenant, job, tier)

        ex._queue.put = spy  # type: ignore[method-assign]
        # Far enough ahead that all 5,001 are held before the first is due on a loaded
        # host (300 ms was not: a run beside a fault test released some of A's before B's
        # was submitted).
        due = clock.now_ms() + 1_500
        for i in range(5_000):
            ex.submit(Dispatch(exec_id=f"a{i}", job_id="j", tenant="A", scheduled_for_ms=due,
                               attempt=1, fencing_token=1, lease_s=30.0, not_before_ms=due,
                               target={"url": "http://x.invalid/"}), 0)
        ex.submit(Dispatch(exec_id="b-critical", job_id="k", tenant="B", scheduled_for_ms=due,
                           attempt=1, fencing_token=1, lease_s=30.0, not_before_ms=due,
                           target={"url": "http://x.invalid/"}, priority=Priority.CRITICAL), 0)
        for _ in range(1_000):
            if len(calls) >= 2:
                break
            await asyncio.sleep(0.01)
        await ex.stop()
        assert calls[0][0] == "b-critical", calls[:3]
        assert all(at >= due for _, at, _ in calls)
        # Queued first though submitted last (a bucket's higher tier first).
        assert puts[0] == "b-critical" and len(puts) > 1

    asyncio.run(run())


class Clock:
    """now_ms and monotonic set apart, as the wall clock's ms floor and the monotonic clock
    are in a worker."""

    def __init__(self, now_ms: int, mono: float) -> None:
        self.ms, self.mono = now_ms, mono

    def now_ms(self) -> int:
        return self.ms

    def monotonic(self) -> float:
        return self.mono


def held_executor(c: Clock) -> tuple[Executor, list[str]]:
    """An executor with no runners started: what its release puts in the queue, in order."""
    async def noop(*_: Any, **__: Any) -> None:
        return None

    ex = Executor(runners={}, report=noop, clock=c, worker_id="w")
    puts: list[str] = []
    put = ex._queue.put

    def spy(tenant: str, job: Any, tier: str) -> None:
        puts.append(job.dispatch.exec_id)
        put(tenant, job, tier)

    ex._queue.put = spy  # type: ignore[method-assign,assignment]
    return ex, puts


def one(exec_id: str, tenant: str, due: int, priority: Any = None) -> Dispatch:
    extra = {} if priority is None else {"priority": priority}
    return Dispatch(exec_id=exec_id, job_id="j", tenant=tenant, scheduled_for_ms=due,
                    attempt=1, fencing_token=1, lease_s=30.0, not_before_ms=due,
                    target={"url": "http://x.invalid/"}, **extra)


def release_all(ex: Executor, c: Clock, at: float) -> None:
    c.mono = at
    for _ in range(100):
        ex._release()
        if not ex.held:
            return


def test_calls_due_at_the_same_ms_share_a_bucket_whatever_their_release_estimate() -> None:
    """The release time carries the wall clock's ms floor: two calls due at the same ms,
    submitted half a ms apart, got release times 2.5 ms apart and, across a bucket edge
    of the monotonic clock, B's critical call went after all 600 of A's normal ones."""
    from streams.domain.policies import Priority

    async def run() -> None:
        c = Clock(now_ms=1_000, mono=0.0)
        ex, puts = held_executor(c)
        due = 1_019  # A's release: 0.019 s, under the 0.020 edge
        for i in range(600):
            ex.submit(one(f"a{i}", "A", due), 0)
        c.mono = 0.0025  # the monotonic clock moved on; the wall clock's ms had not
        ex.submit(one("b", "B", due, Priority.CRITICAL), 0)  # release 0.0205
        release_all(ex, c, 0.03)
        assert puts[0] == "b", puts[:3]
        assert len(puts) == 601

    asyncio.run(run())


def test_a_bucket_releases_each_tiers_tenants_in_turn() -> None:
    """A's 1,000 normal calls submitted before B's 3 at the same due time: B's are among
    the first six released, so the queue's weights apply to them at once (in submit order
    they came in the spike's second chunk)."""
    async def run() -> None:
        c = Clock(now_ms=0, mono=0.0)
        ex, puts = held_executor(c)
        for i in range(1_000):
            ex.submit(one(f"a{i}", "A", 500), 0)
        for i in range(3):
            ex.submit(one(f"b{i}", "B", 500), 0)
        assert not ex.releases_within(0.4) and ex.releases_within(0.5)
        release_all(ex, c, 0.5)
        assert {"b0", "b1", "b2"} <= set(puts[:6]), puts[:6]
        assert [p for p in puts if p.startswith("a")] == [f"a{i}" for i in range(1_000)]
        assert not ex.releases_within(10.0)

    asyncio.run(run())


def test_a_bucket_goes_when_its_earliest_call_is_due_not_at_its_start() -> None:
    """Released at the bucket's start, calls slept out the rest in their runners and woke in
    the timer heap's order; at its earliest due time none need to."""
    async def run() -> None:
        c = Clock(now_ms=0, mono=0.0)
        ex, puts = held_executor(c)
        ex.submit(one("x", "A", 517), 0)  # bucket [500, 520)
        ex.submit(one("y", "A", 505), 0)
        c.mono = 0.5049
        ex._release()
        assert puts == []
        c.mono = 0.505
        ex._release()
        assert puts == ["x", "y"] or puts == ["y", "x"]

    asyncio.run(run())


def test_held_http_calls_have_their_connections_opened_while_they_wait() -> None:
    """What the executor asks of its HTTP runner's warm: every call of a bucket to an origin
    (both paths together), again when more are held; a bucket due later than WARM_LEAD_S
    only at that lead (its head-bucket timer)."""
    asks: list[dict[str, int]] = []

    class Warm:
        def warm(self, calls: dict[str, int]) -> None:
            asks.append(dict(calls))

    async def run() -> None:
        async def noop(*_: Any, **__: Any) -> None:
            return None

        c = Clock(now_ms=0, mono=0.0)
        ex = Executor(runners={"http": Warm()}, report=noop,  # type: ignore[dict-item]
                      clock=c, worker_id="w")
        for i, path in enumerate(["a", "b", "a"]):
            ex.submit(Dispatch(exec_id=f"e{i}", job_id="j", tenant="t", scheduled_for_ms=500,
                               attempt=1, fencing_token=1, lease_s=30.0, not_before_ms=500,
                               target={"url": f"http://h.example:81/{path}"}), 0)
        for _ in range(3):
            await asyncio.sleep(0)
        assert len(asks) == 1 and list(asks[0].values()) == [3]
        ex.submit(Dispatch(exec_id="e3", job_id="j", tenant="t", scheduled_for_ms=500,
                           attempt=1, fencing_token=1, lease_s=30.0, not_before_ms=500,
                           target={"url": "http://h.example:81"}), 0)
        for _ in range(3):
            await asyncio.sleep(0)
        assert list(asks[1].values()) == [4]
        # Due in 3 s: not warmed yet (the pool closes connections idle for 4 s), but
        # WARM_LEAD_S before it goes.
        ex.submit(Dispatch(exec_id="e4", job_id="j", tenant="t", scheduled_for_ms=3_000,
                           attempt=1, fencing_token=1, lease_s=30.0, not_before_ms=3_000,
                           target={"url": "http://later.example/x"}), 0)
        for _ in range(3):
            await asyncio.sleep(0)
        assert len(asks) == 2
        release_all(ex, c, 0.5)  # the bucket at 500 goes; the one at 3 s is the head
        for _ in range(3):
            await asyncio.sleep(0)
        assert len(asks) == 2 and ex._warm_at is not None
        ex._warm_at._run()  # its timer (2 s ahead, asyncio's clock): run it now
        assert asks[2] == {"http://later.example/x": 1}

    asyncio.run(run())
