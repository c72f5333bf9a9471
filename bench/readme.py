"""`python -m bench.readme`: bench/results/*.json into the performance table of
bench/README.md ("Results"; the top-level README only summarises it and links there).

Rewrites only what lies between the `<!-- perf:start -->` and `<!-- perf:end -->` markers,
so the hand-written rest of the section (and of bench/README.md) stays as it is. Each result is
judged against the floor of its scenario (FLOORS); a floor with no result yet still gets a
row, "not measured", so the table always shows what is left to prove.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.results import REPO, RESULTS_DIR

START, END = "<!-- perf:start -->", "<!-- perf:end -->"
README = REPO / "bench" / "README.md"
ORDER = ("steady", "burst", "timers", "api", "failover", "dag", "noisy")
COLUMNS = ("result", "options", "executions/s", "p50 ms", "p95 ms", "p99 ms", "max ms", "lost",
           "dup", "peak RSS MB", "CPU s", "key figures", "floor", "floor met")
Result = dict[str, Any]


@dataclass(frozen=True)
class Floor:
    key: str
    scenario: str
    text: str
    short: Callable[[Result], list[str]]  # how a result falls short; empty when met


def _lat(r: Result, q: str, key: str = "lateness_ms") -> float | None:
    return (r.get(key) or {}).get(q)


def _over(name: str, value: float | None, limit: float, unit: str) -> list[str]:
    if value is None:
        return [f"no {name}"]
    return [f"{name} {value:,.1f} {unit} > {limit:,.0f} {unit}"] if value > limit else []


def _under(name: str, value: float | None, floor: float, unit: str) -> list[str]:
    if value is None:
        return [f"no {name}"]
    return [f"{name} {value:,.0f}{unit} < {floor:,.0f}{unit}"] if value < floor else []


def _window(r: Result) -> float:
    return float(r.get("window_s") or r.get("duration_s") or 0)


def _steady(min_rate: float, p99_ms: float, *, one_worker: bool = False,
            window_s: float = 60) -> Callable[[Result], list[str]]:
    def short(r: Result) -> list[str]:
        out = _under("rate", r.get("achieved_per_s"), min_rate, "/s")
        out += _under("window", _window(r), window_s, " s")
        out += _over("p99", _lat(r, "p99"), p99_ms, "ms")
        if one_worker and r.get("workers") != 1:
            out.append(f"{r.get('workers')} workers, not 1")
        return out
    return short


def _burst(r: Result) -> list[str]:
    out = _under("jobs", r.get("jobs"), 20_000, "")
    if r.get("executions", 0) < r.get("jobs", 0):
        out.append(f"ran {r.get('executions'):,} of {r.get('jobs'):,}")
    out += _over("last", r.get("time_to_last_ms"), 3000, "ms")
    return out + _over("p50", _lat(r, "p50"), 1000, "ms")


def _timers(r: Result) -> list[str]:
    # "Via Kafka" counts a create once the worker applied it, not when Kafka acked it.
    out = _under("jobs", r.get("jobs"), 1_000_000, "")
    out += _under("creates", r.get("create_applied_per_s"), 20_000, "/s")
    # Per worker: the largest of them.
    out += _over("RSS", max((r.get("rss_mb") or {}).values(), default=None), 1536, "MB")
    out += _over("restart", r.get("restart_ready_s"), 15, "s")
    return out + _over("cold rebuild", r.get("cold_ready_s"), 120, "s")


def _api(r: Result) -> list[str]:
    return (_under("creates", r.get("requests_per_s"), 1000, "/s")
            + _over("p99", _lat(r, "p99", "latency_ms"), 150, "ms"))


def _failover(r: Result) -> list[str]:
    limit_s = float(r.get("session_timeout_s") or 0) + 5
    return (_under("rate", r.get("rate"), 500, "/s")
            + _over("orphan max lateness", _lat(r, "max", "orphan_lateness_ms"),
                    limit_s * 1000, "ms"))


def _tier(r: Result, side: str, tier: str, q: str = "p99") -> float | None:
    return _lat((r.get(side) or {}).get(tier) or {}, q)


def _jobs(r: Result, side: str, *tiers: str) -> int | None:
    """Jobs of one side's groups: tenant A's (`a`), or B's tiers (each a group)."""
    groups = [r.get(side) if tier == "a" else (r.get(side) or {}).get(tier) for tier in tiers]
    counts = [g.get("jobs") for g in groups if isinstance(g, dict)]
    return sum(c for c in counts if isinstance(c, int)) if counts else None


