"""PartitionCore with DAG jobs, example by example: runs released by rule, retries per task,
cancel, retry of a run, overlap, delete, backfill, and the repair of torn writes.

The rules themselves are streams.domain.dag's (test_dag_domain.py, test_dag_properties.py);
these tests check that the core applies them through its state: task instances, leases,
fencing and the run record.
"""

from __future__ import annotations

from typing import Any

import pytest

from streams.domain.errors import PermanentError
from streams.domain.ids import exec_id, task_exec_id
from streams.engine.core import Cancel, Dispatch, Effect
from streams.engine.store import Record
from tests.support.stack import spec
from tests.unit.test_core_scenarios import MIN, SEC, Partition, dispatches, utc

T0 = utc(2026, 3, 1, 0, 0)


def http(name: str) -> tuple[str, dict[str, Any]]:
    return ("kron.HttpTarget", {"method": "POST", "url": f"http://target.invalid/{name}",
                                "headers": {}, "body": None, "timeout_s": 5.0})


def task(task_id: str, *deps: str, rule: str = "all_success", retry: Record | None = None,
         timeout_s: float | None = None) -> Record:
    return {"id": task_id, "target": http(task_id), "depends_on": list(deps),
            "trigger_rule": rule, "retry": retry, "timeout_s": timeout_s}


NO_RETRY = {"max_attempts": 1, "backoff": "fixed", "base_s": 1.0, "max_s": 1.0}
DIAMOND = [task("a"), task("b", "a", retry=NO_RETRY), task("c", "a"), task("d", "b", "c"),
           task("cleanup", "d", rule="all_done")]


def dag_spec(tasks: list[Record], **fields: Any) -> Record:
    s = spec(target={"url": "http://unused.invalid"}, **fields)
    s["target"] = ("kron.DagTarget", {"tasks": tasks})
    return s


class Dag(Partition):
    def create_dag(self, job_id: str, tasks: list[Record], **fields: Any) -> list[Effect]:
        return self.command("CreateJob", job_id, spec=dag_spec(tasks, **fields),
                            idempotency_key=None)

    def run(self, job_id: str, slot_ms: int) -> Record:
        run = self.store.execution(exec_id(job_id, slot_ms))
        assert run is not None and run["dag"] is not None
        return run

    def states(self, run: Record) -> dict[str, str]:
        return {t["task_id"]: t["state"] for t in run["dag"]["tasks"]}


def started(effects: list[Effect]) -> dict[str, Dispatch]:
    return {d.task_id: d for d in dispatches(effects) if d.task_id is not None}


def test_a_diamond_with_a_failing_branch_ends_failed_after_its_all_done_cleanup() -> None:
    p = Dag(T0 - MIN)
    p.create_dag("j", DIAMOND, cron="0 * * * *")
    first = started(p.tick(T0))
    assert set(first) == {"a"}
    run_id = exec_id("j", T0)
    a = first["a"]
    assert (a.run_id, a.exec_id) == (run_id, task_exec_id(run_id, "a"))
    assert a.target["url"].endswith("/a")
    # The run is the slot's execution, and the only entry in the job's `running`.
    assert p.job("j")["running"] == [run_id]
    assert p.store.execution(run_id)["attempts"] == []  # the run makes no call itself
    released = started(p.report(a, "success"))
    assert set(released) == {"b", "c"}
    p.now += SEC
    # b fails: d can't run (all_success), and so is settled now; cleanup (all_done on d)
    # is released in the same event, while c still runs.
    last = started(p.report(released["b"], "permanent", status_code=400))
    assert set(last) == {"cleanup"}
    assert started(p.report(released["c"], "success")) == {}
    run = p.run("j", T0)
    assert p.states(run) == {"a": "succeeded", "b": "failed", "c": "succeeded",
                             "d": "upstream_failed", "cleanup": "running"}
    assert run["state"] == "running"
    p.report(last["cleanup"], "success")
    run = p.run("j", T0)
    assert run["state"] == "failed" and run["last_error"].startswith("task b:")
    # Only the tasks that ran have instances; each ran one attempt.
    instances = [e for e in p.store.executions.values() if e["run_id"] == run_id]
    assert sorted(e["task_id"] for e in instances) == ["a", "b", "c", "cleanup"]
    assert all(e["attempt"] == 1 for e in instances)


