"""DAG jobs through the real path: `kron api`, the broker, a worker and the loopback HTTP
target.

A run is its slot's execution (run id = exec_id(job, slot)); each task that runs is a task
instance called with Idempotency-Key = task_exec_id(run, task), X-Kron-Run-Id, X-Kron-Task-Id
and X-Kron-Attempt. Trigger rules are Airflow's; a failed branch fails the run, an all_done
cleanup still runs; a run can be cancelled and a failed run retried (only what did not
succeed runs again, under the same keys); overlap and backfill treat runs as executions; a
direct producer's CreateJob with a cycle is dead-lettered.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from bench.receiver import Hit
from replay.reader import read_topic
from streams.domain.ids import exec_id, task_exec_id
from tests.support.stack import Commands, latest_executions, spec, wait_until

pytestmark = pytest.mark.integration

NO_RETRY = {"max_attempts": 1}
DONE = ("succeeded", "failed", "cancelled")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


# --- jobs as the API takes them -------------------------------------------------------------


def api_task(task_id: str, url: str, *deps: str, rule: str = "all_success",
             retry: dict[str, Any] | None = None, timeout_s: float | None = None
             ) -> dict[str, Any]:
    out: dict[str, Any] = {"id": task_id, "target": {"type": "http", "url": url,
                                                     "method": "POST"},
                           "depends_on": list(deps), "trigger_rule": rule}
    if retry is not None:
        out["retry"] = retry
    if timeout_s is not None:
        out["timeout_s"] = timeout_s
    return out


def create(c: httpx.Client, tasks: list[dict[str, Any]], **fields: Any) -> str:
    body = {"name": f"dag-{uuid.uuid4().hex[:6]}", "dag": {"tasks": tasks}, **fields}
    r = c.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return str(r.json()["job_id"])


def one_off(c: httpx.Client, tasks: list[dict[str, Any]], **fields: Any) -> tuple[str, str]:
    """A one-off DAG job due now: its id and its run's id."""
    slot = now_ms()
    job_id = create(c, tasks, run_at=iso(slot), **fields)
    return job_id, exec_id(job_id, slot)


def run_of(c: httpx.Client, run_id: str) -> dict[str, Any]:
    r = c.get(f"/v1/runs/{run_id}")
    return r.json() if r.status_code == 200 else {}


def run_ended(c: httpx.Client, run_id: str, timeout_s: float = 60) -> dict[str, Any]:
    run = wait_until(lambda: (r := run_of(c, run_id)).get("state") in DONE and r, timeout_s)
    assert run, run_of(c, run_id)
    return dict(run)


def task_states(run: dict[str, Any]) -> dict[str, str]:
    return {t["task_id"]: t["state"] for t in run["tasks"]}


# --- jobs as a direct producer sends them ---------------------------------------------------


def http(url: str, timeout_s: float = 5.0) -> tuple[str, dict[str, Any]]:
    return ("kron.HttpTarget", {"method": "POST", "url": url, "headers": {}, "body": None,
                                "timeout_s": timeout_s})


def task(task_id: str, url: str, *deps: str, timeout_s: float = 5.0) -> dict[str, Any]:
    return {"id": task_id, "target": http(url, timeout_s), "depends_on": list(deps),
            "trigger_rule": "all_success", "retry": None, "timeout_s": None}


