"""The real path to a secured cluster: a local KRaft broker with a SASL_PLAINTEXT listener
(SCRAM-SHA-512; the user is created by `kafka-storage format --add-scram`), and kron's own
clients going through it: topic admin, the API's producer, the replay reader, and a worker
process (Faust/aiokafka) that runs a job. A wrong password is refused.

Not covered here: TLS (SSL / SASL_SSL) against a broker; that needs a keystore for the broker.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from api.publisher import CommandPublisher
from bench.receiver import Receiver
from kron import localkafka
from kron.kafka_security import confluent_config
from kron.processes import WorkerProcess
from kron.settings import Settings
from kron.topics import create_topics
from replay.reader import read_topic
from tests.support.sasl import sasl_properties
from tests.support.stack import spec

pytestmark = pytest.mark.integration

USER, PASSWORD = "kron", "kron-scram-secret"


@dataclass
class SaslBroker:
    cluster: localkafka.Cluster
    sasl_port: int




@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory) -> Iterator[SaslBroker]:
    localkafka.ensure_jars()
    cluster = localkafka.Cluster.plan_free_ports(root=tmp_path_factory.mktemp("sasl"), size=1)
    sasl_port = localkafka.free_ports(1)[0]
    node = cluster.nodes[0]
    node.data_dir.mkdir(parents=True)
    props = node.data_dir / "server.properties"
    props.write_text(sasl_properties(cluster, sasl_port))
    subprocess.run(localkafka._java(
        "kafka.tools.StorageTool", "format", "-t", localkafka.cluster_id(cluster), "-c",
        str(props), "--add-scram", f"SCRAM-SHA-512=[name={USER},password={PASSWORD}]"),
        check=True, capture_output=True)
    localkafka._spawn(node)  # not localkafka.start: it would rewrite server.properties
    try:
        localkafka.wait_ready(cluster, timeout_s=90)
        yield SaslBroker(cluster=cluster, sasl_port=sasl_port)
    finally:
        localkafka.stop(cluster)


def sasl_settings(broker: SaslBroker, tmp: Path, password: str = PASSWORD) -> Settings:
    return Settings(bootstrap_servers=f"127.0.0.1:{broker.sasl_port}",
                    topic_prefix=f"s{uuid.uuid4().hex[:8]}", partitions=2, data_dir=tmp,
                    allow_private_targets=True, kafka_security_protocol="SASL_PLAINTEXT",
                    kafka_sasl_mechanism="SCRAM-SHA-512", kafka_sasl_username=USER,
                    kafka_sasl_password=password)  # type: ignore[arg-type]


def test_a_wrong_password_is_refused(sasl_broker: SaslBroker, tmp_path: Path) -> None:
    bad = sasl_settings(sasl_broker, tmp_path, password="wrong")
    with pytest.raises(KafkaException):
        create_topics(bad, timeout_s=10)
    # librdkafka reports the reason through error_cb; the call itself only sees no metadata.
    errors: list[KafkaError] = []
    admin = AdminClient(confluent_config(bad, {"error_cb": errors.append, "log_level": 0}))
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=10)
    for _ in range(20):  # error_cb runs from poll(); serve queued events until one shows
        if errors:
            break
        admin.poll(0.5)
    assert KafkaError._AUTHENTICATION in [e.code() for e in errors], errors
    assert len(create_topics(sasl_settings(sasl_broker, tmp_path))) == 6  # the right one works


def test_kron_clients_and_a_worker_over_sasl_scram(sasl_broker: SaslBroker,
                                                   tmp_path: Path) -> None:
    s = sasl_settings(sasl_broker, tmp_path / "data")
    assert len(create_topics(s)) == 6
    with Receiver() as receiver:
        worker = WorkerProcess(s, "w1", tmp_path)
        worker.env |= {"KRON_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                       "KRON_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
                       "KRON_KAFKA_SASL_USERNAME": USER, "KRON_KAFKA_SASL_PASSWORD": PASSWORD}
        worker.start()
        publisher = CommandPublisher(s)
        try:
            job_id = f"sasl-{uuid.uuid4().hex[:8]}"
            record = {"envelope": {"event_id": uuid.uuid4().hex,
                                   "event_type": "job.create_requested", "schema_version": 1,
                                   "occurred_at_ms": time.time_ns() // 1_000_000,
                                   "tenant": "acme", "causation_id": None,
                                   "correlation_id": None, "producer": "tests"},
                      "command_id": uuid.uuid4().hex, "job_id": job_id,
                      "idempotency_key": None,
                      "spec": spec(target={"url": f"{receiver.url}/ok"},
                                   run_at_ms=time.time_ns() // 1_000_000)}
            publisher.publish_sync("kron.commands.CreateJob", record, key=job_id)
            assert [e.record["job_id"] for e in read_topic(s, s.topic("commands"))
                    if e.record] == [job_id]
            # The worker consumed the command and ran the job: Faust's SASL path works.
            assert receiver.wait_for(job_id, 1, 120), worker.log()[-3000:]
        finally:
            publisher.close()
            worker.stop()
