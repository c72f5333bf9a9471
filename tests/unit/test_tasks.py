"""Stopping background tasks: every one cancelled, and ended before the stop returns."""

from __future__ import annotations

import asyncio

from streams.tasks import cancel_and_wait


def test_every_task_has_ended_when_the_stop_returns() -> None:
    unwound: list[int] = []

    async def worker(n: int) -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0)  # unwinding takes a turn of the loop
            unwound.append(n)

    async def run() -> None:
        done = asyncio.ensure_future(asyncio.sleep(0))
        await done
        tasks = [asyncio.ensure_future(worker(n)) for n in range(3)]
        await asyncio.sleep(0)
        await cancel_and_wait(None, done, *tasks)
        assert all(t.done() for t in tasks)
        assert sorted(unwound) == [0, 1, 2]

    asyncio.run(run())
