"""Kafka targets stay inside the tenant (streams/domain/topics.py), through real processes:
the API refuses a topic the tenant may not use with a 422 naming target.topic, and a worker
refuses to publish to one at send time (a job created under a grant since withdrawn)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from bench.receiver import Receiver
from kron.localkafka import Cluster, free_ports
from kron.processes import ApiProcess, WorkerProcess
from kron.settings import Settings
from kron.topics import admin_client
from replay.reader import read_topic
from tests.conftest import fresh_settings
from tests.support.stack import Commands, latest_executions, spec, wait_until

pytestmark = pytest.mark.integration

PROBLEM = "application/problem+json"


def _create_topic(settings: Settings, topic: str) -> None:
    admin = admin_client(settings)  # kept alive until the future resolves
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)


def _records_in(settings: Settings, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": settings.bootstrap_servers,
                         "group.id": f"count-{uuid.uuid4().hex}", "log_level": 2})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), 10)[1]
    finally:
        consumer.close()


def test_the_api_refuses_a_topic_outside_the_tenant(kafka_cluster: Cluster,
                                                    tmp_path: Path) -> None:
    settings = fresh_settings(kafka_cluster, tmp_path / "d",
                              kafka_target_topics="acme=shared.*|audit-log")
    api = ApiProcess(settings, tmp_path, free_ports(1)[0]).start()
    try:
        with httpx.Client(base_url=api.url, headers={"X-API-Key": "key-acme"},
                          timeout=20) as c:
            def post(topic: str, key: str = "key-acme") -> httpx.Response:
                return c.post("/v1/jobs", headers={"X-API-Key": key}, json={
                    "name": "k", "schedule": "0 0 1 1 *", "target": {"topic": topic}})

            for topic in ("acme.reports", "acme.a.b", "shared.reports", "audit-log"):
                r = post(topic)
                assert r.status_code == 201, (topic, r.text)
            refused = {
                "globex.reports": "is not a topic tenant 'acme' may publish to",
                "audit-log.x": "is not a topic tenant 'acme' may publish to",
                "acme": "is not a topic tenant 'acme' may publish to",
                f"{settings.topic_prefix}.commands": "is an internal topic",
                "__consumer_offsets": "is an internal topic",
            }
            for topic, why in refused.items():
                r = post(topic)
                assert r.status_code == 422, (topic, r.text)
                assert r.headers["content-type"] == PROBLEM
                body = r.json()
                assert body["field"] == "target.topic" and why in body["detail"], body
            # What the tenant may use and how to get more, in the answer itself.
            detail = post("globex.reports").json()["detail"]
            assert "'acme.<anything>'" in detail and "'shared.*', 'audit-log'" in detail
            assert 'KRON_KAFKA_TARGET_TOPICS="acme=<prefix>.*|<topic>"' in detail
            # The grants are acme's: globex has its own namespace and nothing else.
            assert post("globex.reports", "key-globex").status_code == 201
            r = post("shared.reports", "key-globex")
            assert r.status_code == 422 and "'globex.<anything>'" in r.json()["detail"]
    finally:
        api.stop()


def test_a_worker_refuses_at_send_a_topic_its_grants_do_not_allow(kafka_cluster: Cluster,
                                                                  tmp_path: Path) -> None:
    """A job created while acme was granted a partner topic; the grant is withdrawn (a
    worker restarted without it) and the next run fails permanently, publishing nothing."""
    topic = f"partner.{uuid.uuid4().hex[:8]}"
    granted = fresh_settings(kafka_cluster, tmp_path / "d", kafka_target_topics=f"acme={topic}")
    _create_topic(granted, topic)
    commands = Commands(granted)
    job_id = f"job-{uuid.uuid4().hex[:10]}"
    with Receiver() as receiver:
        first = WorkerProcess(granted, "w1", tmp_path).start()
        try:
            # Ready when it runs a job; then the Kafka job, far in the future, run once now.
            warm = f"warm-{uuid.uuid4().hex[:8]}"
            commands.send("CreateJob", warm, spec=spec(target={"url": f"{receiver.url}/ok"},
                                                        run_at_ms=time.time_ns() // 1_000_000))
            assert receiver.wait_for(warm, 1, 90), first.log()[-3000:]
            commands.send("CreateJob", job_id, spec=spec(
                target={"topic": topic, "key": b"k", "value": b"v", "headers": {}},
                cron="0 0 1 1 *"))
            commands.send("TriggerJob", job_id)
            ok = wait_until(lambda: [e for e in latest_executions(granted, job_id).values()
                                     if e["state"] == "succeeded"], 30)
            assert ok, (latest_executions(granted, job_id), first.log()[-3000:])
            assert _records_in(granted, topic) == 1  # the grant let it publish
        finally:
            first.stop()
        withdrawn = granted.model_copy(update={"kafka_target_topics": ""})
        second = WorkerProcess(withdrawn, "w2", tmp_path).start()
        try:
            commands.send("TriggerJob", job_id)
            failed = wait_until(lambda: [e for e in latest_executions(granted, job_id).values()
                                         if e["state"] == "failed"], 60)
            assert failed, (latest_executions(granted, job_id), second.log()[-3000:])
            (run,) = failed
            # Permanent: the retry policy (3) is not used. An attempt before it may have
            # ended lease_expired (w2's group join moving the partition under a loaded host
            # once did), never a retry of the refusal.
            outcomes = [a["outcome"] for a in run["attempts"]]
            assert outcomes[-1] == "permanent" and set(outcomes[:-1]) <= {"lease_expired"}, run
            assert run["last_error"].startswith(
                f"publish refused: target.topic '{topic}' is not a topic tenant 'acme' may "
                f"publish to"), run
            assert _records_in(granted, topic) == 1  # nothing more was published
            assert len(list(read_topic(granted.bootstrap_servers, topic))) == 1
        finally:
            second.stop()
            commands.close()
