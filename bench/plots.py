"""The two PNGs of `--plot DIR`: a lateness histogram and a throughput-over-time plot.

matplotlib comes with the `bench` (and `dev`) extra; the Agg backend draws without a
display, so this runs on CI machines and over ssh. Imported only when --plot is given.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: never look for a display
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from bench.report import percentile

# A log axis cannot show 0 or less (a receiver clock a hair ahead of the worker's); such
# values are drawn in the first bin, and the plot says how many there were.
FLOOR_MS = 0.1
BINS = 60


@dataclass(kw_only=True)
class Figures:
    """What one run plots. `times_s`: receive times, seconds since `origin` (the window start
    or due second), one per execution; `values_ms`: the histogram's values."""

    stem: str  # file names: <stem>-<hist_name>.png and <stem>-throughput.png
    title: str
    values_ms: Sequence[float]
    times_s: Sequence[float]
    hist_name: str = "lateness"
    hist_label: str = "lateness at the target (ms, log scale)"
    counted: str = "executions"  # what the histogram's bars count
    rate_label: str = "executions/s (by receive time, 1 s buckets)"
    time_label: str = "seconds since the window start"
    target_per_s: float | None = None
    marks: list[tuple[float, str]] = field(default_factory=list)
    # (seconds since origin, CPU, probe ms) from bench.hostspeed: drawn on a second axis.
    speed: Sequence[tuple[float, int, float]] = ()


def write(plot_dir: Path, figs: Figures) -> list[str]:
    """Both PNGs into plot_dir; their paths."""
    plot_dir.mkdir(parents=True, exist_ok=True)
    hist = plot_dir / f"{figs.stem}-{figs.hist_name}.png"
    rate = plot_dir / f"{figs.stem}-throughput.png"
    histogram(figs.values_ms, hist, title=f"{figs.title}: {figs.hist_name}",
              xlabel=figs.hist_label, ylabel=figs.counted)
    throughput(figs.times_s, rate, title=f"{figs.title}: throughput", ylabel=figs.rate_label,
               xlabel=figs.time_label, target_per_s=figs.target_per_s, marks=figs.marks,
               speed=figs.speed)
    return [str(hist), str(rate)]


def log_bins(lo: float, hi: float, n: int = BINS) -> list[float]:
    """n equal-width bins on a log axis from lo to hi (one bin if they coincide)."""
    lo, hi = max(lo, FLOOR_MS), max(hi, lo * 1.01, FLOOR_MS * 1.01)
    ratio = hi / lo
    return [lo * ratio ** (i / n) for i in range(n + 1)]


def histogram(values_ms: Sequence[float], path: Path, *, title: str, xlabel: str,
              ylabel: str = "executions") -> None:
    data = sorted(values_ms)
    fig, ax = plt.subplots(figsize=(9, 4))
    if data:
        clipped = sum(1 for v in data if v < FLOOR_MS)
        shown = [max(v, FLOOR_MS) for v in data]
        ax.hist(shown, bins=log_bins(shown[0], shown[-1]), color="tab:blue", alpha=0.8)
        ax.set_xscale("log")
        _plain_log_ticks(ax, shown[0], shown[-1])
        for q, color in ((50, "tab:green"), (99, "tab:red")):
            v = percentile(data, q)
            assert v is not None
            ax.axvline(max(v, FLOOR_MS), color=color, linestyle="--",
                       label=f"p{q} {v:,.1f} ms")
        note = f"n={len(data):,}" + (f", {clipped:,} below {FLOOR_MS} ms" if clipped else "")
        ax.legend(title=note, loc="best")
    else:
        ax.text(0.5, 0.5, f"no {ylabel}", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    _save(fig, path)


def _plain_log_ticks(ax: Axes, lo: float, hi: float) -> None:
    """Tick labels as plain milliseconds (30, 1,000, 20,000), not 3x10^1 or 1e+04; the
    in-between ticks get labels only when the data spans too few decades to have many."""
    plain = FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v >= 1 else f"{v:g}")
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain if math.log10(hi / lo) < 2 else NullFormatter())


def per_second(times_s: Iterable[float]) -> tuple[list[int], list[int]]:
    """(second, count) for every whole second from the first to the last, empty ones too."""
    counts = Counter(math.floor(t) for t in times_s)
    if not counts:
        return [], []
    secs = list(range(min(counts), max(counts) + 1))
    return secs, [counts.get(s, 0) for s in secs]


def throughput(times_s: Sequence[float], path: Path, *, title: str, ylabel: str, xlabel: str,
               target_per_s: float | None = None,
               marks: Sequence[tuple[float, str]] = (),
               speed: Sequence[tuple[float, int, float]] = ()) -> None:
    secs, counts = per_second(times_s)
    fig, ax = plt.subplots(figsize=(9, 4))
    if secs:
        ax.bar(secs, counts, width=1.0, align="edge", color="tab:blue", alpha=0.8,
               label="measured")
    else:
        ax.text(0.5, 0.5, "no executions", ha="center", va="center", transform=ax.transAxes)
    if target_per_s is not None:
        ax.axhline(target_per_s, color="tab:orange", linestyle="--",
                   label=f"target {target_per_s:,.0f}/s")
    for x, label in marks:
        ax.axvline(x, color="tab:red", linestyle=":", label=label)
    if secs or target_per_s is not None:
        # The kill mark and the target line move about; the probes' legend takes the right.
        ax.legend(loc="lower left" if speed else "best")
    if speed:
        _speed_axis(ax, speed)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    _save(fig, path)


def _speed_axis(ax: Axes, speed: Sequence[tuple[float, int, float]]) -> None:
    """Each CPU's probe (bench.hostspeed) on a right-hand axis: where the bars drop while
    the line rises, the host, not the code, was slow."""
    right = ax.twinx()
    colors = itertools.cycle(("tab:red", "tab:purple", "tab:brown", "tab:gray"))
    for cpu, color in zip(sorted({c for _, c, _ in speed}), colors, strict=False):
        points = sorted((t, ms) for t, c, ms in speed if c == cpu)
        right.plot([t for t, _ in points], [ms for _, ms in points], color=color,
                   marker=".", linewidth=1, alpha=0.7, label=f"CPU {cpu} probe")
    right.set_ylim(bottom=0)
    right.set_ylabel("CPU probe, ms (higher is slower)")
    right.legend(loc="lower right")


def _save(fig: Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)  # a find-max run draws many; pyplot keeps every open figure
