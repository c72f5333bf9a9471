"""The dispatch queue's bound holds for commands too (issue 39): while the executor's queue
is full, the partition agent reads no command or report record (a trigger, a create due
now, a backfill would each add attempts), and goes on as soon as a runner takes one. The
real PartitionDriver.agent and the real Executor; Faust's stream and the lifecycle are
stand-ins (no broker: the loop's waiting is what is tested)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from kron.clock import SystemClock
from streams.domain.policies import Priority
from streams.engine.core import Dispatch
from streams.executor import Executor
from streams.partition_driver import PartitionDriver


class _Lifecycle:
    stopping = False

    def tune_fetches(self) -> bool:
        return True

    async def hold_lease(self) -> None:
        return None


class _Stream:
    def __init__(self, count: int) -> None:
        self.count = count

    async def events(self) -> Any:
        for i in range(self.count):
            yield SimpleNamespace(message=SimpleNamespace(value=b"", partition=0, offset=i,
                                                         topic="kron.commands"))


def _attempt(exec_id: str) -> Dispatch:
    return Dispatch(exec_id=exec_id, job_id="j", tenant="t", scheduled_for_ms=0, attempt=1,
                    fencing_token=1, target={"topic": "x"}, lease_s=30.0,
                    priority=Priority.NORMAL)


def _driver(executor: Executor, handled: list[int]) -> PartitionDriver:
    driver = PartitionDriver.__new__(PartitionDriver)
    driver._lifecycle = _Lifecycle()  # type: ignore[assignment]
    driver._fetches_decided = True
    driver.executor = executor
    decoded = SimpleNamespace(name="kron.commands.TriggerJob", record={})
    driver.batch_reader = SimpleNamespace(  # type: ignore[assignment]
        decode=lambda value: (decoded, None))

    def handle(msg: Any, decoded: Any) -> list[Any]:
        handled.append(msg.offset)
        return []

    async def apply(effects: list[Any], partition: int) -> None:
        return None

    driver._handle = handle  # type: ignore[method-assign]
    driver._apply = apply  # type: ignore[method-assign]
    return driver


def test_the_agent_reads_no_command_while_the_dispatch_queue_is_full() -> None:
    async def main() -> None:
        ex = Executor(runners={}, report=None, clock=SystemClock(),  # type: ignore[arg-type]
                      worker_id="w", max_queued=1)
        ex.submit(_attempt("a"), 0)
        assert ex.full
        handled: list[int] = []
        agent = asyncio.create_task(_driver(ex, handled).agent(_Stream(2)))
        await asyncio.sleep(0.05)
        assert handled == []  # waiting for room, the command unread
        assert await ex._queue.get() is not None  # a runner takes the attempt
        await asyncio.wait_for(agent, 1.0)
        assert handled == [0, 1]

    asyncio.run(main())


def test_the_agent_does_not_wait_while_there_is_room() -> None:
    async def main() -> None:
        ex = Executor(runners={}, report=None, clock=SystemClock(),  # type: ignore[arg-type]
                      worker_id="w", max_queued=2)
        ex.submit(_attempt("a"), 0)
        handled: list[int] = []
        await asyncio.wait_for(_driver(ex, handled).agent(_Stream(3)), 1.0)
        assert handled == [0, 1, 2]

    asyncio.run(main())