def _sizes(r: Result) -> tuple[int | None, int | None]:
    """(A's jobs, B's): a burst's B per tier, a steady run's B in all (its rate)."""
    b = (_jobs(r, "tenant_b", "critical") if r.get("mode") != "steady"
         else _jobs(r, "tenant_b", "critical", "normal"))
    return _jobs(r, "tenant_a", "a"), b


def _noisy_common(r: Result) -> list[str]:
    out = [f"{r[k]} {k.replace('_', ' ')}" for k in ("audit_lost", "audit_duplicates")
           if r.get(k)]
    a = r.get("tenant_a") or {}
    if a.get("executions", 0) < a.get("expected", 1):
        out.append(f"A ran {num(a.get('executions'))} of {num(a.get('expected'))}")
    return out


def _noisy(r: Result) -> list[str]:
    a, b = _sizes(r)
    out = _under("A jobs", a, 100_000, "")
    out += _under("B jobs", b, 100, "")
    out += _over("B critical p99", _tier(r, "tenant_b", "critical"), 250, "ms")
    out += _over("B normal p99", _tier(r, "tenant_b", "normal"), 1000, "ms")
    return out + _noisy_common(r)


def _noisy_steady(r: Result) -> list[str]:
    a, b = _sizes(r)
    out = _under("A rate", a, 3000, "/s")
    out += _under("B rate", b, 50, "/s")
    out += _under("window", r.get("seconds"), 60, " s")
    for tier in ("critical", "normal"):
        value = (r.get("ratios") or {}).get(f"{tier}_p99")
        if value is None:
            out.append(f"no B {tier} p99 ratio")
        elif value > 2:
            out.append(f"B {tier} p99 {value:.2f}x alone > 2x")
    return out + _noisy_common(r)


FLOORS = (
    Floor("steady-kafka", "steady", "kafka, 1 worker: ≥5,000/s for 60 s, p99 ≤ 1 s",
          _steady(5000, 1000, one_worker=True)),
    Floor("steady-http", "steady", "http: ≥2,000/s for 60 s, p99 ≤ 1 s", _steady(2000, 1000)),
    Floor("steady-500", "steady", "500/s: p99 ≤ 100 ms", _steady(500 * 0.99, 100, window_s=0)),
    Floor("burst", "burst", "20,000 due at one second: all within 3 s, p50 ≤ 1 s", _burst),
    Floor("timers", "timers", "1,000,000 pending: ≥20,000 creates/s via Kafka, RSS ≤ 1.5 GB, "
          "restart ≤ 15 s, cold rebuild ≤ 120 s", _timers),
    Floor("api", "api", "≥1,000 creates/s, p99 ≤ 150 ms", _api),
    Floor("failover", "failover", "at 500/s: orphaned slots run within session timeout + 5 s",
          _failover),
    Floor("noisy", "noisy", "A's 100,000 due at T beside B's 100 critical (T) and 100 normal "
          "(T + 1 s): B critical p99 ≤ 250 ms, normal p99 ≤ 1 s, A completes", _noisy),
    Floor("noisy-steady", "noisy", "A 3,000/s beside B 50/s for 60 s: B's p99 within 2x of "
          "B alone, per tier", _noisy_steady),
)


def floor_of(r: Result) -> Floor | None:
    scenario = r.get("scenario")
    if scenario == "steady":
        key = ("steady-500" if r.get("rate") == 500 else
               "steady-kafka" if r.get("target") == "kafka" else "steady-http")
    elif scenario == "noisy":
        key = "noisy-steady" if r.get("mode") == "steady" else "noisy"
    else:
        key = str(scenario)
    return next((f for f in FLOORS if f.key == key), None)


