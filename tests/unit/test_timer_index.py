"""Reads of the timer index over a real RocksDB (rocksdict), as the ticker and the due scan
make them: lane by lane (streams.domain.timer), found by skip-scan or by the key floor,
past the tombstones of fired timers, the legacy lane (keys from before lanes) included."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streams.domain.timer import (
    LEGACY_LANE,
    SYSTEM_LANE,
    Lane,
    Tier,
    TimerKind,
    due_of,
    due_order,
    encode_timer_key,
    lane_of_prefix,
    tenant_lane,
)
from streams.engine.faust_store import (
    due_lanes,
    fire_dues,
    first_timer_after,
    first_timer_key,
    lanes,
)
from streams.engine.lane_floors import LaneFloors
from streams.engine.store import MemoryStore
from streams.runtime import OFFSET_KEY
from streams.tables import KeyFloor
from tests.unit.test_record_cache import DbTable

KINDS = [TimerKind.FIRE, TimerKind.LEASE, TimerKind.HELD, TimerKind.RETRY]
LANES = [LEGACY_LANE, SYSTEM_LANE, tenant_lane("a", Tier.NORMAL), tenant_lane("b", Tier.NORMAL),
         tenant_lane("a", Tier.CRITICAL), tenant_lane("c", Tier.BATCH)]
timers_st = st.lists(st.tuples(st.integers(0, 200), st.sampled_from(KINDS),
                               st.sampled_from(["a", "b", "job-ü"]), st.booleans(),
                               st.sampled_from(LANES)),
                     max_size=60)


class FlooredTable(DbTable):
    """DbTable with the key floor FencedTable keeps (lowered by every put)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.floor = KeyFloor()

    def write(self, partition: int, key: bytes, value: bytes | None, epoch: int) -> None:
        super().write(partition, key, value, epoch)
        if value is not None:
            self.floor.lower(partition, key)


def _fill(table: Any, timers: list[tuple[int, TimerKind, str, bool, Lane]],
          memory: MemoryStore | None = None) -> list[tuple[bytes, int, TimerKind]]:
    live: list[tuple[bytes, int, TimerKind]] = []
    for i, (due, kind, job, deleted, lane) in enumerate(timers):
        key = encode_timer_key(due_ms=1_000 + due, kind=kind, job_id=job, ref=str(i), lane=lane)
        table.write(0, key, str(i).encode(), 1)
        if deleted:  # a fired timer: a tombstone the scan must pass over
            table.write(0, key, None, 1)
        else:
            live.append((key, due, kind))
            if memory is not None:
                memory.put_timer(key, str(i).encode())
    table.write(0, OFFSET_KEY, b"42", 1)  # Faust's persisted offset: no timer
    return live


