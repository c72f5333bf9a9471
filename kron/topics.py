"""Every kron topic, declared explicitly with its partition count and cleanup policy."""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from kron.errors import SetupError
from kron.kafka_security import confluent_config
from kron.settings import Settings

DAY_MS = 86_400_000


@dataclass(frozen=True, kw_only=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]


def topic_specs(settings: Settings) -> list[TopicSpec]:
    p = settings.partitions
    compact = {"cleanup.policy": "compact", "segment.ms": str(3_600_000)}
    isr = {"min.insync.replicas": str(settings.min_insync_replicas)}
    return [
        # The inbox: other services and the API produce commands here, keyed by job_id.
        TopicSpec(
            name=settings.topic("commands"),
            partitions=p,
            config={"cleanup.policy": "delete", "retention.ms": str(7 * DAY_MS), **isr},
        ),
        # Latest job state per job_id; the jobs table's changelog.
        TopicSpec(name=settings.topic("jobs"), partitions=p, config={**compact, **isr}),
        # Latest execution state per exec_id, partitioned by job_id. The compaction lag keeps
        # every transition for a week so audits see full histories.
        TopicSpec(
            name=settings.topic("executions"),
            partitions=p,
            config={**compact, "min.compaction.lag.ms": str(7 * DAY_MS), **isr},
        ),
        # Pending timers per partition; the timer table's changelog.
        TopicSpec(name=settings.topic("timers"), partitions=p, config={**compact, **isr}),
        # Ticks and attempt reports the engine sends to its own partitions.
        TopicSpec(
            name=settings.topic("signals"),
            partitions=p,
            config={"cleanup.policy": "delete", "retention.ms": str(DAY_MS), **isr},
        ),
        TopicSpec(
            name=settings.topic("dead-letters"),
            partitions=p,
            config={"cleanup.policy": "delete", "retention.ms": str(14 * DAY_MS), **isr},
        ),
    ]


def admin_client(settings: Settings) -> AdminClient:
    return AdminClient(confluent_config(settings, {"log_level": 2}))


def create_topics(settings: Settings, *, timeout_s: float = 30.0) -> list[str]:
    """Create what is missing, then check every topic's partition count. Returns the names
    this call created."""
    admin = admin_client(settings)
    specs = topic_specs(settings)
    existing = admin.list_topics(timeout=timeout_s).topics
    missing = [
        NewTopic(spec.name, num_partitions=spec.partitions,
                 replication_factor=settings.replication_factor, config=spec.config)
        for spec in specs if spec.name not in existing
    ]
    created = _create(admin, missing, timeout_s) if missing else []
    for spec in specs:
        _check_partitions(admin, spec, timeout_s)
    return created


def _check_partitions(admin: AdminClient, spec: TopicSpec, timeout_s: float) -> None:
    """Metadata lags a create, so poll until the topic shows up, then compare."""
    deadline = time.monotonic() + timeout_s
    while True:
        topic = admin.list_topics(spec.name, timeout=timeout_s).topics.get(spec.name)
        if topic is not None and topic.error is None and topic.partitions:
            break
        if time.monotonic() > deadline:
            raise SetupError(f"topic {spec.name} did not appear in the broker's metadata")
        time.sleep(0.1)
    if len(topic.partitions) != spec.partitions:
        raise SetupError(
            f"topic {spec.name} has {len(topic.partitions)} partitions but KRON_PARTITIONS is "
            f"{spec.partitions}; co-partitioning needs them equal")


def _create(admin: AdminClient, missing: list[NewTopic], timeout_s: float) -> list[str]:
    created: list[str] = []
    for name, fut in admin.create_topics(missing, request_timeout=timeout_s).items():
        try:
            fut.result(timeout=timeout_s)
        except Exception as exc:
            # Metadata lags a fresh create, so "exists" here means someone beat us to it.
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise SetupError(f"creating topic {name} failed: {exc}") from exc
            continue
        created.append(name)
    return created
