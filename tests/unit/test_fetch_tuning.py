"""Which fetches a worker's consumer makes (streams.app.tune_fetches), on a real faust.App:
before its consumer started (no broker), and with a real aiokafka consumer that joined a
group on the session broker in the place Faust's consumer thread keeps it, so a rename in
Faust or aiokafka fails here (the effect on CPU is measured by the benchmarks)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import aiokafka
import faust
import pytest

from kron.settings import Settings
from streams import app as app_mod
from streams.runtime.group import FaustRuntime

FAUST_MIN_BYTES, FAUST_WAIT_MS = 1, 1500  # what Faust's aiokafka driver configures
CASES = [
    (True, True, False),  # the default: own ticks and results never cross the topic
    (False, True, True),
    (True, False, True),
    (False, False, True),
]


def runtime(tmp_path: Path, broker: str = "127.0.0.1:1") -> FaustRuntime:
    app = faust.App(f"fetch-{uuid.uuid4().hex[:6]}", broker=f"kafka://{broker}",
                    store="rocksdb://", datadir=str(tmp_path), autodiscover=False,
                    web_enabled=False)
    return FaustRuntime(app, owned_topic="t.signals")


@pytest.mark.parametrize(("local_ticks", "local_results", "gathered"), CASES)
def test_before_the_consumer_starts_tuning_waits_unless_there_is_nothing_to_tune(
        local_ticks: bool, local_results: bool, gathered: bool, tmp_path: Path) -> None:
    settings = Settings(local_ticks=local_ticks, local_results=local_results,
                        data_dir=tmp_path)
    # Decided (True) at once when Faust's fetches are kept; else asked again per record
    # until the consumer is there.
    assert app_mod.tune_fetches(runtime(tmp_path), settings) is not gathered


def test_fetches_gather_records_only_while_own_events_travel_the_topic(
        kafka_settings: Settings, tmp_path: Path) -> None:
    async def run() -> None:
        consumer = aiokafka.AIOKafkaConsumer(
            kafka_settings.topic("signals"),
            bootstrap_servers=kafka_settings.bootstrap_servers,
            group_id=f"fetch-{uuid.uuid4().hex[:8]}", fetch_max_wait_ms=FAUST_WAIT_MS)
        await consumer.start()
        try:
            for i, (local_ticks, local_results, gathered) in enumerate(CASES):
                rt = runtime(tmp_path / str(i), kafka_settings.bootstrap_servers)
                rt.app.consumer._thread._consumer = consumer  # where Faust's thread keeps it
                consumer._fetcher._fetch_min_bytes = FAUST_MIN_BYTES
                consumer._fetcher._fetch_max_wait_ms = FAUST_WAIT_MS
                settings = kafka_settings.model_copy(update={
                    "local_ticks": local_ticks, "local_results": local_results})
                assert app_mod.tune_fetches(rt, settings)  # decided once, not per record
                expected = ((app_mod.FETCH_MIN_BYTES, app_mod.FETCH_WAIT_MS) if gathered
                            else (FAUST_MIN_BYTES, FAUST_WAIT_MS))
                assert (consumer._fetcher._fetch_min_bytes,
                        consumer._fetcher._fetch_max_wait_ms) == expected
        finally:
            await consumer.stop()

    asyncio.run(run())
