"""How fast each of the machine's CPUs was during a run, every few seconds.

A shared machine's cores do not keep one speed. With nothing else running, a thread pinned
to one CPU of the machine the README's figures come from took 5.7-7.9 ms of its own CPU
time for 300,000 increments most of the time, and 9.3-12.7 ms in a seventh to two
fifths of the 2 s windows, on either CPU, alone or with the other CPU busy (eighteenth
pass). A worker at 5,000 executions/s uses ~90% of a core on a fast stretch; a slow one
leaves it behind.

Each probe thread pins itself to one CPU and, every `every_s`, times a fixed loop with its
own CPU time (time.thread_time), so waiting for the GIL or for the CPU is not counted:
only how much CPU the same work took. The best of a few rounds is kept. About 1% of each
CPU.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

EVERY_S = 2.0
ITERATIONS = 100_000
ROUNDS = 3
# A window is slow when its probe took this much longer than the run's fast probes (the
# tenth percentile over every CPU).
SLOW_FACTOR = 1.5


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
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(probes: Sequence[Probe], *, since: float = 0.0,
              slow_factor: float = SLOW_FACTOR) -> dict[str, Any] | None:
    """Per CPU: the probe's p10/p50/p90 in ms and the share of slow windows; overall: the
    share of windows (any CPU) slower than `slow_factor` times the fast reference."""
    window = [p for p in probes if p.at >= since]
    if not window:
        return None
    fast = _percentile([p.ms for p in window], 0.1)
    slow_at = fast * slow_factor
    per_cpu: dict[str, Any] = {}
    for cpu in sorted({p.cpu for p in window}):
        ms = [p.ms for p in window if p.cpu == cpu]
        per_cpu[f"cpu{cpu}"] = {
            "p10": round(_percentile(ms, 0.1), 2), "p50": round(statistics.median(ms), 2),
            "p90": round(_percentile(ms, 0.9), 2), "n": len(ms),
            "slow_share": round(sum(m > slow_at for m in ms) / len(ms), 3)}
    return {"every_s": EVERY_S, "fast_ms": round(fast, 2), "slow_factor": slow_factor,
            "slow_share": round(sum(p.ms > slow_at for p in window) / len(window), 3),
            "cpus": per_cpu}


class HostSpeed:
    """A probe thread per CPU, from start() to stop(); summary() covers the window from
    mark() (the measurement's start) on."""

    def __init__(self, *, every_s: float = EVERY_S, cpus: Sequence[int] | None = None,
                 probe: Callable[[], float] = timed_loop_ms,
                 clock: Callable[[], float] = time.time) -> None:
        self._every_s = every_s
        self._cpus = list(cpus) if cpus is not None else sorted(os.sched_getaffinity(0))
        self._probe = probe
        self._clock = clock
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.probes: list[Probe] = []
        self._since = 0.0

    def start(self) -> HostSpeed:
        for cpu in self._cpus:
            t = threading.Thread(target=self._run, args=(cpu,), name=f"bench-speed-{cpu}",
                                 daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)

    def mark(self) -> None:
        self._since = self._clock()

    def summary(self) -> dict[str, Any] | None:
        with self._lock:
            return summarize(list(self.probes), since=self._since)

    def series(self, origin: float) -> list[tuple[float, int, float]]:
        """(seconds since `origin`, CPU, ms) of every probe from mark() on, for a plot."""
        with self._lock:
            return [(p.at - origin, p.cpu, p.ms) for p in self.probes if p.at >= self._since]

    def _run(self, cpu: int) -> None:
        try:
            os.sched_setaffinity(0, {cpu})  # 0: this thread only
        except OSError:
            return  # a CPU taken away meanwhile: its speed is not ours to measure
        while not self._stop.wait(self._every_s):
            ms = self._probe()
            with self._lock:
                self.probes.append(Probe(at=self._clock(), cpu=cpu, ms=round(ms, 3)))
