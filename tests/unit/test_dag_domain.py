"""DAG workflows (streams/domain/dag.py): parsing, the trigger-rule table, and runs."""

from __future__ import annotations

import math
from typing import Any

import pytest

from streams.domain.dag import (
    MAX_EDGES,
    MAX_TASKS,
    Changes,
    DagPlan,
    TaskState,
    TriggerRule,
    Verdict,
    cancel_run,
    new_progress,
    parse_dag,
    retry_run,
    run_state,
    start_run,
    task_finished,
    verdict,
)
from streams.domain.errors import PermanentError
from streams.domain.policies import Backoff, RetryPolicy

S, F, C = TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED
NONE = Changes(start=(), settled=())
GOOD_RETRY = {"max_attempts": 5, "backoff": "fixed", "base_s": 2.0, "max_s": 60.0}


def task(tid: str, *deps: str, rule: str | None = None, **extra: Any) -> dict[str, Any]:
    t: dict[str, Any] = {"id": tid, "target": ("kron.HttpTarget", {"url": f"http://x/{tid}"})}
    if deps:
        t["depends_on"] = list(deps)
    if rule is not None:
        t["trigger_rule"] = rule
    t.update(extra)
    return t


def dag(*tasks: dict[str, Any]) -> dict[str, Any]:
    return {"tasks": list(tasks)}


def refused(raw: dict[str, Any], **limits: int) -> PermanentError:
    with pytest.raises(PermanentError) as info:
        parse_dag(raw, **limits)
    return info.value


def states(progress: list[dict[str, Any]]) -> dict[str, str]:
    return {p["task_id"]: p["state"] for p in progress}


# --- parse_dag: what it builds -----------------------------------------------------------


def test_parse_builds_the_plan_with_defaults() -> None:
    target = {"opaque": ["anything"]}
    plan = parse_dag(
        dag(
            {"id": "a", "target": target},
            task("b", "a", rule="one_failed", retry=GOOD_RETRY, timeout_s=30),
            task("c", "a", "b"),
        )
    )
    a, b, c = plan.tasks
    assert a.target is target  # untouched, for the core
    assert (a.task_id, a.index, a.depends_on, a.rule, a.retry, a.timeout_s) == (
        "a",
        0,
        (),
        TriggerRule.ALL_SUCCESS,
        None,
        None,
    )
    assert b.rule is TriggerRule.ONE_FAILED and b.timeout_s == 30.0
    assert b.retry == RetryPolicy(max_attempts=5, backoff=Backoff.FIXED, base_s=2.0, max_s=60.0)
    assert b.retry.backoff is Backoff.FIXED
    assert c.depends_on == ("a", "b") and c.rule is TriggerRule.ALL_SUCCESS
    assert dict(plan.index) == {"a": 0, "b": 1, "c": 2}
    assert plan.children == ((1, 2), (2,), ())
    assert plan.order == (0, 1, 2)


def test_order_is_kahn_lowest_index_first_when_the_spec_lists_children_first() -> None:
    plan = parse_dag(dag(task("z", "y"), task("y", "x"), task("w"), task("x")))
    assert plan.order == (2, 3, 1, 0)
    assert plan.parents == ((1,), (3,), (), ())
    assert plan.rank == (3, 2, 0, 1)


def test_none_for_depends_on_and_trigger_rule_means_the_default() -> None:
    plan = parse_dag(dag(task("a", depends_on=None, trigger_rule=None)))
    assert plan.tasks[0].depends_on == () and plan.tasks[0].rule is TriggerRule.ALL_SUCCESS


def test_timeout_bounds_are_inclusive() -> None:
    plan = parse_dag(dag(task("a", timeout_s=0.001), task("b", timeout_s=86400)))
    assert [t.timeout_s for t in plan.tasks] == [0.001, 86400.0]


def test_a_dag_of_exactly_the_limits_is_accepted() -> None:
    assert len(parse_dag(dag(*[task(f"t{i}") for i in range(MAX_TASKS)])).tasks) == MAX_TASKS
    plan = parse_dag(edges_dag(MAX_EDGES))
    assert sum(len(t.depends_on) for t in plan.tasks) == MAX_EDGES


# --- parse_dag: one test per refusal -----------------------------------------------------


def test_empty_dag_is_refused() -> None:
    err = refused({"tasks": []})
    assert err.field == "dag.tasks" and "at least one task" in err.message


