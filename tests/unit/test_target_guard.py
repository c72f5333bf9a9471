"""The partition owner's tenant checks (streams/guard.py) on the pure core: what a command
straight from Kafka may not do, whatever tenant it names."""

from __future__ import annotations

from typing import Any

import pytest

from streams.domain.commands import CommandRegistry
from streams.domain.errors import PermanentError
from streams.domain.topics import TopicGrants
from streams.engine.core import Context, PartitionCore
from streams.engine.store import MemoryStore
from streams.guard import TargetGuard

GUARD = TargetGuard(
    commands=CommandRegistry.parse('[commands.ok]\nargv = ["/bin/true"]\ntenants = ["acme"]\n'),
    topics=TopicGrants.parse("", own_prefix="kron"), allow_private=False)
HTTP = ("kron.HttpTarget", {"method": "POST", "url": "https://example.com/x", "headers": {},
                            "body": None, "timeout_s": 5.0})


@pytest.mark.parametrize(("tenant", "target", "field"), [
    ("acme", ("kron.CommandTarget", {"argv": ["/bin/sh", "-c", "env"]}), "target.argv"),
    ("globex", ("kron.RegisteredCommandTarget", {"command": "ok"}), "target.command"),
    ("acme", ("kron.RegisteredCommandTarget", {"command": "nope"}), "target.command"),
    ("acme", ("kron.KafkaTarget", {"topic": "globex.events"}), "target.topic"),
    ("acme", ("kron.KafkaTarget", {"topic": "kron.commands"}), "target.topic"),
    ("acme", ("kron.HttpTarget", {"url": "http://169.254.169.254/latest"}), "target.url"),
    ("acme", ("kron.HttpTarget", {"url": "http://localhost:8000/"}), "target.url"),
])
def test_refused(tenant: str, target: Any, field: str) -> None:
    with pytest.raises(PermanentError) as info:
        GUARD.check(tenant, target)
    assert info.value.field == field


@pytest.mark.parametrize("target", [
    ("kron.RegisteredCommandTarget", {"command": "ok"}),
    ("kron.KafkaTarget", {"topic": "acme.events"}),
    HTTP,
])
def test_allowed(target: Any) -> None:
    GUARD.check("acme", target)


def _spec(target: Any) -> dict[str, Any]:
    return {"name": "j", "schedule": ("kron.OneOffSchedule", {"run_at_ms": 10_000}),
            "target": target,
            "retry": {"max_attempts": 1, "backoff": "fixed", "base_s": 1.0, "max_s": 1.0},
            "overlap": "allow",
            "misfire": {"kind": "fire_once", "late_by_s": None, "fire_all_cap": 100},
            "dst": {"nonexistent": "shift_forward", "ambiguous": "first"}, "jitter_s": 0.0,
            "start_at_ms": None, "end_at_ms": None, "lease_s": 60.0, "metadata": {},
            "priority": "normal", "notify": None}


def _cmd(kind: str, job_id: str, target: Any, n: int) -> dict[str, Any]:
    return {"envelope": {"event_id": f"e{n}", "event_type": kind, "schema_version": 1,
                         "occurred_at_ms": 1_000, "tenant": "acme", "causation_id": None,
                         "correlation_id": None, "producer": "test"},
            "command_id": f"c{n}", "job_id": job_id, "idempotency_key": None,
            "spec": _spec(target), "expected_version": None}


def _ctx(n: int) -> Context:
    return Context(now_ms=1_000, causation_id=f"e{n}", worker="w", epoch=1, incarnation="i",
                   misfire_grace_ms=60_000)


def test_the_core_refuses_a_create_or_update_the_guard_refuses_and_writes_nothing() -> None:
    store = MemoryStore()
    core = PartitionCore(store, check_target=GUARD.check)
    bad = ("kron.KafkaTarget", {"topic": "globex.events"})
    with pytest.raises(PermanentError):
        core.on_command("kron.commands.CreateJob", _cmd("CreateJob", "j1", bad, 1), _ctx(1))
    assert store.job("j1") is None and not store.timers
    core.on_command("kron.commands.CreateJob", _cmd("CreateJob", "j2", HTTP, 2), _ctx(2))
    before = store.job("j2")
    with pytest.raises(PermanentError):
        core.on_command("kron.commands.UpdateJob", _cmd("UpdateJob", "j2", bad, 3), _ctx(3))
    assert store.job("j2") == before
