"""`replay.audit`'s DAG checks (issue 38): histories built by hand, each check passing on a good
history and failing, alone, on a bad one; and histories the real PartitionCore wrote for DAG
jobs (runs that fail, are retried, cancelled, lose a worker, are backfilled) audit clean.

A history is what kron.jobs and kron.executions hold: every version of every record, in
order per key. Here each record is a dict with the fields the audit reads.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from replay import cli as replay_cli
from replay.audit import (
    DAG_FINAL_STATES,
    DAG_KINDS,
    DAG_NO_DOUBLE_START,
    DAG_ONE_RUN_PER_SLOT,
    DAG_ORPHAN_TASK,
    DAG_RULE_HELD,
    DUPLICATE_TRIGGER,
    KINDS,
    AuditReport,
    audit,
)
from replay.reader import Entry
from streams.domain.ids import exec_id, manual_exec_id, task_exec_id
from streams.engine.store import Record
from tests.unit.test_core_dag import DIAMOND, Dag, dag_spec, started, task
from tests.unit.test_core_scenarios import MIN, SEC, dispatches, utc

T0 = utc(2026, 3, 2, 0, 0)
JOB = "etl"
RUN = exec_id(JOB, T0)
RETRY_2 = {"max_attempts": 2, "backoff": "fixed", "base_s": 1.0, "max_s": 1.0}
# a -> b (all_success, 2 attempts) -> c (all_done)
TASKS = [task("a"), task("b", "a", retry=RETRY_2), task("c", "b", rule="all_done")]
Kinds = set[tuple[str, str | None]]


# --- records by hand ----------------------------------------------------------------------------


def job_state(tasks: list[Record] = TASKS) -> Record:
    """The job as created: one armed slot at T0 (its slots are not this file's business)."""
    return {"envelope": {"event_type": "job.created", "tenant": "acme"}, "job_id": JOB,
            "version": 1, "status": "active", "spec": dag_spec(tasks, cron="0 * * * *"),
            "cursor_ms": None, "next_run_at_ms": T0, "queued_slot_ms": None,
            "running": [], "created_at_ms": T0 - MIN, "updated_at_ms": T0 - MIN}


def _execution(ex_id: str, at: int, event: str, state: str, **fields: Any) -> Record:
    return {"envelope": {"event_type": event, "causation_id": f"ev-{event}-{at}",
                         "tenant": "acme"},
            "exec_id": ex_id, "job_id": JOB, "scheduled_for_ms": T0, "owner_epoch": 1,
            "state": state, "trigger": "schedule", "attempt": 0, "fencing_token": 0,
            "due_at_ms": T0, "worker": "w1", "lease_until_ms": None, "retry_at_ms": None,
            "dst_outcome": None, "reason": None, "last_error": None, "status_code": None,
            "attempts": [], "created_at_ms": T0, "updated_at_ms": at, "run_id": None,
            "task_id": None, "dag": None, **fields}


def run_rec(at: int, event: str, state: str, tasks: dict[str, str], *, run_id: str = RUN,
            counts: dict[str, int] | None = None) -> Record:
    """A run record. Its stored parent counts are zeros (or `counts`): the audit recounts."""
    n = counts or {}
    progress = [{"task_id": t, "state": s, "pending": n.get("pending", 0),
                 "succeeded": n.get("succeeded", 0), "failed": n.get("failed", 0),
                 "skipped": n.get("skipped", 0), "reason": None} for t, s in tasks.items()]
    return _execution(run_id, at, event, state, dag={"tasks": progress})


Attempt = tuple[int, str, int, "str | None"]  # number, worker, started_at_ms, outcome


def task_rec(task_id: str, at: int, event: str, state: str, attempts: list[Attempt], *,
             run_id: str = RUN) -> Record:
    listed = [{"attempt": n, "fencing_token": n, "worker": w, "started_at_ms": s,
               "finished_at_ms": None if o is None else s + 100, "outcome": o,
               "status_code": None, "error": None} for n, w, s, o in attempts]
    last = attempts[-1] if attempts else (0, None, 0, None)
    return _execution(task_exec_id(run_id, task_id), at, event, state, run_id=run_id,
                      task_id=task_id, attempt=last[0], fencing_token=last[0],
                      worker=last[1], attempts=listed)


def good_history() -> list[Record]:
    """a succeeds; b fails twice (its own 2 attempts: one lost to a dead worker, one
    permanent); c (all_done) runs anyway; the run fails; a RetryRun re-runs b alone."""
    s = SEC
    b1: Attempt = (1, "w1", T0 + 2 * s, "lease_expired")
    b2: Attempt = (2, "w2", T0 + 4 * s, "permanent")
    return [
        run_rec(T0, "dag_run.started", "running", {"a": "running", "b": "pending",
                                                   "c": "pending"}),
        task_rec("a", T0, "execution.started", "running", [(1, "w1", T0, None)]),
        # The report corrects the attempt's start as it closes it.
        task_rec("a", T0 + s, "execution.succeeded", "succeeded",
                 [(1, "w1", T0 + 7, "succeeded")]),
        run_rec(T0 + s, "dag_run.progressed", "running", {"a": "succeeded", "b": "running",
                                                          "c": "pending"}),
        task_rec("b", T0 + s, "execution.started", "running", [(1, "w1", T0 + 2 * s, None)]),
        # w1 died: attempt 1's lease ran out, attempt 2 is another (w2), which is fine.
        task_rec("b", T0 + 3 * s, "execution.retry_scheduled", "retry_pending", [b1]),
        task_rec("b", T0 + 4 * s, "execution.started", "running",
                 [b1, (2, "w2", T0 + 4 * s, None)]),
        task_rec("b", T0 + 5 * s, "execution.failed", "failed", [b1, b2]),
        run_rec(T0 + 5 * s, "dag_run.progressed", "running", {"a": "succeeded", "b": "failed",
                                                              "c": "running"}),
        task_rec("c", T0 + 5 * s, "execution.started", "running", [(1, "w2", T0 + 5 * s, None)]),
        task_rec("c", T0 + 6 * s, "execution.succeeded", "succeeded",
                 [(1, "w2", T0 + 5 * s, "succeeded")]),
        run_rec(T0 + 6 * s, "dag_run.failed", "failed", {"a": "succeeded", "b": "failed",
                                                         "c": "succeeded"}),
        # RetryRun: b runs again; a and c (all_done: it ran) keep their success.
        run_rec(T0 + MIN, "dag_run.retried", "running", {"a": "succeeded", "b": "running",
                                                         "c": "succeeded"}),
        task_rec("b", T0 + MIN, "execution.rerun_started", "running",
                 [b1, b2, (3, "w2", T0 + MIN, None)]),
        task_rec("b", T0 + MIN + s, "execution.succeeded", "succeeded",
                 [b1, b2, (3, "w2", T0 + MIN, "succeeded")]),
        run_rec(T0 + MIN + s, "dag_run.succeeded", "succeeded",
                {"a": "succeeded", "b": "succeeded", "c": "succeeded"}),
    ]


def judge(execs: list[Record], jobs: list[Record] | None = None) -> AuditReport:
    return audit([job_state()] if jobs is None else jobs, execs, now_ms=T0 + 2 * MIN)


def kinds(report: AuditReport) -> Kinds:
    return {(v.kind, v.exec_id) for v in report.violations}


def test_the_good_history_passes_every_check() -> None:
    report = judge(good_history())
    assert report.ok, report.violations
    assert (report.dag_runs, report.task_instances) == (1, 3)
    assert report.counts == dict.fromkeys(KINDS, 0)
    assert report.notes == ()


def test_dag_kinds_are_counted_only_when_the_history_has_dag_records() -> None:
    report = audit([], [], now_ms=T0)
    assert not set(report.counts) & set(DAG_KINDS)
    assert set(judge(good_history()).counts) >= set(DAG_KINDS)


# --- dag.rule_held --------------------------------------------------------------------------------


def test_a_task_started_while_its_all_success_parent_failed() -> None:
    history = good_history()
    # b starts as a fails; the stored counts even claim a parent succeeded: not trusted.
    history[3] = run_rec(T0 + SEC, "dag_run.progressed", "running",
                         {"a": "failed", "b": "running", "c": "pending"},
                         counts={"succeeded": 1})
    report = judge(history)
    assert kinds(report) == {(DAG_RULE_HELD, RUN)}
    (v,) = report.violations
    assert v.detail == ("task 'b' started (dag_run.progressed) while its parents were "
                        "a=failed: trigger rule all_success says upstream_failed")
    assert v.job_id == JOB and v.scheduled_for_ms == T0


def test_a_task_started_before_its_parent_ended() -> None:
    history = good_history()
    history[0] = run_rec(T0, "dag_run.started", "running",
                         {"a": "running", "b": "running", "c": "pending"})
    assert kinds(judge(history)) == {(DAG_RULE_HELD, RUN)}
    assert "a=running: trigger rule all_success says wait" in judge(history).violations[0].detail


def test_a_task_still_running_is_judged_once_when_it_started() -> None:
    """Only the record in which a task becomes running is judged: a later record where its
    parent moved (a RetryRun resets both) does not judge it again."""
    history = good_history()
    # c (all_done) was released by b's failure; in the next record c keeps running while the
    # record (wrongly, but not this check's business) shows b running again.
    extra = run_rec(T0 + 5 * SEC + 1, "dag_run.progressed", "running",
                    {"a": "succeeded", "b": "running", "c": "running"})
    history.insert(9, extra)
    assert not judge(history).of_kind(DAG_RULE_HELD)


# --- dag.final_states -----------------------------------------------------------------------------


@pytest.mark.parametrize(("state", "tasks", "detail"), [
    ("failed", {"a": "succeeded", "b": "failed", "c": "pending"},
     "run ended failed with tasks not final: c=pending"),
    ("succeeded", {"a": "succeeded", "b": "upstream_failed", "c": "succeeded"},
     "run ended succeeded with b=upstream_failed"),
    ("failed", {"a": "succeeded", "b": "skipped", "c": "succeeded"},
     "run ended failed but no task failed, was upstream_failed or cancelled"),
    ("cancelled", {"a": "succeeded", "b": "running", "c": "skipped"},
     "run ended cancelled with tasks not final: b=running"),
])
def test_a_finished_run_with_a_task_not_final_or_the_wrong_outcome(
        state: str, tasks: dict[str, str], detail: str) -> None:
    history = good_history()[:11]
    history.append(run_rec(T0 + 6 * SEC, f"dag_run.{state}", state, tasks))
    report = judge(history)
    assert kinds(report) == {(DAG_FINAL_STATES, RUN)}
    assert report.violations[0].detail == detail


def test_a_cancelled_run_with_everything_final_passes() -> None:
    history = good_history()[:5]
    history += [
        task_rec("b", T0 + 2 * SEC, "execution.cancelled", "cancelled",
                 [(1, "w1", T0 + 2 * SEC, None)]),
        run_rec(T0 + 2 * SEC, "dag_run.cancelled", "cancelled",
                {"a": "succeeded", "b": "cancelled", "c": "skipped"}),
    ]
    assert judge(history).ok


# --- dag.one_run_per_slot -------------------------------------------------------------------------


def test_two_runs_for_one_slot() -> None:
    other = manual_exec_id(JOB, "cmd-9")
    history = good_history()
    history.insert(1, run_rec(T0, "dag_run.started", "running",
                              {"a": "pending", "b": "pending", "c": "pending"}, run_id=other))
    report = judge(history)
    # Named once, as the DAG's check: not also as a duplicate trigger.
    assert kinds(report) == {(DAG_ONE_RUN_PER_SLOT, None), (DAG_ONE_RUN_PER_SLOT, other)}
    assert not report.of_kind(DUPLICATE_TRIGGER)
    by_exec = {v.exec_id: v.detail for v in report.violations}
    assert by_exec[None] == f"2 runs for one slot: {sorted([RUN, other])}"
    assert by_exec[other].startswith("a schedule run's id is not the slot's execution id")


def test_a_manual_run_beside_the_slots_run_is_fine() -> None:
    other = manual_exec_id(JOB, "cmd-9")
    manual = run_rec(T0, "dag_run.started", "running",
                     {"a": "pending", "b": "pending", "c": "pending"}, run_id=other)
    manual["trigger"] = "manual"
    assert judge([*good_history(), manual]).ok


def test_task_instances_share_their_runs_slot_without_being_duplicate_triggers() -> None:
    # Every instance here has trigger schedule and the run's slot; the good history passes.
    assert not judge(good_history()).of_kind(DUPLICATE_TRIGGER)


# --- dag.no_double_start --------------------------------------------------------------------------


def test_an_attempt_started_twice() -> None:
    history = good_history()
    b = task_exec_id(RUN, "b")
    # Attempt 1 of b again, by another worker at another time, while it is open.
    history.insert(5, task_rec("b", T0 + 2 * SEC + 500, "execution.started", "running",
                               [(1, "w2", T0 + 2 * SEC + 500, None)]))
    report = judge(history)
    assert (DAG_NO_DOUBLE_START, b) in kinds(report)
    details = [v.detail for v in report.of_kind(DAG_NO_DOUBLE_START)]
    assert any(d.startswith("attempt 1 started twice: by w1 at 2026-03-02T00:00:02")
               and "by w2 at 2026-03-02T00:00:02.500" in d for d in details), details


def test_an_ended_attempt_open_again() -> None:
    history = good_history()
    history.insert(3, task_rec("a", T0 + SEC + 1, "execution.started", "running",
                               [(1, "w1", T0 + 7, None)]))
    report = judge(history)
    assert (DAG_NO_DOUBLE_START, task_exec_id(RUN, "a")) in kinds(report)
    assert any("attempt 1 open again after it ended" in v.detail
               for v in report.of_kind(DAG_NO_DOUBLE_START))


def test_attempt_numbers_with_a_gap() -> None:
    history = good_history()
    history[6] = task_rec("b", T0 + 4 * SEC, "execution.started", "running",
                          [(1, "w1", T0 + 2 * SEC, "lease_expired"), (3, "w2", T0 + 4 * SEC, None)])
    report = judge(history)
    found = {v.exec_id: v.detail for v in report.of_kind(DAG_NO_DOUBLE_START)
             if v.detail.startswith("attempt numbers")}
    assert found[task_exec_id(RUN, "b")].startswith(
        "attempt numbers [1, 3] with attempt 3: not 1..n")


def test_more_attempts_than_the_tasks_policy_and_its_reruns() -> None:
    history = good_history()[:8]  # b ended failed after its 2 attempts
    b1: Attempt = (1, "w1", T0 + 2 * SEC, "lease_expired")
    b2: Attempt = (2, "w2", T0 + 4 * SEC, "permanent")
    # A third attempt with no RetryRun: over b's own max_attempts (2), not the job's (3).
    history.append(task_rec("b", T0 + 6 * SEC, "execution.started", "running",
                            [b1, b2, (3, "w1", T0 + 6 * SEC, None)]))
    report = judge(history)
    details = [v.detail for v in report.of_kind(DAG_NO_DOUBLE_START)]
    assert "attempt 3 but task 'b' allows 2 (retry.max_attempts) + 0 re-run(s)" in details


def test_the_job_retry_applies_to_a_task_without_its_own() -> None:
    history = good_history()[:3]
    attempts: list[Attempt] = [(n, "w1", T0 + n * SEC, "transient") for n in (1, 2, 3)]
    history.append(task_rec("a", T0 + 4 * SEC, "execution.started", "running",
                            [*attempts, (4, "w1", T0 + 4 * SEC, None)]))
    # a's record went back from succeeded to running too: other checks speak; ours says 4 > 3.
    details = [v.detail for v in judge(history).of_kind(DAG_NO_DOUBLE_START)]
    assert any("attempt 4 but task 'a' allows 3" in d for d in details), details


# --- dag.orphan_task ------------------------------------------------------------------------------


@pytest.mark.parametrize(("change", "detail"), [
    (lambda r: r.update(run_id="no-such-run"), "run_id 'no-such-run' names no DAG run record"),
    (lambda r: r.update(task_id="z"), f"run {RUN!r} has no task 'z'"),
    (lambda r: r.update(exec_id="some-other-id"),
     f"its id is not task_exec_id({RUN!r}, 'a')"),
])
def test_a_task_instance_without_its_run(change: Callable[[Record], object], detail: str) -> None:
    history = good_history()
    for rec in history:
        if rec["task_id"] == "a":
            change(rec)
    report = judge(history)
    orphans = report.of_kind(DAG_ORPHAN_TASK)
    assert [v.detail for v in orphans] == [detail]
    assert {v.kind for v in report.violations} == {DAG_ORPHAN_TASK}


def test_a_task_read_before_its_run_is_no_orphan() -> None:
    """Records of different keys interleave freely: the run may come after its tasks."""
    history = good_history()
    runs = [r for r in history if r["dag"] is not None]
    tasks = [r for r in history if r["dag"] is None]
    assert judge(tasks + runs).ok


# --- the CLI ------------------------------------------------------------------------------------


def test_kron_replay_audit_prints_the_dag_violations(monkeypatch: pytest.MonkeyPatch) -> None:
    history = good_history()
    history[3] = run_rec(T0 + SEC, "dag_run.progressed", "running",
                         {"a": "failed", "b": "running", "c": "pending"})
    topics = {"kron.jobs": ("kron.state.JobState", [job_state()]),
              "kron.executions": ("kron.executions.ExecutionState", history)}

    def read_topic(bootstrap: object, topic: str, **_: object) -> Iterator[Entry]:
        name, records = topics[topic]
        for i, rec in enumerate(records):
            yield Entry(topic=topic, partition=0, offset=i, key=None, name=name, record=rec,
                        timestamp_ms=rec["updated_at_ms"])

    monkeypatch.setattr(replay_cli, "read_topic", read_topic)
    monkeypatch.setattr(replay_cli, "topic_offsets", lambda *a, **k: {})
    monkeypatch.setenv("KRON_TOPIC_PREFIX", "kron")
    app = replay_cli.replay_app
    out = CliRunner().invoke(app, ["audit", "--json", "--now-ms", str(T0 + 2 * MIN)])
    assert out.exit_code == 1, out.output
    doc = json.loads(out.output.strip().splitlines()[-1])
    assert doc["counts"][DAG_RULE_HELD] == 1 and doc["dag_runs"] == 1
    text = CliRunner().invoke(app, ["audit", "--now-ms", str(T0 + 2 * MIN)],
                                env={"COLUMNS": "200"})
    assert text.exit_code == 1
    assert "dag.rule_held" in text.output and "1 DAG runs, 3 task instances" in text.output


# --- histories the real core wrote ----------------------------------------------------------------


def core_history(p: Dag) -> tuple[list[Record], list[Record]]:
    jobs = [copy.deepcopy(r) for kind, r in p.store.log if kind == "job"]
    execs = [copy.deepcopy(r) for kind, r in p.store.log if kind == "execution"]
    return jobs, execs


def test_the_cores_diamond_failed_then_retried_audits_clean() -> None:
    p = Dag(T0 - MIN)
    p.create_dag("j", DIAMOND, run_at_ms=T0)
    a = started(p.tick(T0))["a"]
    released = started(p.report(a, "success"))
    cleanup = started(p.report(released["b"], "permanent", status_code=500))["cleanup"]
    p.report(released["c"], "success")
    p.report(cleanup, "success")
    rerun = started(p.command("RetryRun", "j", run_id=exec_id("j", T0)))
    d = started(p.report(rerun["b"], "success"))["d"]
    p.report(d, "success")
    jobs, execs = core_history(p)
    report = audit(jobs, execs, now_ms=p.now)
    assert report.ok, report.violations
    assert (report.dag_runs, report.task_instances) == (1, 5)
    # ...and the same history doctored: d's release recorded with b still failed.
    run_id = exec_id("j", T0)
    versions = [r for r in execs if r["exec_id"] == run_id]
    released_d = next(r for r in versions
                      if {t["task_id"]: t["state"] for t in r["dag"]["tasks"]}["d"] == "running")
    next(t for t in released_d["dag"]["tasks"] if t["task_id"] == "b")["state"] = "failed"
    assert kinds(audit(jobs, execs, now_ms=p.now)) == {(DAG_RULE_HELD, run_id)}


def test_the_cores_cancelled_and_retried_run_audits_clean() -> None:
    p = Dag(T0 - MIN)
    p.create_dag("j", DIAMOND, run_at_ms=T0)
    a = started(p.tick(T0))["a"]
    released = started(p.report(a, "success"))
    p.command("CancelRun", "j", run_id=exec_id("j", T0), reason=None)
    p.report(released["b"], "success")  # fenced
    again = started(p.command("RetryRun", "j", run_id=exec_id("j", T0)))
    assert set(again) == {"b", "c"}
    d = started(p.report(again["b"], "success") + p.report(again["c"], "success"))["d"]
    cleanup = started(p.report(d, "success"))["cleanup"]
    p.report(cleanup, "success")
    assert p.run("j", T0)["state"] == "succeeded"
    report = audit(*core_history(p), now_ms=p.now)
    assert report.ok, report.violations


def test_the_cores_lost_worker_and_hourly_runs_audit_clean() -> None:
    p = Dag(T0 - MIN)
    retry = {"max_attempts": 3, "backoff": "fixed", "base_s": 1.0, "max_s": 1.0}
    p.create_dag("j", [task("a", retry=retry), task("b", "a", rule="one_failed"),
                       task("c", "a", rule="none_failed")], cron="0 * * * *", lease_s=5.0)
    for hour in range(3):
        slot = T0 + hour * 60 * MIN
        a = started(p.tick(slot))["a"]
        if hour == 1:  # the worker is lost: a's lease runs out, attempt 2 runs elsewhere
            p.new_owner(2, "w2")
            retried = [x for x in dispatches(p.ticks(slot + 10 * SEC, SEC)) if x.task_id == "a"]
            a = retried[0]
        rest = started(p.report(a, "success" if hour != 2 else "permanent"))
        for d in rest.values():
            p.report(d, "success")
        p.now = slot + 30 * MIN
    report = audit(*core_history(p), now_ms=p.now)
    assert report.ok, report.violations
    assert report.dag_runs == 3
