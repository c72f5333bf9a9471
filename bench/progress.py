"""A small progress bar on stderr for the long phases (loading timers, waiting, run windows).

Shown only when stderr is a terminal or `--progress` asked for it, so scripts that read the
`--json` line (and the tests) see exactly the output they did before. Off a terminal each
update is a new line, at most every 5 s, instead of a redrawn one.
"""

from __future__ import annotations

import math
import shutil
import sys
import time
from collections.abc import Callable
from typing import TextIO

_forced = False


def force(on: bool) -> None:
    """`--progress`: draw bars even when stderr is not a terminal."""
    global _forced
    _forced = on


def enabled(stream: TextIO | None = None) -> bool:
    s = stream or sys.stderr
    return _forced or s.isatty()


def _duration(s: float) -> str:
    s = max(0, int(s))
    if s >= 3600:
        return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"{s // 60}:{s % 60:02d}"


class Bar:
    """`label [#####-----] done/total  rate/s  ETA m:ss`; a no-op when not enabled."""

    WIDTH = 24

    def __init__(self, label: str, total: int, *, unit: str = "", stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.label, self.total, self.unit = label, max(1, total), unit
        self.stream = stream or sys.stderr
        self.on = enabled(self.stream)
        self.tty = self.stream.isatty()
        self.clock = clock
        self.started = clock()
        self._drawn = -math.inf  # the first update draws at once
        self.done = 0

    def line(self, now: float) -> str:
        frac = min(1.0, self.done / self.total)
        fill = int(frac * self.WIDTH)
        elapsed = now - self.started
        per_s = self.done / elapsed if elapsed > 0 else 0.0
        eta = _duration((self.total - self.done) / per_s) if per_s > 0 else "?"
        return (f"{self.label} [{'#' * fill}{'-' * (self.WIDTH - fill)}] {self.done:,}/"
                f"{self.total:,}{self.unit} {per_s:,.0f}/s ETA {eta} ({_duration(elapsed)})")

    def update(self, done: int, *, force_draw: bool = False) -> None:
        self.done = done
        now = self.clock()
        # 10 redraws a second on a terminal; a line every 5 s into a file or pipe.
        if not self.on or (now - self._drawn < (0.1 if self.tty else 5.0) and not force_draw):
            return
        self._drawn = now
        end = "\r" if self.tty else "\n"
        text = self.line(now)
        if self.tty:  # a wrapped line cannot be redrawn in place: cut it to the width
            text = "\r\x1b[K" + text[:shutil.get_terminal_size().columns - 1]
        self.stream.write(text + end)
        self.stream.flush()

    def close(self) -> None:
        """Draws the final state once and ends the line, so later log lines start clean."""
        if self.on:
            self.update(self.done, force_draw=True)
            if self.tty:
                self.stream.write("\n")
                self.stream.flush()

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
