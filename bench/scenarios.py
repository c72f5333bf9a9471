"""The bench scenarios. Each builds a `Stack`, drives load, reads the history back, audits it.

Timing conventions: the wall clock (`now_ms`) for anything compared with kron's own times
(slots, record timestamps); `time.monotonic()` for durations measured by the bench alone.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.jobs import http_target, job_spec, kafka_target
from bench.progress import Bar
from bench.receiver import Hit, KafkaReceiver
from bench.report import Result, log, rate, summary
from bench.results import create_probe_us, speed_probe_ms
from bench.stack import History, Stack, du_bytes, executor_of
from streams.domain.schedule import apply_jitter
from streams.engine.batch import group_by_partition

# A cron job per unit of rate: six fields, the first is seconds.
EVERY_SECOND = "* * * * * *"
TARGET_TOPIC = "bench.target"  # the bench tenant's own namespace (streams/domain/topics.py)
# A worker applies ~1,500 CreateJobs/s on an idle 2-core machine; the lead before the first
# slot assumes 250/s so a busy machine still has the jobs in place (the run says if not).
APPLY_PER_S = 250.0
# Slots this long past due without any record are "lost" to the audit. Small, because the
# audit runs only after the target has seen every expected call (or the drain gave up).
AUDIT_GRACE_MS = 2_000
HTTP_CLOCK = "receiver wall clock when the request head was read"
KAFKA_CLOCK = ("consumer wall clock when poll() returned the record; "
               "lateness_broker_ms uses the broker's LogAppendTime instead")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def next_second(ms: float) -> int:
    return int(math.ceil(ms / 1000.0) * 1000)


def sleep_until(wall_ms: float, stack: Stack, step_s: float = 0.25,
                tick: Callable[[], None] | None = None) -> None:
    """Sleeps to a wall-clock time in short steps, failing fast if a worker died.

    `tick` runs every step (a progress bar's update)."""
    for _ in range(1_000_000):  # bounded by the deadline; the count is a backstop
        left = (wall_ms - now_ms()) / 1000
        if left <= 0:
            return
        for name, proc in stack.workers.items():
            if not proc.alive() and not proc.expected_exit:
                raise RuntimeError(f"worker {name} died during the run:\n{proc.tail()}")
        if tick is not None:
            tick()
        time.sleep(min(step_s, left))


# --- what the target saw ----------------------------------------------------------------------


@dataclass(slots=True)
class Deliveries:
    """The hits of one run (job-id prefix), first delivery per execution id."""

    first: dict[str, Hit] = field(default_factory=dict)
    per_attempt: Counter[tuple[str, int]] = field(default_factory=Counter)
    deliveries: Counter[str] = field(default_factory=Counter)
    _upto: int = 0

    def update(self, hits: list[Hit], prefix: str) -> int:
        end = len(hits)
        for h in hits[self._upto:end]:
            if not h.job_id.startswith(prefix):
                continue
            self.per_attempt[(h.key, h.attempt)] += 1
            self.deliveries[h.key] += 1
            if h.key not in self.first or h.recv_ms < self.first[h.key].recv_ms:
                self.first[h.key] = h
        self._upto = end
        return len(self.first)

    @property
    def target_duplicates(self) -> int:
        """The same key and attempt delivered again (each answered 200): a true duplicate."""
        return sum(n - 1 for n in self.per_attempt.values() if n > 1)

    @property
    def redeliveries(self) -> int:
        """Extra deliveries of an execution id, retries included (at-least-once at work)."""
        return sum(n - 1 for n in self.deliveries.values() if n > 1)

    def duplicated(self) -> list[tuple[str, int, int]]:
        """(key, attempt, times delivered) of every duplicate delivery."""
        return [(k, a, n) for (k, a), n in self.per_attempt.items() if n > 1]

    def lateness(self, due: Callable[[Hit], int]) -> list[float]:
        return [h.recv_ms - due(h) for h in self.first.values()]


def due_of(jitter_s: float) -> Callable[[Hit], int]:
    """The time a slot was due: its X-Kron-Scheduled-For, plus the job's jitter if any."""
    if jitter_s <= 0:
        return lambda h: h.scheduled_ms
    return lambda h: apply_jitter(h.scheduled_ms, jitter_s=jitter_s, job_id=h.job_id)


def drain(hits: list[Hit], seen: Deliveries, prefix: str, expected: int, timeout_s: float,
          quiet_s: float = 8.0, on_count: Callable[[int], None] | None = None) -> bool:
    """Waits until the target saw `expected` execution ids of the run; False if it gave up.

    It gives up at the timeout, or once no new execution arrived for `quiet_s`: an
    overloaded worker records late slots as `missed` (misfire policy), and those never come.
    """
    deadline = time.monotonic() + timeout_s
    count, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        n = seen.update(hits, prefix)
        if on_count is not None:
            on_count(n)
        if n >= expected:
            return True
        if n != count:
            count, since = n, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            break
        time.sleep(0.1)
    return seen.update(hits, prefix) >= expected


# --- shared pieces ----------------------------------------------------------------------------


def create_jobs(stack: Stack, ids: Iterable[str], spec: dict[str, Any],
                timeout_s: float, total: int, *, batch: int = 1) -> dict[str, float]:
    """Produces a CreateJob per id (`total` of them), or CreateJobs records of up to `batch`
    jobs of one partition, then waits for the worker to apply them.

    Returns seconds from the first produce to the last ack, and to the last JobState the
    worker wrote (each create writes exactly one to kron.jobs).
    """
    base, acked_before = stack.count("jobs"), stack.sink.acked
    started = time.monotonic()
    n = 0
    with Bar("creating (acked by Kafka)", total, unit=" jobs") as bar:
        for sent in _send_creates(stack, ids, spec, batch):
            before, n = n, n + sent
            if n // 1000 != before // 1000:  # the bar reads the clock; not once per job
                bar.update(stack.sink.acked - acked_before)
        stack.sink.flush()
        bar.update(stack.sink.acked - acked_before)
    acked = stack.sink.last_ack - started
    # kron.jobs also grows by other jobs' updates (probes firing): the bar stops at n.
    with Bar("applied by the worker", n, unit=" jobs") as bar:
        applied_at = stack.wait_count("jobs", base + n, timeout_s,
                                      on_count=lambda c: bar.update(min(n, c - base)))
    if applied_at is None:
        raise RuntimeError(f"the worker applied {stack.count('jobs') - base} of {n} creates "
                           f"within {timeout_s:.0f}s")
    return {"acked_s": round(acked, 3), "applied_s": round(applied_at - started, 3)}


def _send_creates(stack: Stack, ids: Iterable[str], spec: dict[str, Any],
                  batch: int) -> Iterator[int]:
    """Sends the creates; yields how many jobs each record carried."""
    if batch == 1:
        for job_id in ids:
            stack.sink.create(job_id, spec)
            yield 1
        return
    jobs = ({"job_id": job_id, "idempotency_key": None, "spec": spec} for job_id in ids)
    for partition, group in group_by_partition(jobs, stack.partitions, size=batch):
        stack.sink.create_many(partition, group)
        yield len(group)


def lead_ms(jobs: int) -> float:
    return 4000 + jobs / APPLY_PER_S * 1000


def write_plots(plot_dir: Path | None, **figures: Any) -> list[str] | None:
    """--plot: the lateness histogram and the throughput plot (bench.plots.Figures)."""
    if plot_dir is None:
        return None
    from bench import plots  # matplotlib loads only when a plot is asked for

    paths = plots.write(plot_dir, plots.Figures(**figures))
    log(f"plots written to {plot_dir}: {' '.join(Path(p).name for p in paths)}")
    return paths


def plot_stem(scenario: str, label: str | None) -> str:
    """`<scenario>[-<label>]`, like the saved result: the README links stay valid when the
    plots are regenerated with the same command."""
    return f"{scenario}-{label}" if label else scenario


def since_s(seen: Deliveries, origin_ms: int) -> list[float]:
    """Receive time of each execution's first delivery, seconds after origin."""
    return [(h.recv_ms - origin_ms) / 1000 for h in seen.first.values()]


def common(stack: Stack, scenario: str, *, executions: int, duration_s: float,
           lateness: list[float], history: History, seen: Deliveries | None) -> Result:
    workers = stack.worker_names()
    others = [n for n in ("broker", "api", "bench") if n in stack.sampler.usage]
    return {
        "scenario": scenario,
        "executions": executions,
        "duration_s": round(duration_s, 2),
        "executions_per_s": rate(executions, duration_s),
        "lateness_ms": summary(lateness),
        "lost": history.lost,
        "duplicates": history.duplicates,
        "target_duplicates": seen.target_duplicates if seen else 0,
        "target_redeliveries": seen.redeliveries if seen else 0,
        "audit": {**history.report.counts, "executions_read": history.report.executions,
                  "slots_checked": history.report.slots_checked},
        "rss_mb": stack.sampler.rss_mb(workers),
        "cpu_s": stack.sampler.cpu_s(workers),
        # Share of one core each worker's event-loop thread used through the load: near
        # 1.0, that thread is what bounds the run.
        "loop_busy": stack.sampler.loop_busy(workers),
        "rss_mb_other": stack.sampler.rss_mb(others),
        "cpu_s_other": stack.sampler.cpu_s(others),
        "workers": len(workers),
        "partitions": stack.partitions,
        "host": {"cpus": os.cpu_count(), "load_1m_before": round(stack.load_before, 2),
                 "load_1m_after": round(os.getloadavg()[0], 2),
                 "probe_ms_before": stack.probe_ms_before, "probe_ms_after": speed_probe_ms(),
                 "create_us_before": stack.create_us_before,
                 "create_us_after": create_probe_us(),
                 "speed": stack.host_speed.summary()},
        "broker_warmup": stack.warmup.as_dict() if stack.warmup else None,
    }


def states_of(history: History, prefix: str) -> Counter[str]:
    """Latest execution state per execution of the run's jobs, counted."""
    return Counter(r["state"] for r in history.latest().values()
                   if r["job_id"].startswith(prefix))


def start_workers(stack: Stack, n: int) -> float:
    for i in range(n):
        stack.start_worker(f"w{i + 1}")
    log(f"waiting for {n} worker(s) to own and fire every partition ...")
    ready = stack.wait_ready()
    log(f"workers ready in {ready:.1f}s")
    return ready


# --- steady -----------------------------------------------------------------------------------


@dataclass(kw_only=True)
class Step:
    """One constant-rate window: R per-second cron jobs, each firing `duration_s` times."""

    rate: int
    duration_s: int
    prefix: str
    window_ms: int = 0
    expected: int = 0
    setup: dict[str, float] = field(default_factory=dict)
    setup_margin_ms: int = 0  # how long before the window the creates were applied
    drained: bool = False
    seen: Deliveries = field(default_factory=Deliveries)

    def summary(self, due: Callable[[Hit], int]) -> dict[str, Any]:
        late = self.seen.lateness(due)
        last = max((h.recv_ms for h in self.seen.first.values()), default=self.window_ms)
        # Executions over the time they took: falling behind shows as a rate below R.
        took_s = max(self.duration_s, (last - self.window_ms) / 1000)
        return {"rate": self.rate, "expected": self.expected, "executions": len(self.seen.first),
                "duration_s": round(took_s, 2),
                "achieved_per_s": rate(len(self.seen.first), took_s),
                "lateness_ms": summary(late), "drained": self.drained,
                "setup_margin_ms": self.setup_margin_ms, **self.setup}


def run_step(stack: Stack, step: Step, *, target: tuple[str, dict[str, Any]],
             hits: list[Hit], jitter_s: float) -> Step:
    step.window_ms = next_second(now_ms() + lead_ms(step.rate))
    end_ms = step.window_ms + step.duration_s * 1000
    spec = job_spec(target=target, cron=EVERY_SECOND, start_at_ms=step.window_ms,
                    end_at_ms=end_ms - 1, jitter_s=jitter_s)
    step.expected = step.rate * step.duration_s
    log(f"{step.prefix}: creating {step.rate} per-second cron jobs, window "
        f"{step.duration_s}s from {datetime.fromtimestamp(step.window_ms / 1000, UTC):%T}")
    step.setup = create_jobs(stack, (f"{step.prefix}{i}" for i in range(step.rate)), spec,
                             timeout_s=max(60.0, (step.window_ms - now_ms()) / 1000 + 60),
                             total=step.rate)
    step.setup_margin_ms = step.window_ms - now_ms()
    if step.setup_margin_ms < 500:
        log(f"[yellow]warning:[/yellow] the creates were applied only {step.setup_margin_ms} ms "
            "before the window; the first slots may start late")
    sleep_until(step.window_ms, stack)
    stack.mark()
    with Bar(f"{step.prefix} {step.rate}/s for {step.duration_s}s", step.expected,
             unit=" executions") as bar:
        # Counting the target's hits during the window costs the bench CPU: only for a bar.
        tick = (lambda: bar.update(step.seen.update(hits, step.prefix))) if bar.on else None
        sleep_until(end_ms + jitter_s * 1000, stack, tick=tick)
        step.drained = drain(hits, step.seen, step.prefix, step.expected,
                             timeout_s=30 + step.duration_s, on_count=bar.update)
    stack.mark_end()
    if not step.drained:
        log(f"[yellow]warning:[/yellow] the target saw {len(step.seen.first)} of "
            f"{step.expected} executions by the end of the drain")
    return step


def steady(*, rate_per_s: int, duration_s: int, target: str, workers: int, partitions: int,
           jitter_s: float = 0.0, plot_dir: Path | None = None, label: str | None = None,
           worker_env: dict[str, str] | None = None,
           broker_warmup_s: float = 0.0) -> Result:
    with Stack(partitions=partitions, worker_env=worker_env,
               broker_warmup_s=broker_warmup_s) as stack:
        start_workers(stack, workers)
        tgt, hits, kafka_rx = _target(stack, target)
        try:
            step = run_step(stack, Step(rate=rate_per_s, duration_s=duration_s, prefix="s0-"),
                            target=tgt, hits=hits, jitter_s=jitter_s)
        finally:
            if kafka_rx is not None:
                kafka_rx.stop()
        time.sleep(1.5)  # the last changelog writes reach Kafka after the calls they caused
        history = stack.history(grace_ms=AUDIT_GRACE_MS)
        due = due_of(jitter_s)
        s = step.summary(due)
        result = common(stack, "steady", executions=s["executions"],
                        duration_s=s["duration_s"], lateness=step.seen.lateness(due),
                        history=history, seen=step.seen)
        result.update(_steady_extras(step, history, target, jitter_s, kafka_rx))
        result["plots"] = write_plots(
            plot_dir, stem=plot_stem("steady", label),
            title=f"steady {rate_per_s}/s via {target}", values_ms=step.seen.lateness(due),
            times_s=since_s(step.seen, step.window_ms), target_per_s=rate_per_s,
            speed=stack.host_speed.series(origin=step.window_ms / 1000))
        return result


def _target(stack: Stack, target: str) -> tuple[tuple[str, dict[str, Any]], list[Hit],
                                                KafkaReceiver | None]:
    if target == "kafka":
        stack.create_target_topic(TARGET_TOPIC)
        rx = KafkaReceiver(stack.settings.bootstrap_servers, TARGET_TOPIC).start(
            stack.partitions)
        return kafka_target(TARGET_TOPIC), rx.hits, rx
    return http_target(f"{stack.receiver.url}/t"), stack.receiver.hits, None


def _steady_extras(step: Step, history: History, target: str, jitter_s: float,
                   kafka_rx: KafkaReceiver | None) -> dict[str, Any]:
    states = states_of(history, step.prefix)
    out: dict[str, Any] = {
        "target": target, "rate": step.rate, "window_s": step.duration_s,
        "expected": step.expected,
        "achieved_per_s": rate(len(step.seen.first), step.summary(due_of(jitter_s))[
            "duration_s"]),
        "unfired": max(0, step.expected - sum(states.values())),
        "missed": states.get("missed", 0), "states": dict(states),
        "drained": step.drained, "jitter_s": jitter_s,
        "setup": {**step.setup, "margin_ms": step.setup_margin_ms},
        "lateness_clock": KAFKA_CLOCK if kafka_rx else HTTP_CLOCK,
    }
    if kafka_rx is not None:
        out["lateness_broker_ms"] = summary(h.broker_ms - due_of(jitter_s)(h)
                                            for h in step.seen.first.values())
    return out


def wait_quiet(stack: Stack, quiet_s: float = 3.0, timeout_s: float = 90.0) -> None:
    """Until kron.executions stops growing: an overloaded step's backlog must not spill
    into the next step's measurement."""
    deadline = time.monotonic() + timeout_s
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        n = stack.count("executions")
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.5)


