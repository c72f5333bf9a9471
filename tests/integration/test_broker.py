"""The project's own broker: real produce/consume of Avro events and real topic configs."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import ConfigResource

from kron.settings import Settings
from kron.topics import admin_client, create_topics, topic_specs
from schemas import codec
from schemas.envelope import make_envelope

pytestmark = pytest.mark.integration


def test_avro_command_round_trips_through_the_broker(kafka_settings: Settings) -> None:
    topic = kafka_settings.topic("commands")
    job_id = f"job-{uuid.uuid4().hex}"
    record = {
        "envelope": make_envelope(event_id=str(uuid.uuid4()), event_type="job.pause_requested",
                                  occurred_at_ms=1_800_000_000_000, tenant="acme"),
        "command_id": str(uuid.uuid4()),
        "job_id": job_id,
    }
    producer = Producer({"bootstrap.servers": kafka_settings.bootstrap_servers, "acks": "all"})
    delivered: list[object] = []
    producer.produce(topic, key=job_id.encode(), value=codec.encode("kron.commands.PauseJob",
                     record), on_delivery=lambda err, msg: delivered.append(err or msg))
    producer.flush(15)
    assert len(delivered) == 1 and not isinstance(delivered[0], Exception)

    consumer = Consumer({"bootstrap.servers": kafka_settings.bootstrap_servers,
                         "group.id": f"g-{uuid.uuid4().hex}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    try:
        msg = None
        for _ in range(60):
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                break
        assert msg is not None and msg.error() is None
        decoded = codec.decode(msg.value())
    finally:
        consumer.close()
    assert decoded.name == "kron.commands.PauseJob"
    assert decoded.record["job_id"] == job_id
    assert decoded.record["envelope"]["tenant"] == "acme"
    assert msg.key() == job_id.encode()


def test_topics_exist_with_their_configs(kafka_settings: Settings) -> None:
    admin = admin_client(kafka_settings)
    md = admin.list_topics(timeout=10)
    specs = {s.name: s for s in topic_specs(kafka_settings)}
    resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in specs]
    configs = {r.name: f.result(10) for r, f in admin.describe_configs(resources).items()}
    for name, spec in specs.items():
        assert len(md.topics[name].partitions) == kafka_settings.partitions
        assert configs[name]["cleanup.policy"].value == spec.config["cleanup.policy"]
    assert configs[kafka_settings.topic("jobs")]["cleanup.policy"].value == "compact"
    assert configs[kafka_settings.topic("executions")]["cleanup.policy"].value == "compact"
    assert int(configs[kafka_settings.topic("executions")]["min.compaction.lag.ms"].value) > 0
    assert configs[kafka_settings.topic("commands")]["cleanup.policy"].value == "delete"


def test_create_topics_is_idempotent_and_rejects_a_partition_mismatch(
    kafka_settings: Settings,
) -> None:
    assert create_topics(kafka_settings) == []
    from kron.errors import SetupError

    with pytest.raises(SetupError, match="partitions"):
        create_topics(kafka_settings.model_copy(update={"partitions": 6}))


def test_broker_auto_create_is_off(kafka_settings: Settings) -> None:
    """Producing to an undeclared topic must fail: every topic is created explicitly."""
    producer = Producer({"bootstrap.servers": kafka_settings.bootstrap_servers,
                         "message.timeout.ms": 3000, "log_level": 2})
    errors: list[object] = []
    producer.produce(kafka_settings.topic("undeclared"), value=b"x",
                     on_delivery=lambda err, msg: errors.append(err))
    producer.flush(10)
    assert errors and errors[0] is not None


def test_commands_use_javas_partitioner(kafka_settings: Settings) -> None:
    """A job's commands must meet on one partition whether the API, a Java service or any
    murmur2 client produced them; confluent-kafka's own default (CRC32) would split them."""
    from aiokafka.partitioner import murmur2

    from api.publisher import CommandPublisher

    publisher = CommandPublisher(kafka_settings)
    try:
        for i in range(20):
            job_id = f"job-{i}"
            record = {
                "envelope": make_envelope(event_id=str(uuid.uuid4()), event_type="x",
                                          occurred_at_ms=1, tenant="acme"),
                "command_id": str(uuid.uuid4()), "job_id": job_id,
            }
            partition, _ = publisher.publish_sync("kron.commands.PauseJob", record, key=job_id)
            expected = (murmur2(job_id.encode()) & 0x7FFFFFFF) % kafka_settings.partitions
            assert partition == expected, job_id
    finally:
        publisher.close()
