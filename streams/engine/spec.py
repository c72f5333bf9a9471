"""A job's Avro spec, validated once into the domain's typed plan.

The engine and the API share this so a command from another service and a request through
HTTP are judged by the same rules.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields
from typing import Any

from streams.domain.dag import DagPlan, parse_dag
from streams.domain.errors import InvalidPolicy, InvalidSchedule, PermanentError
from streams.domain.notify import Notify, parse_notify
from streams.domain.policies import (
    PRIORITIES,
    Backoff,
    DstAmbiguous,
    DstNonexistent,
    DstPolicy,
    MisfireKind,
    MisfirePolicy,
    Overlap,
    Priority,
    RetryPolicy,
)
from streams.domain.schedule import OneOffSchedule, Schedule, parse_cron

# Far enough for any real schedule, near enough that an epoch-ms typo (seconds vs ms) fails.
MAX_TIME_MS = 253_402_300_799_000  # 9999-12-31T23:59:59Z
MAX_JITTER_S = 3600.0
MAX_LEASE_S = 86_400.0


@dataclass(frozen=True, kw_only=True, slots=True)
class JobPlan:
    schedule: Schedule
    retry: RetryPolicy
    misfire: MisfirePolicy
    dst: DstPolicy
    overlap: Overlap
    jitter_s: float
    lease_s: float
    start_at_ms: int | None
    end_at_ms: int | None
    # A DAG job's tasks (its target is a kron.DagTarget); None for any other job.
    dag: DagPlan | None = None
    # The job's tier (JobSpec.priority, v4; normal for a spec without one). A DAG's tasks
    # take their job's: there is nothing per task.
    priority: Priority = Priority.NORMAL
    # The job's own failure alerts (JobSpec.notify, v5); None: its tenant's default. Its
    # webhook goes through the tenant's SSRF guard as a target's URL does (core).
    notify: Notify | None = None


# The slots' own setters, in field order. A frozen dataclass's __init__ sets each field
# through object.__setattr__: 1.2 us for a JobPlan, against 0.7 us this way, in a create of
# ~22 us (bench.create_micro).
_PLAN_SETTERS = tuple(getattr(JobPlan, f.name).__set__ for f in fields(JobPlan))


def _new_plan(*values: Any) -> JobPlan:
    """JobPlan(...) with every field given in field order (a test holds it to that)."""
    plan = object.__new__(JobPlan)
    for setter, value in zip(_PLAN_SETTERS, values, strict=True):
        setter(plan, value)
    return plan


def _finite(value: float, field: str, lo: float, hi: float) -> float:
    if not isinstance(value, int | float) or not math.isfinite(value) or not lo <= value <= hi:
        raise InvalidPolicy(f"{field} must be a finite number in [{lo}, {hi}]", field=field)
    return float(value)


def _time(value: int | None, field: str) -> int | None:
    if value is not None and not 0 <= value <= MAX_TIME_MS:
        raise InvalidSchedule(f"{field} is outside years 1970..9999", field=field)
    return value


def branch(value: Any) -> Any:
    """The record inside an Avro union: the codec decodes named unions as (name, record)."""
    return value[1] if isinstance(value, tuple) else value


def parse_schedule(raw: Any) -> Schedule:
    raw = branch(raw)
    if "expr" in raw:
        return parse_cron(raw["expr"], raw.get("timezone") or "UTC")
    run_at = _time(raw["run_at_ms"], "run_at")
    assert run_at is not None
    return OneOffSchedule(run_at_ms=run_at)


Policies = tuple[RetryPolicy, MisfirePolicy, DstPolicy]
# The policies plus overlap, jitter and lease: what most jobs of a deployment share.
Shared = tuple[RetryPolicy, MisfirePolicy, DstPolicy, Overlap, float, float]


def _policies_of(spec: dict[str, Any]) -> Policies:
    """Built and checked in plan_of's order of old, so a bad spec names the same field."""
    raw = spec["retry"]
    retry = RetryPolicy(max_attempts=raw["max_attempts"], backoff=Backoff(raw["backoff"]),
                        base_s=raw["base_s"], max_s=raw["max_s"])
    retry.validate()
    raw = spec["misfire"]
    misfire = MisfirePolicy(kind=MisfireKind(raw["kind"]), late_by_s=raw.get("late_by_s"),
                            fire_all_cap=raw.get("fire_all_cap", 100))
    misfire.validate()
    raw = spec["dst"]
    return retry, misfire, DstPolicy(nonexistent=DstNonexistent(raw["nonexistent"]),
                                     ambiguous=DstAmbiguous(raw["ambiguous"]))


# Most jobs share a handful of policies, and building and checking them was two thirds of
# plan_of (a sixth of a batched create). They are frozen, so one copy serves every job.
# `typed`: 1, 1.0 and True hash alike, and the checks tell them apart. -0.0 and 0.0 share
# a policy (equal as numbers, and every check and delay treats them alike).
@functools.lru_cache(maxsize=1024, typed=True)
def _cached_policies(max_attempts: Any, backoff: Any, base_s: Any, max_s: Any, kind: Any,
                     late_by_s: Any, fire_all_cap: Any, nonexistent: Any, ambiguous: Any,
                     overlap: Any, jitter_s: Any, lease_s: Any) -> Shared:
    retry, misfire, dst = _policies_of({
        "retry": {"max_attempts": max_attempts, "backoff": backoff, "base_s": base_s,
                  "max_s": max_s},
        "misfire": {"kind": kind, "late_by_s": late_by_s, "fire_all_cap": fire_all_cap},
        "dst": {"nonexistent": nonexistent, "ambiguous": ambiguous}})
    return (retry, misfire, dst, Overlap(overlap), _jitter(jitter_s), _lease(lease_s))


