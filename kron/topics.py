"""Every kron topic, declared explicitly with its partition count and cleanup policy."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from kron.errors import SetupError
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
    return AdminClient({"bootstrap.servers": settings.bootstrap_servers, "log_level": 2})


def create_topics(settings: Settings, *, timeout_s: float = 30.0) -> list[str]:
    """Create what is missing; check what exists. Returns the names it created."""
    admin = admin_client(settings)
    existing = admin.list_topics(timeout=timeout_s).topics
    created: list[str] = []
    missing = []
    for spec in topic_specs(settings):
        if spec.name in existing:
            have = len(existing[spec.name].partitions)
            if have != spec.partitions:
                raise SetupError(
                    f"topic {spec.name} has {have} partitions but KRON_PARTITIONS is "
                    f"{spec.partitions}; co-partitioning needs them equal"
                )
            continue
        missing.append(
            NewTopic(
                spec.name,
                num_partitions=spec.partitions,
                replication_factor=settings.replication_factor,
                config=spec.config,
            )
        )
    if not missing:
        return created
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
