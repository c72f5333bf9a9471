"""Numbers into a result: percentiles, the table for people, the JSON line for scripts."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

Result = dict[str, Any]

# Every result carries these keys, whatever the scenario (scripts and the test rely on them).
REQUIRED = ("scenario", "executions", "duration_s", "executions_per_s", "lateness_ms", "lost",
            "duplicates", "rss_mb", "cpu_s")


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile: always a value that was observed, never an interpolation."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def summary(values: Iterable[float]) -> dict[str, Any]:
    """p50/p95/p99/max (and count, mean) in ms, rounded to 0.1 ms."""
    data = sorted(values)

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 1)

    return {
        "p50": r(percentile(data, 50)), "p95": r(percentile(data, 95)),
        "p99": r(percentile(data, 99)), "max": r(data[-1] if data else None),
        "mean": r(sum(data) / len(data) if data else None), "n": len(data),
    }


def rate(count: int, seconds: float) -> float:
    return round(count / seconds, 1) if seconds > 0 else 0.0


def missing_keys(result: Result) -> list[str]:
    return [k for k in REQUIRED if k not in result]


# --- output ---------------------------------------------------------------------------------


def _flatten(prefix: str, value: Any, out: list[tuple[str, str]]) -> None:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(value, list) and value and isinstance(value[0], dict):
        for i, v in enumerate(value):
            _flatten(f"{prefix}[{i}]", v, out)
    else:
        out.append((prefix, "-" if value is None else str(value)))


def table(result: Result) -> Table:
    rows: list[tuple[str, str]] = []
    _flatten("", result, rows)
    t = Table(title=f"kron bench {result.get('scenario', '')}", show_header=True)
    t.add_column("metric", style="bold")
    t.add_column("value", justify="right", overflow="fold")
    for k, v in rows:
        t.add_row(k, v)
    return t


def emit(result: Result, *, as_json: bool) -> None:
    """The table on stdout; with --json the JSON object follows as the last stdout line."""
    Console(file=sys.stdout, width=110).print(table(result))
    if as_json:
        # Written directly, not through rich: rich would wrap a long line.
        sys.stdout.write(json.dumps(result, separators=(",", ":"), default=str) + "\n")
    sys.stdout.flush()


def log(message: str) -> None:
    """Progress for people, on stderr so stdout stays the result."""
    Console(stderr=True).print(f"[dim]bench:[/dim] {message}", highlight=False)


# --- plot -----------------------------------------------------------------------------------


def plot(points: Sequence[tuple[float, float]], path: Path, *, title: str,
         marks: Sequence[tuple[float, str]] = (),
         xlabel: str = "scheduled time since window start (s)") -> str | None:
    """Scatter lateness over time as a PNG, if matplotlib is importable; else say why not.

    Returns the file written, or None. matplotlib is deliberately not a dependency.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display on CI machines
        import matplotlib.pyplot as plt
    except ImportError:
        log("--plot: matplotlib is not installed; no plot written")
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(10, 4))
    if points:
        xs, ys = zip(*points, strict=True)
        ax.scatter(xs, ys, s=2)
    for x, label in marks:
        ax.axvline(x, color="red", linestyle="--")
        ax.annotate(label, (x, 0), color="red")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("lateness at the target (ms)")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return str(path)