def _shared(spec: dict[str, Any]) -> Shared | None:
    """The cached policies of a spec whose policies are all good; None for any other, which
    plan_of then judges field by field and names (exceptions are never cached)."""
    try:
        retry, misfire, dst = spec["retry"], spec["misfire"], spec["dst"]
        return _cached_policies(
            retry["max_attempts"], retry["backoff"], retry["base_s"], retry["max_s"],
            misfire["kind"], misfire.get("late_by_s"), misfire.get("fire_all_cap", 100),
            dst["nonexistent"], dst["ambiguous"], spec["overlap"],
            spec.get("jitter_s", 0.0), spec.get("lease_s", 60.0))
    except Exception:
        return None


def _jitter(value: Any) -> float:
    return _finite(value, "jitter_s", 0, MAX_JITTER_S)


def _lease(value: Any) -> float:
    return _finite(value, "lease_s", 1, MAX_LEASE_S)


def plan_of(spec: dict[str, Any]) -> JobPlan:
    """Raises a PermanentError naming the field for anything a scheduler can't honour."""
    try:
        plan = _plan(spec)
    except PermanentError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise PermanentError(f"invalid job spec: {exc}", field=None) from exc
    if plan.start_at_ms and plan.end_at_ms and plan.end_at_ms <= plan.start_at_ms:
        raise InvalidSchedule("end_at must be after start_at", field="end_at")
    _check_target(spec.get("target"))
    return plan


def _plan(spec: dict[str, Any]) -> JobPlan:
    shared = _shared(spec)
    if shared is None:  # each field judged in turn, so a bad spec names its first bad field
        retry, misfire, dst = _policies_of(spec)
        schedule = parse_schedule(spec["schedule"])
        overlap = Overlap(spec["overlap"])
        jitter_s = _jitter(spec.get("jitter_s", 0.0))
        lease_s = _lease(spec.get("lease_s", 60.0))
    else:
        retry, misfire, dst, overlap, jitter_s, lease_s = shared
        schedule = parse_schedule(spec["schedule"])
    return _new_plan(schedule, retry, misfire, dst, overlap, jitter_s, lease_s,
                     _time(spec.get("start_at_ms"), "start_at"),
                     _time(spec.get("end_at_ms"), "end_at"), _dag_of(spec.get("target")),
                     _priority(spec.get("priority", "normal")),
                     parse_notify(spec.get("notify")))


def _priority(value: Any) -> Priority:
    """The Priority of a spec's value (a decoded record's plain string, or a member)."""
    try:
        return PRIORITIES[value]
    except (KeyError, TypeError):  # TypeError: unhashable
        raise InvalidPolicy(f"priority must be one of: {', '.join(PRIORITIES)}; got "
                            f"{value!r}", field="priority") from None


def _dag_of(target: Any) -> DagPlan | None:
    """The DAG of a kron.DagTarget, its structure checked (streams.domain.dag); None for any
    other target. Each task's own target is judged by _check_target, as a job's is."""
    if isinstance(target, tuple) and target[0] == "kron.DagTarget":
        return parse_dag(target[1])
    raw = branch(target)
    if isinstance(raw, dict) and "tasks" in raw:
        return parse_dag(raw)
    return None


def _check_target(target: Any) -> None:
    target = branch(target)
    if not isinstance(target, dict):
        raise PermanentError("target is required", field="target")
    if "tasks" in target:
        _check_task_targets(target["tasks"])
    elif "url" in target:
        if not str(target["url"]).lower().startswith(("http://", "https://")):
            raise PermanentError("target.url must be an http(s) URL", field="target.url")
        _finite(target.get("timeout_s", 30.0), "target.timeout_s", 0.001, 3600)
        for name, value in target.get("headers", {}).items():
            if any(c in f"{name}{value}" for c in "\r\n\x00"):
                raise PermanentError("header names and values can't hold CR, LF or NUL",
                                     field=f"target.headers.{name}")
    elif "command" in target:
        # Which commands exist and what their parameters take is the registry's to judge
        # (streams.domain.commands), with the tenant: streams.guard.
        if not isinstance(target["command"], str) or not target["command"]:
            raise PermanentError("target.command must name a registered command",
                                 field="target.command")
        if target.get("timeout_s") is not None:
            _finite(target["timeout_s"], "target.timeout_s", 0.001, 86_400)
    elif "argv" in target:
        if not target["argv"]:
            raise PermanentError("target.argv must not be empty", field="target.argv")
        _finite(target.get("timeout_s", 300.0), "target.timeout_s", 0.001, 86_400)
    elif "topic" not in target:
        raise PermanentError("target must be http, kafka or command", field="target")


def _check_task_targets(tasks: list[dict[str, Any]]) -> None:
    """Each task's target as a job's own, its field named by its place in the DAG."""
    for i, task in enumerate(tasks):
        if "tasks" in branch(task["target"]):
            raise PermanentError("a task's target can't be a DAG", field=f"dag.tasks[{i}].target")
        try:
            _check_target(task["target"])
        except PermanentError as exc:
            raise PermanentError(exc.message, field=f"dag.tasks[{i}].{exc.field}") from None
