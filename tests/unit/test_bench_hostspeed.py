"""bench.hostspeed: the per-CPU speed record a result carries."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.hostspeed import HostSpeed, Probe, summarize, timed_loop_ms


def probes(*rows: tuple[float, int, float]) -> list[Probe]:
    return [Probe(at=at, cpu=cpu, ms=ms) for at, cpu, ms in rows]


def test_a_window_half_again_slower_than_the_fast_probes_counts_as_slow() -> None:
    # Ten fast windows at ~6 ms and two at 11 ms on cpu1: a sixth of the run was slow.
    rows = [(float(i), i % 2, 6.0 + 0.1 * (i % 3)) for i in range(10)]
    rows += [(10.0, 1, 11.0), (11.0, 1, 11.5)]
    s = summarize(probes(*rows))
    assert s is not None
    assert s["fast_ms"] == 6.0
    assert s["slow_share"] == round(2 / 12, 3)
    assert s["cpus"]["cpu0"]["slow_share"] == 0.0
    assert s["cpus"]["cpu1"]["slow_share"] == round(2 / 7, 3)
    assert s["cpus"]["cpu1"]["n"] == 7 and s["cpus"]["cpu1"]["p90"] == 11.5


def test_only_the_measured_window_counts() -> None:
    rows = probes((1.0, 0, 30.0), (5.0, 0, 6.0), (6.0, 0, 6.1))
    s = summarize(rows, since=5.0)
    assert s is not None and s["slow_share"] == 0.0 and s["cpus"]["cpu0"]["n"] == 2
    assert summarize(rows, since=7.0) is None


@given(st.lists(st.tuples(st.integers(0, 3), st.floats(1.0, 100.0)), min_size=1, max_size=60))
def test_the_summary_is_bounded_and_ordered(rows: list[tuple[int, float]]) -> None:
    s = summarize(probes(*((float(i), cpu, ms) for i, (cpu, ms) in enumerate(rows))))
    assert s is not None
    assert 0.0 <= s["slow_share"] <= 0.9  # the fast reference is the tenth percentile
    assert sum(c["n"] for c in s["cpus"].values()) == len(rows)
    for c in s["cpus"].values():
        assert c["p10"] <= c["p50"] <= c["p90"]
        assert 0.0 <= c["slow_share"] <= 1.0


def test_the_loop_reports_its_best_round_in_cpu_time() -> None:
    readings = iter([0.0, 0.5, 1.0, 1.1, 2.0, 2.3])  # rounds of 0.5, 0.1 and 0.3 s
    assert abs(timed_loop_ms(iterations=10, rounds=3, cpu_time=lambda: next(readings))
               - 100.0) < 1e-9


def test_each_probe_runs_pinned_to_its_cpu_until_stopped() -> None:
    seen: dict[int, set[int]] = {}
    lock = threading.Lock()

    def probe() -> float:
        with lock:  # which CPUs this thread may run on, per probe thread
            seen.setdefault(threading.get_ident(), set()).update(os.sched_getaffinity(0))
        return 6.0

    cpus = sorted(os.sched_getaffinity(0))
    speed = HostSpeed(every_s=0.01, cpus=cpus, probe=probe).start()
    deadline = time.monotonic() + 10
    while len(speed.probes) < 4 * len(cpus) and time.monotonic() < deadline:
        time.sleep(0.01)
    speed.stop()
    count = len(speed.probes)
    time.sleep(0.05)
    assert len(speed.probes) == count, "a probe ran after stop()"
    assert {p.cpu for p in speed.probes} == set(cpus)
    assert sorted(len(a) for a in seen.values()) == [1] * len(cpus)
    assert set().union(*seen.values()) == set(cpus)
    s = speed.summary()
    assert s is not None and s["slow_share"] == 0.0


def test_the_plot_series_starts_at_the_mark_and_counts_from_the_origin() -> None:
    now = iter([100.0])
    speed = HostSpeed(cpus=[0], clock=lambda: next(now))
    speed.probes += probes((99.0, 0, 7.0), (101.0, 0, 6.0), (103.5, 1, 12.0))
    speed.mark()  # at 100.0
    assert speed.series(origin=100.5) == [(0.5, 0, 6.0), (3.0, 1, 12.0)]


def test_a_probe_at_exactly_the_factor_is_not_slow_and_one_above_is() -> None:
    rows = [(float(i), 0, 4.0) for i in range(9)] + [(9.0, 0, 6.0), (10.0, 0, 6.01)]
    s = summarize(probes(*rows))
    assert s is not None and s["fast_ms"] == 4.0
    assert s["slow_share"] == round(1 / 11, 3)


def test_probes_after_the_end_of_the_load_do_not_count() -> None:
    readings = iter([100.0, 110.0])
    speed = HostSpeed(cpus=[0], clock=lambda: next(readings))
    speed.probes += probes((101.0, 0, 6.0), (109.0, 0, 6.0), (111.0, 0, 30.0))
    speed.mark()  # at 100.0
    speed.end()  # at 110.0: the drain's and the audit's probes are left out
    summary = speed.summary()
    assert summary is not None and summary["slow_share"] == 0.0
    assert summary["cpus"]["cpu0"]["n"] == 2
    assert [t for t, _, _ in speed.series(origin=100.0)] == [1.0, 9.0]


def test_a_cpu_that_cannot_be_pinned_is_named_and_the_others_still_probe(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    real = os.sched_setaffinity

    def refuse_the_first(pid: int, mask: Iterable[int]) -> None:
        if set(mask) == {cpus[0]}:
            raise OSError(22, "Invalid argument")
        real(pid, mask)

    monkeypatch.setattr(os, "sched_setaffinity", refuse_the_first)
    speed = HostSpeed(every_s=0.01, cpus=cpus, probe=lambda: 6.0).start()
    deadline = time.monotonic() + 10
    while (len(speed.probes) < 3 * (len(cpus) - 1) or not speed.unpinned) \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    speed.stop()
    assert speed.unpinned == [cpus[0]]
    assert cpus[0] not in {p.cpu for p in speed.probes}
    assert {p.cpu for p in speed.probes} == set(cpus[1:])
    summary = speed.summary()
    if len(cpus) > 1:
        assert summary is not None and summary["unpinned"] == [cpus[0]]


def test_starting_twice_keeps_one_probe_thread_per_cpu() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    speed = HostSpeed(every_s=0.01, cpus=cpus, probe=lambda: 6.0)
    before = threading.active_count()
    speed.start()
    speed.start()  # Stack.mark() starts them, and a scenario may mark more than once
    try:
        assert threading.active_count() - before == len(cpus)
    finally:
        speed.stop()