def dag_spec(tasks: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    s = spec(target={"url": "http://unused.invalid"}, **fields)
    s["target"] = ("kron.DagTarget", {"tasks": tasks})
    return s


# --- what the target saw --------------------------------------------------------------------


def calls(hits: list[Hit], task_id: str) -> list[Hit]:
    return [h for h in hits if h.headers.get("X-Kron-Task-Id") == task_id]


def check_headers(hits: list[Hit], job_id: str, run_id: str) -> None:
    for h in hits:
        task_id = h.headers["X-Kron-Task-Id"]
        assert h.headers["Idempotency-Key"] == task_exec_id(run_id, task_id), h.headers
        assert h.headers["X-Kron-Run-Id"] == run_id, h.headers
        assert h.headers["X-Kron-Job-Id"] == job_id, h.headers
        assert "X-Kron-Fencing-Token" in h.headers, h.headers


# --- the tests ------------------------------------------------------------------------------


def test_a_diamond_with_a_failing_branch_fails_after_its_all_done_cleanup(api_stack) -> None:
    stack, url = api_stack, api_stack.receiver.url
    with stack.client() as c:
        job_id, run_id = one_off(c, [
            api_task("a", f"{url}/ok"),
            api_task("b", f"{url}/status/500", "a", retry=NO_RETRY),
            api_task("c", f"{url}/ok", "a"),
            api_task("d", f"{url}/ok", "b", "c"),
            api_task("cleanup", f"{url}/ok", "d", rule="all_done"),
        ])
        assert wait_until(lambda: calls(stack.receiver.hits_for(job_id), "cleanup"), 60), \
            stack.worker.log()[-3000:]
        run = run_ended(c, run_id)
        assert run["state"] == "failed", run
        assert task_states(run) == {"a": "succeeded", "b": "failed", "c": "succeeded",
                                    "d": "upstream_failed", "cleanup": "succeeded"}
        time.sleep(1.0)  # a stray late call would show now
        hits = stack.receiver.hits_for(job_id)
        order = [h.headers["X-Kron-Task-Id"] for h in hits]
        assert sorted(order) == ["a", "b", "c", "cleanup"], order  # d never called
        assert order[0] == "a", order  # a before both b and c
        assert [h.status for h in calls(hits, "b")] == [500]
        check_headers(hits, job_id, run_id)
        assert {h.headers["X-Kron-Attempt"] for h in hits} == {"1"}
        by_task = {t["task_id"]: t for t in run["tasks"]}
        assert by_task["d"]["depends_on"] == ["b", "c"]
        assert by_task["cleanup"]["trigger_rule"] == "all_done"
        assert [len(by_task[t]["attempts"]) for t in ("a", "b", "c", "d", "cleanup")] == [
            1, 1, 1, 0, 1]
        assert by_task["b"]["attempts"][0]["status_code"] == 500
        assert isinstance(run["lateness_ms"], int), run  # its first task attempt's start

        listed = c.get(f"/v1/jobs/{job_id}/runs")
        assert listed.status_code == 200, listed.text
        [mine] = [r for r in listed.json()["runs"] if r["run_id"] == run_id]
        assert mine["state"] == "failed", mine
        counts = {k: v for k, v in mine["tasks"].items() if v}
        assert counts == {"succeeded": 3, "failed": 1, "upstream_failed": 1}, mine


def test_cancel_stops_the_running_task_and_skips_the_rest(api_stack) -> None:
    stack, url = api_stack, api_stack.receiver.url
    with stack.client() as c:
        job_id, run_id = one_off(c, [
            api_task("a", f"{url}/ok"),
            api_task("b", f"{url}/hang", "a", timeout_s=90.0),
            api_task("c", f"{url}/ok", "b"),
        ])
        assert wait_until(lambda: calls(stack.receiver.hits_for(job_id), "b"), 60), \
            stack.worker.log()[-3000:]
        assert wait_until(lambda: run_of(c, run_id).get("state") == "running", 30)
        r = c.post(f"/v1/runs/{run_id}:cancel")
        assert r.status_code == 202, r.text
        run = run_ended(c, run_id)
        assert run["state"] == "cancelled", run
        assert task_states(run) == {"a": "succeeded", "b": "cancelled", "c": "skipped"}
        [skipped] = [t for t in run["tasks"] if t["task_id"] == "c"]
        assert skipped["reason"] == "run cancelled", skipped
        assert skipped["attempts"] == [], skipped
        r = c.post(f"/v1/runs/{run_id}:cancel")
        assert r.status_code == 409, r.text
        time.sleep(1.0)
        hits = stack.receiver.hits_for(job_id)
        assert [h.headers["X-Kron-Task-Id"] for h in hits] == ["a", "b"]
        check_headers(hits, job_id, run_id)


def test_retry_runs_the_failed_task_again_under_its_key_then_its_children(api_stack) -> None:
    stack, url = api_stack, api_stack.receiver.url
    with stack.client() as c:
        job_id, run_id = one_off(c, [
            api_task("a", f"{url}/ok"),
            api_task("b", f"{url}/status/500,200", "a", retry=NO_RETRY),
            api_task("c", f"{url}/ok", "b"),
        ])
        run = run_ended(c, run_id)
        assert run["state"] == "failed", run
        assert task_states(run) == {"a": "succeeded", "b": "failed", "c": "upstream_failed"}
        r = c.post(f"/v1/runs/{run_id}:retry")
        assert r.status_code == 202, r.text
        assert wait_until(lambda: calls(stack.receiver.hits_for(job_id), "c"), 60), \
            stack.worker.log()[-3000:]
        assert wait_until(lambda: run_of(c, run_id).get("state") == "succeeded", 60), \
            run_of(c, run_id)
        run = run_of(c, run_id)
        assert task_states(run) == {"a": "succeeded", "b": "succeeded", "c": "succeeded"}
        time.sleep(1.0)
        hits = stack.receiver.hits_for(job_id)
        assert [h.headers["X-Kron-Task-Id"] for h in hits] == ["a", "b", "b", "c"]
        check_headers(hits, job_id, run_id)
        b1, b2 = calls(hits, "b")
        assert b1.headers["Idempotency-Key"] == b2.headers["Idempotency-Key"]
        assert [b1.headers["X-Kron-Attempt"], b2.headers["X-Kron-Attempt"]] == ["1", "2"]
        assert [b1.status, b2.status] == [500, 200]
        assert [h.headers["X-Kron-Attempt"] for h in calls(hits, "c")] == ["1"]
        by_task = {t["task_id"]: t for t in run["tasks"]}
        assert [a["outcome"] for a in by_task["b"]["attempts"]] == ["transient", "succeeded"]
        assert [a["attempt"] for a in by_task["b"]["attempts"]] == [1, 2]
        assert len(by_task["a"]["attempts"]) == 1 and len(by_task["c"]["attempts"]) == 1


def test_skip_if_running_never_overlaps_runs_and_records_the_skipped_slots(api_stack) -> None:
    stack, url = api_stack, api_stack.receiver.url
    job_id = f"overlap-{uuid.uuid4().hex[:6]}"
    commands = Commands(stack.settings)
    try:
        commands.send("CreateJob", job_id, spec=dag_spec(
            [task("slow", f"{url}/slow/5", timeout_s=30.0)], cron="*/2 * * * * *",
            overlap="skip_if_running"))
        assert stack.receiver.wait_for(job_id, 1, 60), stack.worker.log()[-3000:]
        time.sleep(12)
        commands.send("DeleteJob", job_id)
        time.sleep(2)
    finally:
        commands.close()
    records = latest_executions(stack.settings, job_id).values()
    runs = sorted((e for e in records if e["run_id"] is None),
                  key=lambda e: e["scheduled_for_ms"])
    tasks = {e["run_id"]: e for e in records if e["run_id"] is not None}
    started = [r for r in runs if r["exec_id"] in tasks]
    skipped = [r for r in runs if r["state"] == "skipped"]
    assert len(started) >= 2, runs
    assert len(skipped) >= 2 and all(r["reason"].startswith("overlap") for r in skipped), [
        (r["state"], r["reason"]) for r in runs]
    assert all(r["dag"] is not None for r in started)
    assert all(r["dag"] is None for r in skipped)  # a skipped slot never started a run
    # Each started run's one task attempt ended before the next run's began.
    spans = [(a["started_at_ms"], a["finished_at_ms"]) for r in started
             for a in tasks[r["exec_id"]]["attempts"]]
    assert len(spans) == len(started), spans
    for (_, end), (begin, _) in itertools.pairwise(spans):
        assert end is not None and begin >= end, spans
    # And at the target: one call in flight at a time (each is held 5 s).
    hits = stack.receiver.hits_for(job_id)
    assert len({h.headers["X-Kron-Run-Id"] for h in hits}) == len(hits)
    assert {h.headers["X-Kron-Run-Id"] for h in hits} <= {r["exec_id"] for r in started}
    for h1, h2 in itertools.pairwise(hits):
        assert h2.recv_ms - h1.recv_ms >= 4900, [h.recv_ms for h in hits]


def test_a_backfill_of_three_past_hours_makes_three_runs_with_their_slot_ids(api_stack) -> None:
    stack, url = api_stack, api_stack.receiver.url
    hour = now_ms() // 3_600_000 * 3_600_000  # the last slot before the job's own first
    job_id = f"backfill-{uuid.uuid4().hex[:6]}"
    commands = Commands(stack.settings)
    try:
        commands.send("CreateJob", job_id, spec=dag_spec(
            [task("a", f"{url}/ok"), task("b", f"{url}/ok", "a")], cron="0 * * * *"))
    finally:
        commands.close()
    with stack.client() as c:
        assert wait_until(lambda: c.get(f"/v1/jobs/{job_id}").status_code == 200, 30), \
            stack.api.log()[-3000:]
        slots = [hour - 2 * 3_600_000, hour - 3_600_000, hour]
        r = c.post(f"/v1/jobs/{job_id}:backfill",
                   json={"from": iso(slots[0]), "to": iso(slots[-1]), "max_per_s": 50})
        assert r.status_code == 202, r.text
        assert r.json()["backfill"]["slots"] == 3, r.json()
        run_ids = {exec_id(job_id, s) for s in slots}
        for run_id in run_ids:
            assert run_ended(c, run_id)["state"] == "succeeded", run_of(c, run_id)
        listed = c.get(f"/v1/jobs/{job_id}/runs").json()["runs"]
        assert {r["run_id"] for r in listed if r["trigger"] == "backfill"} == run_ids, listed
        time.sleep(1.0)
        hits = stack.receiver.hits_for(job_id)
        assert sorted((h.headers["X-Kron-Run-Id"], h.headers["X-Kron-Task-Id"]) for h in hits
                      ) == sorted((r, t) for r in run_ids for t in "ab")
        for run_id in run_ids:
            check_headers([h for h in hits if h.headers["X-Kron-Run-Id"] == run_id],
                          job_id, run_id)
        c.delete(f"/v1/jobs/{job_id}")


def test_a_direct_producers_cycle_is_dead_lettered_and_a_good_dag_runs(api_stack) -> None:
    stack, url = api_stack, api_stack.receiver.url
    commands = Commands(stack.settings)
    try:
        cyclic, good = f"cycle-{uuid.uuid4().hex[:6]}", f"good-{uuid.uuid4().hex[:6]}"
        commands.send("CreateJob", cyclic, spec=dag_spec(
            [task("a", f"{url}/ok", "c"), task("b", f"{url}/ok", "a"),
             task("c", f"{url}/ok", "b"), task("d", f"{url}/ok")],
            run_at_ms=now_ms()))
        slot = now_ms()
        commands.send("CreateJob", good, spec=dag_spec(
            [task("a", f"{url}/ok"), task("b", f"{url}/ok", "a")], run_at_ms=slot))

        def letters() -> list[dict[str, Any]]:
            return [e.record for e in read_topic(stack.settings.bootstrap_servers,
                                                 stack.settings.topic("dead-letters"))
                    if e.record and e.key == cyclic.encode()]

        found = wait_until(letters, 30)
        assert found, stack.worker.log()[-3000:]
        [letter] = found
        assert letter["error_class"] == "validation", letter
        # The cycle named along depends_on: a waits on c, c on b, b on a.
        assert "dependency cycle: a -> c -> b -> a" in letter["error"], letter

        run_id = exec_id(good, slot)
        run = wait_until(lambda: (e := latest_executions(stack.settings, good).get(run_id))
                         and e["state"] in DONE and e, 60)
        assert run and run["state"] == "succeeded", latest_executions(stack.settings, good)
        hits = stack.receiver.hits_for(good)
        assert [h.headers["X-Kron-Task-Id"] for h in hits] == ["a", "b"]
        check_headers(hits, good, run_id)

        time.sleep(1.0)
        assert latest_executions(stack.settings, cyclic) == {}
        assert stack.receiver.hits_for(cyclic) == []
        with stack.client() as c:
            assert c.get(f"/v1/jobs/{cyclic}").status_code == 404
    finally:
        commands.close()


# --- the CLI --------------------------------------------------------------------------------


def kron_cli(stack: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kron", "jobs", *args, "--api", stack.api.url, "--key",
         "key-acme"], capture_output=True, text=True, timeout=120)


