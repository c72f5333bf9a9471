"""Properties of DAG runs (streams/domain/dag.py) on random DAGs and random outcomes.

Each run is checked step by step against a reference written here, independently of the
module's parent counts: a plain fixpoint over the parents' states and a table of Airflow's
trigger rules. The reference is driven by the same events in the same order, because the
eager rules are not order-free (an all_success task whose parents are skipped and failed by
different events ends skipped or upstream_failed depending on which came first, in Airflow
too); both decide one event's consequences in topological order.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from streams.domain.dag import (
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

EXAMPLES = settings(max_examples=200)

BAD = {"failed", "upstream_failed", "cancelled"}
FINAL = BAD | {"succeeded", "skipped"}
NO_CHANGES = Changes(start=(), settled=())


def _done(ps: Sequence[str]) -> bool:
    return all(s in FINAL for s in ps)


def _any_bad(ps: Sequence[str]) -> bool:
    return any(s in BAD for s in ps)


# Airflow's table over the parents' states: "run", "skip", "upstream_failed" or "wait".
REFERENCE: dict[str, Callable[[Sequence[str]], str]] = {
    "all_success": lambda ps: (
        "upstream_failed"
        if _any_bad(ps)
        else "skip"
        if "skipped" in ps
        else "run"
        if all(s == "succeeded" for s in ps)
        else "wait"
    ),
    "all_failed": lambda ps: (
        "skip" if any(s in ("succeeded", "skipped") for s in ps) else "run" if _done(ps) else "wait"
    ),
    "all_done": lambda ps: "run" if _done(ps) else "wait",
    "one_success": lambda ps: (
        "run"
        if not ps or "succeeded" in ps
        else "wait"
        if not _done(ps)
        else "skip"
        if all(s == "skipped" for s in ps)
        else "upstream_failed"
    ),
    "one_failed": lambda ps: "run" if not ps or _any_bad(ps) else "skip" if _done(ps) else "wait",
    "none_failed": lambda ps: "upstream_failed" if _any_bad(ps) else "run" if _done(ps) else "wait",
    "always": lambda ps: "run",
}
NEW_STATE = {"run": "running", "skip": "skipped", "upstream_failed": "upstream_failed"}


@dataclass
class Reference:
    """A run that knows nothing of counts: states only, recomputed to a fixpoint."""

    parents: list[list[int]]
    rules: list[str]
    states: list[str]

    def settle(self) -> list[int]:
        """Judges every pending task until nothing changes; returns those started. Index
        order is a topological one here (edges go from lower to higher index)."""
        started: list[int] = []
        changed = True
        while changed:
            changed = False
            for i, state in enumerate(self.states):
                if state != "pending":
                    continue
                got = REFERENCE[self.rules[i]]([self.states[p] for p in self.parents[i]])
                if got != "wait":
                    self.states[i] = NEW_STATE[got]
                    started += [i] if got == "run" else []
                    changed = True
        return started

    def retry(self) -> list[int]:
        below: set[int] = set()
        for i in range(len(self.states)):  # parents come first, so one pass finds them all
            if self.states[i] in BAD or any(p in below for p in self.parents[i]):
                below.add(i)
        for i in below:
            if self.states[i] != "succeeded":
                self.states[i] = "pending"
        return self.settle()


@dataclass
class Case:
    parents: list[list[int]]
    rules: list[str | None]  # None: the key is left out (all_success by default)
    outcomes: list[TaskState]

    def raw(self) -> dict[str, Any]:
        tasks = []
        for i, ps in enumerate(self.parents):
            t: dict[str, Any] = {
                "id": f"t{i}",
                "target": {"n": i},
                "depends_on": [f"t{p}" for p in ps],
            }
            if self.rules[i] is not None:
                t["trigger_rule"] = self.rules[i]
            tasks.append(t)
        return {"tasks": tasks}

    def reference(self) -> Reference:
        rules = [r or "all_success" for r in self.rules]
        return Reference(self.parents, rules, ["pending"] * len(self.parents))


@st.composite
def cases(draw: st.DrawFn, max_tasks: int = 30) -> Case:
    n = draw(st.integers(1, max_tasks))
    parents = [
        draw(st.lists(st.integers(0, i - 1), unique=True, max_size=min(i, 5))) if i else []
        for i in range(n)
    ]
    rules = draw(st.lists(st.sampled_from([None, *TriggerRule]), min_size=n, max_size=n))
    # A worker may also report a task cancelled (its own stop), rarer than the others.
    outcome = st.sampled_from(
        [TaskState.SUCCEEDED] * 2 + [TaskState.FAILED] * 2 + [TaskState.CANCELLED]
    )
    outcomes = draw(st.lists(outcome, min_size=n, max_size=n))
    return Case(parents, [None if r is None else str(r) for r in rules], outcomes)


def counts(plan: DagPlan, progress: list[dict[str, Any]], i: int) -> dict[str, int]:
    """Task i's parent counts from scratch, from the parents' states."""
    ps = [progress[plan.index[d]]["state"] for d in plan.tasks[i].depends_on]
    return {
        "pending": sum(s not in FINAL for s in ps),
        "succeeded": ps.count("succeeded"),
        "failed": sum(s in BAD for s in ps),
        "skipped": ps.count("skipped"),
    }


def fresh_verdict(plan: DagPlan, progress: list[dict[str, Any]], i: int) -> Verdict:
    task = plan.tasks[i]
    return verdict(task.rule, total=len(task.depends_on), **counts(plan, progress, i))


class Run:
    """Drives the module and the reference through the same events, checking each step."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self.plan = parse_dag(case.raw())
        self.progress = new_progress(self.plan)
        self.ref = case.reference()
        self.started: set[str] = set()  # in this attempt of the run (reset by a retry)

    def running(self) -> list[str]:
        return [p["task_id"] for p in self.progress if p["state"] == "running"]

    def step(
        self,
        call: Callable[[], Changes],
        ref_call: Callable[[], list[int]],
        judged: frozenset[str] = frozenset({"pending"}),
    ) -> None:
        """Applies one event to the module (``call``), then to the reference, and checks.
        ``judged``: the states a task the event starts or settles may have had before it."""
        before = [p["state"] for p in self.progress]
        changes = call()
        self.check(before, changes, ref_call(), judged)

    def check(
        self, before: list[str], changes: Changes, ref_started: list[int], judged: frozenset[str]
    ) -> None:
        plan, progress = self.plan, self.progress
        ids = [plan.index[t] for t in changes.start]
        # (1) started at most once per attempt, from pending.
        assert not self.started & set(changes.start)
        self.started |= set(changes.start)
        assert all(before[i] in judged and progress[i]["state"] == "running" for i in ids)
        # (2) started only when the rule, on the parents as they are, says run.
        assert all(fresh_verdict(plan, progress, i) is Verdict.RUN for i in ids)
        for tid, state, reason in changes.settled:
            i = plan.index[tid]
            assert before[i] in judged and progress[i]["state"] == state
            assert reason is not None and reason.startswith(f"trigger rule {plan.tasks[i].rule}")
            want = Verdict.SKIP if state == "skipped" else Verdict.UPSTREAM_FAILED
            assert fresh_verdict(plan, progress, i) is want
        # Nothing left pending that its rule decides now, and the counts are exact.
        self.assert_counts()
        for i, entry in enumerate(progress):
            if entry["state"] == "pending":
                assert fresh_verdict(plan, progress, i) is Verdict.WAIT
        # (4) the reference, driven by the same event, agrees on everything.
        assert sorted(ids) == sorted(ref_started)
        assert [p["state"] for p in progress] == self.ref.states
        assert run_state(progress) is None or not self.running()

    def assert_counts(self) -> None:
        for i, entry in enumerate(self.progress):
            kept = {k: entry[k] for k in ("pending", "succeeded", "failed", "skipped")}
            assert kept == counts(self.plan, self.progress, i)

    def start(self) -> None:
        self.step(lambda: start_run(self.plan, self.progress), self.ref.settle)

    def finish(self, tid: str, state: TaskState) -> None:
        i = self.plan.index[tid]

        def ref_call() -> list[int]:
            self.ref.states[i] = state
            return self.ref.settle()

        self.step(lambda: task_finished(self.plan, self.progress, tid, state, "why"), ref_call)

    def finish_all(self, data: st.DataObject, outcome: Callable[[int], TaskState]) -> None:
        """Finishes started tasks in a drawn order until none runs; redelivers some."""
        done: list[str] = []
        while running := self.running():
            tid = data.draw(st.sampled_from(running))
            self.finish(tid, outcome(self.plan.index[tid]))
            done.append(tid)
            if data.draw(st.booleans()):
                self.redeliver(data.draw(st.sampled_from(done)))

    def redeliver(self, tid: str) -> None:
        """A finish of a final task, with either outcome, changes nothing."""
        before = [dict(p) for p in self.progress]
        for state in (TaskState.SUCCEEDED, TaskState.FAILED):
            assert task_finished(self.plan, self.progress, tid, state) == NO_CHANGES
        assert self.progress == before

    def assert_over(self) -> TaskState:
        # (3) nothing runs: every task is final and the run has a state.
        assert all(p["state"] in FINAL for p in self.progress)
        state = run_state(self.progress)
        assert state is not None
        bad = any(p["state"] in BAD for p in self.progress)
        assert state == (TaskState.FAILED if bad else TaskState.SUCCEEDED)
        return state

    def retry(self) -> None:
        before = [p["state"] for p in self.progress]
        self.started = set()
        # Reset to pending first: whatever did not succeed may be judged again.
        again = frozenset(FINAL - {"succeeded"} | {"pending"})
        self.step(lambda: retry_run(self.plan, self.progress), self.ref.retry, again)
        # (5) what succeeded is never reset.
        for i, entry in enumerate(self.progress):
            if before[i] == "succeeded":
                assert entry["state"] == "succeeded"


