"""The bulk restore at a worker's start against a real broker: deletes, the epoch fence, the
persisted offset Faust resumes from, stores that are current read nothing, and stores that
are behind read only what they miss."""

from __future__ import annotations

import logging
import time

import pytest
import rocksdict
from confluent_kafka import Producer
from faust.stores.rocksdb import RocksDBOptions, Store

from streams.domain.fencing import EPOCH_HEADER, EpochFence
from streams.restore import OFFSET_KEY, StoreSpec, restore_stores
from tests.conftest import fresh_settings

pytestmark = pytest.mark.integration


def test_restore_fills_missing_stores_as_faust_would(kafka_cluster, tmp_path,
                                                     caplog) -> None:
    caplog.set_level(logging.INFO, logger="kron.restore")  # as a worker logs
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
    report = restore_stores([spec], partitions=2, consumer_config=config,
                            batch_module=rocksdict)
    assert (report.created, report.records, report.rejected) == (2, 5, 1)
    (line,) = [r for r in caplog.records if r.name == "kron.restore"]
    assert (line.stores_created, line.records) == (2, 5)  # type: ignore[attr-defined]

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
    # Stores that are current read nothing again.
    again = restore_stores([spec], partitions=2, consumer_config=config,
                           batch_module=rocksdict)
    assert (again.created, again.caught_up, again.records) == (0, 0, 0)

    # Another owner wrote on (this worker kept no standby): only the new records are read,
    # with the fence as Faust's own recovery would judge them.
    put(b"k2", None, 3)
    put(b"k5", b"v5", 3)
    put(b"k6", b"late", 2)  # the replaced owner again, after epoch 3 wrote
    assert producer.flush(30) == 0
    behind = restore_stores([spec], partitions=2, consumer_config=config,
                            batch_module=rocksdict)
    assert (behind.created, behind.caught_up, behind.records, behind.rejected) == (0, 1, 3, 1)
    db = options.open(tmp_path / "jobs-0.db")
    try:
        live = {bytes(k): bytes(v) for k, v in db.items() if bytes(k) != OFFSET_KEY}
        assert live == {b"k4": b"v4", b"k5": b"v5"}
        assert db.get(OFFSET_KEY) == b"7"
    finally:
        db.close()


def test_a_store_without_a_persisted_offset_is_read_whole_and_one_past_the_end_is_left(
        kafka_cluster, tmp_path) -> None:
    settings = fresh_settings(kafka_cluster, tmp_path / "d", partitions=2)
    topic = settings.topic("jobs")
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    for i in range(3):
        producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i, partition=0)
        producer.produce(topic, key=b"k%d" % i, value=b"w%d" % i, partition=1)
    assert producer.flush(30) == 0
    options = RocksDBOptions()
    no_offset, past_end = options.open(tmp_path / "jobs-0.db"), options.open(tmp_path / "jobs-1.db")
    no_offset.put(b"k0", b"stale")
    past_end.put(OFFSET_KEY, b"99")  # a topic made again under the same name
    past_end.put(b"k9", b"kept")
    no_offset.close()
    past_end.close()
    spec = StoreSpec(name="jobs", topic=topic, path_of=lambda p: tmp_path / f"jobs-{p}.db",
                     open_db=options.open, fence=EpochFence())
    report = restore_stores([spec], partitions=2, batch_module=rocksdict, consumer_config={
        "bootstrap.servers": settings.bootstrap_servers, "group.id": "restore-test"})
    assert (report.created, report.caught_up, report.records) == (0, 1, 3)
    db = options.open(tmp_path / "jobs-0.db")
    try:
        assert {bytes(k): bytes(v) for k, v in db.items()} == {
            b"k0": b"v0", b"k1": b"v1", b"k2": b"v2", OFFSET_KEY: b"2"}
    finally:
        db.close()
    db = options.open(tmp_path / "jobs-1.db")
    try:  # Faust's consistency check judges it, as before
        assert {bytes(k): bytes(v) for k, v in db.items()} == {b"k9": b"kept", OFFSET_KEY: b"99"}
    finally:
        db.close()
