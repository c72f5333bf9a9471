"""Helpers of the integration tests: publishing commands, job specs, reading executions back.

The processes (`kron worker`, `kron api`) are kron.processes's; the HTTP target is
bench.receiver.Receiver."""

from __future__ import annotations

import time
import uuid
from typing import Any

from api.publisher import CommandPublisher
from kron.settings import Settings
from replay.reader import read_topic


class Commands:
    """Builds and publishes Avro commands the way another service would."""

    def __init__(self, settings: Settings, tenant: str = "acme") -> None:
        self.settings = settings
        self.tenant = tenant
        self.publisher = CommandPublisher(settings)

    def close(self) -> None:
        self.publisher.close()

    def send(self, kind: str, job_id: str, *, now_ms: int | None = None,
             **fields: Any) -> str:
        command_id = fields.pop("command_id", None) or uuid.uuid4().hex
        record = {
            "envelope": {
                "event_id": command_id, "event_type": f"job.{kind.lower()}_requested",
                "schema_version": 1, "occurred_at_ms": now_ms or time.time_ns() // 1_000_000,
                "tenant": fields.pop("tenant", self.tenant), "causation_id": None,
                "correlation_id": None, "producer": "tests",
            },
            "command_id": command_id,
            "job_id": job_id,
            **fields,
        }
        self.publisher.publish_sync(f"kron.commands.{kind}", record, key=job_id)
        return command_id


def spec(*, target: dict[str, Any], cron: str | None = None, tz: str = "UTC",
         run_at_ms: int | None = None, **overrides: Any) -> dict[str, Any]:
    schedule = (("kron.CronSchedule", {"expr": cron, "timezone": tz}) if cron is not None
                else ("kron.OneOffSchedule", {"run_at_ms": run_at_ms}))
    kind = ("kron.HttpTarget" if "url" in target else
            "kron.RegisteredCommandTarget" if "command" in target else
            "kron.CommandTarget" if "argv" in target else "kron.KafkaTarget")
    if kind == "kron.RegisteredCommandTarget":
        target = {"args": {}, "env": {}, "timeout_s": None, **target}
    if kind == "kron.HttpTarget":
        target = {"method": "POST", "headers": {}, "body": None, "timeout_s": 5.0, **target}
    base: dict[str, Any] = {
        "name": "test-job",
        "schedule": schedule,
        "target": (kind, target),
        "retry": {"max_attempts": 3, "backoff": "exponential", "base_s": 0.2, "max_s": 2.0},
        "overlap": "allow",
        "misfire": {"kind": "fire_once", "late_by_s": None, "fire_all_cap": 100},
        "dst": {"nonexistent": "shift_forward", "ambiguous": "first"},
        "jitter_s": 0.0, "start_at_ms": None, "end_at_ms": None, "lease_s": 10.0,
        "metadata": {}, "priority": "normal", "notify": None,
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return base


def executions(settings: Settings) -> list[dict[str, Any]]:
    """Every execution transition in kron.executions, in offset order per partition."""
    return [e.record for e in read_topic(settings.bootstrap_servers,
                                         settings.topic("executions")) if e.record]


def latest_executions(settings: Settings, job_id: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for rec in executions(settings):
        if rec["job_id"] == job_id:
            out[rec["exec_id"]] = rec
    return out


def wait_until(predicate: Any, timeout_s: float, interval_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    return predicate()
