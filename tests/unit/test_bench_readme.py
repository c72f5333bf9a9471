"""bench.readme (results into the table of bench/README.md), bench.results (--save) and the CLI's
worker-environment options."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
import typer

from bench import readme, results
from bench.cli import fire_ahead_of, worker_env
from bench.readme import options
from bench.stack import Stack
from kron.settings import Settings

REPO = Path(__file__).resolve().parents[2]
MACHINE = {"nproc": 2, "cpu_model": "AMD EPYC 7B13", "ram_gb": 7.8, "python": "3.11.9",
           "kernel": "6.1.0", "date": "2025-01-02T03:04:05+00:00",
           "git_commit": "0123456789abcdef", "git_dirty": False}
# What `kron bench steady --target kafka --rate 5000 --duration 60 --save --label kafka`
# writes, trimmed to what the table reads.
STEADY: dict[str, Any] = {
    "scenario": "steady", "executions": 300_000, "duration_s": 60.0,
    "executions_per_s": 5000.0,
    "lateness_ms": {"p50": 41.2, "p95": 180.0, "p99": 412.5, "max": 950.3, "mean": 60.0,
                    "n": 300_000},
    "lost": 0, "duplicates": 0, "rss_mb": {"w1": 412.3}, "cpu_s": {"w1": 88.41},
    "workers": 1, "partitions": 8, "target": "kafka", "rate": 5000, "window_s": 60,
    "expected": 300_000, "achieved_per_s": 5000.0, "missed": 0, "jitter_s": 0.0,
    "worker_env": {}, "label": "kafka", "machine": MACHINE,
}
TIMERS: dict[str, Any] = {
    "scenario": "timers", "executions": 0, "duration_s": 80.0, "executions_per_s": 0.0,
    "lateness_ms": {"p50": None, "p95": None, "p99": None, "max": None, "mean": None, "n": 0},
    "lost": 0, "duplicates": 0, "rss_mb": {"w1": 1800.0}, "cpu_s": {"w1": 200.0},
    "workers": 1, "partitions": 8, "jobs": 1_000_000, "create_acked_per_s": 90_000.0,
    "create_applied_per_s": 12_500.0, "restart_ready_s": 9.5, "cold_ready_s": 95.0,
    "worker_env": {"KRON_DISPATCH_BARRIER": "false"}, "machine": MACHINE,
}


def test_a_result_that_meets_its_floor() -> None:
    table = readme.render([("steady-kafka", STEADY)])
    assert "Machine: 2 CPUs (AMD EPYC 7B13), 7.8 GB RAM, Python 3.11.9" in table
    assert "2025-01-02 at commit 0123456789." in table
    header, rule, first = table.splitlines()[4:7]
    assert header.startswith("| result | options | executions/s | p50 ms | p95 ms | p99 ms |")
    assert "peak RSS MB" in header and "CPU s" in header and "floor met" in header
    assert rule.count("---") == len(readme.COLUMNS)
    cells = [c.strip() for c in first.strip("|").split("|")]
    assert cells[:11] == ["steady-kafka", "kafka, 5,000/s x 60 s, 1 worker, fire-ahead off",
                          "5,000", "41.2", "180", "412", "950", "0", "0", "412", "88.4"]
    assert cells[-2].startswith("kafka, 1 worker: ≥5,000/s") and cells[-1] == "**met**"


def test_a_result_that_falls_short_says_why() -> None:
    table = readme.render([("timers", TIMERS)])
    line = next(ln for ln in table.splitlines() if ln.startswith("| timers |"))
    assert "no barrier" in line  # the --no-barrier A/B shows in the options
    assert "creates 90,000/s acked, 12,500/s applied; restart 9.5 s; cold rebuild 95 s" in line
    assert "not met: creates 12,500/s < 20,000/s; RSS 1,800.0 MB > 1,536 MB" in line


def test_every_floor_without_a_result_is_listed_as_not_measured() -> None:
    table = readme.render([("steady-kafka", STEADY)])
    missing = [ln for ln in table.splitlines() if ln.endswith("| not measured |")]
    assert len(missing) == len(readme.FLOORS) - 1
    assert "Machine: no results saved yet" in readme.render([])


@pytest.mark.parametrize(("change", "floor", "met"), [
    ({}, "steady-kafka", True),
    ({"lateness_ms": {"p99": 1000.1}}, "steady-kafka", False),
    ({"lost": 1}, "steady-kafka", False),
    ({"window_s": 30}, "steady-kafka", False),
    ({"workers": 2}, "steady-kafka", False),
    ({"target": "http", "rate": 2000, "achieved_per_s": 2000.0}, "steady-http", True),
    ({"rate": 500, "achieved_per_s": 500.0}, "steady-500", False),  # p99 412 > 100 ms
    ({"rate": 500, "achieved_per_s": 500.0, "lateness_ms": {"p99": 90.0}}, "steady-500", True),
])
def test_steady_floors(change: dict[str, Any], floor: str, met: bool) -> None:
    r = {**copy.deepcopy(STEADY), **change}
    f = readme.floor_of(r)
    assert f is not None and f.key == floor
    assert (readme.verdict(f, r) == "**met**") is met, readme.verdict(f, r)


def test_other_floors() -> None:
    burst = {**STEADY, "scenario": "burst", "jobs": 20_000, "executions": 20_000,
             "time_to_last_ms": 2900.0, "lateness_ms": {"p50": 800.0}}
    api = {**STEADY, "scenario": "api", "requests_per_s": 1200.0, "latency_ms": {"p99": 151.0}}
    failover = {**STEADY, "scenario": "failover", "rate": 500, "session_timeout_s": 10.0,
                "orphan_lateness_ms": {"max": 14_000.0}}
    verdicts = {r["scenario"]: readme.verdict(f, r) for r in (burst, api, failover)
                if (f := readme.floor_of(r))}
    assert verdicts == {"burst": "**met**", "api": "not met: p99 151.0 ms > 150 ms",
                        "failover": "**met**"}
    small = {**burst, "jobs": 200, "executions": 199}
    f = readme.floor_of(small)
    assert f is not None
    assert readme.verdict(f, small) == "not met: jobs 200 < 20,000; ran 199 of 200"


def test_rewrite_replaces_only_between_the_markers() -> None:
    text = f"# x\n\n## Performance\nintro\n{readme.START}\nold\n{readme.END}\nafter\n"
    new = readme.rewrite(text, "TABLE")
    assert new == f"# x\n\n## Performance\nintro\n{readme.START}\nTABLE\n{readme.END}\nafter\n"
    assert readme.rewrite(new, "TABLE") == new
    with pytest.raises(ValueError, match="needs"):
        readme.rewrite("no markers", "TABLE")


def test_main_renders_the_results_directory_into_the_readme(tmp_path: Path) -> None:
    res = tmp_path / "results"
    res.mkdir()
    (res / "steady-kafka.json").write_text(json.dumps(STEADY))
    (res / "notes.json").write_text("[]")  # not a result: ignored
    md = tmp_path / "README.md"
    md.write_text(f"a\n{readme.START}\n{readme.END}\nb\n")
    args = ["--results", str(res), "--readme", str(md)]
    assert readme.main([*args, "--check"]) == 1
    assert readme.main(args) == 0
    assert "| steady-kafka | kafka, 5,000/s x 60 s" in md.read_text()
    assert readme.main([*args, "--check"]) == 0


def test_the_readme_table_is_up_to_date_with_bench_results() -> None:
    """After `kron bench ... --save`, run `python -m bench.readme` and commit both."""
    assert readme.main(["--check"]) == 0, "run: python -m bench.readme"


def test_the_table_lives_in_bench_readme_and_the_top_readme_links_to_it() -> None:
    """One generated table, in bench/README.md; the README keeps a summary and a link."""
    assert readme.README == REPO / "bench" / "README.md"
    assert readme.README.read_text().count(readme.START) == 1
    top = (REPO / "README.md").read_text()
    assert readme.START not in top and readme.END not in top
    assert "](bench/README.md)" in top


def test_save_writes_the_result_with_the_machine(tmp_path: Path) -> None:
    r = {k: v for k, v in STEADY.items() if k not in ("machine", "label")}
    path = results.save(r, label="kafka", results_dir=tmp_path)
    assert path == tmp_path / "steady-kafka.json"
    doc = json.loads(path.read_text())
    assert doc["executions"] == 300_000 and doc["label"] == "kafka"
    m = doc["machine"]
    assert set(m) >= {"nproc", "cpu_model", "ram_gb", "python", "date", "git_commit"}
    assert m["nproc"] >= 1 and m["python"].startswith("3.11")
    assert results.save(r, label=None, results_dir=tmp_path).name == "steady.json"
    with pytest.raises(ValueError, match="label"):
        results.path_for("steady", "../x", tmp_path)


def test_machine_description_from_proc(tmp_path: Path) -> None:
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nmodel name\t: AMD  EPYC 7B13\n")
    (tmp_path / "meminfo").write_text("MemTotal:        8048592 kB\nMemFree: 1 kB\n")
    assert results.cpu_model(tmp_path / "cpuinfo") == "AMD EPYC 7B13"
    assert results.ram_gb(tmp_path / "meminfo") == 7.7
    assert results.ram_gb(tmp_path / "absent") is None


def test_command_keeps_what_was_measured_and_drops_where_output_went() -> None:
    argv = ["/x/kron/__main__.py", "bench", "steady", "--rate", "500", "--json", "--plot",
            "docs/perf", "--save", "--label=500", "--no-barrier", "--progress",
            "--worker-env", "KRON_X=1", "--results-dir", "/tmp/r"]
    assert results.command_of(argv) == ("kron bench steady --rate 500 --no-barrier "
                                        "--worker-env KRON_X=1")


def test_worker_env_options() -> None:
    assert worker_env(None, no_barrier=False) == {}
    assert worker_env(["KRON_A=1", "B=x=y"], no_barrier=True) == {
        "KRON_A": "1", "B": "x=y", "KRON_DISPATCH_BARRIER": "false"}
    for bad in ("NOVALUE", "=1", "1X=2", "A B=1"):
        with pytest.raises(typer.BadParameter):
            worker_env([bad], no_barrier=False)


def test_workers_get_the_extra_environment_and_the_api_does_not(tmp_path: Path) -> None:
    stack = Stack(worker_env={"KRON_DISPATCH_BARRIER": "false", "KRON_DATA_DIR": "/elsewhere"})
    stack.settings = Settings(bootstrap_servers="127.0.0.1:1", topic_prefix="bench",
                              data_dir=tmp_path, api_keys="bench=k")
    env = stack.worker_process_env("w1")
    assert env["KRON_DISPATCH_BARRIER"] == "false" and env["KRON_WORKER_ID"] == "w1"
    assert env["KRON_DATA_DIR"] == "/elsewhere"  # the caller's choice wins over the bench's
    assert "KRON_DISPATCH_BARRIER" not in stack.api_process().env


def test_the_fire_ahead_window_a_result_ran_with_is_spelled_out() -> None:
    base = {"scenario": "steady", "target": "kafka", "rate": 500, "window_s": 60, "workers": 1}
    assert fire_ahead_of({}) == Settings().fire_ahead_s
    assert fire_ahead_of({"KRON_FIRE_AHEAD_S": "3"}) == 3.0
    assert options({**base, "fire_ahead_s": 0.5}).endswith("1 worker, fire-ahead 0.5 s")
    assert options({**base, "fire_ahead_s": 0.0}).endswith("fire-ahead off")
    # Saved before the window was recorded: the default then was off.
    assert options(base).endswith("fire-ahead off")
    # Set explicitly: the variable says it once.
    explicit = options({**base, "fire_ahead_s": 3.0, "worker_env": {"KRON_FIRE_AHEAD_S": "3"}})
    assert explicit.endswith("1 worker, KRON_FIRE_AHEAD_S=3")
    assert "fire-ahead" not in options({"scenario": "api", "concurrency": 32, "duration_s": 30})


def test_a_timers_run_with_batched_creates_says_so() -> None:
    assert options({"scenario": "timers", "jobs": 1000}) == "1,000 jobs"
    assert options({"scenario": "timers", "jobs": 1000, "batch": 1}) == "1,000 jobs"
    assert options({"scenario": "timers", "jobs": 1000, "batch": 100}) == (
        "1,000 jobs, CreateJobs of 100")


def test_a_timers_or_failover_run_names_workers_other_than_its_default() -> None:
    assert options({"scenario": "timers", "jobs": 1000, "workers": 1}) == "1,000 jobs"
    assert options({"scenario": "timers", "jobs": 1000, "batch": 100, "workers": 2}) == (
        "1,000 jobs, CreateJobs of 100, 2 workers")
    failover = {"scenario": "failover", "rate": 500, "window_s": 60, "kill_after_s": 20}
    assert options({**failover, "workers": 2}).startswith("500/s x 60 s, kill at 20 s, fire")
    assert "3 workers" in options({**failover, "workers": 3})


def test_the_timers_rss_floor_is_judged_by_the_largest_worker() -> None:
    two = {**TIMERS, "workers": 2, "rss_mb": {"w1": 900.0, "w2": 1600.0}}
    floor = readme.floor_of(two)
    assert floor is not None and floor.key == "timers"
    assert "RSS 1,600.0 MB > 1,536 MB" in readme.verdict(floor, two)
    assert "RSS" not in readme.verdict(floor, {**two, "rss_mb": {"w1": 900.0, "w2": 1500.0}})


def test_a_single_runs_host_probe_is_shown_and_an_old_result_without_one_is_not() -> None:
    probed = {**STEADY, "host": {"probe_ms_before": 64.3, "probe_ms_after": 80.0}}
    assert readme.row("steady-kafka", probed)[11].endswith("; host probe 64.3 ms")
    assert "host probe" not in readme.row("steady-kafka", STEADY)[11]


def test_a_runs_share_of_slow_cpu_windows_follows_the_probe() -> None:
    watched = {**STEADY, "host": {"probe_ms_before": 40.0, "speed": {"slow_share": 0.236}}}
    assert readme.row("steady-kafka", watched)[11].endswith(
        "; host probe 40 ms; CPU slow in 24% of 2 s probes")


def test_the_create_probe_follows_the_host_probe_and_precedes_the_slow_share() -> None:
    probed = {**STEADY, "host": {"probe_ms_before": 44.7, "create_us_before": 29.1,
                                 "speed": {"slow_share": 0.02}}}
    assert readme.row("steady-kafka", probed)[11].endswith(
        "; host probe 44.7 ms; create probe 29.1 µs; CPU slow in 2% of 2 s probes")
    older = {**STEADY, "host": {"probe_ms_before": 44.7}}
    assert "create probe" not in readme.row("steady-kafka", older)[11]


def test_the_create_probe_runs_create_micro_and_takes_the_best_of_its_rounds() -> None:
    """A real bench.create_micro per round (a few hundred jobs): a positive figure, the
    least of the rounds' own."""
    best = results.create_probe_us(rounds=2, jobs=300)
    assert best is not None and 0 < best < 100_000


