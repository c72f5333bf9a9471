"""A DAG run survives `kill -9` of the worker that owns it, mid-task: the task's lease
expires, the new owner calls it again under the same Idempotency-Key with the next
X-Kron-Attempt, and the run goes on to its end there.

Real processes: a KRaft broker, two `kron worker`s, the loopback HTTP receiver."""

from __future__ import annotations

import collections
import time
import uuid
from typing import Any

import pytest

from kron.processes import WorkerProcess
from streams.domain.ids import exec_id, task_exec_id
from tests.conftest import fresh_settings
from tests.support.stack import Commands, latest_executions, spec, wait_until

pytestmark = pytest.mark.integration


def now_ms() -> int:
    return time.time_ns() // 1_000_000


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


def test_kill_9_of_the_owner_mid_task_finishes_the_run_on_the_new_owner(
    kafka_cluster, tmp_path, receiver
) -> None:
    settings = fresh_settings(kafka_cluster, tmp_path / "d", session_timeout_s=6.0)
    commands = Commands(settings)
    workers = [WorkerProcess(settings, f"w{i}", tmp_path).start() for i in (1, 2)]
    try:
        warm = f"warm-{uuid.uuid4().hex[:8]}"
        commands.send("CreateJob", warm, spec=spec(target={"url": f"{receiver.url}/ok"},
                                                    run_at_ms=now_ms()))
        assert receiver.wait_for(warm, 1, 90), "\n".join(w.log()[-2000:] for w in workers)
        time.sleep(3)  # let the second worker's join settle the assignment

        job_id = f"dag-{uuid.uuid4().hex[:8]}"
        slot = now_ms()
        url = receiver.url
        commands.send("CreateJob", job_id, spec=dag_spec(
            [task("a", f"{url}/ok"), task("b", f"{url}/hold-first/60", "a", timeout_s=90.0),
             task("c", f"{url}/ok", "b")],
            run_at_ms=slot, lease_s=4.0))
        run_id = exec_id(job_id, slot)
        b_id = task_exec_id(run_id, "b")

        def b_hits() -> list[Any]:
            return [h for h in receiver.hits_for(job_id) if h.headers["X-Kron-Task-Id"] == "b"]

        assert wait_until(b_hits, 60), [w.log()[-2000:] for w in workers]
        b_running = wait_until(lambda: (e := latest_executions(settings, job_id).get(b_id))
                               and e["state"] == "running" and e, 30)
        assert b_running, latest_executions(settings, job_id)
        owner = next(w for w in workers if w.name == b_running["worker"])
        owner.kill()  # SIGKILL while the target holds b's first call

        def c_hits() -> list[Any]:
            return [h for h in receiver.hits_for(job_id) if h.headers["X-Kron-Task-Id"] == "c"]

        assert wait_until(c_hits, 60), [w.log()[-3000:] for w in workers]

        def run_done() -> dict[str, Any] | None:
            run = latest_executions(settings, job_id).get(run_id)
            return run if run and run["state"] in ("succeeded", "failed", "cancelled") else None

        run = wait_until(run_done, 30)
        assert run and run["state"] == "succeeded", latest_executions(settings, job_id)
        assert {t["task_id"]: t["state"] for t in run["dag"]["tasks"]} == {
            "a": "succeeded", "b": "succeeded", "c": "succeeded"}
        time.sleep(1.0)  # a stray late call of c would show now
        assert len(c_hits()) == 1

        b = latest_executions(settings, job_id)[b_id]
        assert (b["state"], b["attempt"], b["run_id"], b["task_id"]) == (
            "succeeded", 2, run_id, "b")
        assert [a["outcome"] for a in b["attempts"]] == ["lease_expired", "succeeded"]
        assert b["attempts"][1]["worker"] != owner.name

        calls = b_hits()
        assert [h.headers["X-Kron-Attempt"] for h in calls] == ["1", "2"]
        assert {h.headers["Idempotency-Key"] for h in calls} == {b_id}
        assert {h.headers["X-Kron-Run-Id"] for h in calls} == {run_id}

        hits = receiver.hits_for(job_id)
        pairs = collections.Counter((h.headers["Idempotency-Key"], h.headers["X-Kron-Attempt"])
                                    for h in hits)
        assert [p for p, n in pairs.items() if n > 1] == [], pairs
        assert [h.headers["X-Kron-Task-Id"] for h in hits if h.headers["X-Kron-Task-Id"] == "a"
                ] == ["a"]
    finally:
        for w in workers:
            w.stop()
        commands.close()
