"""Producing to kron.commands is an operator-level right, and Kafka ACLs are what keep it
one (docs/security.md): a local KRaft broker with SASL/SCRAM and the StandardAuthorizer,
the engine running as a principal with the ACLs docs/security.md gives a worker, a producing
service with WRITE on kron.commands only, and a read-only principal that can read
kron.commands but not produce to it. The broker refuses the reader's CreateJob
(TOPIC_AUTHORIZATION_FAILED), nothing of it reaches the engine, and the engine keeps running
the jobs the service sends.

The PLAINTEXT and CONTROLLER listeners (the broker's own traffic, and this test's setup as a
super user) stay unauthenticated on loopback; in production they are authenticated too.
"""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from api.publisher import CommandPublisher
from bench.receiver import Receiver
from kron import localkafka
from kron.kafka_security import confluent_config
from kron.processes import WorkerProcess
from kron.settings import Settings
from kron.topics import create_topics
from replay.reader import read_topic
from schemas import codec
from tests.support.sasl import sasl_properties
from tests.support.stack import spec

pytestmark = pytest.mark.integration

ENGINE, SERVICE, READER = "kron-engine", "billing", "kron-reader"
PASSWORDS = {ENGINE: "engine-scram-secret", SERVICE: "service-scram-secret",
             READER: "reader-scram-secret"}


@dataclass
class AclBroker:
    cluster: localkafka.Cluster
    sasl_port: int

    @property
    def plaintext(self) -> str:
        return self.cluster.bootstrap_servers


def _properties(cluster: localkafka.Cluster, sasl_port: int) -> str:
    # KRaft's authorizer; nobody may do anything without an ACL that says so. The broker's
    # own listeners run as ANONYMOUS here (see the module docstring).
    return sasl_properties(cluster, sasl_port, {
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        "super.users": "User:ANONYMOUS;User:admin",
    })


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclBroker]:
    localkafka.ensure_jars()
    cluster = localkafka.Cluster.plan_free_ports(root=tmp_path_factory.mktemp("acl"), size=1)
    sasl_port = localkafka.free_ports(1)[0]
    node = cluster.nodes[0]
    node.data_dir.mkdir(parents=True)
    props = node.data_dir / "server.properties"
    props.write_text(_properties(cluster, sasl_port))
    scram = [arg for user, password in PASSWORDS.items() for arg in (
        "--add-scram", f"SCRAM-SHA-512=[name={user},password={password}]")]
    subprocess.run(localkafka._java(
        "kafka.tools.StorageTool", "format", "-t", localkafka.cluster_id(cluster), "-c",
        str(props), *scram), check=True, capture_output=True)
    localkafka._spawn(node)  # not localkafka.start: it would rewrite server.properties
    try:
        localkafka.wait_ready(cluster, timeout_s=90)
        yield AclBroker(cluster=cluster, sasl_port=sasl_port)
    finally:
        localkafka.stop(cluster)


def _settings(broker: AclBroker, prefix: str, data_dir: Path, user: str) -> Settings:
    return Settings(bootstrap_servers=f"127.0.0.1:{broker.sasl_port}", topic_prefix=prefix,
                    partitions=2, data_dir=data_dir, allow_private_targets=True,
                    kafka_security_protocol="SASL_PLAINTEXT",
                    kafka_sasl_mechanism="SCRAM-SHA-512", kafka_sasl_username=user,
                    kafka_sasl_password=PASSWORDS[user])  # type: ignore[arg-type]


def _acl(user: str, kind: ResourceType, name: str, pattern: ResourcePatternType,
         op: AclOperation) -> AclBinding:
    return AclBinding(kind, name, pattern, f"User:{user}", "*", op, AclPermissionType.ALLOW)


def _grant(admin: AdminClient, prefix: str) -> None:
    """The ACLs of docs/security.md: the engine's on kron's topics and groups and the
    tenants' target topics, the service's and the reader's on kron.commands only."""
    topic, group, cluster = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.BROKER
    lit, pre = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    acls = [
        # `prefix` covers kron's topics (prefix.*) and Faust's groups/changelogs (prefix-*).
        _acl(ENGINE, topic, prefix, pre, AclOperation.ALL),
        _acl(ENGINE, group, prefix, pre, AclOperation.ALL),
        _acl(ENGINE, cluster, "kafka-cluster", lit, AclOperation.DESCRIBE),
        _acl(ENGINE, cluster, "kafka-cluster", lit, AclOperation.IDEMPOTENT_WRITE),
        _acl(ENGINE, topic, "acme.", pre, AclOperation.WRITE),  # a tenant's Kafka targets
        _acl(ENGINE, topic, "acme.", pre, AclOperation.DESCRIBE),
        _acl(SERVICE, topic, f"{prefix}.commands", lit, AclOperation.WRITE),
        _acl(SERVICE, topic, f"{prefix}.commands", lit, AclOperation.DESCRIBE),
        _acl(READER, topic, f"{prefix}.commands", lit, AclOperation.READ),
        _acl(READER, topic, f"{prefix}.commands", lit, AclOperation.DESCRIBE),
        _acl(READER, group, "kron-reader-", pre, AclOperation.READ),  # replay.reader's group
    ]
    for fut in admin.create_acls(acls, request_timeout=30).values():
        fut.result(30)


