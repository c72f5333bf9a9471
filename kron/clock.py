"""The only place that reads the wall clock. Everything else takes `now` as an argument."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...

    def monotonic(self) -> float: ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock tests move by hand."""

    def __init__(self, now_ms: int = 0, monotonic: float = 0.0) -> None:
        self._now_ms = now_ms
        self._mono = monotonic

    def now_ms(self) -> int:
        return self._now_ms

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._now_ms += int(seconds * 1000)
        self._mono += seconds
