"""DAG workflows: a job whose target is a graph of tasks, and the rules that run it.

Pure: the partition core persists a run's progress (one ``kron.TaskProgress`` record per task,
in spec order) and calls these functions on every event; it never decides a task's fate
itself, so a replay of the same events gives the same run.

Trigger rules follow Apache Airflow's (``trigger_rule_dep.py``), evaluated eagerly: a task
is decided as soon as its parents' states decide it, not once all of them are done (an
``all_success`` task with a failed parent is ``upstream_failed`` at once). Within one call,
tasks are decided in topological order, so a task sees every parent that the same event
settles before it is judged (an ``all_success`` task whose parents are skipped and failed by
one event is ``upstream_failed``, whichever of them the event reached first).

Each progress entry keeps counts of its parents by state (``pending``: not final yet;
``failed``: failed, upstream_failed or cancelled), so a finish costs the finished task's
children and whatever they settle, not a scan of the graph.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import re
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum, nonmember
from typing import Any

from streams.domain.errors import InvalidPolicy, PermanentError
from streams.domain.policies import Backoff, RetryPolicy


class TriggerRule(StrEnum):
    """When a task runs, given its parents' states (Airflow's names and meanings)."""

    ALL_SUCCESS = "all_success"
    ALL_FAILED = "all_failed"
    ALL_DONE = "all_done"
    ONE_SUCCESS = "one_success"
    ONE_FAILED = "one_failed"
    NONE_FAILED = "none_failed"
    ALWAYS = "always"


class TaskState(StrEnum):
    """A task's ``state`` in a run's progress."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    UPSTREAM_FAILED = "upstream_failed"
    CANCELLED = "cancelled"

    # Over for this run (a retry_run may put it back to pending).
    FINAL = nonmember(frozenset({SUCCEEDED, FAILED, SKIPPED, UPSTREAM_FAILED, CANCELLED}))
    # Counted in a child's ``failed``; any of them makes the run failed.
    BAD = nonmember(frozenset({FAILED, UPSTREAM_FAILED, CANCELLED}))


class Verdict(StrEnum):
    """What a pending task's trigger rule says now."""

    WAIT = "wait"
    RUN = "run"
    SKIP = "skip"
    UPSTREAM_FAILED = "upstream_failed"


TASK_ID_PATTERN = r"[a-z0-9][a-z0-9_.-]{0,63}"
MAX_TASKS = 500
MAX_EDGES = 5000
TIMEOUT_S_MIN = 0.001
TIMEOUT_S_MAX = 86400.0

_TASK_ID = re.compile(TASK_ID_PATTERN)
_RULES = tuple(r.value for r in TriggerRule)
_RETRY_KEYS = ("max_attempts", "backoff", "base_s", "max_s")


@dataclass(frozen=True, kw_only=True, slots=True)
class DagTask:
    """One task of a DAG; ``target`` is the raw Avro target value, left for the core."""

    task_id: str
    index: int
    target: Any
    depends_on: tuple[str, ...]
    rule: TriggerRule
    retry: RetryPolicy | None
    timeout_s: float | None


@dataclass(frozen=True, kw_only=True, slots=True)
class DagPlan:
    """A checked, acyclic DAG. ``children`` and ``order`` are indexes into ``tasks``.

    ``parents`` and ``rank`` (a task's position in ``order``) are derived here rather than
    passed in: every run function needs them and none may pay O(V) per event to rebuild them.
    """

    tasks: tuple[DagTask, ...]
    index: Mapping[str, int]
    children: tuple[tuple[int, ...], ...]
    order: tuple[int, ...]
    parents: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)
    rank: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parents = tuple(tuple(self.index[d] for d in t.depends_on) for t in self.tasks)
        rank = [0] * len(self.order)
        for pos, i in enumerate(self.order):
            rank[i] = pos
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "rank", tuple(rank))


@dataclass(frozen=True, kw_only=True, slots=True)
class Changes:
    """What one call did: tasks to start now (already RUNNING in progress), and tasks that
    became final without running, as (id, SKIPPED | UPSTREAM_FAILED, reason)."""

    start: tuple[str, ...]
    settled: tuple[tuple[str, TaskState, str | None], ...]


NO_CHANGES = Changes(start=(), settled=())

Progress = Sequence[MutableMapping[str, Any]]


# --- parsing -----------------------------------------------------------------------------


