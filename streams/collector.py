"""The cyclic garbage collector runs between spikes, not inside them.

CPython collects the young generation when allocations cross its threshold, and a spike is
when they do: at 500 executions/s due at the top of each second, a young collection paused
the event loop for 11-20 ms (timed with gc.callbacks) while the second's slots were being
decided, and that second's last call left 144 ms after its due time, against 75-110 ms for
the seconds without one. Spikes hit by a pause are what a p99 is made of.

Full collections also paused the loop for 56-155 ms in a burst of 20,000, mostly walking
what start-up built (modules, Faust's services, schemas): that is frozen when the collector
starts, and never walked again. A young generation of 50,000 objects instead of CPython's
700 then left young passes of 6-15 ms in the same burst (last call 1.9 -> 1.2 s, p50
1.07 -> 0.69 s).

Here automatic collection is off and a task collects instead:
- once IDLE_YOUNG objects wait in the young generation and the worker is idle (nothing is
  being decided, no call waits for a runner or for its writes to be acknowledged);
- under load that never pauses, once FORCE_YOUNG wait, idle or not: CPython's threshold
  as the worker set it before, so a busy worker collects no later than it did.
Older generations follow CPython's rule: a generation is collected with the younger ones
once the one below it has been collected more often than its threshold. A full pass walks
every cached record and plan, so while
the worker is busy it waits for an idle moment, up to FULL_PATIENCE times its threshold.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable
from typing import Protocol

from streams.tasks import cancel_and_wait

log = logging.getLogger("kron.collector")

IDLE_YOUNG = 25_000
FORCE_YOUNG = 50_000
POLL_S = 0.025
OLDER_THRESHOLDS = (20, 20)
FULL_PATIENCE = 4


class GarbageCollector(Protocol):
    """The parts of the gc module used here (tests pass their own)."""

    def get_count(self) -> tuple[int, int, int]: ...
    def collect(self, generation: int = 2) -> int: ...
    def disable(self) -> None: ...
    def freeze(self) -> None: ...
    def enable(self) -> None: ...


def generation_to_collect(count: tuple[int, int, int], *, busy: bool,
                          idle_young: int = IDLE_YOUNG, force_young: int = FORCE_YOUNG,
                          older: tuple[int, int] = OLDER_THRESHOLDS) -> int | None:
    """Which generation to collect now, if any: the oldest whose younger neighbour has
    been collected more than its threshold, once the young one is due; a full pass waits
    for an idle moment while it may."""
    young, since_gen1, since_gen2 = count
    if young < (force_young if busy else idle_young):
        return None
    if since_gen2 > older[1] * (FULL_PATIENCE if busy else 1):
        return 2
    if since_gen1 > older[0]:
        return 1
    return 0


class IdleCollector:
    def __init__(self, *, busy: Callable[[], bool], poll_s: float = POLL_S,
                 collector: GarbageCollector | None = None) -> None:
        self._busy = busy
        self._poll_s = poll_s
        self._gc: GarbageCollector = collector if collector is not None else gc
        self._task: asyncio.Task[None] | None = None
        self.collections = [0, 0, 0]  # per generation
        self.forced = 0  # collections made while busy

    def start(self) -> None:
        """Call once start-up is done: what exists now is frozen out of every pass."""
        self._gc.freeze()
        self._gc.disable()
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._gc.enable()

    def step(self) -> int | None:
        """Collect if one is due now; returns the generation collected."""
        busy = self._busy()
        generation = generation_to_collect(self._gc.get_count(), busy=busy)
        if generation is not None:
            self._gc.collect(generation)
            self.collections[generation] += 1
            self.forced += busy
        return generation

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._poll_s)
            try:
                self.step()
            except Exception:  # never leave the worker without a collector
                log.exception("garbage collection step failed; collecting as CPython does")
                self._gc.enable()
                return
