"""Dispatch only after the writes that decided it are acknowledged by Kafka.

The agent records an attempt as started (a changelog write, buffered by the producer) and
then hands it to the executor. If the call went out before that record reached Kafka and
the worker died, the next owner would not know the attempt existed and would run the same
attempt number again. Waiting for one producer flush closes that window; concurrent
dispatches share each flush, so the cost is one broker round trip of latency, not
throughput.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from streams.tasks import cancel_and_wait


class DurabilityBarrier:
    def __init__(self, flush: Callable[[], Awaitable[None]]) -> None:
        self._flush = flush
        self._waiters: list[asyncio.Future[None]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._flushing = False
        self.flushes = 0

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    @property
    def pending(self) -> bool:
        """Is a dispatch waiting for its writes to be acknowledged?"""
        return bool(self._waiters) or self._flushing

    async def wait(self) -> None:
        """Returns once everything produced before this call is acknowledged."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self._wake.set()
        await fut

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            # Waiters registered from here on need the next flush, not this one.
            waiters, self._waiters = self._waiters, []
            self._flushing = True
            try:
                await self._flush()
            except Exception as exc:  # the broker is away: those attempts must not go out
                for w in waiters:
                    if not w.done():
                        w.set_exception(exc)
                continue
            finally:
                self._flushing = False
            self.flushes += 1
            for w in waiters:
                if not w.done():
                    w.set_result(None)