def parse_dag(
    raw: Mapping[str, Any], *, max_tasks: int = MAX_TASKS, max_edges: int = MAX_EDGES
) -> DagPlan:
    """The plan of a decoded ``dag`` record; a PermanentError naming the field for anything
    that cannot run (bad ids or references, limits, rules, policies, a cycle). O(V+E)."""
    tasks = _task_list(raw, max_tasks)
    index = _index_ids(tasks)
    _check_edge_count(tasks, max_edges)
    parsed = tuple(_task_of(i, t, index) for i, t in enumerate(tasks))
    children: list[list[int]] = [[] for _ in parsed]
    for t in parsed:
        for dep in t.depends_on:
            children[index[dep]].append(t.index)
    kids = tuple(tuple(c) for c in children)
    order = _topological_order(parsed, index, kids)
    return DagPlan(tasks=parsed, index=index, children=kids, order=order)


def _task_list(raw: Mapping[str, Any], max_tasks: int) -> list[Any]:
    tasks = raw.get("tasks") if isinstance(raw, Mapping) else None
    if not isinstance(tasks, list | tuple):
        raise PermanentError("dag.tasks must be a list of tasks", field="dag.tasks")
    if not tasks:
        raise PermanentError("a DAG needs at least one task", field="dag.tasks")
    if len(tasks) > max_tasks:
        raise PermanentError(
            f"a DAG has at most {max_tasks} tasks; got {len(tasks)}", field="dag.tasks"
        )
    for i, t in enumerate(tasks):
        if not isinstance(t, Mapping):
            raise PermanentError(f"dag.tasks[{i}] must be an object", field=f"dag.tasks[{i}]")
    return list(tasks)


def _index_ids(tasks: list[Any]) -> dict[str, int]:
    index: dict[str, int] = {}
    for i, t in enumerate(tasks):
        tid = t.get("id")
        name = f"dag.tasks[{i}].id"
        if not isinstance(tid, str) or not _TASK_ID.fullmatch(tid):
            raise PermanentError(
                f"{name} must be a string matching {TASK_ID_PATTERN}; got {tid!r}", field=name
            )
        if tid in index:
            raise PermanentError(
                f"{name}: duplicate task id {tid!r} (also dag.tasks[{index[tid]}])", field=name
            )
        index[tid] = i
    return index


def _depends_on_list(t: Mapping[str, Any], i: int) -> list[Any] | tuple[Any, ...]:
    deps = t.get("depends_on")
    if deps is None:
        return ()
    if not isinstance(deps, list | tuple):
        name = f"dag.tasks[{i}].depends_on"
        raise PermanentError(f"{name} must be a list of task ids", field=name)
    return deps


def _check_edge_count(tasks: list[Any], max_edges: int) -> None:
    # Counted before any edge is resolved, so an oversized graph costs O(V) to refuse.
    edges = sum(len(_depends_on_list(t, i)) for i, t in enumerate(tasks))
    if edges > max_edges:
        raise PermanentError(
            f"a DAG has at most {max_edges} dependencies; got {edges}", field="dag.tasks"
        )


def _task_of(i: int, t: Mapping[str, Any], index: Mapping[str, int]) -> DagTask:
    if "target" not in t:
        raise PermanentError(f"dag.tasks[{i}].target is required", field=f"dag.tasks[{i}].target")
    return DagTask(
        task_id=t["id"],
        index=i,
        target=t["target"],
        depends_on=_deps_of(i, t, index),
        rule=_rule_of(i, t.get("trigger_rule")),
        retry=_retry_of(i, t.get("retry")),
        timeout_s=_timeout_of(i, t.get("timeout_s")),
    )


def _deps_of(i: int, t: Mapping[str, Any], index: Mapping[str, int]) -> tuple[str, ...]:
    name = f"dag.tasks[{i}].depends_on"
    seen: set[str] = set()
    for dep in _depends_on_list(t, i):
        if not isinstance(dep, str):
            raise PermanentError(f"{name} must be a list of task ids; got {dep!r}", field=name)
        if dep not in index:
            raise PermanentError(f"{name}: unknown task {dep!r}", field=name)
        if dep == t["id"]:
            raise PermanentError(f"{name}: task {dep!r} depends on itself", field=name)
        if dep in seen:
            raise PermanentError(f"{name}: {dep!r} is listed twice", field=name)
        seen.add(dep)
    return tuple(_depends_on_list(t, i))


