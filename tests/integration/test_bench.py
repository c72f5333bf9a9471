"""`kron bench` end to end: it starts its own broker and worker, measures, audits, cleans up."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
REQUIRED = ("scenario", "executions", "duration_s", "executions_per_s", "lateness_ms", "lost",
            "duplicates", "rss_mb", "cpu_s")


def bench(*args: str, timeout_s: float) -> dict:
    proc = subprocess.Popen([sys.executable, "-m", "kron", "bench", *args, "--json"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # SIGTERM lets the bench stop its broker and workers before it exits.
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"kron bench {args[0]} took over {timeout_s}s:\n{err[-4000:]}")
    assert proc.returncode == 0, err[-4000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert [k for k in REQUIRED if k not in result] == []
    assert set(result["lateness_ms"]) >= {"p50", "p95", "p99", "max"}
    assert not (REPO / ".kron" / f"bench-{proc.pid}").exists(), "temp dir left behind"
    return result


def test_steady_http_reports_on_time_executions_without_loss() -> None:
    r = bench("steady", "--rate", "50", "--duration", "5", "--target", "http", timeout_s=75)
    assert r["scenario"] == "steady"
    assert r["executions"] > 0
    assert r["executions"] == r["expected"] == 250, r
    assert r["lost"] == 0 and r["duplicates"] == 0, r["audit"]
    assert r["target_duplicates"] == 0
    assert r["lateness_ms"]["p50"] is not None
    assert r["rss_mb"]["w1"] > 0 and r["cpu_s"]["w1"] > 0


def test_burst_runs_every_job_once() -> None:
    r = bench("burst", "--jobs", "200", timeout_s=75)
    assert r["scenario"] == "burst"
    assert r["executions"] == 200, r
    assert r["lost"] == 0 and r["duplicates"] == 0, r["audit"]
    assert r["target_duplicates"] == 0
    assert r["time_to_last_ms"] >= r["lateness_ms"]["p50"]
