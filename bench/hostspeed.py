"""How fast each of the machine's CPUs was during a run, every few seconds.

A shared machine's cores do not keep one speed. With nothing else running, a thread pinned
to one CPU of the machine the README's figures come from took 5.7-7.9 ms of its own CPU
time for 300,000 increments in most 2 s windows, and 9.3-12.7 ms in a seventh to two
fifths of them, on either CPU, alone or with the other CPU busy (eighteenth pass). A worker
at 5,000 executions/s uses ~90% of a core on a fast stretch; a slow one leaves it behind.

Each probe thread pins itself to one CPU and, every `every_s`, times a fixed loop (ITERATIONS
increments, ~1.3-1.6 ms on a fast stretch of that machine) with its own CPU time
(time.thread_time), so waiting for the GIL or for the CPU is not counted: only how much CPU
the same work took. The best of a few rounds is kept. The threads start staggered over the
period, so they never hold the GIL together: the bench's receiver stamps arrival times. At
most MAX_CPUS are probed, ~0.2% of each.

"Slow" is relative to the run itself: a probe over SLOW_FACTOR times the run's fast probes
(the tenth percentile over every CPU). A run slow from start to end reads as not slow, so
`fast_ms` is kept beside the share.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.report import percentile

log = logging.getLogger("bench.hostspeed")

EVERY_S = 2.0
ITERATIONS = 100_000
ROUNDS = 3
# A window is slow when its probe took this much longer than the run's fast probes (the
# tenth percentile over every CPU).
SLOW_FACTOR = 1.5
MAX_CPUS = 8


@dataclass(frozen=True, kw_only=True, slots=True)
class Probe:
    at: float  # wall clock, seconds
    cpu: int
    ms: float


def timed_loop_ms(iterations: int = ITERATIONS, rounds: int = ROUNDS,
                  cpu_time: Callable[[], float] = time.thread_time) -> float:
    """CPU milliseconds of a fixed pure-Python loop, the best of `rounds`."""
    best = float("inf")
    for _ in range(rounds):
        started = cpu_time()
        i = 0
        while i < iterations:
            i += 1
        best = min(best, cpu_time() - started)
    return best * 1000


def _percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank, as every other figure of a result (q in percent)."""
    value = percentile(sorted(values), q)
    assert value is not None  # callers pass at least one value
    return value


def summarize(probes: Sequence[Probe], *, since: float = 0.0, until: float = math.inf,
              slow_factor: float = SLOW_FACTOR) -> dict[str, Any] | None:
    """Per CPU: the probe's p10/p50/p90 in ms and the share of its probes that were slow;
    overall: the share of all probes (CPU by CPU, window by window) slower than
    `slow_factor` times the fast reference. Probes taken in [since, until] count."""
    window = [p for p in probes if since <= p.at <= until]
    if not window:
        return None
    fast = _percentile([p.ms for p in window], 10)
    slow_at = fast * slow_factor
    per_cpu: dict[str, Any] = {}
    for cpu in sorted({p.cpu for p in window}):
        ms = [p.ms for p in window if p.cpu == cpu]
        per_cpu[f"cpu{cpu}"] = {
            "p10": round(_percentile(ms, 10), 2), "p50": round(statistics.median(ms), 2),
            "p90": round(_percentile(ms, 90), 2), "n": len(ms),
            "slow_share": round(sum(m > slow_at for m in ms) / len(ms), 3)}
    return {"every_s": EVERY_S, "fast_ms": round(fast, 2), "slow_factor": slow_factor,
            "slow_share": round(sum(p.ms > slow_at for p in window) / len(window), 3),
            "cpus": per_cpu}


class HostSpeed:
    """A probe thread per CPU, from start() to stop(); summary() and series() cover the
    measurement, from mark() to end(). start() is idempotent."""

    def __init__(self, *, every_s: float = EVERY_S, cpus: Sequence[int] | None = None,
                 probe: Callable[[], float] = timed_loop_ms,
                 clock: Callable[[], float] = time.time) -> None:
        self._every_s = every_s
        self._cpus = (list(cpus) if cpus is not None
                      else sorted(os.sched_getaffinity(0))[:MAX_CPUS])
        self._probe = probe
        self._clock = clock
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.probes: list[Probe] = []
        self._since = 0.0
        self._until = math.inf
        self.unpinned: list[int] = []  # CPUs a thread could not pin itself to

    def start(self) -> HostSpeed:
        if self._threads:
            return self
        for i, cpu in enumerate(self._cpus):
            offset = self._every_s * i / len(self._cpus)
            t = threading.Thread(target=self._run, args=(cpu, offset),
                                 name=f"bench-speed-{cpu}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)

    def mark(self) -> None:
        """The measurement starts."""
        self._since, self._until = self._clock(), math.inf

    def end(self) -> None:
        """The measurement ends: later probes (the drain, the audit) do not count."""
        self._until = self._clock()

    def _measured(self) -> list[Probe]:
        with self._lock:
            return [p for p in self.probes if self._since <= p.at <= self._until]

    def summary(self) -> dict[str, Any] | None:
        out = summarize(self._measured())
        with self._lock:
            unpinned = sorted(self.unpinned)
        if out is not None and unpinned:
            out["unpinned"] = unpinned
        return out

    def series(self, origin: float) -> list[tuple[float, int, float]]:
        """(seconds since `origin`, CPU, ms) of every probe of the measurement, for a plot."""
        return [(p.at - origin, p.cpu, p.ms) for p in self._measured()]

    def _run(self, cpu: int, offset_s: float) -> None:
        try:
            os.sched_setaffinity(0, {cpu})  # 0: this thread only
        except OSError as exc:  # a CPU taken away meanwhile: said, and left out
            log.warning("CPU %s not probed: %s", cpu, exc)
            with self._lock:
                self.unpinned.append(cpu)
            return
        if self._stop.wait(offset_s):
            return
        while not self._stop.wait(self._every_s):
            at = self._clock()
            ms = self._probe()
            with self._lock:
                self.probes.append(Probe(at=at, cpu=cpu, ms=round(ms, 3)))
