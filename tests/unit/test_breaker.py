"""The per-host circuit breaker, on an injected clock, and through the executor with a real
HTTP runner against a closed loopback port."""

from __future__ import annotations

import asyncio
from typing import Any

from kron.clock import ManualClock
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


def test_executor_reports_circuit_opened_and_fails_fast_while_open() -> None:
    port = free_ports(1)[0]  # nothing listens: every attempt is "connection refused"
    reports: list[tuple[str, dict[str, Any]]] = []

    async def report(partition: int, name: str, record: dict[str, Any], /,
                     **_: Any) -> None:
        reports.append((name, record))

    async def run() -> None:
        runner = HttpRunner(allow_private=True)
        ex = Executor(runners={"http": runner}, report=report, clock=ManualClock(
            now_ms=1, monotonic=1.0), worker_id="w", concurrency=1)
        ex.start()
        for i in range(14):
            ex.submit(Dispatch(exec_id=f"e{i}", job_id="j", tenant="t", scheduled_for_ms=0,
                               attempt=1, fencing_token=1, lease_s=60.0,
                               target={"url": f"http://127.0.0.1:{port}/", "timeout_s": 2}), 0)
        for _ in range(400):
            if ex.completed == 14:
                break
            await asyncio.sleep(0.01)
        await ex.stop()
        await runner.close()

    asyncio.run(run())
    names = [n for n, _ in reports]
    assert names.count("kron.engine.CircuitOpened") == 1
    failed = [r for n, r in reports if n == "kron.executions.ExecutionFailed"]
    assert len(failed) == 14 and all(r["error_class"] == "transient" for r in failed)
    fast = [r for r in failed if r["error"].startswith("circuit open")]
    assert len(fast) == 14 - 10  # the 10th failure tripped it; the rest never dialled