def _rule_of(i: int, value: Any) -> TriggerRule:
    if value is None:
        return TriggerRule.ALL_SUCCESS
    if not isinstance(value, str) or value not in _RULES:
        name = f"dag.tasks[{i}].trigger_rule"
        raise PermanentError(
            f"{name} must be one of: {', '.join(_RULES)}; got {value!r}", field=name
        )
    return TriggerRule(value)


def _retry_of(i: int, value: Any) -> RetryPolicy | None:
    """Built as the job's own retry policy is (streams.engine.spec), its fields named under
    the task."""
    prefix = f"dag.tasks[{i}]."
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise PermanentError(f"{prefix}retry must be an object", field=f"{prefix}retry")
    for key in _RETRY_KEYS:
        if key not in value:
            name = f"{prefix}retry.{key}"
            raise PermanentError(f"{name} is required", field=name)
    # The backoff goes in raw so validate() names a bad one; it is made a member once valid.
    policy = RetryPolicy(
        max_attempts=value["max_attempts"],
        backoff=value["backoff"],
        base_s=value["base_s"],
        max_s=value["max_s"],
    )
    try:
        policy.validate()
    except InvalidPolicy as exc:
        raise InvalidPolicy(prefix + exc.message, field=prefix + (exc.field or "retry")) from exc
    return dataclasses.replace(policy, backoff=Backoff(policy.backoff))


def _timeout_of(i: int, value: Any) -> float | None:
    if value is None:
        return None
    # bool is an int subclass; True as a timeout is a client bug.
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not TIMEOUT_S_MIN <= value <= TIMEOUT_S_MAX
    ):
        name = f"dag.tasks[{i}].timeout_s"
        raise PermanentError(
            f"{name} must be a finite number in {TIMEOUT_S_MIN}..{TIMEOUT_S_MAX:.0f}; "
            f"got {value!r}",
            field=name,
        )
    return float(value)


