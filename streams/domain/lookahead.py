"""How far ahead a tick decides: far enough to finish a coming spike by its due time.

Fire-ahead decides eligible slots `base` ahead of their due time. A spike (twenty thousand
one-offs due at one second) takes longer than that to decide, so its first slots are late
and its last ones later still. Given the due times of the undecided timers past the base
window, the window grows to take in every timer whose backlog (the timers due up to and at
it, less what the base window absorbs) would take longer to decide than the time left
before it. A steady stream slower than the deciding rate never grows it.
"""

from __future__ import annotations

from collections.abc import Iterable


def carrying_stream(calls_per_s: float, decide_per_s: float) -> bool:
    """A worker making calls (a second, lately) at half the deciding rate or more is
    carrying a stream, not waiting for a spike: to window_ms that stream looks like a pile
    that never ends, and deciding it further ahead only moves its work (a kafka 5,000/s
    bench degraded with the window grown to its cap). It keeps the base window."""
    return calls_per_s >= decide_per_s / 2


def window_ms(dues: Iterable[int], *, now_ms: int, base_ms: int, cap_ms: int,
              decide_per_s: float, slack: int) -> int:
    """The window, in [base_ms, cap_ms], for the undecided timers due at `dues` (due
    times past now + base_ms, in any order). `slack` timers are left to the base window."""
    window = base_ms
    for pending, due in enumerate(sorted(dues), start=1):
        ahead = due - now_ms
        if ahead > cap_ms:
            break
        # Deciding `pending - slack` timers takes longer than the time before this one,
        # beyond the base window: it must start now.
        if (pending - slack) * 1000 >= (ahead - base_ms) * decide_per_s:
            window = max(window, ahead)
    return window