def verdict(floor: Floor, r: Result) -> str:
    problems = floor.short(r)
    if r.get("lost"):
        problems.append(f"{r['lost']} lost")
    if r.get("duplicates"):
        problems.append(f"{r['duplicates']} duplicates")
    return "**met**" if not problems else "not met: " + "; ".join(problems)


# --- cells ----------------------------------------------------------------------------------


def num(v: Any, unit: str = "") -> str:
    """1 decimal below 100, thousands separators above; a dash for what was not measured."""
    if v is None or v == "":
        return "-"
    if isinstance(v, int | float) and not isinstance(v, bool):
        return (f"{v:,.1f}" if abs(v) < 100 and v != int(v) else f"{v:,.0f}") + unit
    return str(v)


# Scenarios whose slots fire, so the fire-ahead window shapes them.
FIRING = ("steady", "burst", "failover", "noisy")


def options(r: Result) -> str:
    """What was measured, spelled out (defaults included, unlike the command line)."""
    s = r.get("scenario")
    w = f"{r.get('workers', '?')} worker{'s' if r.get('workers') != 1 else ''}"
    parts = {
        "steady": [str(r.get("target")), f"{num(r.get('rate'))}/s x {num(_window(r))} s", w],
        "burst": [f"{num(r.get('jobs'))} jobs", w],
        "timers": [f"{num(r.get('jobs'))} jobs"] + (
            [f"CreateJobs of {num(r['batch'])}"] if r.get("batch", 1) > 1 else []) + (
            [w] if r.get("workers", 1) != 1 else []),
        "api": [f"{r.get('concurrency')} clients x {num(r.get('duration_s'))} s", w],
        "failover": [f"{num(r.get('rate'))}/s x {num(_window(r))} s",
                     f"kill at {num(r.get('kill_after_s'))} s"] + (
            [w] if r.get("workers", 2) != 2 else []),
        "dag": [f"{num(r.get('runs'))} runs of 1 → {num(r.get('fanout'))} → 1", w],
        "noisy": [*_noisy_options(r), w],
    }.get(str(s), [])
    if r.get("find_max"):
        parts.append("find-max")
    if r.get("jitter_s"):
        parts.append(f"jitter {r['jitter_s']} s")
    if r.get("partitions", 8) != 8:
        parts.append(f"{r['partitions']} partitions")
    env = r.get("worker_env") or {}
    if s in FIRING and "KRON_FIRE_AHEAD_S" not in env:
        # Results from before the window was recorded ran with the old default, off.
        ahead = r.get("fire_ahead_s") or 0
        parts.append(f"fire-ahead {num(ahead)} s" if ahead else "fire-ahead off")
    for k, v in env.items():
        parts.append("no barrier" if (k, v) == ("KRON_DISPATCH_BARRIER", "false") else f"{k}={v}")
    return ", ".join(parts)


def _noisy_options(r: Result) -> list[str]:
    a, b = _sizes(r)
    if r.get("mode") == "steady":
        return [f"A {num(a)}/s, B {num(b)}/s (half critical) x {num(r.get('seconds'))} s"]
    return [f"A {num(a)} one-offs at T, B {num(b)} critical at T + {num(b)} normal at T + 1 s"]


def _noisy_figures(r: Result) -> str:
    """B's p99 per tier beside A, alone and their ratio; A's drain; CPU per execution."""
    tiers = []
    for tier in ("critical", "normal"):
        ratio = (r.get("ratios") or {}).get(f"{tier}_p99")
        tiers.append(f"B {tier} p99 {num(_tier(r, 'tenant_b', tier))} ms (alone "
                     f"{num(_tier(r, 'alone', tier))} ms, x{num(ratio)})")
    a = r.get("tenant_a") or {}
    cpu = ((r.get("phases") or {}).get("noisy") or {}).get("worker_cpu_us_per_execution")
    return (f"p50-max: B critical beside A; {'; '.join(tiers)}; A's last call at "
            f"{num(a.get('time_to_last_ms'))} ms ({num(a.get('executions_per_s'))}/s); "
            f"worker CPU {num(cpu)} µs an execution")


