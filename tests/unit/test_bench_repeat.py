"""bench.repeat: N runs of a scenario reported as the median run, with loss summed."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench import readme
from bench.repeat import combine, headline


def steady(p99: float | None, *, lost: int = 0, dup: int = 0, cpu: float = 1.0) -> dict[str, Any]:
    return {"scenario": "steady", "target": "kafka", "rate": 5000, "achieved_per_s": 5000,
            "workers": 1, "window_s": 60, "executions_per_s": 5000.0,
            "lateness_ms": {"p50": None if p99 is None else p99 / 2, "p99": p99},
            "lost": lost, "duplicates": dup, "target_duplicates": 0, "cpu_s": {"w1": cpu}}


@given(st.lists(st.tuples(st.floats(0, 1e5, allow_nan=False), st.integers(0, 3),
                          st.integers(0, 3)), min_size=1, max_size=9))
def test_the_median_run_is_shown_and_every_loss_counts(
        runs: list[tuple[float, int, int]]) -> None:
    results = [steady(p99, lost=lost, dup=dup) for p99, lost, dup in runs]
    out = combine(results)
    p99s = sorted(p99 for p99, _, _ in runs)
    # Odd: the middle run. Even: the worse of the two middle runs.
    assert out["lateness_ms"]["p99"] == p99s[len(runs) // 2]
    assert out["lost"] == sum(lost for _, lost, _ in runs)
    assert out["duplicates"] == sum(dup for _, _, dup in runs)
    rep = out["repeats"]
    assert rep["n"] == len(runs) and rep["by"] == "lateness_ms.p99"
    assert [r["lateness_p99_ms"] for r in rep["runs"]] == [p99 for p99, _, _ in runs]
    assert results[rep["chosen"]]["lateness_ms"]["p99"] == out["lateness_ms"]["p99"]
    assert "repeats" not in results[rep["chosen"]], "the runs themselves are not changed"


def test_for_throughput_scenarios_the_median_is_by_rate_higher_is_better() -> None:
    runs = [{"scenario": "api", "requests_per_s": rps, "latency_ms": {"p99": 100.0},
             "lost": 0, "duplicates": 0} for rps in (1200.0, 950.0, 1400.0, 1000.0)]
    out = combine(runs)
    # Sorted worst first: 950, 1000, 1200, 1400; of the middle two the worse is 1000.
    assert out["requests_per_s"] == 1000.0
    assert out["repeats"]["by"] == "requests_per_s"
    assert [r["requests_per_s"] for r in out["repeats"]["runs"]] == [1200, 950, 1400, 1000]
    assert out["repeats"]["runs"][1]["latency_p99_ms"] == 100.0
    # The table shows every run's latency too, not only the figure the median is chosen by.
    assert readme.repeats(out) == (" (median of 4 runs by requests_per_s: 1,200, 950, 1,400, "
                                   "1,000; their latency p99 100, 100, 100, 100)")


@pytest.mark.parametrize(("result", "name", "value"), [
    ({"scenario": "burst", "time_to_last_ms": 2400}, "time_to_last_ms", 2400),
    ({"scenario": "timers", "create_applied_per_s": 4000}, "create_applied_per_s", -4000),
    ({"scenario": "failover", "orphan_lateness_ms": {"max": 12000}}, "orphan_lateness_ms.max",
     12000),
    ({"scenario": "steady", "find_max": True, "max_sustainable_rate": 6000},
     "max_sustainable_rate", -6000),
    ({"scenario": "steady", "lateness_ms": {"p99": None}}, "lateness_ms.p99", math.inf),
])
def test_each_scenario_is_judged_by_its_floors_figure(result: dict[str, Any], name: str,
                                                      value: float) -> None:
    assert headline(result) == (name, value)


def test_a_run_that_measured_nothing_is_never_the_median_of_three() -> None:
    out = combine([steady(None), steady(900.0), steady(700.0)])
    assert out["lateness_ms"]["p99"] == 900.0


def test_no_runs_is_an_error() -> None:
    with pytest.raises(ValueError, match="no runs"):
        combine([])


def test_a_burst_row_shows_every_runs_time_to_last_call_and_p99() -> None:
    runs = [{"scenario": "burst", "time_to_last_ms": t, "lateness_ms": {"p99": t - 100},
             "lost": 0, "duplicates": 0} for t in (4400, 2800, 3100)]
    assert readme.repeats(combine(runs)) == (
        " (median of 3 runs by time_to_last_ms: 4,400, 2,800, 3,100; their p99 4,300, "
        "2,700, 3,000)")


def test_the_readme_row_names_the_median_and_every_run() -> None:
    out = combine([steady(1200.0), steady(700.0, lost=1), steady(900.0)])
    cells = readme.row("steady-kafka", out)
    assert "(median of 3 runs by lateness_ms.p99: 1,200, 700, 900)" in cells[11]
    # The shown run met the floor, but a loss in another run fails it.
    assert cells[-1] == "not met: 1 lost"


def test_plots_of_one_run_are_refused_with_repeat(tmp_path: Any) -> None:
    import typer

    from bench.cli import common

    def opts(plot_dir: Any, repeat: int) -> Any:
        return common(as_json=True, plot_dir=plot_dir, progress=False, save=False, label=None,
                      results_dir=None, env=None, no_barrier=False, repeat=repeat)

    with pytest.raises(typer.BadParameter, match="not with --repeat"):
        opts(tmp_path, 2)
    assert opts(None, 3).repeat == 3


def test_each_runs_host_probe_is_kept_and_shown_in_the_row() -> None:
    runs = [steady(p99) for p99 in (1200.0, 700.0, 900.0)]
    for run, probe in zip(runs, (61.5, 98.0, 70.2), strict=True):
        run["host"] = {"probe_ms_before": probe}
    out = combine(runs)
    assert [r["probe_ms"] for r in out["repeats"]["runs"]] == [61.5, 98.0, 70.2]
    assert readme.row("steady-kafka", out)[11].endswith("; host probe 61.5, 98, 70.2 ms")


def test_each_runs_create_probe_is_kept_and_shown() -> None:
    runs = [steady(p99) for p99 in (1200.0, 700.0, 900.0)]
    for run, create_us in zip(runs, (29.1, 47.5, None), strict=True):
        run["host"] = {"probe_ms_before": 45.0, "create_us_before": create_us}
    out = combine(runs)
    assert [r["create_us"] for r in out["repeats"]["runs"]] == [29.1, 47.5, None]
    assert readme.row("steady-kafka", out)[11].endswith(
        "; host probe 45, 45, 45 ms; create probe 29.1, 47.5, - µs")


def test_each_runs_share_of_slow_cpu_windows_is_kept_and_shown() -> None:
    runs = [steady(p99) for p99 in (1200.0, 700.0, 900.0)]
    for run, slow in zip(runs, (0.4, 0.05, None), strict=True):
        run["host"] = {"probe_ms_before": 40.0,
                       "speed": None if slow is None else {"slow_share": slow}}
    out = combine(runs)
    assert [r["host_slow_share"] for r in out["repeats"]["runs"]] == [0.4, 0.05, None]
    assert readme.row("steady-kafka", out)[11].endswith(
        "; host probe 40, 40, 40 ms; CPU slow in 40%, 5%, - of 2 s probes")