@EXAMPLES
@given(cases(), st.data())
def test_a_run_follows_the_rules_and_the_reference(case: Case, data: st.DataObject) -> None:
    run = Run(case)
    run.start()
    run.finish_all(data, lambda i: case.outcomes[i])
    run.assert_over()


@EXAMPLES
@given(cases(), st.data())
def test_a_retried_run_whose_retries_succeed_succeeds(case: Case, data: st.DataObject) -> None:
    run = Run(case)
    run.start()
    run.finish_all(data, lambda i: case.outcomes[i])
    if run.assert_over() is TaskState.FAILED:
        run.retry()
        run.finish_all(data, lambda i: TaskState.SUCCEEDED)
    assert run.assert_over() is TaskState.SUCCEEDED
    # Whatever did not run was skipped by its own rule.
    for entry in run.progress:
        assert entry["state"] == "succeeded" or entry["reason"].startswith("trigger rule")


@EXAMPLES
@given(cases(), st.data())
def test_a_cancelled_run_is_over_and_a_retry_finishes_it(case: Case, data: st.DataObject) -> None:
    run = Run(case)
    run.start()
    for _ in range(data.draw(st.integers(0, len(case.parents)))):
        if not (running := run.running()):
            break
        tid = data.draw(st.sampled_from(running))
        run.finish(tid, case.outcomes[run.plan.index[tid]])
    running = run.running()
    pending = [p["task_id"] for p in run.progress if p["state"] == "pending"]
    cancelled, changes = cancel_run(run.plan, run.progress, "stop")
    assert sorted(cancelled) == sorted(running)
    assert changes == Changes(
        start=(), settled=tuple((t, TaskState.SKIPPED, "stop") for t in pending)
    )
    state = run.assert_over()
    run.assert_counts()
    assert state is TaskState.FAILED or not running
    for tid in cancelled:  # their finishes come later and change nothing
        run.redeliver(tid)
    # The reference learns the cancel as states, then both retry.
    run.ref.states = [p["state"] for p in run.progress]
    if state is TaskState.FAILED:
        run.retry()
        run.finish_all(data, lambda i: TaskState.SUCCEEDED)
    assert run.assert_over() is TaskState.SUCCEEDED