def key_figures(r: Result) -> str:
    s = r.get("scenario")
    if s == "steady":
        if r.get("find_max"):
            return f"max sustained {num(r.get('max_sustainable_rate'))}/s"
        missed = f", {num(r.get('missed'))} missed" if r.get("missed") else ""
        return f"{num(r.get('executions'))} of {num(r.get('expected'))} ran{missed}"
    if s == "burst":
        return f"last at {num(r.get('time_to_last_ms'))} ms"
    if s == "timers":
        return (f"creates {num(r.get('create_acked_per_s'))}/s acked, "
                f"{num(r.get('create_applied_per_s'))}/s applied; restart "
                f"{num(r.get('restart_ready_s'))} s; cold rebuild {num(r.get('cold_ready_s'))} s")
    if s == "api":
        p50, p99 = _lat(r, "p50", "latency_ms"), _lat(r, "p99", "latency_ms")
        return f"{num(r.get('requests_per_s'))} req/s; latency p50 {num(p50)} ms, p99 {num(p99)} ms"
    if s == "dag":
        return (f"release (parent answered → child called) p50 "
                f"{num(_lat(r, 'p50', 'release_ms'))} ms, p99 {num(_lat(r, 'p99', 'release_ms'))}"
                f" ms; {num(r.get('runs_per_s'))} runs/s; worker CPU "
                f"{num(r.get('worker_cpu_us_per_call'))} µs a task call")
    if s == "noisy":
        return _noisy_figures(r)
    if s == "failover":
        takeover = r.get("takeover_ms")
        return (f"takeover {num(None if takeover is None else takeover / 1000)} s; orphan max "
                f"lateness {num(_lat(r, 'max', 'orphan_lateness_ms'))} ms")
    return ""


def repeats(r: Result) -> str:
    """For a --repeat result: which run is shown, and every run's judged figure."""
    rep = r.get("repeats")
    if not rep:
        return ""
    by = str(rep.get("by", ""))
    # bench.repeat.run_summary keeps the judged figure under its own name, p99 excepted.
    key = "lateness_p99_ms" if by == "lateness_ms.p99" else by
    runs = rep.get("runs", [])
    values = ", ".join(num(run.get(key)) for run in runs)
    if key != "lateness_p99_ms" and any(run.get("lateness_p99_ms") is not None for run in runs):
        values += "; their p99 " + ", ".join(num(run.get("lateness_p99_ms")) for run in runs)
    if any(run.get("latency_p99_ms") is not None for run in runs):
        values += "; their latency p99 " + ", ".join(num(run.get("latency_p99_ms"))
                                                     for run in runs)
    return f" (median of {rep.get('n')} runs by {by}: {values})"


def probe(r: Result) -> str:
    """The host's speed when the run started (bench.results.speed_probe_ms), per run of a
    --repeat result: lower is faster. Then, where recorded, a create's cost in
    bench.create_micro at that time (bench.results.create_probe_us), and the share of the
    CPUs' 2 s probes that ran slow against the run's fast ones (bench.hostspeed)."""
    runs = (r.get("repeats") or {}).get("runs") or []
    host = r.get("host") or {}
    values = [run.get("probe_ms") for run in runs] if runs else [host.get("probe_ms_before")]
    creates = ([run.get("create_us") for run in runs] if runs
               else [host.get("create_us_before")])
    slow = ([run.get("host_slow_share") for run in runs] if runs
            else [(host.get("speed") or {}).get("slow_share")])
    out = "" if all(v is None for v in values) else (
        f"; host probe {', '.join(num(v) for v in values)} ms")
    if any(v is not None for v in creates):
        out += f"; create probe {', '.join(num(v) for v in creates)} µs"
    if any(v is not None for v in slow):
        shares = ", ".join("-" if v is None else f"{round(100 * v)}%" for v in slow)
        out += f"; CPU slow in {shares} of 2 s probes"
    return out