def test_missing_or_non_list_tasks_is_refused() -> None:
    assert refused({}).field == "dag.tasks"
    assert refused({"tasks": "a"}).field == "dag.tasks"


def test_a_task_that_is_not_an_object_is_refused() -> None:
    assert refused(dag(task("a"), "b")).field == "dag.tasks[1]"  # type: ignore[arg-type]


def test_too_many_tasks_is_refused() -> None:
    err = refused(dag(*[task(f"t{i}") for i in range(MAX_TASKS + 1)]))
    assert err.field == "dag.tasks"
    assert "at most 500 tasks; got 501" in err.message
    assert refused(dag(task("a"), task("b"), task("c")), max_tasks=2).field == "dag.tasks"


def edges_dag(edges: int) -> dict[str, Any]:
    """100 roots and as many children, each on up to 100 of them, as ``edges`` needs."""
    roots = [f"r{i}" for i in range(100)]
    children = []
    for n in range(0, edges, 100):
        children.append(task(f"c{n}", *roots[: min(100, edges - n)]))
    return dag(*[task(r) for r in roots], *children)


def test_a_dag_of_5001_edges_is_refused() -> None:
    err = refused(edges_dag(5001))
    assert err.field == "dag.tasks"
    assert "5001" in err.message and "5000" in err.message
    assert refused(dag(task("a"), task("b", "a"), task("c", "a", "b")), max_edges=2).message == (
        "a DAG has at most 2 dependencies; got 3"
    )


@pytest.mark.parametrize(
    "tid", [7, None, "", "A", "has space", "-lead", "_lead", ".lead", "a" * 65, "é", "a/b"]
)
def test_a_bad_task_id_is_refused(tid: Any) -> None:
    err = refused(dag(task("ok"), {"id": tid, "target": 1}))
    assert err.field == "dag.tasks[1].id"
    assert repr(tid) in err.message


def test_a_missing_task_id_is_refused() -> None:
    assert refused(dag({"target": 1})).field == "dag.tasks[0].id"


def test_the_longest_and_punctuated_ids_are_accepted() -> None:
    ids = ["a" * 64, "0", "a.b-c_d", "9z"]
    assert [t.task_id for t in parse_dag(dag(*[task(i) for i in ids])).tasks] == ids


def test_a_duplicate_id_is_refused_at_the_second_one() -> None:
    err = refused(dag(task("a"), task("b"), task("a")))
    assert err.field == "dag.tasks[2].id"
    assert "duplicate task id 'a'" in err.message


def test_an_unknown_dependency_is_refused() -> None:
    err = refused(dag(task("a"), task("b", "a", "ghost")))
    assert err.field == "dag.tasks[1].depends_on"
    assert "unknown task 'ghost'" in err.message


def test_a_self_dependency_is_refused() -> None:
    err = refused(dag(task("a"), task("b", "a", "b")))
    assert err.field == "dag.tasks[1].depends_on"
    assert "'b' depends on itself" in err.message


def test_a_dependency_listed_twice_is_refused() -> None:
    err = refused(dag(task("a"), task("b", "a", "a")))
    assert err.field == "dag.tasks[1].depends_on"
    assert "'a' is listed twice" in err.message


def test_a_malformed_depends_on_is_refused() -> None:
    assert refused(dag(task("a", depends_on="b"))).field == "dag.tasks[0].depends_on"
    assert refused(dag(task("a"), task("b", depends_on=[1]))).field == "dag.tasks[1].depends_on"


def test_an_unknown_trigger_rule_is_refused_listing_the_allowed_ones() -> None:
    err = refused(dag(task("a"), task("b"), task("c", "a", rule="all_skipped")))
    assert err.field == "dag.tasks[2].trigger_rule"
    assert "'all_skipped'" in err.message
    for rule in TriggerRule:
        assert rule.value in err.message
    assert refused(dag(task("a", trigger_rule=3))).field == "dag.tasks[0].trigger_rule"


@pytest.mark.parametrize("timeout", [0, 0.0009, 86400.5, -1, math.nan, math.inf, True, "5", []])
def test_a_bad_timeout_is_refused(timeout: Any) -> None:
    err = refused(dag(task("a"), task("b", timeout_s=timeout)))
    assert err.field == "dag.tasks[1].timeout_s"
    assert "finite number in 0.001..86400" in err.message