def _topological_order(
    tasks: tuple[DagTask, ...], index: Mapping[str, int], children: tuple[tuple[int, ...], ...]
) -> tuple[int, ...]:
    """Kahn's algorithm, the lowest ready index first, so the order is the spec's wherever
    the edges allow it."""
    indegree = [len(t.depends_on) for t in tasks]
    ready = [i for i, d in enumerate(indegree) if d == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for c in children[i]:
            indegree[c] -= 1
            if indegree[c] == 0:
                heapq.heappush(ready, c)
    if len(order) < len(tasks):
        _raise_cycle(tasks, index, indegree)
    return tuple(order)


def _raise_cycle(tasks: tuple[DagTask, ...], index: Mapping[str, int], indegree: list[int]) -> None:
    """Names one real cycle among the tasks Kahn left unsorted. Each of them still has an
    unsorted parent, so walking from parent to unsorted parent must come back to a task
    already walked; the walk from there is a cycle. Each task is walked at most once, so
    this is O(V+E). ``a -> b`` reads "a depends on b"."""
    left = {i for i, d in enumerate(indegree) if d > 0}
    walked: dict[int, int] = {}  # task -> position in path
    path: list[int] = []
    i = min(left)
    while i not in walked:
        walked[i] = len(path)
        path.append(i)
        i = next(index[d] for d in tasks[i].depends_on if index[d] in left)
    cycle = path[walked[i] :]
    # Start at the task listed first in the spec, so the same graph always reads the same.
    first = cycle.index(min(cycle))
    cycle = cycle[first:] + cycle[:first]
    names = " -> ".join(tasks[j].task_id for j in [*cycle, cycle[0]])
    raise PermanentError(f"dependency cycle: {names}", field=f"dag.tasks[{cycle[0]}].depends_on")


# --- trigger rules -----------------------------------------------------------------------

_V = Verdict
# Each rule's verdict for a task with parents, from (pending, succeeded, failed, skipped,
# total); WAIT where the parents do not decide it yet.
_VERDICTS: dict[str, Callable[[int, int, int, int, int], Verdict]] = {
    TriggerRule.ALL_SUCCESS: lambda p, s, f, k, n: (
        _V.UPSTREAM_FAILED if f else _V.SKIP if k else _V.RUN if p == 0 and s == n else _V.WAIT
    ),
    TriggerRule.ALL_FAILED: lambda p, s, f, k, n: (
        _V.SKIP if s + k else _V.RUN if p == 0 else _V.WAIT
    ),
    TriggerRule.ALL_DONE: lambda p, s, f, k, n: _V.RUN if p == 0 else _V.WAIT,
    TriggerRule.ONE_SUCCESS: lambda p, s, f, k, n: (
        _V.RUN if s else _V.WAIT if p else _V.SKIP if k == n else _V.UPSTREAM_FAILED
    ),
    TriggerRule.ONE_FAILED: lambda p, s, f, k, n: _V.RUN if f else _V.WAIT if p else _V.SKIP,
    TriggerRule.NONE_FAILED: lambda p, s, f, k, n: (
        _V.UPSTREAM_FAILED if f else _V.RUN if p == 0 else _V.WAIT
    ),
    TriggerRule.ALWAYS: lambda p, s, f, k, n: _V.RUN,
}

_REASONS: dict[tuple[str, str], str] = {
    (TriggerRule.ALL_SUCCESS, Verdict.UPSTREAM_FAILED): "a parent failed or was cancelled",
    (TriggerRule.ALL_SUCCESS, Verdict.SKIP): "a parent was skipped",
    (TriggerRule.ALL_FAILED, Verdict.SKIP): "a parent succeeded or was skipped",
    (TriggerRule.ONE_SUCCESS, Verdict.SKIP): "every parent was skipped",
    (TriggerRule.ONE_SUCCESS, Verdict.UPSTREAM_FAILED): "no parent succeeded",
    (TriggerRule.ONE_FAILED, Verdict.SKIP): "no parent failed",
    (TriggerRule.NONE_FAILED, Verdict.UPSTREAM_FAILED): "a parent failed or was cancelled",
}


def verdict(
    rule: TriggerRule, *, total: int, pending: int, succeeded: int, failed: int, skipped: int
) -> Verdict:
    """What ``rule`` says of a pending task with ``total`` parents in these states
    (``failed`` counts failed, upstream_failed and cancelled parents)."""
    # Airflow runs a task without parents whatever its rule; one_success and one_failed
    # would otherwise skip it (no parent succeeded / failed).
    if total == 0:
        return Verdict.RUN
    return _VERDICTS[rule](pending, succeeded, failed, skipped, total)


# --- runs --------------------------------------------------------------------------------


def new_progress(plan: DagPlan) -> list[dict[str, Any]]:
    """A run's progress before anything ran: every task pending, no parent final."""
    return [
        {
            "task_id": t.task_id,
            "state": TaskState.PENDING,
            "pending": len(t.depends_on),
            "succeeded": 0,
            "failed": 0,
            "skipped": 0,
            "reason": None,
        }
        for t in plan.tasks
    ]


def start_run(plan: DagPlan, progress: Progress) -> Changes:
    """Starts what can start (roots, ``always`` tasks) and settles what their rules settle."""
    return _release(
        plan, progress, [i for i, p in enumerate(progress) if p["state"] == TaskState.PENDING]
    )


def task_finished(
    plan: DagPlan, progress: Progress, task_id: str, state: TaskState, reason: str | None = None
) -> Changes:
    """Records a running task's end (SUCCEEDED, FAILED or CANCELLED), then starts and settles
    what that decides downstream.

    A finish for a task that is not running changes nothing: a final one is a redelivery,
    a pending one a stale finish of an attempt from before a retry_run.
    Raises KeyError for an unknown task id and ValueError for another state.
    """
    state = TaskState(state)
    if state not in _FINISHES:
        raise ValueError(f"a task finishes succeeded, failed or cancelled, not {state}")
    i = plan.index[task_id]
    entry = progress[i]
    if entry["state"] != TaskState.RUNNING:
        return NO_CHANGES
    entry["state"] = state
    entry["reason"] = reason
    return _release(plan, progress, _count_in_children(plan, progress, i, state))


_FINISHES = frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED})


def run_state(progress: Progress) -> TaskState | None:
    """None while a task is not final; then FAILED if one failed, was cancelled or is
    upstream_failed, else SUCCEEDED (skipped tasks fail no run)."""
    failed = False
    for entry in progress:
        s = entry["state"]
        if s not in TaskState.FINAL:
            return None
        failed = failed or s in TaskState.BAD
    return TaskState.FAILED if failed else TaskState.SUCCEEDED