def test_a_task_retries_by_its_own_policy_under_the_same_instance() -> None:
    p = Dag(T0 - MIN)
    retry = {"max_attempts": 3, "backoff": "fixed", "base_s": 1.0, "max_s": 1.0}
    p.create_dag("j", [task("a", retry=retry), task("b", "a")], run_at_ms=T0)
    a = started(p.tick(T0))["a"]
    p.report(a, "transient")
    again = started(p.tick(T0 + 2 * SEC))["a"]
    assert (again.exec_id, again.attempt, again.run_id) == (a.exec_id, 2, a.run_id)
    b = started(p.report(again, "success"))["b"]
    p.report(b, "success")
    assert p.run("j", T0)["state"] == "succeeded"
    assert p.job("j")["status"] == "completed"  # a one-off DAG is done when its run is


def test_a_lost_worker_expires_the_task_lease_and_the_task_retries() -> None:
    p = Dag(T0 - MIN)
    p.create_dag("j", [task("a"), task("b", "a")], run_at_ms=T0, lease_s=5.0)
    a = started(p.tick(T0))["a"]
    p.new_owner(2, "w2")
    effects = p.ticks(T0 + 10 * SEC, SEC)
    retried = [d for d in dispatches(effects) if d.task_id == "a"]
    assert [d.attempt for d in retried] == [2]
    p.report(a, "success")  # the first worker's late word: fenced
    assert p.states(p.run("j", T0))["a"] == "running"
    b = started(p.report(retried[0], "success"))["b"]
    p.report(b, "success")
    assert p.run("j", T0)["state"] == "succeeded"


def test_cancel_run_fences_running_tasks_and_skips_the_rest() -> None:
    p = Dag(T0 - MIN)
    p.create_dag("j", DIAMOND, run_at_ms=T0)
    a = started(p.tick(T0))["a"]
    released = started(p.report(a, "success"))
    run_id = exec_id("j", T0)
    effects = p.command("CancelRun", "j", run_id=run_id, reason=None)
    cancels = {e.exec_id for e in effects if isinstance(e, Cancel)}
    assert cancels == {released["b"].exec_id, released["c"].exec_id}
    run = p.run("j", T0)
    assert run["state"] == "cancelled"
    assert p.states(run) == {"a": "succeeded", "b": "cancelled", "c": "cancelled",
                             "d": "skipped", "cleanup": "skipped"}
    assert {t["reason"] for t in run["dag"]["tasks"] if t["state"] == "skipped"} == {
        "run cancelled"}
    assert started(p.report(released["b"], "success")) == {}  # fenced
    assert p.run("j", T0)["state"] == "cancelled"
    with pytest.raises(PermanentError, match="not running"):
        p.command("CancelRun", "j", run_id=run_id, reason=None)


def test_retry_run_reruns_failed_and_downstream_tasks_only() -> None:
    p = Dag(T0 - MIN)
    p.create_dag("j", DIAMOND, run_at_ms=T0)
    a = started(p.tick(T0))["a"]
    released = started(p.report(a, "success"))
    cleanup = started(p.report(released["b"], "permanent", status_code=500))["cleanup"]
    p.report(released["c"], "success")
    p.report(cleanup, "success")
    run_id = exec_id("j", T0)
    assert p.run("j", T0)["state"] == "failed"
    rerun = started(p.command("RetryRun", "j", run_id=run_id))
    assert set(rerun) == {"b"}
    assert (rerun["b"].exec_id, rerun["b"].attempt) == (released["b"].exec_id, 2)
    d = started(p.report(rerun["b"], "success"))["d"]
    p.report(d, "success")
    run = p.run("j", T0)
    assert run["state"] == "succeeded"
    # a, c and cleanup kept their one attempt.
    attempts = {e["task_id"]: e["attempt"] for e in p.store.executions.values()
                if e["run_id"] == run_id}
    assert attempts == {"a": 1, "b": 2, "c": 1, "cleanup": 1, "d": 1}
    with pytest.raises(PermanentError, match="only a failed or cancelled"):
        p.command("RetryRun", "j", run_id=run_id)


