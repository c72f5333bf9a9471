"""bench.plots (the two PNGs of --plot) and bench.progress (the stderr bar)."""

from __future__ import annotations

import io
import math
import random
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pytest

from bench import plots, progress

PNG = b"\x89PNG\r\n\x1a\n"


def test_write_draws_a_lateness_histogram_and_a_throughput_plot(tmp_path: Path) -> None:
    rng = random.Random(1)
    late = [rng.lognormvariate(4, 1) for _ in range(3000)] + [0.0, -2.0]  # log axis: <= 0 too
    times = [rng.uniform(0, 10) for _ in late]
    paths = plots.write(tmp_path / "out", plots.Figures(
        stem="steady-x", title="steady", values_ms=late, times_s=times, target_per_s=300,
        marks=[(3.0, "kill -9 w2")]))
    assert [Path(p).name for p in paths] == ["steady-x-lateness.png",
                                             "steady-x-throughput.png"]
    for p in paths:
        data = Path(p).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000


def test_the_throughput_plot_draws_each_cpus_speed_on_a_second_axis(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    saved: list[Any] = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: saved.append(fig))
    speed = [(2.0, 1, 6.1), (0.0, 0, 6.0), (2.0, 0, 11.5), (0.0, 1, 6.3)]
    plots.throughput([0.5, 1.5, 2.5], tmp_path / "t.png", title="t", ylabel="y", xlabel="x",
                     speed=speed)
    (fig,) = saved
    bars, right = fig.axes
    lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
             for line in right.get_lines()}
    assert lines == {"CPU 0 probe": ([0.0, 2.0], [6.0, 11.5]),
                     "CPU 1 probe": ([0.0, 2.0], [6.3, 6.1])}
    assert len(bars.patches) == 3  # one bar a second, on the left axis
    assert right.get_ylim()[0] == 0
    assert [t.get_text() for t in bars.get_legend().get_texts()] == ["measured"]
    assert [t.get_text() for t in right.get_legend().get_texts()] == ["CPU 0 probe",
                                                                      "CPU 1 probe"]
    plt.close(fig)


def test_an_empty_run_still_gets_both_files(tmp_path: Path) -> None:
    paths = plots.write(tmp_path, plots.Figures(stem="burst", title="b", values_ms=[],
                                                times_s=[], hist_name="latency"))
    assert [Path(p).name for p in paths] == ["burst-latency.png", "burst-throughput.png"]
    assert all(Path(p).read_bytes().startswith(PNG) for p in paths)


def test_log_bins_are_even_on_a_log_axis_and_never_below_the_floor() -> None:
    bins = plots.log_bins(1.0, 1000.0, n=3)
    assert bins == pytest.approx([1.0, 10.0, 100.0, 1000.0])
    assert plots.log_bins(-5.0, 0.0)[0] == plots.FLOOR_MS
    one = plots.log_bins(7.0, 7.0)  # a single value still gets a bin of its own
    assert one[0] <= 7.0 <= one[-1] and one[-1] > one[0]


def test_per_second_counts_every_second_including_empty_ones() -> None:
    secs, counts = plots.per_second([0.1, 0.9, 1.5, 3.2, -0.5])
    assert secs == [-1, 0, 1, 2, 3]
    assert counts == [1, 2, 1, 0, 1]
    assert plots.per_second([]) == ([], [])


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bar_is_silent_off_a_terminal_unless_forced() -> None:
    out = io.StringIO()
    with progress.Bar("load", 10, stream=out) as bar:
        bar.update(5)
    assert out.getvalue() == ""
    progress.force(True)
    try:
        with progress.Bar("load", 10, stream=out) as bar:
            bar.update(10)
    finally:
        progress.force(False)
    assert "load [" in out.getvalue() and out.getvalue().endswith("\n")


def test_bar_on_a_terminal_redraws_one_line_with_rate_and_eta() -> None:
    clock = iter([100.0, 102.0, 104.0, 104.0])
    out = Tty()
    bar = progress.Bar("creating", 1000, unit=" jobs", stream=out, clock=lambda: next(clock))
    bar.update(500)  # 2 s in: 250/s, 500 left -> 2 s more
    assert "\r" in out.getvalue() and "\n" not in out.getvalue()
    assert "[############------------] 500/1,000 jobs 250/s ETA 0:02 (0:02)" in out.getvalue()
    bar.update(1000)
    bar.close()
    assert out.getvalue().endswith("\n")
    assert "ETA 0:00" in out.getvalue()


@pytest.mark.parametrize(("seconds", "text"), [(0, "0:00"), (61.5, "1:01"), (3725, "1:02:05"),
                                               (-3, "0:00"), (math.pi, "0:03")])
def test_durations(seconds: float, text: str) -> None:
    assert progress._duration(seconds) == text
