"""Real `kron worker` processes for integration tests, and a helper to send commands."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from api.publisher import CommandPublisher
from kron.settings import Settings
from replay.reader import read_topic

REPO = Path(__file__).resolve().parents[2]


class WorkerProcess:
    def __init__(self, settings: Settings, name: str, log_dir: Path) -> None:
        self.name = name
        self.data_dir = log_dir / f"{name}-state"
        self.log_path = log_dir / f"{name}.log"
        self.env = {
            **os.environ,
            "KRON_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
            "KRON_TOPIC_PREFIX": settings.topic_prefix,
            "KRON_PARTITIONS": str(settings.partitions),
            "KRON_DATA_DIR": str(self.data_dir),
            "KRON_WORKER_ID": name,
            "KRON_ALLOW_PRIVATE_TARGETS": "true",
            "KRON_SESSION_TIMEOUT_S": str(settings.session_timeout_s),
            "KRON_MISFIRE_GRACE_S": str(settings.misfire_grace_s),
            "KRON_FIRE_AHEAD_S": str(settings.fire_ahead_s),
            "KRON_STANDBY_REPLICAS": str(settings.standby_replicas),
            "KRON_KAFKA_TARGET_TOPICS": settings.kafka_target_topics,
            "KRON_COMMANDS_FILE": str(settings.commands_file or ""),
            "PYTHONPATH": str(REPO),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "kron", "worker"], env=self.env,
                                     stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        log.close()
        return self

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, grace_s: float = 15.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


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
        "metadata": {},
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


class ApiProcess:
    """`kron api` as a real process on a free loopback port."""

    def __init__(self, settings: Settings, log_dir: Path, port: int) -> None:
        self.port = port
        self.log_path = log_dir / "api.log"
        self.env = {
            **os.environ,
            "KRON_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
            "KRON_TOPIC_PREFIX": settings.topic_prefix,
            "KRON_PARTITIONS": str(settings.partitions),
            "KRON_DATA_DIR": str(log_dir / "api-state"),
            "KRON_API_KEYS": settings.api_keys,
            "KRON_API_PORT": str(port),
            "KRON_ALLOW_PRIVATE_TARGETS": "true" if settings.allow_private_targets else "false",
            "KRON_TENANT_RATE_PER_S": str(settings.tenant_rate_per_s),
            "KRON_TENANT_BURST": str(settings.tenant_burst),
            "KRON_TENANT_MAX_ACTIVE_JOBS": str(settings.tenant_max_active_jobs),
            "KRON_KAFKA_TARGET_TOPICS": settings.kafka_target_topics,
            "KRON_COMMANDS_FILE": str(settings.commands_file or ""),
            "PYTHONPATH": str(REPO),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, wait_path: str = "/readyz", ok_statuses: tuple[int, ...] = (200,)
              ) -> ApiProcess:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "kron", "api"], env=self.env,
                                     stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        log.close()
        import httpx

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kron api exited: {self.log()[-3000:]}")
            try:
                if httpx.get(f"{self.url}{wait_path}", timeout=5).status_code in ok_statuses:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"kron api not ready: {self.log()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
