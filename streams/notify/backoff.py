"""When a webhook is tried again: bounded attempts, exponentially spaced, with jitter.

Attempt n+1 (n >= 1 failed) waits ``base_s * 2**(n-1)``, scaled by a factor in
[0.5, 1.0] so that many alerts failing together don't come back together. With the
defaults (6 attempts, 10 s) the tries span at most 10+20+40+80+160 s, about 5 minutes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class Backoff:
    attempts: int = 6
    base_s: float = 10.0

    def delay_s(self, failed_attempt: int, rand: float = 1.0) -> float | None:
        """The wait after attempt `failed_attempt` failed (`rand` in [0, 1)), or None when
        it was the last one."""
        if failed_attempt >= self.attempts:
            return None
        return float(self.base_s * 2.0 ** (failed_attempt - 1) * (0.5 + rand / 2))

    def schedule(self) -> list[float]:
        """The longest waits between the attempts, in order (without jitter)."""
        return [self.base_s * 2.0 ** (n - 1) for n in range(1, self.attempts)]
