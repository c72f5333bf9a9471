"""The one typed settings object. Built once at process start and passed down."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KRON_", frozen=True, extra="ignore")

    # Kafka
    bootstrap_servers: str = "127.0.0.1:9092"
    partitions: int = Field(default=8, ge=1, le=1024)
    replication_factor: int = Field(default=1, ge=1, le=5)
    min_insync_replicas: int = Field(default=1, ge=1, le=5)
    topic_prefix: str = Field(default="kron", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,100}$")
    session_timeout_s: float = Field(default=10.0, gt=0)
    # A slot found later than this is judged by its job's misfire policy. Longer than a
    # failover (session timeout + recovery), so a takeover runs the dead owner's late slots.
    misfire_grace_s: float = Field(default=60.0, ge=1, le=86_400)
    # Local state (RocksDB tables, projections) lives here; two workers need two dirs.
    data_dir: Path = Path(".kron/data")
    # API
    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8000, ge=0, le=65535)
    # Comma-separated tenant=key pairs. Keys are secrets: never logged, never echoed.
    api_keys: str = Field(default="", repr=False)
    allow_private_targets: bool = False
    # Per-tenant limits: a token bucket on writes, and a cap on jobs that aren't finished.
    tenant_rate_per_s: float = Field(default=200.0, gt=0)
    tenant_burst: int = Field(default=400, ge=1)
    tenant_max_active_jobs: int = Field(default=100_000, ge=1)
    max_body_bytes: int = Field(default=64 * 1024, ge=1024)
    # Worker
    # Call targets only after the attempt's start is acknowledged by Kafka: a crash then
    # repeats a call only as a new attempt with a new token. Costs dispatch latency.
    dispatch_barrier: bool = True
    worker_id: str = Field(default_factory=_default_worker_id)
    log_level: str = "INFO"

    @field_validator("api_keys")
    @classmethod
    def _check_keys(cls, value: str) -> str:
        parse_api_keys(value)
        return value

    @property
    def tenant_keys(self) -> dict[str, str]:
        """tenant -> key."""
        return parse_api_keys(self.api_keys)

    def topic(self, name: str) -> str:
        return f"{self.topic_prefix}.{name}"

    @property
    def app_id(self) -> str:
        return f"{self.topic_prefix}-engine"


def parse_api_keys(raw: str) -> dict[str, str]:
    keys: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in raw.split(","))):
        tenant, sep, key = pair.partition("=")
        if not sep or not tenant.strip() or not key.strip():
            raise ValueError("KRON_API_KEYS must be comma-separated tenant=key pairs")
        keys[tenant.strip()] = key.strip()
    return keys