def _create_job(job_id: str, url: str, producer: str) -> dict[str, Any]:
    return {"envelope": {"event_id": uuid.uuid4().hex, "event_type": "job.create_requested",
                         "schema_version": 1, "occurred_at_ms": time.time_ns() // 1_000_000,
                         "tenant": "acme", "causation_id": None, "correlation_id": None,
                         "producer": producer},
            "command_id": uuid.uuid4().hex, "job_id": job_id, "idempotency_key": None,
            "spec": spec(target={"url": url}, run_at_ms=time.time_ns() // 1_000_000)}


def _produce_as(settings: Settings, topic: str, key: str, value: bytes) -> KafkaError | None:
    """One plain (not idempotent) produce; the delivery report's error, None if acked."""
    producer = Producer(confluent_config(settings, {"acks": "all", "log_level": 0,
                                                    "message.timeout.ms": 15_000}))
    errors: list[KafkaError | None] = []
    done = threading.Event()

    def delivered(err: KafkaError | None, _msg: Any) -> None:
        errors.append(err)
        done.set()

    producer.produce(topic, key=key.encode(), value=value, on_delivery=delivered)
    deadline = time.monotonic() + 20
    while not done.is_set() and time.monotonic() < deadline:
        producer.poll(0.1)
    assert errors, "no delivery report"
    return errors[0]


def test_a_read_only_principal_cannot_produce_a_command(acl_broker: AclBroker,
                                                        tmp_path: Path) -> None:
    prefix = f"a{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": acl_broker.plaintext, "log_level": 2})
    _grant(admin, prefix)
    engine = _settings(acl_broker, prefix, tmp_path / "data", ENGINE)
    service = _settings(acl_broker, prefix, tmp_path / "service", SERVICE)
    reader = _settings(acl_broker, prefix, tmp_path / "reader", READER)
    assert len(create_topics(engine)) == 6  # the engine's principal may create kron's topics
    commands = engine.topic("commands")

    with Receiver() as receiver:
        worker = WorkerProcess(engine, "w1", tmp_path)
        worker.env |= {"KRON_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                       "KRON_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
                       "KRON_KAFKA_SASL_USERNAME": ENGINE,
                       "KRON_KAFKA_SASL_PASSWORD": PASSWORDS[ENGINE]}
        worker.start()
        # kron's own (idempotent) producer, as a service with WRITE on kron.commands only.
        publisher = CommandPublisher(service)
        try:
            # The service produces a command and the worker runs it.
            first = f"acl-{uuid.uuid4().hex[:8]}"
            publisher.publish_sync("kron.commands.CreateJob",
                                   _create_job(first, f"{receiver.url}/ok", "tests"), key=first)
            assert receiver.wait_for(first, 1, 60), worker.log()[-3000:]

            # The reader produces a CreateJob: the broker refuses it.
            forged = f"forged-{uuid.uuid4().hex[:8]}"
            value = codec.encode("kron.commands.CreateJob",
                                 _create_job(forged, f"{receiver.url}/ok", "reader"))
            err = _produce_as(reader, commands, forged, value)
            assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err
            # The reader's right is to read: it sees the service's command only.
            assert [e.record["job_id"] for e in read_topic(reader, commands)
                    if e.record] == [first]

            # The engine kept running: a later command still runs, the forged one never did.
            second = f"acl-{uuid.uuid4().hex[:8]}"
            publisher.publish_sync("kron.commands.CreateJob",
                                   _create_job(second, f"{receiver.url}/ok", "tests"),
                                   key=second)
            assert receiver.wait_for(second, 1, 30), worker.log()[-3000:]
            assert worker.proc is not None and worker.proc.poll() is None
            assert receiver.hits_for(forged) == []
        finally:
            publisher.close()
            worker.stop()