@pytest.fixture(params=[DbTable, FlooredTable])
def make_table(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    made: list[Any] = []

    def make() -> Any:
        table = request.param(tmp_path_factory.mktemp("timers"))
        made.append(table)
        return table
    yield make
    for table in made:
        table.db.close()


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(timers=timers_st, after=st.integers(-1, 200), until=st.integers(0, 200),
       limit=st.integers(0, 70))
def test_fire_dues_counts_the_live_fire_timers_in_the_range_in_order(
        make_table: Any, timers: list[tuple[int, TimerKind, str, bool, Lane]],
        after: int, until: int, limit: int) -> None:
    table = make_table()
    live = _fill(table, timers)
    expected = sorted(1_000 + due for _, due, kind in live
                      if kind == TimerKind.FIRE and after < due <= until)[:limit]
    lanes(table, 0)  # the floor (if any) knows the lanes: later writes lower it
    assert fire_dues(table, 0, 1_000 + after, 1_000 + until, limit) == expected


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(timers=timers_st, now=st.integers(-1, 200), after=st.integers(-1, 200))
def test_the_index_reads_every_lane_as_the_memory_store_does(
        make_table: Any, timers: list[tuple[int, TimerKind, str, bool, Lane]],
        now: int, after: int) -> None:
    table, memory = make_table(), MemoryStore()
    live = _fill(table, timers, memory)
    live_lanes = {key[:6] if key[0] == 1 else key[:1] for key, _, _ in live}
    for _ in range(2):  # found by skip-scan, then (with a floor) known
        assert set(lanes(table, 0)) == live_lanes
        # A lane whose floor is due may turn out to hold nothing due (a floor is a bound).
        got = [(lane, ts) for lane, gen in due_lanes(table, 0, 1_000 + now) if (ts := list(gen))]
        want = [(lane, list(gen)) for lane, gen in memory.due_lanes(1_000 + now)]
        assert got == want
        assert all(due_of(k) <= 1_000 + now for _, ts in got for k, _ in ts)
        assert sum(len(ts) for _, ts in got) == sum(1 for _, due, _ in live if due <= now)
        by_due = sorted((k for k, _, _ in live), key=lambda k: due_order((k, b"")))
        assert first_timer_key(table, 0) == (by_due[0] if by_due else None)
        later = [k for k in by_due if due_of(k) > 1_000 + after]
        assert first_timer_after(table, 0, 1_000 + after) == (later[0] if later else None)


def test_a_lane_emptied_is_dropped_and_found_again_when_written(tmp_path: Path) -> None:
    table = FlooredTable(tmp_path / "t")
    try:
        lane = tenant_lane("a", Tier.NORMAL)
        keys = [encode_timer_key(due_ms=d, kind=TimerKind.FIRE, job_id="j", ref="", lane=lane)
                for d in (10, 20)]
        for key in keys:
            table.write(0, key, b"{}", 1)
        assert dict(lanes(table, 0).items()) == {lane.prefix: keys[0]}
        [(found, gen)] = due_lanes(table, 0, 15)
        assert found == lane and [k for k, _ in gen] == keys[:1]
        table.write(0, keys[0], None, 1)
        [(found, gen)] = due_lanes(table, 0, 15)  # its floor is due: a candidate
        assert list(gen) == []  # read: the floor is raised past the tombstone to keys[1]
        assert dict(table.floor.lanes(0).items()) == {lane.prefix: keys[1]}
        assert due_lanes(table, 0, 15) == []  # and not due any more
        table.write(0, keys[1], None, 1)
        [(found, gen)] = due_lanes(table, 0, 25)
        assert list(gen) == []  # read: found empty, dropped
        assert len(table.floor.lanes(0)) == 0
        again = encode_timer_key(due_ms=5, kind=TimerKind.FIRE, job_id="j", ref="", lane=lane)
        table.write(0, again, b"{}", 1)
        assert [(lane, list(gen)) for lane, gen in due_lanes(table, 0, 5)] == [
            (lane, [(again, b"{}")])]
    finally:
        table.db.close()


def test_a_lane_whose_floor_is_not_due_is_not_read(tmp_path: Path) -> None:
    table = FlooredTable(tmp_path / "t")
    try:
        lane = tenant_lane("a", Tier.NORMAL)
        key = encode_timer_key(due_ms=100, kind=TimerKind.FIRE, job_id="j", ref="", lane=lane)
        table.write(0, key, b"{}", 1)
        lanes(table, 0)

        class Unreadable:
            def __getattr__(self, name: str) -> Any:
                raise AssertionError(f"read: {name}")
        table.db, db = Unreadable(), table.db  # type: ignore[assignment]
        try:
            assert due_lanes(table, 0, 99) == []
        finally:
            table.db = db
    finally:
        table.db.close()


def test_skip_scan_makes_a_seek_per_lane(tmp_path: Path) -> None:
    table = DbTable(tmp_path / "t")
    try:
        for t in range(20):
            lane = tenant_lane(f"t{t}", Tier.NORMAL)
            for due in range(50):
                table.write(0, encode_timer_key(due_ms=due, kind=TimerKind.FIRE, job_id=f"j{due}",
                                                ref="", lane=lane), b"{}", 1)
        seeks = 0
        real = table.db

        class Counting:
            def iter(self) -> Any:
                it = real.iter()

                class It:
                    def __getattr__(self, name: str) -> Any:
                        nonlocal seeks
                        if name.startswith("seek"):
                            seeks += 1
                        return getattr(it, name)
                return It()
        table.db = Counting()  # type: ignore[assignment]
        assert len(lanes(table, 0)) == 20
        assert seeks == 21  # the first key, then past each lane
        table.db = real
    finally:
        real.close()


ops_st = st.lists(st.tuples(st.sampled_from(["lower", "raise", "drop", "due", "asc"]),
                            st.sampled_from(LANES[1:]), st.integers(0, 100)), max_size=80)


@settings(max_examples=200, deadline=None)
@given(ops_st)
def test_lane_floors_find_the_due_lanes_as_a_scan_of_every_lane_would(
        ops: list[tuple[str, Lane, int]]) -> None:
    floors, model = LaneFloors(), {}
    for op, lane, due in ops:
        key = encode_timer_key(due_ms=due, kind=TimerKind.FIRE, job_id="j", ref="", lane=lane)
        if op == "lower":
            floors.lower(key)
            if lane.prefix not in model or key < model[lane.prefix]:
                model[lane.prefix] = key
        elif op == "raise":
            floors.raise_to(lane.prefix, key)
            if lane.prefix in model and key > model[lane.prefix]:
                model[lane.prefix] = key
        elif op == "drop":
            floors.drop(lane.prefix)
            model.pop(lane.prefix, None)
        elif op == "due":
            assert floors.due(due) == sorted(p for p, k in model.items() if due_of(k) <= due)
        else:
            # As first_timer_key goes: each lane taken is read, which raises its floor
            # (by `due` ms past it, here) or drops it (every third).
            want = sorted((due_of(k), p) for p, k in model.items())
            gen = floors.ascending()
            got = []
            for floor_due, prefix in itertools.islice(gen, due % 4):
                got.append((floor_due, prefix))
                if len(got) % 3 == 0:
                    floors.drop(prefix)
                    del model[prefix]
                    continue
                raised = encode_timer_key(due_ms=floor_due + due, kind=TimerKind.FIRE,
                                          job_id="k", ref="", lane=lane_of_prefix(prefix))
                floors.raise_to(prefix, raised)
                model[prefix] = max(model[prefix], raised)
            gen.close()
            assert [d for d, _ in got] == [d for d, _ in want[:len(got)]]
        assert dict(floors.items()) == model
        # The heap still finds every lane by its floor's due time.
        for upto in (0, 50, 100, 250):
            assert floors.due(upto) == sorted(p for p, k in model.items() if due_of(k) <= upto)
    assert sorted(floors.ascending()) == sorted((due_of(k), p) for p, k in model.items())


def test_the_ticker_is_not_told_of_queued_executions_but_knows_they_are_there(
        make_table: Any) -> None:
    """WAIT timers (executions queued for their tenant's max_running) are due from the
    start: the ticker's `first` passes over their lanes (or it would tick without end while
    the tenant is at its cap), and `has_waiting` says a partition holds some."""
    from streams.domain.timer import WAITING_TIER
    from streams.engine.faust_store import has_waiting_lanes

    table = make_table()
    waiting = Lane(WAITING_TIER + Tier.NORMAL, tenant_lane("a", Tier.NORMAL).tenant)
    queued = encode_timer_key(due_ms=10, kind=TimerKind.WAIT, job_id="j", ref="x",
                              lane=waiting)
    fire = encode_timer_key(due_ms=500, kind=TimerKind.FIRE, job_id="k", ref="",
                            lane=tenant_lane("b", Tier.NORMAL))
    assert not has_waiting_lanes(table, 0)
    table.write(0, queued, b'{"a":0}', 1)
    assert has_waiting_lanes(table, 0)
    assert first_timer_key(table, 0) is None
    table.write(0, fire, b"{}", 1)
    assert first_timer_key(table, 0) == fire
    assert first_timer_after(table, 0, 0) == fire
    # The due scan still reads the lane (the owner starts them when the tenant has room).
    assert {lane for lane, _ in due_lanes(table, 0, 600)} == {tenant_lane("b", Tier.NORMAL),
                                                              waiting}
