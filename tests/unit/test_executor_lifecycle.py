"""Stopping the executor pool and cancelling one attempt, with the real HTTP runner against a
loopback server that accepts and never answers (an attempt stays in flight)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from kron.clock import ManualClock
from streams.engine.core import Dispatch
from streams.executor import Executor
from streams.targets import HttpRunner


@asynccontextmanager
async def silent_server() -> AsyncIterator[tuple[str, asyncio.Event]]:
    """Accepts a request and never answers it; `arrived` is set when a request came in."""
    arrived = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        arrived.set()
        await asyncio.sleep(3600)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/hang", arrived
    finally:
        server.close()


def dispatch(url: str) -> Dispatch:
    return Dispatch(exec_id="e1", job_id="j", tenant="t", scheduled_for_ms=0, attempt=1,
                    fencing_token=1, lease_s=600.0, target={"url": url, "timeout_s": 300})


async def in_flight(url: str, arrived: asyncio.Event,
                    reports: list[tuple[str, dict[str, Any]]]) -> tuple[Executor, HttpRunner]:
    async def report(partition: int, name: str, record: dict[str, Any], /,
                     **_: Any) -> None:
        reports.append((name, record))

    runner = HttpRunner(allow_private=True)
    ex = Executor(runners={"http": runner}, report=report,
                  clock=ManualClock(now_ms=1, monotonic=1.0), worker_id="w", concurrency=4)
    ex.start()
    ex.submit(dispatch(url), 0)
    await asyncio.wait_for(arrived.wait(), 10)
    return ex, runner


def test_stop_returns_while_an_attempt_is_in_flight() -> None:
    """A SIGTERM'd worker once hung here: the pool task took the stop's cancellation for the
    attempt's own cancel, reported it and went back to waiting on the queue."""
    reports: list[tuple[str, dict[str, Any]]] = []

    async def run() -> None:
        async with silent_server() as (url, arrived):
            ex, runner = await in_flight(url, arrived, reports)
            await asyncio.wait_for(ex.stop(), 10)
            await runner.close()

    asyncio.run(run())
    # Stopped, not finished: no outcome is reported, the owner's lease timer retries it.
    assert reports == []


def test_cancelling_one_attempt_reports_it_and_keeps_the_pool() -> None:
    reports: list[tuple[str, dict[str, Any]]] = []

    async def run() -> None:
        async with silent_server() as (url, arrived):
            ex, runner = await in_flight(url, arrived, reports)
            ex.cancel("e1")
            for _ in range(500):
                if reports:
                    break
                await asyncio.sleep(0.01)
            assert ex.completed == 1
            await asyncio.wait_for(ex.stop(), 10)
            await runner.close()

    asyncio.run(run())
    assert [n for n, _ in reports] == ["kron.executions.ExecutionFailed"]
    assert reports[0][1]["error_class"] == "cancelled"


def test_a_cancel_and_a_stop_together_stop_the_runner() -> None:
    """The call runs in its runner's own task, so the engine's cancel and the pool's stop
    cancel the same task: with both, the stop still returns, and the cancel (repeated
    before it lands) is reported at most once."""
    reports: list[tuple[str, dict[str, Any]]] = []

    async def run() -> None:
        async with silent_server() as (url, arrived):
            ex, runner = await in_flight(url, arrived, reports)
            assert ex.in_flight == 1
            ex.cancel("e1")
            ex.cancel("e1")
            await asyncio.wait_for(ex.stop(), 10)
            assert ex.in_flight == 0
            await runner.close()

    asyncio.run(run())
    assert [r["error_class"] for _, r in reports] in ([], ["cancelled"])


def test_a_cancelled_call_frees_its_runner_for_the_next() -> None:
    """After the engine's cancel the same runner task takes the next attempt (concurrency 1):
    the cancel was taken back (uncancel), not left pending on the pool's task."""
    reports: list[tuple[str, dict[str, Any]]] = []

    async def run() -> None:
        async with silent_server() as (url, arrived):
            async def report(partition: int, name: str, record: dict[str, Any], /,
                             **_: Any) -> None:
                reports.append((name, record))

            runner = HttpRunner(allow_private=True)
            ex = Executor(runners={"http": runner}, report=report,
                          clock=ManualClock(now_ms=1, monotonic=1.0), worker_id="w",
                          concurrency=1)
            ex.start()
            ex.submit(dispatch(url), 0)
            await asyncio.wait_for(arrived.wait(), 10)
            arrived.clear()
            ex.cancel("e1")
            second = Dispatch(exec_id="e2", job_id="j", tenant="t", scheduled_for_ms=0,
                              attempt=1, fencing_token=1, lease_s=600.0,
                              target={"url": url, "timeout_s": 300})
            ex.submit(second, 0)
            await asyncio.wait_for(arrived.wait(), 10)  # the one runner called e2
            assert ex.in_flight == 1
            await asyncio.wait_for(ex.stop(), 10)
            await runner.close()

    asyncio.run(run())
    assert [(n, r["exec_id"], r["error_class"]) for n, r in reports] == [
        ("kron.executions.ExecutionFailed", "e1", "cancelled")]
