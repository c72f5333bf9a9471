"""The per-host circuit breaker, on an injected clock, and through the executor with a real
HTTP runner against a closed loopback port."""

from __future__ import annotations

import asyncio
from typing import Any

from kron.clock import ManualClock, SystemClock
from kron.localkafka import free_ports
from streams.breaker import CircuitBreaker
from streams.engine.core import Dispatch
from streams.executor import Executor
from streams.targets import HttpRunner


def test_opens_when_most_recent_attempts_fail_and_half_opens_after_cooldown() -> None:
    clock = ManualClock(now_ms=1_000, monotonic=100.0)
    breaker = CircuitBreaker(clock=clock, window=20, min_samples=10, failure_ratio=0.5,
                             cooldown_s=30)
    for _ in range(5):
        assert breaker.record("h", ok=True) is None
    opened = None
    for _ in range(6):
        opened = breaker.record("h", ok=False) or opened
    assert opened is not None and opened["host"] == "h"
    assert opened["failure_ratio"] > 0.5 and opened["until_ms"] == 1_000 + 30_000
    assert not breaker.allow("h")
    assert breaker.allow("other")  # one host's trouble pauses only that host
    clock.advance(29.9)
    assert not breaker.allow("h")
    clock.advance(0.2)
    assert breaker.allow("h") and not breaker.is_open("h")


def test_few_samples_never_open() -> None:
    breaker = CircuitBreaker(clock=ManualClock(), min_samples=10)
    assert all(breaker.record("h", ok=False) is None for _ in range(9))
    assert breaker.allow("h")


def test_an_open_circuit_pauses_attempts_without_spending_them() -> None:
    """Nothing listens at first: 10 attempts fail ("connection refused") and trip the
    breaker. The 4 after it are not failed: they wait, each called once after the cooldown,
    when a server listens again, as the same attempt. Their lease (shorter than the pause)
    is extended first by a heartbeat, so the owner would not retry what is still held."""
    port = free_ports(1)[0]
    reports: list[tuple[str, dict[str, Any]]] = []
    arrivals: list[str] = []
    clock = SystemClock()

    async def report(partition: int, name: str, record: dict[str, Any], /,
                     **_: Any) -> None:
        reports.append((name, record))

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        arrivals.append((await reader.readline()).split()[1].decode().lstrip("/"))
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    async def run() -> None:
        runner = HttpRunner(allow_private=True)
        ex = Executor(runners={"http": runner}, report=report, clock=clock, worker_id="w",
                      concurrency=1)
        ex.breaker = CircuitBreaker(clock=clock, cooldown_s=1.0)
        ex.start()
        for i in range(14):
            ex.submit(Dispatch(exec_id=f"e{i}", job_id="j", tenant="t", scheduled_for_ms=0,
                               attempt=1, fencing_token=1, lease_s=0.6,
                               target={"url": f"http://127.0.0.1:{port}/e{i}",
                                       "timeout_s": 2}), 0)
        for _ in range(200):
            if ex.completed == 10 and ex.held == 4:
                break
            await asyncio.sleep(0.01)
        assert ex.completed == 10 and ex.held == 4 and ex.paused == 4
        server = await asyncio.start_server(handle, "127.0.0.1", port)
        try:
            for _ in range(400):
                if ex.completed == 14:
                    break
                await asyncio.sleep(0.01)
        finally:
            server.close()
            await ex.stop()
            await runner.close()

    asyncio.run(run())
    names = [n for n, _ in reports]
    assert names.count("kron.engine.CircuitOpened") == 1
    failed = [r for n, r in reports if n == "kron.executions.ExecutionFailed"]
    assert [r["exec_id"] for r in failed] == [f"e{i}" for i in range(10)]
    assert all(r["error_class"] == "transient" for r in failed)
    succeeded = [r for n, r in reports if n == "kron.executions.ExecutionSucceeded"]
    assert sorted(r["exec_id"] for r in succeeded) == [f"e{i}" for i in range(10, 14)]
    assert all(r["attempt"] == 1 for r in succeeded)
    assert sorted(arrivals) == [f"e{i}" for i in range(10, 14)]  # each called once
    beats = [r for n, r in reports if n == "kron.executions.ExecutionHeartbeat"]
    assert sorted(r["exec_id"] for r in beats) == [f"e{i}" for i in range(10, 14)]
    # Extended past the pause: the 0.6 s lease alone would have ended inside the 1 s.
    for beat in beats:
        assert beat["lease_until_ms"] - beat["envelope"]["occurred_at_ms"] >= 1_000
