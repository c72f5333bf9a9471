"""Which fetches a worker's consumer makes. The engine around `_tune_fetches` is a stand-in
holding only what it reads (settings and the consumer's fetcher): building a Faust consumer
needs a broker, and the effect on CPU is measured by the benchmarks (README, Performance)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from streams import app as app_mod
from streams.app import Engine

FAUST_MIN_BYTES, FAUST_WAIT_MS = 1, 1500  # what Faust's aiokafka driver configures


@pytest.mark.parametrize(("local_ticks", "local_results", "gathered"), [
    (True, True, False),  # the default: own ticks and results never cross the topic
    (False, True, True),
    (True, False, True),
    (False, False, True),
])
def test_fetches_gather_records_only_while_own_events_travel_the_topic(
        local_ticks: bool, local_results: bool, gathered: bool) -> None:
    fetcher = SimpleNamespace(_fetch_min_bytes=FAUST_MIN_BYTES,
                              _fetch_max_wait_ms=FAUST_WAIT_MS)
    consumer = SimpleNamespace(_thread=SimpleNamespace(
        _consumer=SimpleNamespace(_fetcher=fetcher)))
    engine = SimpleNamespace(
        settings=SimpleNamespace(local_ticks=local_ticks, local_results=local_results),
        app=SimpleNamespace(consumer=consumer), _fetches_decided=False)
    Engine._tune_fetches(engine)  # type: ignore[arg-type]
    assert engine._fetches_decided  # decided once, not again at every record
    expected = ((app_mod.FETCH_MIN_BYTES, app_mod.FETCH_WAIT_MS) if gathered
                else (FAUST_MIN_BYTES, FAUST_WAIT_MS))
    assert (fetcher._fetch_min_bytes, fetcher._fetch_max_wait_ms) == expected
