"""The executor's fair queue: round-robin across tenants, one wake-up per item, none lost."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.executor import FairQueue, Job


def _job(n: int) -> Job:
    return Job(dispatch=n, partition=0, lease_deadline=0.0)  # type: ignore[arg-type]


def test_tenants_take_turns() -> None:
    async def main() -> list[int]:
        q = FairQueue()
        for i in range(3):
            q.put("flood", _job(i))
        q.put("quiet", _job(100))
        return [(await q.get()).dispatch for _ in range(4)]  # type: ignore[misc]

    assert asyncio.run(main()) == [0, 100, 1, 2]


@settings(max_examples=60, deadline=None)
@given(getters=st.integers(1, 64), items=st.integers(0, 200), cancel=st.integers(0, 16))
def test_every_item_reaches_a_getter(getters: int, items: int, cancel: int) -> None:
    """Idle getters, some cancelled while waiting: each item is taken exactly once."""

    async def main() -> tuple[list[int], int]:
        q = FairQueue()
        got: list[int] = []

        async def getter() -> None:
            while True:
                got.append((await q.get()).dispatch)  # type: ignore[arg-type]
                await asyncio.sleep(0)

        tasks = [asyncio.ensure_future(getter()) for _ in range(getters)]
        await asyncio.sleep(0)
        for t in tasks[:min(cancel, getters - 1)]:
            t.cancel()
        for i in range(items):
            q.put(f"t{i % 3}", _job(i))
            if i % 7 == 0:
                await asyncio.sleep(0)
        for _ in range(items + 10):
            await asyncio.sleep(0)
        size = q.size
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return got, size

    got, left = asyncio.run(main())
    assert sorted(got) == list(range(items))
    assert left == 0


def test_one_put_wakes_one_getter() -> None:
    async def main() -> int:
        q = FairQueue()
        woken = 0

        async def getter() -> None:
            nonlocal woken
            await q.get()
            woken += 1

        tasks = [asyncio.ensure_future(getter()) for _ in range(50)]
        await asyncio.sleep(0)
        q.put("a", _job(1))
        for _ in range(5):
            await asyncio.sleep(0)
        n = woken
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return n

    assert asyncio.run(main()) == 1