@pytest.mark.parametrize(
    ("change", "fld"),
    [
        ({"max_attempts": 0}, "retry.max_attempts"),
        ({"max_attempts": 2.5}, "retry.max_attempts"),
        ({"backoff": "linear"}, "retry.backoff"),
        ({"base_s": 0.0}, "retry.base_s"),
        ({"max_s": 1.0}, "retry.max_s"),  # below base_s
    ],
)
def test_a_bad_retry_policy_is_refused_under_the_task(change: dict[str, Any], fld: str) -> None:
    err = refused(dag(task("a"), task("b", retry=GOOD_RETRY | change)))
    assert err.field == f"dag.tasks[1].{fld}"
    assert err.message.startswith(f"dag.tasks[1].{fld} must be")


def test_a_retry_policy_missing_a_field_or_not_an_object_is_refused() -> None:
    partial = {k: v for k, v in GOOD_RETRY.items() if k != "base_s"}
    assert refused(dag(task("a", retry=partial))).field == "dag.tasks[0].retry.base_s"
    assert refused(dag(task("a", retry=3))).field == "dag.tasks[0].retry"


def test_a_missing_target_is_refused() -> None:
    assert refused(dag({"id": "a"})).field == "dag.tasks[0].target"


def test_a_cycle_is_refused_naming_it() -> None:
    err = refused(dag(task("x"), task("b", "a"), task("c", "b", "x"), task("a", "c")))
    # Printed from the task listed first in the spec; "b -> a" reads "b depends on a".
    assert err.message == "dependency cycle: b -> a -> c -> b"
    assert err.field == "dag.tasks[1].depends_on"


def test_a_cycle_is_named_without_the_tasks_that_merely_hang_off_it() -> None:
    # t0 and t1 depend on the 2-cycle {t2, t3} (unsorted by Kahn) but are not on it.
    err = refused(dag(task("t0", "t1"), task("t1", "t2"), task("t2", "t3"), task("t3", "t2")))
    assert err.message == "dependency cycle: t2 -> t3 -> t2"
    assert err.field == "dag.tasks[2].depends_on"


def test_a_long_cycle_is_found_without_recursion() -> None:
    n = MAX_TASKS
    err = refused(dag(*[task(f"t{i}", f"t{(i + 1) % n}") for i in range(n)]))
    names = err.message.removeprefix("dependency cycle: ").split(" -> ")
    assert names == [f"t{i}" for i in range(n)] + ["t0"]


# --- verdict: the Airflow table ----------------------------------------------------------

R = TriggerRule
RUN, WAIT, SKIP, UF = Verdict.RUN, Verdict.WAIT, Verdict.SKIP, Verdict.UPSTREAM_FAILED

# (rule, total, pending, succeeded, failed, skipped) -> verdict
TABLE = [
    # all_success: any failure fails it at once; a skip skips it (Airflow); else all succeed.
    (R.ALL_SUCCESS, 2, 1, 1, 0, 0, WAIT),
    (R.ALL_SUCCESS, 2, 0, 2, 0, 0, RUN),
    (R.ALL_SUCCESS, 3, 2, 0, 1, 0, UF),
    (R.ALL_SUCCESS, 2, 1, 0, 0, 1, SKIP),  # a skipped parent skips it, others still running
    (R.ALL_SUCCESS, 2, 0, 1, 0, 1, SKIP),
    (R.ALL_SUCCESS, 2, 0, 0, 1, 1, UF),
    # all_failed: any success or skip skips it; runs once all failed.
    (R.ALL_FAILED, 2, 1, 0, 1, 0, WAIT),
    (R.ALL_FAILED, 2, 0, 0, 2, 0, RUN),
    (R.ALL_FAILED, 3, 2, 1, 0, 0, SKIP),
    (R.ALL_FAILED, 2, 1, 0, 0, 1, SKIP),
    # all_done: waits for every parent, whatever they did.
    (R.ALL_DONE, 3, 1, 1, 1, 0, WAIT),
    (R.ALL_DONE, 3, 0, 1, 1, 1, RUN),
    (R.ALL_DONE, 2, 0, 0, 0, 2, RUN),
    # one_success: runs as soon as one parent succeeds, others pending.
    (R.ONE_SUCCESS, 3, 2, 1, 0, 0, RUN),
    (R.ONE_SUCCESS, 3, 1, 0, 1, 1, WAIT),
    (R.ONE_SUCCESS, 2, 0, 0, 0, 2, SKIP),
    (R.ONE_SUCCESS, 2, 0, 0, 1, 1, UF),
    (R.ONE_SUCCESS, 2, 0, 0, 2, 0, UF),
    # one_failed: runs as soon as one parent fails, others pending; skipped if none did.
    (R.ONE_FAILED, 3, 2, 0, 1, 0, RUN),
    (R.ONE_FAILED, 3, 1, 1, 0, 1, WAIT),
    (R.ONE_FAILED, 2, 0, 1, 0, 1, SKIP),
    (R.ONE_FAILED, 2, 0, 2, 0, 0, SKIP),
    # none_failed: a skipped parent is fine (Airflow); a failure fails it at once.
    (R.NONE_FAILED, 2, 0, 1, 0, 1, RUN),
    (R.NONE_FAILED, 2, 0, 0, 0, 2, RUN),
    (R.NONE_FAILED, 2, 1, 0, 0, 1, WAIT),
    (R.NONE_FAILED, 3, 2, 0, 1, 0, UF),
    # always: runs whatever its parents do, even before they finish.
    (R.ALWAYS, 2, 2, 0, 0, 0, RUN),
    (R.ALWAYS, 2, 0, 0, 2, 0, RUN),
    (R.ALWAYS, 2, 0, 0, 0, 2, RUN),
]


