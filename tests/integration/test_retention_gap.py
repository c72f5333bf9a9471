"""Commands deleted by retention while the group was away: the worker resumes from what is
left and its commits move on (Faust alone would refuse every commit of that partition, and
so did kron's first commit guard, which kept seeking back to records that no longer exist)."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from kron.processes import WorkerProcess
from tests.conftest import fresh_settings
from tests.support.stack import Commands, spec, wait_until

pytestmark = pytest.mark.integration


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def committed_and_end(settings) -> tuple[int, int]:
    topic = settings.topic("commands")
    c = Consumer({"bootstrap.servers": settings.bootstrap_servers, "group.id": settings.app_id,
                  "enable.auto.commit": False, "log_level": 2})
    try:
        (tp,) = c.committed([TopicPartition(topic, 0)], timeout=10)
        return tp.offset, c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    finally:
        c.close()


def test_commands_deleted_by_retention_do_not_stall_commits(kafka_cluster, tmp_path,
                                                            receiver) -> None:
    settings = fresh_settings(kafka_cluster, tmp_path / "d", session_timeout_s=6.0,
                              partitions=1)
    commands = Commands(settings)
    url = f"{receiver.url}/ok"
    worker = WorkerProcess(settings, "w1", tmp_path).start()
    try:
        first = f"job-{uuid.uuid4().hex[:8]}"
        commands.send("CreateJob", first, spec=spec(target={"url": url}, run_at_ms=now_ms()))
        assert receiver.wait_for(first, 1, 90), worker.log()[-3000:]
        assert wait_until(lambda: committed_and_end(settings) == (1, 1), 30)
        worker.stop()
        # While the group is away: two commands arrive and retention deletes them, then a
        # third arrives and is kept.
        for _ in range(2):
            commands.send("CreateJob", f"gone-{uuid.uuid4().hex[:8]}",
                          spec=spec(target={"url": url}, run_at_ms=now_ms()))
        admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
        (fut,) = admin.delete_records([TopicPartition(settings.topic("commands"), 0, 3)],
                                      request_timeout=30).values()
        assert fut.result().low_watermark == 3  # the log starts at 3; the group committed 1
        kept = f"job-{uuid.uuid4().hex[:8]}"
        commands.send("CreateJob", kept, spec=spec(target={"url": url}, run_at_ms=now_ms()))
        worker = WorkerProcess(settings, "w1", tmp_path).start()
        assert receiver.wait_for(kept, 1, 90), worker.log()[-3000:]
        assert wait_until(lambda: committed_and_end(settings) == (4, 4), 30), (
            committed_and_end(settings), worker.log()[-3000:])
        assert "are gone (retention)" in worker.log()
    finally:
        worker.stop()
        commands.close()