def descendants(parents: list[list[int]], u: int) -> list[int]:
    below = {u}
    for i in range(u + 1, len(parents)):
        if any(p in below for p in parents[i]):
            below.add(i)
    return sorted(below - {u})


@EXAMPLES
@given(cases(), st.data())
def test_parse_accepts_every_dag_and_names_a_real_cycle(case: Case, data: st.DataObject) -> None:
    # (6) Listed in a drawn order, so the topological order is not the spec's.
    raw = case.raw()
    raw["tasks"] = data.draw(st.permutations(raw["tasks"]))
    plan = parse_dag(raw)
    pos = {i: p for p, i in enumerate(plan.order)}
    assert sorted(plan.order) == list(range(len(raw["tasks"])))
    for t in plan.tasks:
        assert all(pos[plan.index[d]] < pos[t.index] for d in t.depends_on)
        assert all(t.index in plan.children[plan.index[d]] for d in t.depends_on)
    # One back edge: u comes to depend on a task below it.
    pairs = [(u, v) for u in range(len(case.parents)) for v in descendants(case.parents, u)]
    assume(pairs)
    u, v = data.draw(st.sampled_from(pairs))
    by_id = {t["id"]: t for t in raw["tasks"]}
    by_id[f"t{u}"]["depends_on"] = [*by_id[f"t{u}"]["depends_on"], f"t{v}"]
    try:
        parse_dag(raw)
    except PermanentError as err:
        assert err.message.startswith("dependency cycle: ")
        names = err.message.removeprefix("dependency cycle: ").split(" -> ")
        assert names[0] == names[-1] and len(set(names)) == len(names) - 1 >= 2
        for a, b in itertools.pairwise(names):
            assert b in by_id[a]["depends_on"]  # every edge named is real
        assert (f"t{u}", f"t{v}") in set(itertools.pairwise(names))
        first = next(i for i, t in enumerate(raw["tasks"]) if t["id"] == names[0])
        assert err.field == f"dag.tasks[{first}].depends_on"
    else:
        raise AssertionError("a cycle was accepted")