def test_skip_if_running_skips_a_slot_while_a_run_is_unfinished() -> None:
    p = Dag(T0 - 30 * SEC)
    p.create_dag("j", [task("a"), task("b", "a")], cron="* * * * *", overlap="skip_if_running",
                 lease_s=300.0)
    a = started(p.tick(T0))["a"]
    b = started(p.report(a, "success"))["b"]
    assert started(p.tick(T0 + MIN)) == {}
    assert p.ex("j", T0 + MIN)["state"] == "skipped"
    p.report(b, "success")
    assert set(started(p.tick(T0 + 2 * MIN))) == {"a"}


def test_delete_cancels_the_running_tasks_of_its_runs() -> None:
    p = Dag(T0 - 30 * SEC)
    p.create_dag("j", [task("a"), task("b", "a")], cron="* * * * *")
    a = started(p.tick(T0))["a"]
    effects = p.command("DeleteJob", "j")
    assert [e.exec_id for e in effects if isinstance(e, Cancel)] == [a.exec_id]
    run = p.run("j", T0)
    assert (run["state"], p.states(run)) == ("cancelled", {"a": "cancelled", "b": "skipped"})
    assert p.job("j")["status"] == "deleted"


def test_backfill_creates_the_runs_of_past_slots_with_their_slot_ids() -> None:
    p = Dag(T0 - MIN)
    p.create_dag("j", [task("a")], cron="0 * * * *")
    p.now = T0 + 10 * MIN
    p.command("PauseJob", "j")
    p.command("BackfillJob", "j", from_ms=T0 - 3 * 3600 * SEC, to_ms=T0 - 1, max_per_s=10.0)
    effects = p.ticks(T0 + 11 * MIN, 100)
    runs = {d.run_id for d in dispatches(effects)}
    assert runs == {exec_id("j", T0 - h * 3600 * SEC) for h in (1, 2, 3)}


def test_a_run_whose_task_start_was_lost_is_mended_when_its_event_comes_again() -> None:
    p = Dag(T0 - MIN)
    p.create_dag("j", [task("a"), task("b", "a")], run_at_ms=T0)
    a = started(p.tick(T0))["a"]
    b = started(p.report(a, "success"))["b"]
    # The run write landed, b's instance write did not (a crash between them).
    del p.store.executions[b.exec_id]
    # The report comes again (its offset was not committed): now stale, it mends the run.
    again = started(p.report(a, "success"))
    assert set(again) == {"b"} and again["b"].attempt == 1
    p.report(again["b"], "success")
    assert p.run("j", T0)["state"] == "succeeded"


def test_a_task_end_the_run_missed_is_taken_in_when_the_report_comes_again() -> None:
    p = Dag(T0 - MIN)
    p.create_dag("j", [task("a"), task("b", "a")], run_at_ms=T0)
    a = started(p.tick(T0))["a"]
    before = p.store.executions[exec_id("j", T0)]
    p.report(a, "success")
    # The instance's end landed, the run write (and b's start) did not.
    p.store.executions[exec_id("j", T0)] = before
    p.store._saved[("execution", exec_id("j", T0))] = before
    del p.store.executions[task_exec_id(exec_id("j", T0), "b")]
    again = started(p.report(a, "success"))
    assert set(again) == {"b"}
    assert p.states(p.run("j", T0)) == {"a": "succeeded", "b": "running"}


def test_a_task_target_the_tenant_may_not_use_refuses_the_job_naming_the_task() -> None:
    def deny(tenant: str, target: Any) -> None:
        if "secret" in str(target):
            raise PermanentError("not granted", field="target.url")

    p = Dag(T0 - MIN)
    p.core = type(p.core)(p.store, check_target=deny)
    bad = task("x", "a")
    bad["target"] = ("kron.HttpTarget", {**http("x")[1], "url": "http://secret.invalid/"})
    with pytest.raises(PermanentError) as err:
        p.create_dag("j", [task("a"), bad], run_at_ms=T0)
    assert err.value.field == "dag.tasks[1].target.url"
    assert p.store.job("j") is None


def test_a_cycle_sent_straight_to_kafka_is_refused() -> None:
    p = Dag(T0 - MIN)
    with pytest.raises(PermanentError, match="cycle"):
        p.create_dag("j", [task("a", "b"), task("b", "a")], run_at_ms=T0)
