"""Jobs for the bench, created the fast way: Avro CreateJob commands straight onto Kafka.

`CommandSink` keeps many commands in flight (acks=all, idempotent producer) instead of
waiting for each ack like the API's `publish_sync`: the set-up of 10,000 jobs must take
seconds, not minutes, and the ack rate is itself one of the numbers `timers` reports.
"""

from __future__ import annotations

import time
import uuid
from array import array
from typing import Any

from confluent_kafka import KafkaError, Producer

from kron.settings import Settings
from schemas import codec, names
from schemas.envelope import Envelope, make_envelope

TENANT = "bench"
CREATE = "kron.commands.CreateJob"


def http_target(url: str) -> tuple[str, dict[str, Any]]:
    return "kron.HttpTarget", {"method": "POST", "url": url, "headers": {}, "body": None,
                               "timeout_s": 5.0}


def kafka_target(topic: str) -> tuple[str, dict[str, Any]]:
    return "kron.KafkaTarget", {"topic": topic, "key": None, "value": b"bench", "headers": {}}


def job_spec(*, target: tuple[str, dict[str, Any]], cron: str | None = None,
             run_at_ms: int | None = None, start_at_ms: int | None = None,
             end_at_ms: int | None = None, jitter_s: float = 0.0,
             lease_s: float = 30.0) -> dict[str, Any]:
    schedule = (("kron.CronSchedule", {"expr": cron, "timezone": "UTC"}) if cron is not None
                else ("kron.OneOffSchedule", {"run_at_ms": run_at_ms}))
    return {
        "name": "bench", "schedule": schedule, "target": target,
        "retry": {"max_attempts": 3, "backoff": "exponential", "base_s": 0.5, "max_s": 5.0},
        "overlap": "allow",
        "misfire": {"kind": "fire_once", "late_by_s": None, "fire_all_cap": 100},
        "dst": {"nonexistent": "shift_forward", "ambiguous": "first"},
        "jitter_s": jitter_s, "start_at_ms": start_at_ms, "end_at_ms": end_at_ms,
        "lease_s": lease_s, "metadata": {}, "priority": "normal", "notify": None,
    }


def _envelope(command_id: str, event_type: str) -> Envelope:
    return make_envelope(event_id=command_id, event_type=event_type,
                         occurred_at_ms=time.time_ns() // 1_000_000, tenant=TENANT,
                         producer="kron-bench")


def create_command(job_id: str, spec: dict[str, Any]) -> dict[str, Any]:
    command_id = uuid.uuid4().hex
    return {"envelope": _envelope(command_id, "job.create_requested"),
            "command_id": command_id, "job_id": job_id, "idempotency_key": None, "spec": spec}


def create_many_command(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """A CreateJobs batch (streams/engine/batch.py) of {job_id, idempotency_key, spec}."""
    command_id = uuid.uuid4().hex
    return {"envelope": _envelope(command_id, "job.create_many_requested"),
            "command_id": command_id, "jobs": jobs}


def _encode(name: str, record: dict[str, Any]) -> bytes:
    """Unvalidated: the bench builds these records from known-good values, and validation
    was more than half of their encode (a CreateJobs of 100: 75 -> 31 us per job on the
    2026-12-02 host), CPU the bench took from the worker and the broker on the same two
    cores. The worker checks every spec it applies either way."""
    return codec.encode_trusted(name, record)


class CommandSink:
    """Produces CreateJob commands without waiting per message; counts acks."""

    def __init__(self, settings: Settings) -> None:
        self.topic = settings.topic("commands")
        self.producer = Producer({
            "bootstrap.servers": settings.bootstrap_servers, "acks": "all",
            "partitioner": "murmur2_random",
            "enable.idempotence": True, "linger.ms": 5, "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 500_000, "message.timeout.ms": 60_000,
            "log_level": 2})
        self.acked = 0
        self.errors: list[str] = []
        self.last_ack = 0.0  # monotonic time of the latest ack
        # For --plot: every ack's time and produce-to-ack latency. Arrays of doubles, not
        # lists of floats: a million pending timers would otherwise cost ~50 MB of objects.
        self.ack_times: array[float] | None = None
        self.ack_latency_ms: array[float] | None = None

    def record_acks(self) -> None:
        self.ack_times, self.ack_latency_ms = array("d"), array("d")

    def _delivered(self, err: KafkaError | None, msg: Any, jobs: int = 1) -> None:
        if err is not None:
            self.errors.append(str(err))
            return
        self.acked += jobs
        self.last_ack = time.monotonic()
        if self.ack_times is not None and self.ack_latency_ms is not None:
            # Per job, so a batch's jobs count in the plots as the jobs of single creates.
            self.ack_times.extend([self.last_ack] * jobs)
            self.ack_latency_ms.extend([(msg.latency() or 0.0) * 1000] * jobs)

    def create(self, job_id: str, spec: dict[str, Any], *, partition: int | None = None) -> None:
        value = _encode(CREATE, create_command(job_id, spec))
        kwargs: dict[str, Any] = {"key": job_id.encode(), "value": value,
                                  "on_delivery": self._delivered}
        if partition is not None:
            kwargs["partition"] = partition  # probes: one per partition, to reach every owner
        self._produce(kwargs)

    def create_many(self, partition: int, jobs: list[dict[str, Any]]) -> None:
        """One CreateJobs record for jobs of one partition (batch.group_by_partition);
        `acked` counts its jobs."""
        value = _encode(names.CREATE_JOBS, create_many_command(jobs))
        count = len(jobs)

        def delivered(err: KafkaError | None, msg: Any) -> None:
            self._delivered(err, msg, count)

        self._produce({"key": jobs[0]["job_id"].encode(), "value": value,
                       "partition": partition, "on_delivery": delivered})

    def _produce(self, kwargs: dict[str, Any]) -> None:
        for _ in range(1000):  # bounded: a full queue drains within seconds or Kafka is down
            try:
                self.producer.produce(self.topic, **kwargs)
                break
            except BufferError:
                self.producer.poll(0.05)
        else:
            raise RuntimeError("the producer queue stayed full; is the broker up?")
        self.producer.poll(0)

    def flush(self, timeout_s: float = 60.0) -> None:
        left = self.producer.flush(timeout_s)
        if left or self.errors:
            raise RuntimeError(f"{left} commands unacknowledged, errors: {self.errors[:3]}")

    def close(self) -> None:
        self.producer.flush(5)
