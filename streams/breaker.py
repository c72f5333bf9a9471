"""A circuit breaker per target host: when most recent attempts fail, pause dispatch."""

from __future__ import annotations

from collections import deque
from typing import Any

from kron.clock import Clock
from schemas.envelope import make_envelope


class CircuitBreaker:
    def __init__(self, *, clock: Clock, window: int = 20, min_samples: int = 10,
                 failure_ratio: float = 0.5, cooldown_s: float = 30.0) -> None:
        self._clock = clock
        self._window = window
        self._min = min_samples
        self._ratio = failure_ratio
        self._cooldown = cooldown_s
        self._results: dict[str, deque[bool]] = {}
        self._open_until: dict[str, float] = {}

    def allow(self, host: str) -> bool:
        until = self._open_until.get(host)
        if until is None:
            return True
        if self._clock.monotonic() >= until:
            # Half-open: let traffic probe the host again with a fresh window.
            del self._open_until[host]
            self._results.pop(host, None)
            return True
        return False

    def record(self, host: str, *, ok: bool) -> dict[str, Any] | None:
        """Returns a CircuitOpened record when this result trips the breaker."""
        results = self._results.setdefault(host, deque(maxlen=self._window))
        results.append(ok)
        failures = results.count(False)
        if len(results) < self._min or failures / len(results) <= self._ratio:
            return None
        self._open_until[host] = self._clock.monotonic() + self._cooldown
        now = self._clock.now_ms()
        return {
            "envelope": make_envelope(event_id=f"circuit:{host}:{now}",
                                      event_type="circuit.opened", occurred_at_ms=now, tenant=""),
            "host": host, "until_ms": now + int(self._cooldown * 1000),
            "failure_ratio": failures / len(results),
        }

    def open_hosts(self) -> list[str]:
        """Hosts whose dispatch is paused now."""
        now = self._clock.monotonic()
        return [host for host, until in self._open_until.items() if until > now]

    def is_open(self, host: str) -> bool:
        return host in self._open_until

    def closes_in_s(self, host: str) -> float:
        """How long dispatch to the host stays paused; 0 when it is not."""
        until = self._open_until.get(host)
        return 0.0 if until is None else max(0.0, until - self._clock.monotonic())
