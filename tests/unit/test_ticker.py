"""The ticker outlives its own errors. The engine around it is a stand-in (the ticker reads
only its lease, owned partitions, timer index and signals topic); the real path is covered
by the integration and fault suites."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from kron.clock import ManualClock
from schemas import codec
from streams import ticker as ticker_mod
from streams.ticker import Ticker


class FlakyEngine:
    """Owned partitions fail twice (as a DB closing under a rebalance may), then work."""

    def __init__(self) -> None:
        self.clock = ManualClock(now_ms=10_000, monotonic=50.0)
        self.settings = SimpleNamespace(worker_id="w1")
        self.timers = object()
        self.failures = 2
        self.sent: list[tuple[int, dict[str, Any]]] = []
        self.lease = SimpleNamespace(watch=lambda coordinator: None, valid=lambda: True)
        self.signals = SimpleNamespace(send=self._send)

    def coordinator(self) -> None:
        return None

    def owned_partitions(self) -> set[int]:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("partition DB closed")
        return {3}

    async def _send(self, *, key: bytes, value: bytes, partition: int) -> None:
        self.sent.append((partition, codec.decode(value).record))


def test_ticker_survives_an_error_and_ticks_the_due_partition(
        monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FlakyEngine()
    due = (9_000).to_bytes(8, "big") + b"x"  # already due at now_ms=10_000
    monkeypatch.setattr(ticker_mod, "first_timer_key", lambda table, p: due)
    monkeypatch.setattr(ticker_mod, "RESCAN_S", 0.01)

    async def run() -> None:
        t = Ticker(engine=engine)  # type: ignore[arg-type]
        t.start()
        for _ in range(300):
            if engine.sent:
                break
            await asyncio.sleep(0.01)
        assert t._task is not None
        t._task.cancel()

    asyncio.run(run())
    assert engine.failures == 0
    assert [(p, r["now_ms"]) for p, r in engine.sent] == [(3, 10_000)]
