"""`kron bench dag`: many DAG runs of one fan-out/fan-in shape, all due at the same second.

`runs` one-off DAG jobs (one run each) of 1 -> `fanout` -> 1 tasks, created in CreateJobs
batches before the due second T, every task an HTTP call to the loopback receiver. Each
task's URL ends in its task id (`/dag/<task id>`), so a `Hit`'s path names the task and
its X-Kron-Job-Id the run (one run per one-off job); the Idempotency-Key is checked against
the task instance id those two give (streams.domain.ids.task_exec_id).

Release latency is what the bench can see from outside the worker: "parent answered ->
child called", the child's receive time minus its parent's receive time (for the fan-in
task, the latest of its `fanout` parents'). The receiver writes its 200 in the same event
loop step that read the request head, before it reads any other request, so a parent's
receive time is when it was answered to within that step; what the worker did in between
(read the answer, record the result, decide and start the child) is what this measures.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.jobs import http_target, job_spec
from bench.progress import Bar
from bench.receiver import Hit
from bench.report import Result, log, rate, summary
from bench.scenarios import (
    AUDIT_GRACE_MS,
    HTTP_CLOCK,
    Deliveries,
    common,
    create_jobs,
    drain,
    lead_ms,
    next_second,
    now_ms,
    plot_stem,
    since_s,
    sleep_until,
    start_workers,
    wait_quiet,
    write_plots,
)
from bench.stack import History, Stack
from streams.domain.ids import exec_id, task_exec_id

PREFIX = "d-"
ROOT, JOIN = "root", "join"
PATH = "/dag/"
RELEASE_CLOCK = ("parent answered -> child called: the child call's receive time at the "
                 "loopback receiver minus its parent call's receive time (the fan-in task: "
                 "the latest of its parents'); the receiver answers 200 in the same event "
                 "loop step that read the request")
# CreateJobs records of at most about this many tasks (a 22-task spec is ~2 KB of Avro).
TASKS_PER_RECORD = 4000


def children(fanout: int) -> list[str]:
    return [f"c{i}" for i in range(fanout)]


def dag_target(url: str, fanout: int) -> tuple[str, dict[str, Any]]:
    """A `kron.DagTarget` of 1 -> fanout -> 1 tasks, each a POST to `url`/dag/<task id>."""
    def task(task_id: str, deps: list[str]) -> dict[str, Any]:
        return {"id": task_id, "target": http_target(f"{url}{PATH}{task_id}"),
                "depends_on": deps, "trigger_rule": "all_success", "retry": None,
                "timeout_s": None}

    kids = children(fanout)
    tasks = [task(ROOT, []), *(task(k, [ROOT]) for k in kids), task(JOIN, kids)]
    return "kron.DagTarget", {"tasks": tasks}


# --- what the target saw ----------------------------------------------------------------


@dataclass(kw_only=True)
class Runs:
    """The first call of each task of each run, as (job id -> task id -> Hit)."""

    fanout: int
    due_ms: int
    calls: dict[str, dict[str, Hit]] = field(default_factory=lambda: defaultdict(dict))
    keys_mismatched: int = 0  # an Idempotency-Key that is not the (run, task)'s instance id

    @classmethod
    def of(cls, seen: Deliveries, *, fanout: int, due_ms: int) -> Runs:
        out = cls(fanout=fanout, due_ms=due_ms)
        for h in seen.first.values():
            task = h.path.rpartition("/")[2]
            if h.key != task_exec_id(exec_id(h.job_id, due_ms), task):
                out.keys_mismatched += 1
            tasks = out.calls[h.job_id]
            if task not in tasks or h.recv_ms < tasks[task].recv_ms:
                tasks[task] = h
        return out

    @property
    def tasks_per_run(self) -> int:
        return self.fanout + 2

    def complete(self) -> list[dict[str, Hit]]:
        """The runs all of whose tasks were called."""
        return [t for t in self.calls.values() if len(t) == self.tasks_per_run]

    def releases(self) -> tuple[list[float], list[float], int]:
        """(fan-out releases, fan-in releases, children called before a parent's answer)."""
        fan_out: list[float] = []
        fan_in: list[float] = []
        for tasks in self.calls.values():
            root, join = tasks.get(ROOT), tasks.get(JOIN)
            kids = [h for k in children(self.fanout) if (h := tasks.get(k)) is not None]
            if root is not None:
                fan_out.extend(h.recv_ms - root.recv_ms for h in kids)
            if join is not None and len(kids) == self.fanout:
                fan_in.append(join.recv_ms - max(h.recv_ms for h in kids))
        early = sum(1 for v in fan_out + fan_in if v < 0)
        return fan_out, fan_in, early

    def window_ms(self) -> tuple[float, float] | None:
        """First root call, last fan-in call."""
        roots = [t[ROOT].recv_ms for t in self.calls.values() if ROOT in t]
        joins = [t[JOIN].recv_ms for t in self.calls.values() if JOIN in t]
        return (min(roots), max(joins)) if roots and joins else None


def run_states(history: History) -> Counter[str]:
    """Latest state of each run record (the slot's execution; its tasks are not counted)."""
    return Counter(r["state"] for r in history.latest().values()
                   if r["job_id"].startswith(PREFIX) and r.get("dag") is not None)


def _figures(runs: Runs, seen: Deliveries, expected_runs: int,
             releases: tuple[list[float], list[float], int]) -> dict[str, Any]:
    fan_out, fan_in, early = releases
    window = runs.window_ms()
    window_s = (window[1] - window[0]) / 1000 if window else 0.0
    done = runs.complete()
    return {
        "release_ms": summary(fan_out + fan_in), "release_fanout_ms": summary(fan_out),
        "release_fanin_ms": summary(fan_in), "release_clock": RELEASE_CLOCK,
        "released_before_parent": early,
        # Each run's last call, from the due second: how long a whole run took.
        "run_ms": summary(t[JOIN].recv_ms - runs.due_ms for t in done),
        "root_lateness_ms": summary(t[ROOT].recv_ms - runs.due_ms
                                    for t in runs.calls.values() if ROOT in t),
        "window_s": round(window_s, 3), "runs_called": len(done),
        "runs_per_s": rate(len(done), window_s), "task_calls": len(seen.first),
        "tasks_lost": expected_runs * runs.tasks_per_run - sum(map(len, runs.calls.values())),
        "keys_mismatched": runs.keys_mismatched,
    }


def _cpu(cpu_s: dict[str, float], runs: int, calls: int) -> dict[str, Any]:
    total = sum(cpu_s.values())
    return {"worker_cpu_s": round(total, 2),
            "worker_cpu_ms_per_run": round(total * 1000 / runs, 2) if runs else None,
            "worker_cpu_us_per_call": round(total * 1e6 / calls, 1) if calls else None}


# --- the scenario -----------------------------------------------------------------------


def dag(*, runs: int, fanout: int, workers: int, partitions: int,
        plot_dir: Path | None = None, label: str | None = None,
        worker_env: dict[str, str] | None = None, broker_warmup_s: float = 0.0) -> Result:
    """`runs` one-off DAG jobs of 1 -> fanout -> 1 HTTP tasks, all due at one second."""
    tasks = fanout + 2
    expected = runs * tasks
    with Stack(partitions=partitions, worker_env=worker_env,
               broker_warmup_s=broker_warmup_s) as stack:
        start_workers(stack, workers)
        due_ms = next_second(now_ms() + lead_ms(runs * tasks // 4))
        spec = job_spec(target=dag_target(stack.receiver.url, fanout), run_at_ms=due_ms)
        log(f"creating {runs} DAG jobs of 1 -> {fanout} -> 1 tasks due at "
            f"{datetime.fromtimestamp(due_ms / 1000, UTC):%T}")
        setup = create_jobs(stack, (f"{PREFIX}{i}" for i in range(runs)), spec,
                            timeout_s=max(60.0, (due_ms - now_ms()) / 1000 + 60), total=runs,
                            batch=max(1, min(100, TASKS_PER_RECORD // tasks)))
        margin = due_ms - now_ms()
        # CPU counts from just before the workers may fire (their fire-ahead window).
        ahead_s = float((worker_env or {}).get("KRON_FIRE_AHEAD_S",
                                               stack.settings.fire_ahead_s))
        sleep_until(due_ms - ahead_s * 1000 - 500, stack)
        stack.mark()
        seen = Deliveries()
        with Bar(f"{runs} runs of {tasks} tasks", expected, unit=" calls") as bar:
            drained = drain(stack.receiver.hits, seen, PREFIX, expected,
                            timeout_s=60 + expected / 50, on_count=bar.update)
        stack.mark_end()  # the load window (loop_busy) ends at the last call; CPU counts on
        wait_quiet(stack, quiet_s=1.0, timeout_s=60.0)  # to the last results, applied
        cpu = _cpu(stack.sampler.cpu_s(stack.worker_names()), runs, len(seen.first))
        history = stack.history(grace_ms=AUDIT_GRACE_MS)
        found = Runs.of(seen, fanout=fanout, due_ms=due_ms)
        released = found.releases()
        figures = _figures(found, seen, runs, released)
        late = seen.lateness(lambda h: h.scheduled_ms)
        result = common(stack, "dag", executions=len(seen.first),
                        duration_s=figures["window_s"], lateness=late, history=history,
                        seen=seen)
        states = run_states(history)
        result.update(figures)
        result.update(cpu)
        result.update({
            "runs": runs, "fanout": fanout, "tasks_per_run": tasks, "expected": expected,
            "run_states": dict(states), "runs_succeeded": states.get("succeeded", 0),
            "drained": drained, "setup": {**setup, "margin_ms": margin},
            "lateness_clock": HTTP_CLOCK})
        result["plots"] = write_plots(
            plot_dir, stem=plot_stem("dag", label), title=f"{runs} DAG runs, 1-{fanout}-1",
            values_ms=released[0] + released[1],
            times_s=since_s(seen, due_ms), hist_name="release", counted="child calls",
            hist_label="parent answered -> child called (ms, log scale)",
            rate_label="task calls/s (by receive time, 1 s buckets)",
            time_label="seconds since the due second")
        return result
