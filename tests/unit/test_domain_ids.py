from __future__ import annotations

import enum
import hashlib
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


def reference_encoding(*parts: str | int) -> bytes:
    """The encoding as first written: ids already in Kafka were derived from these bytes."""
    out = bytearray()
    for part in parts:
        if isinstance(part, bool) or not isinstance(part, str | int):
            raise TypeError(type(part).__name__)
        tag, raw = (b"s", part.encode("utf-8")) if isinstance(part, str) else (b"i", b"%d" % part)
        out += tag
        out += len(raw).to_bytes(4, "big")
        out += raw
    return bytes(out)


class Kind(enum.IntEnum):
    ONE = 1


class Name(enum.StrEnum):
    A = "a"


@given(st.lists(st.text() | st.integers(-(10**30), 10**30)
                | st.sampled_from([Kind.ONE, Name.A]), max_size=6))
def test_encoding_is_unchanged(parts: list[str | int]) -> None:
    assert encode_parts(*parts) == reference_encoding(*parts)


def test_ids_are_pinned() -> None:
    """Known values: a change here re-identifies every execution and event in Kafka."""
    assert exec_id("job-1", 1_767_225_600_000) == _digest_hex(b"kron.exec", "job-1",
                                                               1_767_225_600_000)
    assert event_id("x", 1, "y") == _digest_hex(b"kron.event", "x", 1, "y")


def _digest_hex(person: bytes, *parts: str | int) -> str:
    return hashlib.blake2b(reference_encoding(*parts), digest_size=16,
                           person=person).hexdigest()


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
