"""Numbers into a result: percentiles, the table for people, the JSON line for scripts."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Sequence
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


# ... and these per scenario: the figures its floor in the README is judged by.
SCENARIO_KEYS: dict[str, tuple[str, ...]] = {
    "steady": ("target", "rate", "achieved_per_s"),
    "burst": ("jobs", "time_to_last_ms", "unfired"),
    "timers": ("jobs", "create_acked_per_s", "create_applied_per_s", "pending",
               "restart_ready_s", "cold_ready_s"),
    "api": ("requests_per_s", "latency_ms", "accepted"),
    "failover": ("rate", "takeover_ms", "orphan_lateness_ms", "session_timeout_s"),
}


def missing_keys(result: Result) -> list[str]:
    keys = REQUIRED + SCENARIO_KEYS.get(result.get("scenario", ""), ())
    return [k for k in keys if k not in result]


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
