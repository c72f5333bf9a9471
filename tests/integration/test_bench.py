"""`kron bench` end to end: it starts its own broker and worker, measures, audits, cleans up.

A small run of each of the five scenarios (seconds of load each): the JSON contract (the last
stdout line, every common key and the scenario's own), no loss, no duplicates; and --plot,
--save, --progress, --no-barrier and --repeat on the way.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
REQUIRED = ("scenario", "executions", "duration_s", "executions_per_s", "lateness_ms", "lost",
            "duplicates", "rss_mb", "cpu_s")
SCENARIO_KEYS = {
    "steady": ("target", "rate", "achieved_per_s"),
    "burst": ("jobs", "time_to_last_ms", "unfired"),
    "timers": ("jobs", "create_acked_per_s", "create_applied_per_s", "pending",
               "restart_ready_s", "cold_ready_s"),
    "api": ("requests_per_s", "latency_ms", "accepted"),
    "failover": ("rate", "takeover_ms", "orphan_lateness_ms", "session_timeout_s"),
}
PNG = b"\x89PNG\r\n\x1a\n"


def bench(*args: str, timeout_s: float) -> dict[str, Any]:
    # A cold broker unless a test asks otherwise: the warm-up is up to 30 s per run.
    warmup = () if "--broker-warmup" in args else ("--broker-warmup", "0")
    proc = subprocess.Popen([sys.executable, "-m", "kron", "bench", *args, *warmup, "--json"],
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
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    assert [k for k in REQUIRED + SCENARIO_KEYS[args[0]] if k not in result] == []
    assert set(result["lateness_ms"]) >= {"p50", "p95", "p99", "max"}
    # The host's speed before and after, for comparing runs across a shared machine's moods.
    assert result["host"]["probe_ms_before"] > 0 and result["host"]["probe_ms_after"] > 0
    # And what a create costs bench.create_micro then: the drift that moves kron's figures.
    assert result["host"]["create_us_before"] > 0 and result["host"]["create_us_after"] > 0
    assert result["scenario"] == args[0]
    # Each worker's main thread (its event loop) through the load window: a share of a core.
    assert set(result["loop_busy"]) <= set(result["cpu_s"]), result["loop_busy"]
    assert all(0 <= v <= 1.2 for v in result["loop_busy"].values()), result["loop_busy"]
    assert result["lost"] == 0 and result["duplicates"] == 0, result["audit"]
    assert not (REPO / ".kron" / f"bench-{proc.pid}").exists(), "temp dir left behind"
    result["_stderr"] = err
    return result


def pngs(paths: list[str]) -> list[str]:
    """Names of the files, after checking each is a non-empty PNG."""
    for p in paths:
        data = Path(p).read_bytes()
        assert data.startswith(PNG) and len(data) > 1000, p
    return [Path(p).name for p in paths]


def test_steady_http_reports_on_time_executions_without_loss(tmp_path: Path) -> None:
    r = bench("steady", "--rate", "50", "--duration", "5", "--target", "http",
              "--plot", str(tmp_path / "plots"), "--save", "--label", "smoke",
              "--results-dir", str(tmp_path / "results"), timeout_s=75)
    assert r["executions"] > 0
    assert r["executions"] == r["expected"] == 250, r
    assert r["target_duplicates"] == 0
    assert r["lateness_ms"]["p50"] is not None
    assert r["rss_mb"]["w1"] > 0 and r["cpu_s"]["w1"] > 0 and r["loop_busy"]["w1"] > 0
    # Every CPU's speed over the measured window (bench.hostspeed), a probe each 2 s.
    speed = r["host"]["speed"]
    assert set(speed["cpus"]) == {f"cpu{c}" for c in os.sched_getaffinity(0)}, speed
    assert all(c["n"] >= 1 and c["p10"] > 0 for c in speed["cpus"].values()), speed
    # Only the load counts (5 s and the drain), not the audit after it: a probe each 2 s.
    assert all(c["n"] <= r["duration_s"] / 2 + 3 for c in speed["cpus"].values()), speed
    assert pngs(r["plots"]) == ["steady-smoke-lateness.png", "steady-smoke-throughput.png"]
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "steady-smoke-lateness.png", "steady-smoke-throughput.png"]
    saved = json.loads((tmp_path / "results" / "steady-smoke.json").read_text())
    assert saved["executions"] == 250 and saved["label"] == "smoke"
    assert saved["command"] == ("kron bench steady --rate 50 --duration 5 --target http "
                                "--broker-warmup 0")
    assert set(saved["machine"]) >= {"nproc", "cpu_model", "ram_gb", "python", "date",
                                     "git_commit"}
    assert " ETA " not in r["_stderr"], "no progress bar unless stderr is a terminal"


def test_burst_runs_every_job_once_with_progress_and_without_the_barrier() -> None:
    r = bench("burst", "--jobs", "200", "--progress", "--no-barrier", "--repeat", "2",
              timeout_s=150)
    assert r["executions"] == 200, r
    # Two runs, each on its own stack: the shown one is the slower, both are audited.
    runs = r["repeats"]["runs"]
    assert r["repeats"]["n"] == 2 and len(runs) == 2
    assert [(run["lost"], run["duplicates"]) for run in runs] == [(0, 0), (0, 0)]
    assert r["time_to_last_ms"] == max(run["time_to_last_ms"] for run in runs)
    assert r["_stderr"].count("run 1 of 2") == 1 and r["_stderr"].count("run 2 of 2") == 1
    assert r["target_duplicates"] == 0
    assert r["time_to_last_ms"] >= r["lateness_ms"]["p50"]
    assert r["worker_env"] == {"KRON_DISPATCH_BARRIER": "false"}
    # --progress draws on stderr even into a pipe; stdout still ends with the JSON.
    assert "burst of 200 [########################] 200/200" in r["_stderr"]
    assert "creating (acked by Kafka) [" in r["_stderr"]


def test_timers_creates_pending_jobs_and_restarts() -> None:
    # In CreateJobs batches: every other scenario creates its jobs one CreateJob each. Two
    # workers: the restarts stop and start both, and every job survives the cold one.
    r = bench("timers", "--jobs", "300", "--batch", "50", "--workers", "2", timeout_s=150)
    assert r["jobs"] == 300 and r["executions"] == 0 and r["batch"] == 50
    assert r["workers"] == 2 and set(r["rss_mb"]) == {"w1", "w2"}
    assert r["create_acked_per_s"] > 0 and r["create_applied_per_s"] > 0
    assert r["restart_ready_s"] > 0 and r["cold_ready_s"] > 0
    each = r["pending"]["per_worker"]
    assert set(each) == {"w1", "w2"} and all(w["rss_mb"] > 0 for w in each.values())
    assert r["pending"]["rss_mb"] == max(w["rss_mb"] for w in each.values())
    assert r["pending"]["disk_mb"] == pytest.approx(sum(w["disk_mb"] for w in each.values()),
                                                    abs=0.11)


def test_api_accepts_creates(tmp_path: Path) -> None:
    r = bench("api", "--duration", "3", "--concurrency", "4", "--plot", str(tmp_path),
              "--broker-warmup", "2", timeout_s=90)
    # Warmed for its whole 2 s (a new JVM's compiler is not quiet that soon), then measured.
    assert r["broker_warmup"]["messages"] > 0 and 2 <= r["broker_warmup"]["seconds"] < 10
    assert "broker warm after" in r["_stderr"]
    assert r["accepted"] > 0 and r["requests_per_s"] > 0
    assert r["accepted"] == r["requests"], r["statuses"]
    assert r["latency_ms"]["p99"] is not None
    assert pngs(r["plots"]) == ["api-latency.png", "api-throughput.png"]


def test_failover_takes_over_the_killed_workers_partitions() -> None:
    r = bench("failover", "--rate", "20", "--duration", "12", "--session-timeout", "6",
              timeout_s=150)
    assert r["executions"] == r["expected"] == 240, r["states"]
    assert r["orphaned_partitions"] and r["takeover_ms"] is not None
    assert r["orphan_lateness_ms"]["max"] is not None


def test_dag_calls_every_task_of_every_run_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # 5 one-off DAG jobs of 1 -> 3 -> 1 tasks due together (bench/dag.py). No timing asserted.
    monkeypatch.setitem(SCENARIO_KEYS, "dag", ("runs", "fanout", "release_ms", "runs_per_s",
                                               "tasks_lost", "worker_cpu_ms_per_run"))
    r = bench("dag", "--runs", "5", "--fanout", "3", timeout_s=120)
    assert (r["runs"], r["tasks_per_run"], r["expected"]) == (5, 5, 25)
    assert r["executions"] == r["task_calls"] == 25 and r["tasks_lost"] == 0, r
    # No (Idempotency-Key, attempt) twice, no task called again, each key its (run, task)'s.
    assert r["target_duplicates"] == r["target_redeliveries"] == r["keys_mismatched"] == 0
    assert r["runs_called"] == r["runs_succeeded"] == 5, r["run_states"]
    # Every child's parent-answered -> child-called figure: 3 fan-out and 1 fan-in a run.
    assert r["release_fanout_ms"]["n"] == 15 and r["release_fanin_ms"]["n"] == 5
    assert r["released_before_parent"] == 0
    # replay.audit's DAG checks over the runs' history (rules held, final states, ...).
    dag_kinds = {k: v for k, v in r["audit"].items() if k.startswith("dag.")}
    assert dag_kinds and not any(dag_kinds.values()), r["audit"]
    assert r["worker_cpu_ms_per_run"] > 0 and r["worker_cpu_us_per_call"] > 0
