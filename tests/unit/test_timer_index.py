"""Reads of the timer index over a real RocksDB (rocksdict), as the ticker makes them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.domain.timer import TimerKind, encode_timer_key
from streams.engine.faust_store import fire_dues
from tests.unit.test_record_cache import DbTable

KINDS = [TimerKind.FIRE, TimerKind.LEASE, TimerKind.HELD, TimerKind.RETRY]
timers_st = st.lists(st.tuples(st.integers(0, 200), st.sampled_from(KINDS),
                               st.sampled_from(["a", "b", "job-ü"]), st.booleans()),
                     max_size=60)


@settings(max_examples=60, deadline=None)
@given(timers_st, st.integers(-1, 200), st.integers(0, 200), st.integers(0, 70))
def test_fire_dues_counts_the_live_fire_timers_in_the_range_in_order(
        tmp_path_factory: pytest.TempPathFactory, timers: list[tuple[int, TimerKind, str, bool]],
        after: int, until: int, limit: int) -> None:
    table = DbTable(tmp_path_factory.mktemp("timers"))
    try:
        live: list[tuple[bytes, int, TimerKind]] = []
        for i, (due, kind, job, deleted) in enumerate(timers):
            key = encode_timer_key(due_ms=1_000 + due, kind=kind, job_id=job, ref=str(i))
            table.write(0, key, b"{}", 1)
            if deleted:  # a fired timer: a tombstone the scan must pass over
                table.write(0, key, None, 1)
            else:
                live.append((key, due, kind))
        expected = [1_000 + due for _, due, kind in sorted(live)
                    if kind == TimerKind.FIRE and after < due <= until][:limit]
        assert fire_dues(table, 0, 1_000 + after, 1_000 + until, limit) == expected
    finally:
        table.db.close()
