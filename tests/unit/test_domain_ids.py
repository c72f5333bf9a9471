from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.domain.cursor import advance_cursor
from streams.domain.errors import InvalidPolicy, InvalidSchedule, KronError, PermanentError
from streams.domain.ids import encode_parts, event_id, exec_id, manual_exec_id
from streams.domain.policies import (
    DstPolicy,
    MisfireKind,
    MisfirePolicy,
    Overlap,
    RetryPolicy,
)

parts = st.lists(st.text(max_size=5) | st.integers(-(10**15), 10**15), max_size=4)


def test_ids_are_deterministic_hex_and_namespaced() -> None:
    a = exec_id("job", 1000)
    assert a == exec_id("job", 1000) and len(a) == 32 and int(a, 16) >= 0
    assert a != exec_id("job", 1001) != exec_id("job2", 1000)
    assert manual_exec_id("job", "1000") != exec_id("job", 1000)
    assert event_id("job", 1000) != exec_id("job", 1000)
    assert event_id("a", "1") != event_id("a1", "") != event_id("a", 1)


@given(parts, parts)
def test_encoding_is_injective(a: list[str | int], b: list[str | int]) -> None:
    same = [(type(x), x) for x in a] == [(type(y), y) for y in b]
    assert (encode_parts(*a) == encode_parts(*b)) == same
    assert (event_id(*a) == event_id(*b)) == same


def test_encoding_rejects_other_types() -> None:
    with pytest.raises(TypeError):
        encode_parts(True)
    with pytest.raises(TypeError):
        encode_parts(1.5)  # type: ignore[arg-type]


@given(st.none() | st.integers(), st.integers())
def test_cursor_never_moves_backwards(current: int | None, proposed: int) -> None:
    got = advance_cursor(current, proposed)
    assert got >= proposed
    if current is not None:
        assert got == max(current, proposed)


def test_errors() -> None:
    err = InvalidSchedule("bad cron", field="schedule.cron")
    assert isinstance(err, PermanentError) and isinstance(err, KronError)
    assert str(err) == "bad cron" and err.field == "schedule.cron"
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is InvalidSchedule and again.field == "schedule.cron"
    assert again.message == "bad cron"
    assert InvalidPolicy(field="x", message="m").message == "m"


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        (RetryPolicy(max_attempts=0), "retry.max_attempts"),
        (RetryPolicy(max_attempts=101), "retry.max_attempts"),
        (RetryPolicy(max_attempts=True), "retry.max_attempts"),
        (RetryPolicy(base_s=0.001), "retry.base_s"),
        (RetryPolicy(base_s=float("nan")), "retry.base_s"),
        (RetryPolicy(base_s=3601.0, max_s=4000.0), "retry.base_s"),
        (RetryPolicy(base_s=10.0, max_s=5.0), "retry.max_s"),
        (RetryPolicy(max_s=float("inf")), "retry.max_s"),
        (RetryPolicy(max_s=86401.0), "retry.max_s"),
        (RetryPolicy(backoff="linear"), "retry.backoff"),  # type: ignore[arg-type]
        (MisfirePolicy(kind=MisfireKind.SKIP_IF_LATE_BY), "misfire.late_by_s"),
        (MisfirePolicy(kind=MisfireKind.SKIP_IF_LATE_BY, late_by_s=-1), "misfire.late_by_s"),
        (MisfirePolicy(late_by_s=5.0), "misfire.late_by_s"),
        (MisfirePolicy(fire_all_cap=0), "misfire.fire_all_cap"),
        (DstPolicy(ambiguous="twice"), "dst.ambiguous"),  # type: ignore[arg-type]
    ],
)
def test_policy_validation_names_the_field(
    policy: RetryPolicy | MisfirePolicy | DstPolicy, field: str
) -> None:
    with pytest.raises(InvalidPolicy) as err:
        policy.validate()
    assert err.value.field == field


def test_valid_policies_and_enum_values() -> None:
    RetryPolicy().validate()
    RetryPolicy(max_attempts=1, base_s=0.01, max_s=0.01).validate()
    MisfirePolicy(kind=MisfireKind.SKIP_IF_LATE_BY, late_by_s=0).validate()
    MisfirePolicy(kind=MisfireKind.FIRE_ALL, fire_all_cap=10_000).validate()
    DstPolicy().validate()
    assert Overlap("skip_if_running") is Overlap.SKIP_IF_RUNNING
    assert [o.value for o in Overlap] == ["allow", "skip_if_running", "queue", "replace"]
