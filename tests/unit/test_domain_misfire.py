from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.domain.misfire import MissReason, resolve_misfire
from streams.domain.policies import MisfireKind, MisfirePolicy
from streams.domain.schedule import Slot

NOW = 10_000_000


def slots(*ms: int) -> list[Slot]:
    return [Slot(scheduled_for_ms=m) for m in ms]


policies = st.one_of(
    st.builds(MisfirePolicy, kind=st.just(MisfireKind.FIRE_ONCE)),
    st.builds(
        MisfirePolicy,
        kind=st.just(MisfireKind.SKIP_IF_LATE_BY),
        late_by_s=st.floats(0, 20_000, allow_nan=False),
    ),
    st.builds(MisfirePolicy, kind=st.just(MisfireKind.FIRE_ALL), fire_all_cap=st.integers(1, 30)),
)
late_slot_lists = st.lists(st.integers(0, NOW), max_size=60, unique=True).map(
    lambda ms: slots(*sorted(ms))
)


@given(late_slot_lists, policies)
def test_every_late_slot_is_fired_or_missed_exactly_once(
    late: list[Slot], policy: MisfirePolicy
) -> None:
    policy.validate()
    decision = resolve_misfire(late_slots=late, now_ms=NOW, policy=policy)
    missed = [s for s, _ in decision.missed]
    assert sorted(decision.fire + missed, key=lambda s: s.scheduled_for_ms) == late
    assert not set(decision.fire) & set(missed)
    assert decision.fire == sorted(decision.fire, key=lambda s: s.scheduled_for_ms)
    reasons = {r for _, r in decision.missed}
    if policy.kind is MisfireKind.FIRE_ONCE:
        assert decision.fire == late[-1:]
        assert reasons <= {MissReason.COALESCED}
    elif policy.kind is MisfireKind.FIRE_ALL:
        assert decision.fire == late[-policy.fire_all_cap :]
        assert reasons <= {MissReason.FIRE_ALL_CAP}
    else:
        assert policy.late_by_s is not None
        limit = policy.late_by_s * 1000
        assert all(NOW - s.scheduled_for_ms <= limit for s in decision.fire)
        assert all(NOW - s.scheduled_for_ms > limit for s in missed)
        assert reasons <= {MissReason.LATE_BY_EXCEEDED}


def test_fire_once_fires_newest_and_coalesces_the_rest() -> None:
    d = resolve_misfire(late_slots=slots(1, 2, 3), now_ms=NOW, policy=MisfirePolicy())
    assert d.fire == slots(3)
    assert d.missed == [
        (Slot(scheduled_for_ms=1), "coalesced"),
        (Slot(scheduled_for_ms=2), "coalesced"),
    ]


def test_skip_if_late_by_boundary_is_inclusive() -> None:
    policy = MisfirePolicy(kind=MisfireKind.SKIP_IF_LATE_BY, late_by_s=1.0)
    d = resolve_misfire(late_slots=slots(NOW - 1001, NOW - 1000, NOW), now_ms=NOW, policy=policy)
    assert d.fire == slots(NOW - 1000, NOW)
    assert d.missed == [(Slot(scheduled_for_ms=NOW - 1001), "late_by_exceeded")]


def test_fire_all_keeps_newest_cap() -> None:
    policy = MisfirePolicy(kind=MisfireKind.FIRE_ALL, fire_all_cap=2)
    d = resolve_misfire(late_slots=slots(1, 2, 3, 4), now_ms=NOW, policy=policy)
    assert d.fire == slots(3, 4)
    assert [(s.scheduled_for_ms, r) for s, r in d.missed] == [
        (1, "fire_all_cap"),
        (2, "fire_all_cap"),
    ]


@pytest.mark.parametrize("kind", list(MisfireKind))
def test_no_late_slots_means_nothing_to_do(kind: MisfireKind) -> None:
    late_by = 1.0 if kind is MisfireKind.SKIP_IF_LATE_BY else None
    d = resolve_misfire(
        late_slots=[], now_ms=NOW, policy=MisfirePolicy(kind=kind, late_by_s=late_by)
    )
    assert d.fire == [] and d.missed == []


def test_unsorted_input_is_still_partitioned_by_age() -> None:
    d = resolve_misfire(late_slots=slots(3, 1, 2), now_ms=NOW, policy=MisfirePolicy())
    assert d.fire == slots(3)