@pytest.mark.parametrize(("rule", "total", "pending", "succ", "fail", "skip", "want"), TABLE)
def test_verdict_table(
    rule: TriggerRule, total: int, pending: int, succ: int, fail: int, skip: int, want: Verdict
) -> None:
    got = verdict(rule, total=total, pending=pending, succeeded=succ, failed=fail, skipped=skip)
    assert got is want


def test_the_table_covers_every_rule() -> None:
    assert {row[0] for row in TABLE} == set(TriggerRule)


@pytest.mark.parametrize("rule", list(TriggerRule))
def test_every_rule_runs_a_task_without_parents(rule: TriggerRule) -> None:
    assert verdict(rule, total=0, pending=0, succeeded=0, failed=0, skipped=0) is RUN


def test_verdict_takes_plain_strings_as_decoded_from_avro() -> None:
    got = verdict("one_failed", total=1, pending=0, succeeded=0, failed=1, skipped=0)  # type: ignore[arg-type]
    assert got is RUN


# --- runs --------------------------------------------------------------------------------


def diamond() -> DagPlan:
    """a -> (b, c) -> d -> cleanup (all_done on b, c, d)."""
    return parse_dag(
        dag(
            task("a"),
            task("b", "a"),
            task("c", "a"),
            task("d", "b", "c"),
            task("cleanup", "b", "c", "d", rule="all_done"),
        )
    )


def test_new_progress_and_start() -> None:
    plan = diamond()
    progress = new_progress(plan)
    assert progress[3] == {
        "task_id": "d",
        "state": "pending",
        "pending": 2,
        "succeeded": 0,
        "failed": 0,
        "skipped": 0,
        "reason": None,
    }
    assert list(progress[0]) == [
        "task_id",
        "state",
        "pending",
        "succeeded",
        "failed",
        "skipped",
        "reason",
    ]
    assert start_run(plan, progress) == Changes(start=("a",), settled=())
    assert progress[0]["state"] == "running"
    assert run_state(progress) is None


def test_diamond_with_a_failing_branch_runs_its_all_done_cleanup() -> None:
    plan = diamond()
    progress = new_progress(plan)
    start_run(plan, progress)
    assert task_finished(plan, progress, "a", S) == Changes(start=("b", "c"), settled=())
    changes = task_finished(plan, progress, "b", F, "exit 1")
    # d's all_success is decided by b alone; cleanup still waits for c.
    assert changes == Changes(
        start=(),
        settled=(
            (
                "d",
                TaskState.UPSTREAM_FAILED,
                "trigger rule all_success: a parent failed or was cancelled",
            ),
        ),
    )
    assert progress[1]["reason"] == "exit 1"
    assert progress[4]["pending"] == 1  # c still runs
    assert (progress[4]["failed"], progress[4]["succeeded"]) == (2, 0)
    assert task_finished(plan, progress, "c", S) == Changes(start=("cleanup",), settled=())
    assert run_state(progress) is None
    assert task_finished(plan, progress, "cleanup", S) == NONE
    assert states(progress) == {
        "a": S,
        "b": F,
        "c": S,
        "d": TaskState.UPSTREAM_FAILED,
        "cleanup": S,
    }
    assert run_state(progress) is TaskState.FAILED