def next_rate(good: int, bad: int | None, current: int) -> int | None:
    """Doubling until the first failure, then bisecting; None once within 10 %."""
    if bad is None:
        return current * 2
    if bad - good <= max(1, good // 10):
        return None
    return (good + bad) // 2


def find_max(*, start_rate: int, step_s: int, target: str, workers: int, partitions: int,
             max_steps: int, limit_ms: float, jitter_s: float = 0.0,
             plot_dir: Path | None = None, label: str | None = None,
             worker_env: dict[str, str] | None = None,
             broker_warmup_s: float = 0.0) -> Result:
    """Raises the rate until p99 lateness passes `limit_ms` (or the target falls behind)."""
    due = due_of(jitter_s)
    with Stack(partitions=partitions, worker_env=worker_env,
               broker_warmup_s=broker_warmup_s) as stack:
        start_workers(stack, workers)
        tgt, hits, kafka_rx = _target(stack, target)
        steps: list[Step] = []
        summaries: list[dict[str, Any]] = []
        good, bad, r = 0, None, start_rate
        try:
            for i in range(max_steps):
                step = run_step(stack, Step(rate=r, duration_s=step_s, prefix=f"s{i}-"),
                                target=tgt, hits=hits, jitter_s=jitter_s)
                s = step.summary(due)
                # The step's own window: the next step's mark() starts the shares afresh.
                s["loop_busy"] = stack.sampler.loop_busy(stack.worker_names())
                p99 = s["lateness_ms"]["p99"]
                s["sustained"] = ok = bool(step.drained and p99 is not None and p99 <= limit_ms)
                log(f"rate {r}/s: p99 {p99} ms -> {'ok' if ok else 'not sustained'}")
                steps.append(step)
                summaries.append(s)
                if ok:
                    good = max(good, r)
                else:
                    bad = r if bad is None else min(bad, r)
                    wait_quiet(stack)
                nxt = next_rate(good, bad, r)
                if nxt is None or nxt <= 0:
                    break
                r = nxt
        finally:
            if kafka_rx is not None:
                kafka_rx.stop()
        time.sleep(1.5)
        history = stack.history(grace_ms=AUDIT_GRACE_MS)
        best = next((st for st in reversed(steps) if st.rate == good), steps[-1])
        b = best.summary(due)
        result = common(stack, "steady", executions=sum(len(st.seen.first) for st in steps),
                        duration_s=b["duration_s"], lateness=best.seen.lateness(due),
                        history=history, seen=best.seen)
        result.update({"find_max": True, "target": target, "limit_p99_ms": limit_ms,
                       "loop_busy": summaries[steps.index(best)]["loop_busy"],
                       "max_sustainable_rate": good, "first_unsustained_rate": bad,
                       "rate": best.rate, "window_s": best.duration_s,
                       "executions_per_s": b["achieved_per_s"],
                       "achieved_per_s": b["achieved_per_s"],
                       "lateness_clock": KAFKA_CLOCK if kafka_rx else HTTP_CLOCK,
                       "steps": summaries})
        result["plots"] = write_plots(
            plot_dir, stem=plot_stem("steady", label),
            title=f"steady {best.rate}/s via {target} (highest sustained)",
            values_ms=best.seen.lateness(due), times_s=since_s(best.seen, best.window_ms),
            target_per_s=best.rate)
        return result


# --- burst ------------------------------------------------------------------------------------


def burst(*, jobs: int, workers: int, partitions: int, plot_dir: Path | None = None,
          label: str | None = None, worker_env: dict[str, str] | None = None,
          broker_warmup_s: float = 0.0) -> Result:
    """N one-off jobs all due at the same second, created well before it."""
    with Stack(partitions=partitions, worker_env=worker_env,
               broker_warmup_s=broker_warmup_s) as stack:
        start_workers(stack, workers)
        due_ms = next_second(now_ms() + lead_ms(jobs))
        spec = job_spec(target=http_target(f"{stack.receiver.url}/b"), run_at_ms=due_ms)
        log(f"creating {jobs} one-off jobs due at "
            f"{datetime.fromtimestamp(due_ms / 1000, UTC):%T}")
        setup = create_jobs(stack, (f"b-{i}" for i in range(jobs)), spec,
                            timeout_s=max(60.0, (due_ms - now_ms()) / 1000 + 60), total=jobs)
        margin = due_ms - now_ms()
        sleep_until(due_ms, stack)
        stack.mark()
        seen = Deliveries()
        with Bar(f"burst of {jobs}", jobs, unit=" executions") as bar:
            drained = drain(stack.receiver.hits, seen, "b-", jobs, timeout_s=60 + jobs / 50,
                            on_count=bar.update)
        stack.mark_end()
        time.sleep(1.5)
        history = stack.history(grace_ms=AUDIT_GRACE_MS)
        late = seen.lateness(lambda h: h.scheduled_ms)
        last_ms = max(late, default=0.0)
        result = common(stack, "burst", executions=len(seen.first),
                        duration_s=max(last_ms, 1.0) / 1000, lateness=late, history=history,
                        seen=seen)
        states = states_of(history, "b-")
        result.update({
            "jobs": jobs, "time_to_last_ms": round(last_ms, 1), "drained": drained,
            "unfired": max(0, jobs - sum(states.values())), "missed": states.get("missed", 0),
            "states": dict(states),
            "setup": {**setup, "margin_ms": margin}, "lateness_clock": HTTP_CLOCK})
        result["plots"] = write_plots(
            plot_dir, stem=plot_stem("burst", label), title=f"burst of {jobs}",
            values_ms=late, times_s=since_s(seen, due_ms),
            time_label="seconds since the due second")
        return result


# --- timers -----------------------------------------------------------------------------------


def timers(*, jobs: int, partitions: int, due_in_s: int = 86_400, batch: int = 1,
           workers: int = 1, plot_dir: Path | None = None, label: str | None = None,
           worker_env: dict[str, str] | None = None,
           broker_warmup_s: float = 0.0) -> Result:
    """N pending one-offs: create rate, memory and disk with them pending, restart times.
    With several workers, each holds its partitions' jobs (and standbys of the others'),
    and a restart restarts them all."""
    with Stack(partitions=partitions, worker_env=worker_env,
               broker_warmup_s=broker_warmup_s) as stack:
        empty_ready_s = start_workers(stack, workers)
        stack.mark()
        spec = job_spec(target=http_target(f"{stack.receiver.url}/never"),
                        run_at_ms=now_ms() + due_in_s * 1000)
        log(f"creating {jobs} pending one-off jobs ...")
        if plot_dir is not None:
            stack.sink.record_acks()
        started = time.monotonic()
        setup = create_jobs(stack, (f"p-{i}" for i in range(jobs)), spec,
                            timeout_s=max(120.0, jobs / 50), total=jobs, batch=batch)
        stack.mark_end()
        plots = _timers_plots(stack, plot_dir, plot_stem("timers", label), started, jobs)
        time.sleep(2.0)  # let RocksDB flush and the RSS settle before reading them
        stack.sampler.sample()
        pending = _footprint(stack)
        log(f"{jobs} pending: {pending}")
        warm = restart(stack, wipe=False)
        log(f"restart with local state: ready in {warm['ready_s']} s")
        cold = restart(stack, wipe=True)
        log(f"restart from the changelogs: ready in {cold['ready_s']} s")
        stack.sampler.sample()
        after_cold = _footprint(stack)
        history = stack.history(grace_ms=AUDIT_GRACE_MS)
        total_s = setup["applied_s"]
        result = common(stack, "timers", executions=0, duration_s=total_s, lateness=[],
                        history=history, seen=None)
        result.update({
            "jobs": jobs, "batch": batch,
            "create_acked_per_s": rate(jobs, setup["acked_s"]),
            "create_applied_per_s": rate(jobs, setup["applied_s"]),
            "setup": setup, "pending": pending,
            # For scale: a first start with no state at all, same probe.
            "empty_ready_s": round(empty_ready_s, 2),
            "restart_ready_s": warm["ready_s"], "restart_stop_s": warm["stop_s"],
            "cold_ready_s": cold["ready_s"], "cold_stop_s": cold["stop_s"],
            "rss_mb_after_cold": after_cold["rss_mb"],
            "disk_mb_after_cold": after_cold["disk_mb"],
            "plots": plots,
        })
        return result


def _footprint(stack: Stack) -> dict[str, Any]:
    """The largest worker's RSS (the floor is per worker) and the state on disk of all of
    them, with each worker's own figures when there are several."""
    names = stack.worker_names()
    rss = stack.sampler.rss_mb(names, peak=False)
    disk = {n: round(du_bytes(stack.worker_dir(n)) / 2**20, 1) for n in names}
    out: dict[str, Any] = {"rss_mb": max(rss.values(), default=None),
                           "disk_mb": round(sum(disk.values()), 1)}
    if len(names) > 1:
        out["per_worker"] = {n: {"rss_mb": rss.get(n), "disk_mb": disk[n]} for n in names}
    return out


def _timers_plots(stack: Stack, plot_dir: Path | None, stem: str, started: float,
                  jobs: int) -> list[str] | None:
    """Nothing fires in `timers`: its plots are the creates' ack latency and acks/s."""
    sink = stack.sink
    if plot_dir is None or sink.ack_times is None or sink.ack_latency_ms is None:
        return None
    paths = write_plots(
        plot_dir, stem=stem, title=f"{jobs:,} pending timers", values_ms=sink.ack_latency_ms,
        times_s=[t - started for t in sink.ack_times], hist_name="ack-latency", counted="creates",
        hist_label="CreateJob produce-to-ack latency, acks=all (ms, log scale)",
        rate_label="creates acked by Kafka per second", time_label="seconds since the first create")
    sink.ack_times = sink.ack_latency_ms = None  # a million of each: free them
    return paths


def restart(stack: Stack, *, wipe: bool) -> dict[str, float]:
    """SIGTERM every worker, optionally delete their state, start them again; time until
    probes fire on every partition."""
    t0 = time.monotonic()
    names = stack.worker_names()
    for name in names:
        stack.workers[name].signal(signal.SIGTERM)
    for name in names:  # they stop side by side; each gets the same 60 s
        proc = stack.workers[name]
        if not proc.wait(max(1.0, 60 - (time.monotonic() - t0))):
            log(f"[yellow]warning:[/yellow] {name} ignored SIGTERM for 60 s; killing it")
            proc.kill()
    stop_s = time.monotonic() - t0
    if wipe:
        for name in names:
            shutil.rmtree(stack.worker_dir(name))
    started = time.monotonic()
    for name in names:
        stack.start_worker(name)
    stack.wait_ready(timeout_s=600)
    return {"stop_s": round(stop_s, 2), "ready_s": round(time.monotonic() - started, 2)}


# --- api --------------------------------------------------------------------------------------


@dataclass(slots=True)
class ApiLoad:
    latencies_ms: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    done_s: list[float] = field(default_factory=list)  # when each answer came, for --plot


async def _api_load(url: str, key: str, target_url: str, *, concurrency: int,
                    duration_s: float) -> ApiLoad:
    # aiohttp, not httpx: httpx's AsyncClient cost ~2 ms of client CPU per request, so on a
    # 2-core box the load generator (not the API) set the rate. aiohttp costs ~0.08 ms; one
    # session with a pool of `concurrency` connections measured the same as one per task.
    import aiohttp

    load = ApiLoad()
    started = time.monotonic()
    deadline = started + duration_s
    session = aiohttp.ClientSession(
        base_url=url, headers={"X-API-Key": key}, timeout=aiohttp.ClientTimeout(total=30),
        connector=aiohttp.TCPConnector(limit=concurrency))

    async def client_loop(n: int) -> None:
        for i in range(10_000_000):  # bounded by the deadline; the count is a backstop
            if time.monotonic() >= deadline:
                return
            run_at = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
            body = {"name": f"api-{n}-{i}", "run_at": run_at,
                    "target": {"type": "http", "url": target_url, "method": "POST"}}
            t0 = time.perf_counter()
            try:
                async with session.post("/v1/jobs", json=body) as resp:
                    await resp.read()  # the whole answer, and the connection back to the pool
                    status = str(resp.status)
            except (aiohttp.ClientError, TimeoutError) as exc:
                status = type(exc).__name__
            load.latencies_ms.append((time.perf_counter() - t0) * 1000)
            load.statuses[status] += 1
            load.done_s.append(time.monotonic() - started)

    async with session:
        await asyncio.gather(*(client_loop(n) for n in range(concurrency)))
    return load


def api(*, duration_s: int, concurrency: int, workers: int, partitions: int,
        plot_dir: Path | None = None, label: str | None = None,
        worker_env: dict[str, str] | None = None,
        broker_warmup_s: float = 0.0) -> Result:
    """Concurrent POST /v1/jobs against a `kron api` process (one-offs due in an hour)."""
    with Stack(partitions=partitions, worker_env=worker_env,
               broker_warmup_s=broker_warmup_s) as stack:
        if workers:
            start_workers(stack, workers)
        url = stack.start_api()
        log(f"API ready at {url}; {concurrency} clients for {duration_s}s ...")
        base = stack.count("jobs")
        stack.mark()
        started = time.monotonic()
        load = asyncio.run(_api_load(url, stack.api_key, f"{stack.receiver.url}/api",
                                     concurrency=concurrency, duration_s=duration_s))
        took = time.monotonic() - started
        stack.mark_end()
        ok = sum(n for s, n in load.statuses.items() if s.startswith("2"))
        applied_lag = None
        if workers:
            reached = stack.wait_count("jobs", base + ok, timeout_s=120)
            applied_lag = None if reached is None else round(reached - started - took, 2)
        history = stack.history(grace_ms=AUDIT_GRACE_MS)
        result = common(stack, "api", executions=0, duration_s=took, lateness=[],
                        history=history, seen=None)
        result.update({
            "concurrency": concurrency, "requests": sum(load.statuses.values()),
            "accepted": ok, "requests_per_s": rate(ok, took),
            "latency_ms": summary(load.latencies_ms), "statuses": dict(load.statuses),
            "worker_applied_lag_s": applied_lag})
        result["plots"] = write_plots(
            plot_dir, stem=plot_stem("api", label),
            title=f"POST /v1/jobs, {concurrency} clients", values_ms=load.latencies_ms,
            times_s=load.done_s, hist_name="latency", counted="requests",
            hist_label="request latency (ms, log scale)",
            rate_label="answered requests per second", time_label="seconds since the load began")
        return result


# --- failover ---------------------------------------------------------------------------------


def failover(*, rate_per_s: int, duration_s: int, kill_after_s: float, partitions: int,
             session_timeout_s: float | None, workers: int = 2, plot_dir: Path | None = None,
             label: str | None = None, worker_env: dict[str, str] | None = None,
             broker_warmup_s: float = 0.0) -> Result:
    """Workers (two by default) at a steady rate; one is SIGKILLed mid-window. Who picks
    up, how fast."""
    if workers < 2:
        raise ValueError("failover needs at least two workers: one to kill, one to take over")
    with Stack(partitions=partitions, session_timeout_s=session_timeout_s,
               worker_env=worker_env, broker_warmup_s=broker_warmup_s) as stack:
        start_workers(stack, workers)
        owners = stack.partition_owners(stack.last_probe_ids)
        # The last worker that owns partitions: with two, w2 as before.
        victim = max(set(owners.values()), key=lambda w: int(w[1:]), default="w1")
        survivors = set(stack.worker_names()) - {victim}
        orphans = sorted(p for p, w in owners.items() if w == victim)
        log(f"partition owners: {owners}; {victim} will be killed")
        window_ms = next_second(now_ms() + lead_ms(rate_per_s))
        end_ms = window_ms + duration_s * 1000
        # A short lease: attempts the victim had in flight are retried soon after takeover.
        spec = job_spec(target=http_target(f"{stack.receiver.url}/f"), cron=EVERY_SECOND,
                        start_at_ms=window_ms, end_at_ms=end_ms - 1, lease_s=10.0)
        setup = create_jobs(stack, (f"f-{i}" for i in range(rate_per_s)), spec,
                            timeout_s=max(60.0, (window_ms - now_ms()) / 1000 + 60),
                            total=rate_per_s)
        sleep_until(window_ms, stack)
        stack.mark()
        kill_ms = window_ms + int(kill_after_s * 1000)
        sleep_until(kill_ms, stack)
        kill_ms = now_ms()
        stack.workers[victim].kill()
        log(f"killed {victim} (SIGKILL) {kill_after_s}s into the window")
        sleep_until(end_ms, stack)
        wait_quiet(stack, quiet_s=5.0, timeout_s=120.0)
        stack.mark_end()
        seen = Deliveries()
        seen.update(stack.receiver.hits, "f-")
        history = stack.history(grace_ms=AUDIT_GRACE_MS)
        due = due_of(0.0)
        result = common(stack, "failover", executions=len(seen.first),
                        duration_s=duration_s, lateness=seen.lateness(due), history=history,
                        seen=seen)
        result.update(_failover_extras(history, seen, orphans, survivors, kill_ms))
        result.update({"rate": rate_per_s, "window_s": duration_s, "expected":
                       rate_per_s * duration_s, "victim": victim, "owners": owners,
                       "kill_after_s": round(kill_after_s, 2), "setup": setup,
                       "session_timeout_s": stack.settings.session_timeout_s,
                       "states": dict(states_of(history, "f-")),
                       "lateness_clock": HTTP_CLOCK})
        result["plots"] = write_plots(
            plot_dir, stem=plot_stem("failover", label),
            title=f"failover at {rate_per_s}/s", values_ms=seen.lateness(due),
            times_s=since_s(seen, window_ms), target_per_s=rate_per_s,
            marks=[((kill_ms - window_ms) / 1000, f"kill -9 {victim}")])
        return result


def _failover_extras(history: History, seen: Deliveries, orphans: list[int],
                     survivors: set[str], kill_ms: int) -> dict[str, Any]:
    """Slots of the partitions the victim owned: their lateness, the takeover, misses."""
    part_of: dict[str, int] = {}
    takeover: int | None = None
    for e in history.executions:
        rec = e.record
        assert rec is not None
        part_of[rec["exec_id"]] = e.partition
        if (e.partition in orphans and executor_of(rec) in survivors
                and rec["updated_at_ms"] >= kill_ms):
            takeover = min(takeover or rec["updated_at_ms"], rec["updated_at_ms"])
    orphan_hits = [h for h in seen.first.values()
                   if part_of.get(h.key) in orphans and h.scheduled_ms >= kill_ms - 1000]
    latest = history.latest()
    orphan_states = Counter(r["state"] for x, r in latest.items()
                            if part_of.get(x) in orphans and r["job_id"].startswith("f-")
                            and r["scheduled_for_ms"] >= kill_ms - 1000)
    dups = seen.duplicated()
    return {
        "orphaned_partitions": orphans,
        "takeover_ms": None if takeover is None else takeover - kill_ms,
        # Where the target's duplicates come from: the victim's partitions or not.
        "target_duplicates_in_orphans": sum(n - 1 for k, _a, n in dups
                                            if part_of.get(k) in orphans),
        "target_duplicate_examples": [_dup_example(history, k, a, n, part_of, kill_ms)
                                      for k, a, n in dups[:5]],
        "orphan_lateness_ms": summary(h.recv_ms - h.scheduled_ms for h in orphan_hits),
        "orphan_states": dict(orphan_states),
    }


def _dup_example(history: History, key: str, attempt: int, n: int, part_of: dict[str, int],
                 kill_ms: int) -> dict[str, Any]:
    """One duplicate delivery with what kron.executions recorded for it."""
    recs = [e.record for e in history.executions if e.record and e.record["exec_id"] == key]
    return {"exec_id": key, "attempt": attempt, "delivered": n, "partition": part_of.get(key),
            "slot_after_kill_ms": (recs[0]["scheduled_for_ms"] - kill_ms) if recs else None,
            "records": [f"{r['envelope']['event_type']} a{r['attempt']} by {executor_of(r)}"
                        for r in recs]}
