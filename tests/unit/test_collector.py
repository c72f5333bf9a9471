"""The idle collector: young collections wait for an idle worker, bounded by a forced one."""

from __future__ import annotations

import asyncio
import gc

from hypothesis import given
from hypothesis import strategies as st

from streams.collector import (
    FORCE_YOUNG,
    FULL_PATIENCE,
    IDLE_YOUNG,
    OLDER_THRESHOLDS,
    IdleCollector,
    generation_to_collect,
)


class FakeGc:
    """Counts as CPython keeps them: collecting generation g zeroes the counts up to g and
    adds one to the next older generation's."""

    def __init__(self, young: int = 0, since1: int = 0, since2: int = 0) -> None:
        self.count = [young, since1, since2]
        self.collected: list[int] = []
        self.enabled = True
        self.frozen = False

    def get_count(self) -> tuple[int, int, int]:
        return self.count[0], self.count[1], self.count[2]

    def collect(self, generation: int = 2) -> int:
        self.collected.append(generation)
        for g in range(generation + 1):
            self.count[g] = 0
        if generation < 2:
            self.count[generation + 1] += 1
        return 0

    def disable(self) -> None:
        self.enabled = False

    def freeze(self) -> None:
        self.frozen = True

    def enable(self) -> None:
        self.enabled = True


counts = st.tuples(st.integers(0, 4 * FORCE_YOUNG), st.integers(0, 60), st.integers(0, 60))


@given(count=counts, busy=st.booleans())
def test_young_collections_wait_for_idle_up_to_the_forced_size(
        count: tuple[int, int, int], busy: bool) -> None:
    generation = generation_to_collect(count, busy=busy)
    due = count[0] >= (FORCE_YOUNG if busy else IDLE_YOUNG)
    assert (generation is not None) == due
    if generation is not None:
        # The oldest generation whose younger neighbour passed its threshold, as CPython;
        # a busy worker's full pass waits up to FULL_PATIENCE times its threshold.
        full_at = OLDER_THRESHOLDS[1] * (FULL_PATIENCE if busy else 1)
        expected = (2 if count[2] > full_at
                    else 1 if count[1] > OLDER_THRESHOLDS[0] else 0)
        assert generation == expected


@given(steps=st.lists(st.tuples(st.integers(0, 60_000), st.booleans()), max_size=200))
def test_garbage_never_waits_past_the_forced_size_and_old_generations_get_their_turn(
        steps: list[tuple[int, bool]]) -> None:
    fake = FakeGc()
    busy = [False]
    collector = IdleCollector(busy=lambda: busy[0], collector=fake)
    for allocated, is_busy in steps:
        fake.count[0] += allocated
        busy[0] = is_busy
        collector.step()
        # After a step the young generation is below the bound that applies right now.
        assert fake.count[0] < (FORCE_YOUNG if is_busy else IDLE_YOUNG)
        assert fake.count[1] <= OLDER_THRESHOLDS[0] + 1
        assert fake.count[2] <= OLDER_THRESHOLDS[1] * FULL_PATIENCE + 1
    assert sum(collector.collections) == len(fake.collected)
    assert collector.forced <= len(fake.collected)


def test_a_busy_worker_is_not_paused_until_the_young_generation_is_large() -> None:
    fake = FakeGc(young=IDLE_YOUNG)
    busy = [True]
    collector = IdleCollector(busy=lambda: busy[0], collector=fake)
    assert collector.step() is None and fake.collected == []
    busy[0] = False
    assert collector.step() == 0 and fake.collected == [0]
    fake.count[0] = FORCE_YOUNG
    busy[0] = True
    assert collector.step() == 0 and collector.forced == 1


def test_a_full_pass_waits_for_idle_while_it_may() -> None:
    fake = FakeGc(young=FORCE_YOUNG, since2=OLDER_THRESHOLDS[1] + 1)
    busy = [True]
    collector = IdleCollector(busy=lambda: busy[0], collector=fake)
    assert collector.step() == 0  # forced young pass; the full one waits
    fake.count[0] = IDLE_YOUNG
    busy[0] = False
    assert collector.step() == 2 and fake.get_count() == (0, 0, 0)
    fake.count[:] = [FORCE_YOUNG, 0, OLDER_THRESHOLDS[1] * FULL_PATIENCE + 1]
    busy[0] = True
    assert collector.step() == 2  # waited as long as it may


def test_the_task_turns_automatic_collection_off_and_back_on() -> None:
    async def run() -> None:
        collector = IdleCollector(busy=lambda: False, poll_s=0.001)
        collector.start()
        try:
            assert not gc.isenabled()
            junk = [[i] for i in range(IDLE_YOUNG + 1000)]  # tracked and alive: counted
            for _ in range(100):
                await asyncio.sleep(0.002)
                if sum(collector.collections):
                    break
            assert sum(collector.collections) >= 1
            del junk
        finally:
            await collector.stop()
            gc.unfreeze()  # the test process's own objects go back to being collected
        assert gc.isenabled()

    asyncio.run(run())


def test_a_failing_step_hands_collection_back_to_cpython() -> None:
    class Broken(FakeGc):
        def get_count(self) -> tuple[int, int, int]:
            raise RuntimeError("boom")

    async def run() -> Broken:
        fake = Broken()
        collector = IdleCollector(busy=lambda: False, poll_s=0.001, collector=fake)
        collector.start()
        assert not fake.enabled and fake.frozen
        await asyncio.sleep(0.02)
        assert collector._task is not None and collector._task.done()
        await collector.stop()
        return fake

    assert asyncio.run(run()).enabled