def test_a_clean_run_succeeds_and_skips_fail_no_run() -> None:
    plan = parse_dag(dag(task("a"), task("on_error", "a", rule="one_failed"), task("b", "a")))
    progress = new_progress(plan)
    start_run(plan, progress)
    changes = task_finished(plan, progress, "a", S)
    assert changes == Changes(
        start=("b",),
        settled=(("on_error", TaskState.SKIPPED, "trigger rule one_failed: no parent failed"),),
    )
    task_finished(plan, progress, "b", S)
    assert run_state(progress) is TaskState.SUCCEEDED


def test_a_duplicate_finish_changes_nothing() -> None:
    plan = diamond()
    progress = new_progress(plan)
    start_run(plan, progress)
    task_finished(plan, progress, "a", S)
    before = [dict(p) for p in progress]
    # Redelivered, even with another outcome: the first one stands.
    assert task_finished(plan, progress, "a", S) == NONE
    assert task_finished(plan, progress, "a", F) == NONE
    assert progress == before


def test_a_finish_for_a_pending_task_changes_nothing() -> None:
    plan = diamond()
    progress = new_progress(plan)
    start_run(plan, progress)
    before = [dict(p) for p in progress]
    assert task_finished(plan, progress, "d", S) == NONE
    assert progress == before


def test_a_finish_takes_a_plain_string_state_and_refuses_others() -> None:
    plan = diamond()
    progress = new_progress(plan)
    start_run(plan, progress)
    assert task_finished(plan, progress, "a", "succeeded").start == ("b", "c")  # type: ignore[arg-type]
    assert progress[0]["state"] is TaskState.SUCCEEDED
    with pytest.raises(ValueError, match="not skipped"):
        task_finished(plan, progress, "b", TaskState.SKIPPED)
    with pytest.raises(KeyError):
        task_finished(plan, progress, "ghost", S)


def test_always_tasks_start_with_the_roots() -> None:
    plan = parse_dag(dag(task("a"), task("b", "a"), task("watch", "b", rule="always")))
    progress = new_progress(plan)
    assert start_run(plan, progress) == Changes(start=("a", "watch"), settled=())


def test_one_success_starts_while_other_parents_run() -> None:
    plan = parse_dag(dag(task("a"), task("b"), task("c", "a", "b", rule="one_success")))
    progress = new_progress(plan)
    start_run(plan, progress)
    assert task_finished(plan, progress, "b", S).start == ("c",)
    # a's later failure does not touch c, which already runs.
    assert task_finished(plan, progress, "a", F) == NONE
    assert progress[2]["state"] == "running"
    assert (progress[2]["pending"], progress[2]["succeeded"], progress[2]["failed"]) == (0, 1, 1)


def test_one_task_settling_a_parent_is_seen_before_the_child_is_judged() -> None:
    # x's success skips p1 (all_failed) and w (one_failed); w's skip then fails p2
    # (one_success, y failed). c (all_success) must see p2's failure, not just p1's skip.
    plan = parse_dag(
        dag(
            task("x"),
            task("y"),
            task("p1", "x", rule="all_failed"),
            task("w", "x", rule="one_failed"),
            task("p2", "y", "w", rule="one_success"),
            task("c", "p1", "p2"),
        )
    )
    progress = new_progress(plan)
    start_run(plan, progress)
    task_finished(plan, progress, "y", F)
    changes = task_finished(plan, progress, "x", S)
    assert [(tid, st) for tid, st, _ in changes.settled] == [
        ("p1", TaskState.SKIPPED),
        ("w", TaskState.SKIPPED),
        ("p2", TaskState.UPSTREAM_FAILED),
        ("c", TaskState.UPSTREAM_FAILED),
    ]


def test_cancel_cancels_running_tasks_and_skips_pending_ones() -> None:
    plan = diamond()
    progress = new_progress(plan)
    start_run(plan, progress)
    task_finished(plan, progress, "a", S)
    task_finished(plan, progress, "b", S)
    cancelled, changes = cancel_run(plan, progress, "cancelled by alice")
    assert cancelled == ("c",)
    assert changes == Changes(
        start=(),
        settled=(
            ("d", TaskState.SKIPPED, "cancelled by alice"),
            ("cleanup", TaskState.SKIPPED, "cancelled by alice"),
        ),
    )
    assert states(progress) == {"a": S, "b": S, "c": C, "d": "skipped", "cleanup": "skipped"}
    assert progress[2]["reason"] == "cancelled by alice"
    assert run_state(progress) is TaskState.FAILED
    # The cancelled task's own finish arrives later and is ignored; so is a second cancel.
    assert task_finished(plan, progress, "c", S) == NONE
    assert cancel_run(plan, progress) == ((), NONE)
    assert (
        progress[4]["pending"],
        progress[4]["succeeded"],
        progress[4]["failed"],
        progress[4]["skipped"],
    ) == (0, 1, 1, 1)