def cancel_run(
    plan: DagPlan, progress: Progress, reason: str = "run cancelled"
) -> tuple[tuple[str, ...], Changes]:
    """Ends a run: running tasks become CANCELLED (returned: the caller cancels them; their
    finishes are then ignored) and pending ones SKIPPED. Nothing starts."""
    cancelled: list[str] = []
    settled: list[tuple[str, TaskState, str | None]] = []
    for i, entry in enumerate(progress):
        if entry["state"] == TaskState.RUNNING:
            new = TaskState.CANCELLED
            cancelled.append(entry["task_id"])
        elif entry["state"] == TaskState.PENDING:
            new = TaskState.SKIPPED
            settled.append((entry["task_id"], new, reason))
        else:
            continue
        entry["state"] = new
        entry["reason"] = reason
        # Kept exact even though nothing is left to decide: retry_run and readers trust them.
        _count_in_children(plan, progress, i, new)
    return tuple(cancelled), Changes(start=(), settled=tuple(settled))


def retry_run(plan: DagPlan, progress: Progress) -> Changes:
    """Runs a finished run's failures again: every failed, upstream_failed or cancelled task,
    and every descendant of one that did not succeed, goes back to pending and is released
    as by start_run. A task that succeeded is never run again.
    Raises ValueError while the run is not finished."""
    if run_state(progress) is None:
        raise ValueError("retry_run needs a finished run")
    reset = _retry_set(plan, progress)
    for i in reset:
        progress[i]["state"] = TaskState.PENDING
        progress[i]["reason"] = None
    _recount(plan, progress)
    return _release(plan, progress, reset)


def _retry_set(plan: DagPlan, progress: Progress) -> list[int]:
    # Walked through succeeded tasks too: an all_done cleanup that succeeded stays, but what
    # it skipped below the failure is run again.
    seen = {i for i, entry in enumerate(progress) if entry["state"] in TaskState.BAD}
    stack = list(seen)
    while stack:
        for c in plan.children[stack.pop()]:
            if c not in seen:
                seen.add(c)
                stack.append(c)
    return sorted(i for i in seen if progress[i]["state"] != TaskState.SUCCEEDED)


def _recount(plan: DagPlan, progress: Progress) -> None:
    for i, entry in enumerate(progress):
        entry["pending"] = entry["succeeded"] = entry["failed"] = entry["skipped"] = 0
        for parent in plan.parents[i]:
            entry[_COUNT_OF.get(progress[parent]["state"], "pending")] += 1


_COUNT_OF: dict[str, str] = {
    TaskState.SUCCEEDED: "succeeded",
    TaskState.FAILED: "failed",
    TaskState.UPSTREAM_FAILED: "failed",
    TaskState.CANCELLED: "failed",
    TaskState.SKIPPED: "skipped",
}


def _count_in_children(plan: DagPlan, progress: Progress, i: int, state: str) -> list[int]:
    """Moves task ``i`` from its children's ``pending`` to the count of its new final
    ``state``; returns the children still pending, whose verdict may have changed."""
    key = _COUNT_OF[state]
    waiting: list[int] = []
    for c in plan.children[i]:
        child = progress[c]
        child["pending"] -= 1
        child[key] += 1
        if child["state"] == TaskState.PENDING:
            waiting.append(c)
    return waiting


def _release(plan: DagPlan, progress: Progress, candidates: Sequence[int]) -> Changes:
    """Judges the pending ``candidates``, and the children of every task that settles, in
    topological order: a task is judged after every parent this call settles. Iterative, as
    a settle can run down a 500-task chain."""
    heap = [(plan.rank[i], i) for i in candidates]
    heapq.heapify(heap)
    start: list[str] = []
    settled: list[tuple[str, TaskState, str | None]] = []
    while heap:
        _, i = heapq.heappop(heap)
        entry = progress[i]
        if entry["state"] != TaskState.PENDING:
            continue  # judged already: a task is queued once per parent that settled
        task = plan.tasks[i]
        v = verdict(
            task.rule,
            total=len(task.depends_on),
            pending=entry["pending"],
            succeeded=entry["succeeded"],
            failed=entry["failed"],
            skipped=entry["skipped"],
        )
        if v == Verdict.RUN:
            entry["state"] = TaskState.RUNNING
            start.append(task.task_id)
        elif v != Verdict.WAIT:
            new = TaskState.SKIPPED if v == Verdict.SKIP else TaskState.UPSTREAM_FAILED
            reason = f"trigger rule {task.rule}: {_REASONS[task.rule, v]}"
            entry["state"] = new
            entry["reason"] = reason
            settled.append((task.task_id, new, reason))
            for c in _count_in_children(plan, progress, i, new):
                heapq.heappush(heap, (plan.rank[c], c))
    return Changes(start=tuple(start), settled=tuple(settled))
