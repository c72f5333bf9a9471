"""The seam (streams/runtime/) on a running consumer: a real faust.App whose consumer
thread holds a real aiokafka consumer that joined a group on the session broker. The epoch
is the group's generation, fetch tuning reaches the real fetcher, and the ownership lease
is renewed by the real coordinator's heartbeats."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import aiokafka
import faust
import pytest

from kron import localkafka
from kron.clock import SystemClock
from kron.settings import Settings
from streams.lease import OwnershipLease
from streams.runtime.group import FaustRuntime

pytestmark = pytest.mark.integration


def test_epoch_fetch_tuning_and_lease_on_a_real_consumer(
        kafka_cluster: localkafka.Cluster, kafka_settings: Settings, tmp_path: Path) -> None:
    topic = kafka_settings.topic("signals")
    app = faust.App("seam-test", broker=f"kafka://{kafka_cluster.bootstrap_servers}",
                    store="rocksdb://", datadir=str(tmp_path), autodiscover=False,
                    web_enabled=False)
    runtime = FaustRuntime(app, owned_topic=topic)

    async def run() -> None:
        consumer = aiokafka.AIOKafkaConsumer(
            topic, bootstrap_servers=kafka_cluster.bootstrap_servers,
            group_id=f"seam-{uuid.uuid4().hex[:8]}", heartbeat_interval_ms=200,
            session_timeout_ms=6000, fetch_max_wait_ms=1500)
        await consumer.start()
        try:
            for _ in range(300):
                if consumer.assignment():
                    break
                await consumer.getmany(timeout_ms=100)
            # Where Faust's consumer thread keeps the consumer it started.
            app.consumer._thread._consumer = consumer
            coordinator = runtime.coordinator()
            assert coordinator is not None
            assert runtime.epoch() == coordinator.generation > 0
            assert runtime.fetch_settings() == (1, 1500)
            assert runtime.tune_fetches(min_bytes=64 << 10, max_wait_ms=5)
            assert runtime.fetch_settings() == (64 << 10, 5)

            lease = OwnershipLease(clock=SystemClock(), session_timeout_s=6, margin_s=1)
            lease.watch(coordinator)
            watched_at = lease.remaining_s()
            await asyncio.sleep(1.5)
            # Without a heartbeat the lease would have 1.5 s less left than at the watch.
            assert lease.remaining_s() > watched_at - 1.0
        finally:
            await consumer.stop()

    asyncio.run(run())
