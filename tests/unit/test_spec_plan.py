"""plan_of's shared policies and the plan a create hands to its first fire.

plan_of keeps the retry, misfire and DST policies, the overlap, jitter and lease it built,
by their raw values: these tests pin that a cached answer is always the answer a fresh
check gives, refusals included, and that a refusal names the field a check in the spec's
order would.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.domain.errors import PermanentError
from streams.engine import core as core_module
from streams.engine import spec as spec_module
from streams.engine.core import Context, PartitionCore, PlanCache
from streams.engine.spec import JobPlan, plan_of
from streams.engine.store import MemoryStore
from tests.support.stack import spec

TARGET = {"url": "http://target.invalid/hook"}
T0 = 1_767_225_600_000

# Valid and invalid values of each policy field, with the look-alikes a hash confuses
# (1, 1.0 and True; 0 and False) side by side.
numbers = st.sampled_from([0, 1, 1.0, True, False, 3, 0.5, 2.0, -1, 101, 1e9,
                           float("nan"), float("inf"), None, "3"])
policy_values = st.fixed_dictionaries({
    "retry": st.fixed_dictionaries({
        "max_attempts": numbers, "backoff": st.sampled_from(["exponential", "fixed", "x"]),
        "base_s": numbers, "max_s": numbers}),
    "misfire": st.fixed_dictionaries({
        "kind": st.sampled_from(["fire_once", "skip", "skip_if_late_by", "fire_all", "x"]),
        "late_by_s": numbers, "fire_all_cap": numbers}),
    "dst": st.fixed_dictionaries({
        "nonexistent": st.sampled_from(["shift_forward", "skip", "x"]),
        "ambiguous": st.sampled_from(["first", "both", "x"])}),
    "overlap": st.sampled_from(["allow", "queue", "skip_if_running", "x", None, 1]),
    "jitter_s": st.sampled_from([0.0, -0.0, 0, 1, 1.5, True, -1, 3601, float("nan"), None]),
    "lease_s": st.sampled_from([60.0, 60, 1, 0.5, True, 86_401, float("inf"), None, "3"]),
    # A one-off's time: the schedule is judged between the policies and the overlap.
    "schedule": st.sampled_from([("kron.OneOffSchedule", {"run_at_ms": T0}),
                                 ("kron.OneOffSchedule", {"run_at_ms": -1}),
                                 ("kron.OneOffSchedule", {})]),
})


def judged(s: dict[str, Any]) -> JobPlan | tuple[str, str | None]:
    try:
        return plan_of(s)
    except PermanentError as exc:
        return (str(exc), exc.field)


@settings(max_examples=300, deadline=None)
@given(st.lists(policy_values, min_size=1, max_size=6))
def test_a_cached_plan_is_what_a_fresh_check_gives(sequence: list[dict[str, Any]]) -> None:
    specs = [spec(target=TARGET, run_at_ms=T0, **values) for values in sequence]
    warm = [judged(s) for s in specs]  # later specs may hit what earlier ones cached
    fresh = []
    for s in specs:
        spec_module._cached_policies.cache_clear()
        fresh.append(judged(s))
    assert warm == fresh


def test_true_is_refused_after_one_was_accepted() -> None:
    plan_of(spec(target=TARGET, run_at_ms=T0, retry={"max_attempts": 1}))
    with pytest.raises(PermanentError) as refused:
        plan_of(spec(target=TARGET, run_at_ms=T0, retry={"max_attempts": True}))
    assert refused.value.field == "retry.max_attempts"


def test_an_unhashable_value_gets_the_fields_own_error() -> None:
    with pytest.raises(PermanentError) as refused:
        plan_of(spec(target=TARGET, run_at_ms=T0, retry={"max_attempts": [3]}))
    assert refused.value.field == "retry.max_attempts"


def test_a_bad_schedule_is_named_before_a_bad_overlap() -> None:
    for _ in range(2):  # the second time, what the first cached must not change the answer
        with pytest.raises(PermanentError) as refused:
            plan_of(spec(target=TARGET, run_at_ms=-1, overlap="sometimes"))
        assert refused.value.field == "run_at"
        plan_of(spec(target=TARGET, run_at_ms=T0, overlap="queue"))
    with pytest.raises(PermanentError) as refused:
        plan_of(spec(target=TARGET, run_at_ms=-1, overlap="queue"))
    assert refused.value.field == "run_at"


def test_jobs_of_one_policy_share_its_objects() -> None:
    a = plan_of(spec(target=TARGET, run_at_ms=T0))
    b = plan_of(spec(target=TARGET, run_at_ms=T0 + 1))
    assert a.retry is b.retry and a.misfire is b.misfire and a.dst is b.dst
    assert a.schedule != b.schedule


def _command(kind: str, job_id: str, n: int, **fields: Any) -> dict[str, Any]:
    cid = f"cmd-{n}"
    return {"envelope": {"event_id": cid, "event_type": "job.create_requested",
                         "schema_version": 1, "occurred_at_ms": T0, "tenant": "acme",
                         "causation_id": None, "correlation_id": None, "producer": "tests"},
            "command_id": cid, "job_id": job_id, **fields}


def test_a_create_hands_its_plan_to_the_first_fire() -> None:
    store = MemoryStore()
    core = PartitionCore(store, PlanCache())
    ctx = Context(now_ms=T0, causation_id="ev-1", worker="w1", epoch=1)
    core.on_command("kron.commands.CreateJob", _command(
        "CreateJob", "j1", 1, spec=spec(target=TARGET, run_at_ms=T0 + 1000),
        idempotency_key=None), ctx)
    with mock.patch.object(core_module, "plan_of", side_effect=AssertionError("planned again")):
        effects, _ = core.on_tick(Context(now_ms=T0 + 1000, causation_id="ev-2",
                                          worker="w1", epoch=1))
    assert [e.job_id for e in effects if isinstance(e, core_module.Dispatch)] == ["j1"]


class CountingStore(MemoryStore):
    """Records what the core asked the store to cache."""

    def __init__(self) -> None:
        super().__init__()
        self.cached: dict[str, bool] = {}

    def put_job(self, job: dict[str, Any], *, cache: bool = True) -> None:
        self.cached[job["job_id"]] = cache
        super().put_job(job, cache=cache)


@pytest.mark.parametrize(("due_in_ms", "hot"), [
    (0, True), (core_module.HOT_CREATE_MS, True), (core_module.HOT_CREATE_MS + 1, False),
    (86_400_000, False)])
def test_only_a_create_due_soon_is_cached_and_a_later_one_still_fires(
        due_in_ms: int, hot: bool) -> None:
    store, plans = CountingStore(), PlanCache()
    core = PartitionCore(store, plans)
    ctx = Context(now_ms=T0, causation_id="ev-1", worker="w1", epoch=1)
    core.on_command("kron.commands.CreateJob", _command(
        "CreateJob", "j1", 1, spec=spec(target=TARGET, run_at_ms=T0 + due_in_ms),
        idempotency_key=None), ctx)
    assert store.cached == {"j1": hot} and len(plans) == (1 if hot else 0)
    effects, _ = core.on_tick(Context(now_ms=T0 + due_in_ms, causation_id="ev-2",
                                      worker="w1", epoch=1))
    assert [e.job_id for e in effects if isinstance(e, core_module.Dispatch)] == ["j1"]
    assert len(plans) == 1  # the fire planned it, and keeps it for the result


def test_a_refused_create_leaves_no_plan_behind() -> None:
    plans = PlanCache()
    core = PartitionCore(MemoryStore(), plans)
    ctx = Context(now_ms=T0, causation_id="ev-1", worker="w1", epoch=1)
    good = spec(target=TARGET, run_at_ms=T0 + 1000)
    with mock.patch.object(PartitionCore, "_save_job", side_effect=OSError("disk full")), \
            pytest.raises(OSError):
        core.on_command("kron.commands.CreateJob", _command(
            "CreateJob", "j1", 1, spec=good, idempotency_key=None), ctx)
    assert len(plans) == 0
    other = spec(target=TARGET, run_at_ms=T0 + 5000)
    core.on_command("kron.commands.CreateJob", _command(
        "CreateJob", "j1", 2, spec=other, idempotency_key=None), ctx)
    job = core.store.job("j1")
    assert job is not None and plans.plan(job).schedule == plan_of(other).schedule


def test_a_bad_spec_names_the_field_it_always_named() -> None:
    # retry is judged before dst is read: the shared path must not report the missing
    # dst (a KeyError, field None) ahead of the bad retry.
    bad = spec(target=TARGET, run_at_ms=T0, retry={"max_attempts": 0})
    del bad["dst"]
    with pytest.raises(PermanentError) as refused:
        plan_of(bad)
    assert refused.value.field == "retry.max_attempts"


def test_a_plan_built_by_its_slots_is_the_plan_its_constructor_builds() -> None:
    """plan_of builds JobPlans through the slots' setters, with the values in field order:
    a field added, removed or moved must fail here, not build a plan with fields swapped."""
    names = [f.name for f in dataclasses.fields(JobPlan)]
    values = [object() for _ in names]  # each field's own value, so a swap shows
    built = spec_module._new_plan(*values)
    assert built == JobPlan(**dict(zip(names, values, strict=True)))
    assert [getattr(built, name) for name in names] == values
    with pytest.raises(ValueError):
        spec_module._new_plan(*values[:-1])
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.lease_s = 1.0  # type: ignore[misc]
    plan = plan_of(spec(target=TARGET, run_at_ms=T0, jitter_s=2.5, lease_s=45.0,
                        start_at_ms=T0 - 1, end_at_ms=T0 + 1))
    assert (plan.jitter_s, plan.lease_s, plan.start_at_ms, plan.end_at_ms) == (
        2.5, 45.0, T0 - 1, T0 + 1)