def row(name: str, r: Result) -> list[str]:
    floor = floor_of(r)
    rss, cpu = (r.get("rss_mb") or {}).values(), (r.get("cpu_s") or {}).values()
    return [name, options(r), num(r.get("executions_per_s")),
            *(num(_lat(r, q)) for q in ("p50", "p95", "p99", "max")),
            num(r.get("lost")), num(r.get("duplicates")), num(max(rss, default=None)),
            num(round(sum(cpu), 1) if cpu else None), key_figures(r) + repeats(r) + probe(r),
            floor.text if floor else "-", verdict(floor, r) if floor else "-"]


def machines(results: Sequence[tuple[str, Result]]) -> list[str]:
    """One line per machine the results came from, with their dates and commits."""
    by: dict[str, list[dict[str, Any]]] = {}
    for _name, r in results:
        m = r.get("machine") or {}
        line = (f"{m.get('nproc', '?')} CPUs ({m.get('cpu_model') or 'unknown CPU'}), "
                f"{num(m.get('ram_gb'))} GB RAM, Python {m.get('python', '?')}, "
                f"Linux {m.get('kernel', '?')}")
        by.setdefault(line, []).append(m)
    out = []
    for line, ms in by.items():
        dates = sorted(str(m.get("date", "?"))[:10] for m in ms)
        commits = sorted({str(m.get("git_commit") or "?")[:10]
                          + ("+changes" if m.get("git_dirty") else "") for m in ms})
        span = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
        out.append(f"Machine: {line}; measured {span} at commit {', '.join(commits)}.")
    return out


def render(results: Sequence[tuple[str, Result]]) -> str:
    """The markdown between the markers: machine line(s) and the table."""
    def md(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    ordered = sorted(results, key=lambda nr: (
        ORDER.index(nr[1]["scenario"]) if nr[1].get("scenario") in ORDER else len(ORDER), nr[0]))
    seen = {f.key for _n, r in ordered if (f := floor_of(r))}
    lines = ["<!-- generated by `python -m bench.readme` from bench/results/*.json: "
             "edits here are overwritten -->", ""]
    lines += machines(ordered) or ["Machine: no results saved yet (`kron bench ... --save`)."]
    lines += ["", md(COLUMNS), md(["---"] * len(COLUMNS))]
    lines += [md(row(name, r)) for name, r in ordered]
    lines += [md([f.key, *["-"] * (len(COLUMNS) - 3), f.text, "not measured"])
              for f in FLOORS if f.key not in seen]
    return "\n".join(lines)


# --- files ----------------------------------------------------------------------------------


def load(results_dir: Path) -> list[tuple[str, Result]]:
    out = []
    for path in sorted(results_dir.glob("*.json")):
        doc = json.loads(path.read_text())
        if isinstance(doc, dict) and "scenario" in doc:
            out.append((path.stem, doc))
    return out


def rewrite(text: str, block: str) -> str:
    """text with everything between the markers replaced by block."""
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the file needs {START} followed by {END}")
    return f"{text[:start + len(START)]}\n{block}\n{text[end:]}"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.readme", description=__doc__.split("\n")[0])
    p.add_argument("--results", type=Path, default=RESULTS_DIR, help="the results directory")
    p.add_argument("--readme", type=Path, default=README, help="the file to rewrite")
    p.add_argument("--check", action="store_true",
                   help="change nothing; exit 1 if the table is not up to date")
    p.add_argument("--print", action="store_true", help="print the table instead")
    args = p.parse_args(argv)
    block = render(load(args.results))
    if args.print:
        print(block)
        return 0
    old = args.readme.read_text()
    new = rewrite(old, block)
    if args.check:
        return 0 if new == old else 1
    if new != old:
        args.readme.write_text(new)
    print(f"{args.readme}: {'updated' if new != old else 'up to date'} "
          f"({len(load(args.results))} results)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
