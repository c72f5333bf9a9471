"""The cold-start bulk restore against a real broker: deletes, the epoch fence, the persisted
offset Faust resumes from, and stores that already exist being left alone."""

from __future__ import annotations

import time

import pytest
import rocksdict
from confluent_kafka import Producer
from faust.stores.rocksdb import RocksDBOptions, Store

from streams.domain.fencing import EPOCH_HEADER, EpochFence
from streams.restore import OFFSET_KEY, StoreSpec, restore_missing
from tests.conftest import fresh_settings

pytestmark = pytest.mark.integration


def test_restore_fills_missing_stores_as_faust_would(kafka_cluster, tmp_path) -> None:
    settings = fresh_settings(kafka_cluster, tmp_path / "d", partitions=2)
    topic = settings.topic("jobs")
    # fresh_settings created kron's topics: jobs is compacted, with 2 partitions here.
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    now = int(time.time() * 1000)

    def put(key: bytes, value: bytes | None, epoch: int) -> None:
        producer.produce(topic, key=key, value=value, partition=0, timestamp=now,
                         headers=[(EPOCH_HEADER, str(epoch).encode())])

    put(b"k1", b"v1", 2)
    put(b"k2", b"v2", 2)
    put(b"k1", None, 2)  # a delete
    put(b"k3", b"zombie", 1)  # a replaced owner's late write: fenced out
    put(b"k4", b"v4", 3)
    assert producer.flush(30) == 0

    options = RocksDBOptions()
    spec = StoreSpec(name="jobs", topic=topic, path_of=lambda p: tmp_path / f"jobs-{p}.db",
                     open_db=options.open, fence=EpochFence())
    config = {"bootstrap.servers": settings.bootstrap_servers, "group.id": "restore-test"}
    report = restore_missing([spec], partitions=2, consumer_config=config,
                             batch_module=rocksdict)
    assert (report.partitions, report.records, report.rejected) == (2, 5, 1)

    db = options.open(tmp_path / "jobs-0.db")
    try:
        live = {bytes(k): bytes(v) for k, v in db.items() if bytes(k) != OFFSET_KEY}
        assert live == {b"k2": b"v2", b"k4": b"v4"}
        assert Store.offset_key == OFFSET_KEY
        assert db.get(OFFSET_KEY) == b"4"  # Faust resumes its own recovery from here
    finally:
        db.close()
    empty = options.open(tmp_path / "jobs-1.db")
    try:
        assert list(empty.items()) == []
    finally:
        empty.close()
    # Stores that exist are Faust's to bring up to date: nothing is read again.
    again = restore_missing([spec], partitions=2, consumer_config=config,
                            batch_module=rocksdict)
    assert (again.partitions, again.records) == (0, 0)
