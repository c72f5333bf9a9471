"""The durability barrier: a dispatch waits for a flush that started after it asked."""

from __future__ import annotations

import asyncio

import pytest

from streams.barrier import DurabilityBarrier


def test_waiters_are_released_only_by_a_flush_that_began_after_them() -> None:
    log: list[str] = []

    async def run() -> None:
        gate = asyncio.Event()

        async def flush() -> None:
            log.append("flush-start")
            await gate.wait()
            gate.clear()
            log.append("flush-done")

        barrier = DurabilityBarrier(flush)
        barrier.start()
        first = asyncio.ensure_future(barrier.wait())
        await asyncio.sleep(0.01)  # the first flush is now in progress
        second = asyncio.ensure_future(barrier.wait())
        await asyncio.sleep(0.01)
        assert not first.done() and not second.done()
        gate.set()
        await first
        log.append("first-released")
        await asyncio.sleep(0.01)
        assert not second.done()  # its writes may postdate the first flush
        gate.set()
        await second
        log.append("second-released")
        await barrier.stop()
        assert barrier.flushes == 2

    asyncio.run(run())
    assert [e for e in log if e.startswith("flush")] == ["flush-start", "flush-done"] * 2
    assert log.index("second-released") > len(log) - 2
    assert log.index("first-released") > log.index("flush-done")


def test_a_failed_flush_fails_its_waiters() -> None:
    async def run() -> None:
        async def flush() -> None:
            raise ConnectionError("broker away")

        barrier = DurabilityBarrier(flush)
        barrier.start()
        with pytest.raises(ConnectionError):
            await barrier.wait()
        await barrier.stop()

    asyncio.run(run())