def test_a_create_probe_that_cannot_run_reports_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(results.sys, "executable", "/nonexistent/python")
    assert results.create_probe_us(rounds=1, jobs=10) is None


def test_the_speed_probe_takes_the_best_of_its_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    # A clock whose rounds take 0.5 s, 0.1 s and 0.3 s: the probe reports the best one.
    ticks = iter([0.0, 0.5, 1.0, 1.1, 2.0, 2.3])
    monkeypatch.setattr(results.time, "perf_counter", lambda: next(ticks))
    assert results.speed_probe_ms(rounds=3, iterations=10) == 100.0


def test_the_warmup_reads_only_the_jvms_compiler_threads(tmp_path: Path) -> None:
    from bench.warmup import compiler_cpu_s

    tick = os.sysconf("SC_CLK_TCK")
    for tid, name, utime, stime in [(1, "java", 500, 50), (7, "C2 CompilerThre", 3 * tick, tick),
                                    (8, "C1 CompilerThre", tick, 0), (9, "GC Thread#0", 9, 9)]:
        task = tmp_path / "42" / "task" / str(tid)
        task.mkdir(parents=True)
        # comm may hold spaces and parentheses: fields are counted after the last ')'.
        fields = ["S", *["0"] * 10, str(utime), str(stime)]
        (task / "stat").write_text(f"{tid} ({name}) {' '.join(fields)} 0 0\n")
    assert compiler_cpu_s(42, proc=tmp_path) == 5.0
    assert compiler_cpu_s(43, proc=tmp_path) is None