def test_the_cli_creates_a_dag_job_shows_its_tasks_and_retries_its_run(api_stack,
                                                                       tmp_path) -> None:
    stack, url = api_stack, api_stack.receiver.url
    slot = now_ms()
    body = {"name": f"cli-dag-{uuid.uuid4().hex[:6]}", "run_at": iso(slot), "dag": {"tasks": [
        api_task("extract", f"{url}/ok"),
        api_task("load", f"{url}/status/503,200", "extract", retry=NO_RETRY),
        api_task("notify", f"{url}/ok", "load", rule="all_done")]}}
    (tmp_path / "dag.json").write_text(json.dumps(body))
    created = kron_cli(stack, "create", f"@{tmp_path / 'dag.json'}", "--json")
    assert created.returncode == 0, created.stderr
    job_id = json.loads(created.stdout)["job_id"]
    run_id = exec_id(job_id, slot)
    with stack.client() as c:
        assert run_ended(c, run_id)["state"] == "failed"
    runs = json.loads(kron_cli(stack, "runs", job_id, "--json").stdout)["runs"]
    assert [(r["run_id"], r["state"]) for r in runs] == [(run_id, "failed")]
    assert runs[0]["tasks"]["succeeded"] == 2 and runs[0]["tasks"]["failed"] == 1
    table = kron_cli(stack, "run-get", run_id)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    # The task table, in dependency order, with each task's state.
    order = [next(i for i, line in enumerate(lines) if f" {t} " in line)
             for t in ("extract", "load", "notify")]
    assert order == sorted(order), table.stdout
    assert "failed" in lines[order[1]] and "succeeded" in lines[order[2]]
    assert kron_cli(stack, "run-cancel", run_id).returncode == 1  # not running: 409
    retried = kron_cli(stack, "run-retry", run_id, "--json")
    assert retried.returncode == 0, retried.stderr
    with stack.client() as c:
        assert wait_until(lambda: run_of(c, run_id).get("state") == "succeeded", 60)
    load = calls(stack.receiver.hits_for(job_id), "load")
    assert [h.headers["X-Kron-Attempt"] for h in load] == ["1", "2"]