def test_cancel_then_retry_runs_the_cancelled_part_again() -> None:
    plan = diamond()
    progress = new_progress(plan)
    start_run(plan, progress)
    task_finished(plan, progress, "a", S)
    cancel_run(plan, progress)
    assert retry_run(plan, progress) == Changes(start=("b", "c"), settled=())
    assert states(progress)["d"] == "pending" and progress[3]["reason"] is None


def test_retry_runs_failures_again_but_never_what_succeeded() -> None:
    plan = diamond()
    progress = new_progress(plan)
    start_run(plan, progress)
    task_finished(plan, progress, "a", S)
    task_finished(plan, progress, "b", F)
    task_finished(plan, progress, "c", S)
    task_finished(plan, progress, "cleanup", S)
    assert run_state(progress) is TaskState.FAILED
    # b failed and d was upstream_failed: both reset; cleanup (all_done) succeeded: kept.
    assert retry_run(plan, progress) == Changes(start=("b",), settled=())
    assert states(progress) == {"a": S, "b": "running", "c": S, "d": "pending", "cleanup": S}
    assert (progress[3]["pending"], progress[3]["succeeded"], progress[3]["failed"]) == (1, 1, 0)
    assert (progress[4]["pending"], progress[4]["succeeded"], progress[4]["failed"]) == (2, 1, 0)
    assert task_finished(plan, progress, "b", S) == Changes(start=("d",), settled=())
    assert task_finished(plan, progress, "d", S) == NONE
    assert run_state(progress) is TaskState.SUCCEEDED
    assert states(progress)["cleanup"] == S


def test_retry_resets_what_a_succeeded_cleanup_skipped_below_the_failure() -> None:
    plan = parse_dag(
        dag(
            task("a"),
            task("cleanup", "a", rule="all_done"),
            task("notify", "cleanup", rule="one_failed"),
            task("after", "a"),
        )
    )
    progress = new_progress(plan)
    start_run(plan, progress)
    task_finished(plan, progress, "a", F)
    task_finished(plan, progress, "cleanup", S)
    assert states(progress) == {
        "a": F,
        "cleanup": S,
        "notify": "skipped",
        "after": "upstream_failed",
    }
    changes = retry_run(plan, progress)
    # notify is below a (through cleanup) and is judged again: still skipped.
    assert changes == Changes(
        start=("a",),
        settled=(("notify", TaskState.SKIPPED, "trigger rule one_failed: no parent failed"),),
    )
    assert states(progress)["after"] == "pending"


def test_retry_keeps_skips_no_failure_caused() -> None:
    plan = parse_dag(dag(task("a"), task("b"), task("on_error", "a", rule="one_failed")))
    progress = new_progress(plan)
    start_run(plan, progress)
    task_finished(plan, progress, "a", S)
    task_finished(plan, progress, "b", F)
    assert retry_run(plan, progress) == Changes(start=("b",), settled=())
    assert states(progress)["on_error"] == "skipped"


def test_retry_refuses_a_running_run_and_does_nothing_on_a_succeeded_one() -> None:
    plan = parse_dag(dag(task("a")))
    progress = new_progress(plan)
    start_run(plan, progress)
    with pytest.raises(ValueError, match="finished run"):
        retry_run(plan, progress)
    task_finished(plan, progress, "a", S)
    assert retry_run(plan, progress) == NONE


def test_a_500_task_chain_settles_in_one_call_without_recursion() -> None:
    plan = parse_dag(dag(task("t0"), *[task(f"t{i}", f"t{i - 1}") for i in range(1, 500)]))
    progress = new_progress(plan)
    assert start_run(plan, progress).start == ("t0",)
    changes = task_finished(plan, progress, "t0", F)
    assert [tid for tid, _, _ in changes.settled] == [f"t{i}" for i in range(1, 500)]
    assert run_state(progress) is TaskState.FAILED
    assert retry_run(plan, progress).start == ("t0",)
    for i in range(500):
        want = (f"t{i + 1}",) if i < 499 else ()
        assert task_finished(plan, progress, f"t{i}", S) == Changes(start=want, settled=())
    assert run_state(progress) is TaskState.SUCCEEDED