def _noisy(mode: str, *, crit: float, normal: float, ratios: dict[str, float]) -> dict[str, Any]:
    """A `kron bench noisy` result, trimmed to what the table reads."""
    def tier(jobs: int, p99: float) -> dict[str, Any]:
        return {"jobs": jobs, "lateness_ms": {"p50": p99 / 2, "p99": p99, "max": p99}}

    a, b = (3000, 25) if mode == "steady" else (100_000, 100)
    return {**STEADY, "scenario": "noisy", "mode": mode, "seconds": 60 if mode == "steady" else 0,
            "tenant_a": {"jobs": a, "expected": a * (60 if mode == "steady" else 1),
                         "executions": a * (60 if mode == "steady" else 1),
                         "time_to_last_ms": 5000.0, "executions_per_s": 20_000.0},
            "tenant_b": {"critical": tier(b, crit), "normal": tier(b, normal)},
            "alone": {"critical": tier(b, 20.0), "normal": tier(b, 20.0)},
            "ratios": ratios, "audit_lost": 0, "audit_duplicates": 0,
            "phases": {"noisy": {"worker_cpu_us_per_execution": 250.0}}, "fire_ahead_s": 0.5}


def test_noisy_floors_judge_b_beside_a() -> None:
    burst = _noisy("burst", crit=200.0, normal=900.0,
                   ratios={"critical_p99": 10.0, "normal_p99": 45.0})
    floor = readme.floor_of(burst)
    assert floor is not None and floor.key == "noisy"
    assert readme.verdict(floor, burst) == "**met**"
    late = {**burst, "tenant_b": {**burst["tenant_b"],
                                  "critical": {"jobs": 100, "lateness_ms": {"p99": 300.0}}}}
    assert readme.verdict(floor, late) == "not met: B critical p99 300.0 ms > 250 ms"
    row = readme.row("noisy", burst)
    assert row[1].startswith("A 100,000 one-offs at T, B 100 critical at T + 100 normal")
    assert "B critical p99 200 ms (alone 20 ms, x10)" in row[11]
    steady = _noisy("steady", crit=30.0, normal=50.0,
                    ratios={"critical_p99": 1.5, "normal_p99": 2.5})
    floor = readme.floor_of(steady)
    assert floor is not None and floor.key == "noisy-steady"
    assert readme.verdict(floor, steady) == "not met: B normal p99 2.50x alone > 2x"
    assert readme.row("noisy-steady", steady)[1].startswith("A 3,000/s, B 50/s (half critical)")
