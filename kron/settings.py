"""The one typed settings object. Built once at process start and passed down."""

from __future__ import annotations

import enum
import functools
import hashlib
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Self

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from streams.domain.commands import CommandRegistry
from streams.domain.tenants import TenantQuotas, TenantTable
from streams.domain.topics import TopicGrants
from streams.output import DEFAULT_OUTPUT_BYTES, EXECUTION_OUTPUT_BUDGET

# API keys are random high-entropy tokens, so one unsalted SHA-256 is enough: nobody can
# brute-force a 192-bit preimage, and a salt or a slow KDF only helps low-entropy passwords.
# An unsalted digest also lets auth look keys up without knowing which tenant is asking.
KEY_HASH_PREFIX = "sha256:"
_KEY_HASH = re.compile(r"sha256:[0-9a-f]{64}")


class Scope(enum.StrEnum):
    """What a key may do. A READ key is refused every write (api/auth.py decides)."""

    READ = "read"
    WRITE = "write"


@dataclass(frozen=True, kw_only=True, slots=True)
class ApiKey:
    """One KRON_API_KEYS entry, `tenant[:scope]=key`; `key` is its hash, ``sha256:<hex>``."""

    tenant: str
    scope: Scope
    key: str

    @property
    def entry(self) -> str:
        """The entry as errors name it: tenant and scope, never the key."""
        return self.tenant if self.scope is Scope.WRITE else f"{self.tenant}:{self.scope}"


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Settings(BaseSettings):
    # hide_input_in_errors: a bad KRON_API_KEYS or password must not be echoed into a log.
    model_config = SettingsConfigDict(env_prefix="KRON_", frozen=True, extra="ignore",
                                      hide_input_in_errors=True)

    # Kafka
    bootstrap_servers: str = "127.0.0.1:9092"
    partitions: int = Field(default=8, ge=1, le=1024)
    replication_factor: int = Field(default=1, ge=1, le=5)
    min_insync_replicas: int = Field(default=1, ge=1, le=5)
    topic_prefix: str = Field(default="kron", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,100}$")
    # Kafka client security, applied to every client (kron/kafka_security.py).
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = (
        "PLAINTEXT")
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "SCRAM-SHA-512"
    kafka_sasl_username: str = ""
    kafka_sasl_password: SecretStr = Field(default=SecretStr(""), repr=False)
    kafka_ssl_ca_file: Path | None = None
    kafka_ssl_cert_file: Path | None = None
    kafka_ssl_key_file: Path | None = None
    # Off only for brokers whose certificates don't name the address used to reach them.
    kafka_ssl_check_hostname: bool = True
    session_timeout_s: float = Field(default=10.0, gt=0)
    # A slot found later than this is judged by its job's misfire policy. Longer than a
    # failover (session timeout + recovery), so a takeover runs the dead owner's late slots.
    misfire_grace_s: float = Field(default=60.0, ge=1, le=86_400)
    # Decide eligible slots (one-offs, overlap=allow) up to this long before they are due
    # and hold the call until then, so a spike's decisions are made ahead of it. 0 is off.
    # Each tick carries the window its ticker chose, so replays decide alike. Half a
    # second takes a tick's deciding off the due time without making pauses and deletes
    # much earlier than they look (see docs/semantics.md, Fire-ahead).
    fire_ahead_s: float = Field(default=0.5, ge=0, le=10)
    # Where state writes are produced and their acks served (streams.changelog): on the
    # worker's event loop (`inline`), or in a child process of the worker (`process`),
    # which takes that work off the loop that bounds a worker (docs/perf/passes.md,
    # twenty-fourth to twenty-sixth passes). `inline` spares the child's ~30 MB and a
    # process.
    changelog_writer: Literal["inline", "process"] = "process"
    # Workers that keep a copy of each partition they do not own, read from its changelog,
    # so a takeover starts from local state (seconds) instead of the whole changelog (15 s
    # for a million jobs). Keeping a copy costs a worker's event loop more than applying
    # the same writes as their owner (bench/README.md, Where the time goes): 0 buys
    # throughput with more workers than cores can otherwise give, at the price of slower
    # takeovers.
    standby_replicas: int = Field(default=1, ge=0, le=8)
    # Executions that ended longer ago than this leave the hot path: their partition's
    # owner writes their tombstones to kron.executions and the API's views drop them
    # (streams/engine/retention.py). Fractional days are allowed (tests use seconds'
    # worth: 0.0001 is 8.64 s); 0 keeps every execution for good.
    history_days: float = Field(default=30.0, ge=0, le=36_500)
    # Local state (RocksDB tables, projections) lives here; two workers need two dirs.
    data_dir: Path = Path(".kron/data")
    # API
    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8000, ge=0, le=65535)
    # Comma-separated tenant[:scope]=key entries; the key may be sha256:<hex>. Scope `write`
    # (the default) may do everything, `read` only reads. A tenant may have several keys at
    # once (rotation). Plaintext keys are replaced by their hash as soon as the settings are
    # read, so the object never holds a key.
    api_keys: str = Field(default="", repr=False)
    allow_private_targets: bool = False
    # The programs jobs may run (TOML, streams/domain/commands.py); unset: no command
    # targets at all. Read by the API and every worker at start.
    commands_file: Path | None = None
    # Run registered commands as this user (the worker must be root to switch); unset: the
    # worker's own user.
    command_user: str | None = None
    # Kafka targets: besides its own `<tenant>.*` topics, what each tenant may publish to,
    # "tenant=prefix.*|exact.topic,..." (streams/domain/topics.py). kron's own are never.
    kafka_target_topics: str = ""
    # Per-tenant limits: a token bucket on writes, and a cap on jobs that aren't finished.
    # They are the defaults of KRON_TENANTS_FILE's [defaults] (create_rate_per_s,
    # create_burst, max_active_jobs), and every tenant's limits without that file.
    tenant_rate_per_s: float = Field(default=200.0, gt=0)
    tenant_burst: int = Field(default=400, ge=1)
    tenant_max_active_jobs: int = Field(default=100_000, ge=1)
    # Each tenant's quotas and share (TOML, streams/domain/tenants.py): weight, max_running
    # and dispatch rate in the worker, create rate and active jobs at the API. Read by the
    # API and every worker at start; a malformed file stops them, naming its line.
    tenants_file: Path | None = None
    max_body_bytes: int = Field(default=64 * 1024, ge=1024)
    # Keyless creates of a tenant that arrive while its last batch waits for Kafka's ack go
    # out together as one CreateJobs record of up to this many (api/batcher.py). 1: each
    # create is a CreateJob record of its own.
    api_create_batch: int = Field(default=100, ge=1, le=500)
    # DAG jobs: the most tasks and dependency edges the API accepts in one DAG. They can only
    # lower the limits every worker applies to any command (streams.domain.dag).
    dag_max_tasks: int = Field(default=500, ge=1, le=500)
    dag_max_edges: int = Field(default=5000, ge=0, le=5000)
    # Worker
    # Call targets only after the attempt's start is acknowledged by Kafka: a crash then
    # repeats a call only as a new attempt with a new token. Costs dispatch latency.
    dispatch_barrier: bool = True
    # Apply the results of attempts this worker made, for partitions it owns, at once
    # instead of through kron.signals (streams/reports.py). Off: every result is an event.
    local_results: bool = True
    # Apply the ticker's ticks for owned partitions at once instead of sending them through
    # kron.signals (~10 ms before each due second's first decision). Off: every tick is an event.
    local_ticks: bool = True
    # Attempts in flight per worker. A Kafka target holds its slot until the broker acks
    # (acks=all), so throughput per worker is at most this over the ack latency.
    executor_concurrency: int = Field(default=1024, ge=1, le=65_536)
    # Each attempt keeps this many bytes of what its target gave back (streams/output.py):
    # HTTP's status line and body start, a command's output tail, a Kafka record's
    # partition and offset. 0 keeps none. At most 64 KiB, an execution's budget for all
    # its attempts' outputs.
    output_bytes: int = Field(default=DEFAULT_OUTPUT_BYTES, ge=0, le=EXECUTION_OUTPUT_BUDGET)
    # How often a worker logs its "engine stats" line.
    stats_every_s: float = Field(default=30.0, ge=0.1, le=3600)
    # Prometheus metrics (streams/metrics.py, api/metrics.py): the API serves /metrics on its
    # own port, each worker on KRON_METRICS_HOST:KRON_METRICS_PORT (0: a free port, written to
    # <data_dir>/metrics-port). Off: neither counts anything.
    metrics_enabled: bool = True
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(default=0, ge=0, le=65535)
    # Label values past these many distinct ones (in order of first use) are counted as
    # `other`: a series per tenant or target host must not grow without bound.
    metrics_max_tenants: int = Field(default=100, ge=1, le=10_000)
    metrics_max_hosts: int = Field(default=50, ge=1, le=10_000)
    # Failure alerts (streams/notify/): each tenant's HMAC key, "tenant=secret,..." (a tenant
    # without one gets no alerts: they are never sent unsigned). Never shown or logged.
    notify_keys: SecretStr = Field(default=SecretStr(""), repr=False)
    notify_enabled: bool = True
    # Tries per alert and the first wait; each wait doubles (6 and 10 s: ~5 minutes).
    notify_attempts: int = Field(default=6, ge=1, le=20)
    notify_backoff_s: float = Field(default=10.0, gt=0, le=3600)
    # Deliveries waiting for a runner; past it, alerts are dropped (counted, logged).
    notify_queue: int = Field(default=1000, ge=1, le=1_000_000)
    notify_concurrency: int = Field(default=8, ge=1, le=256)
    # Alerts older than this when read are not sent (a first start, a long outage).
    notify_max_age_s: float = Field(default=3600.0, gt=0)
    worker_id: str = Field(default_factory=_default_worker_id)
    log_level: str = "INFO"

    @field_validator("api_keys")
    @classmethod
    def _hash_keys(cls, value: str) -> str:
        return format_api_keys(parse_api_keys(value))

    @model_validator(mode="after")
    def _check_kafka_security(self) -> Self:
        if self.kafka_security_protocol.startswith("SASL_") and not (
                self.kafka_sasl_username and self.kafka_sasl_password.get_secret_value()):
            raise ValueError("SASL needs KRON_KAFKA_SASL_USERNAME and KRON_KAFKA_SASL_PASSWORD")
        if (self.kafka_ssl_cert_file is None) != (self.kafka_ssl_key_file is None):
            raise ValueError("KRON_KAFKA_SSL_CERT_FILE and KRON_KAFKA_SSL_KEY_FILE go together")
        return self

    @model_validator(mode="after")
    def _check_topic_grants(self) -> Self:
        # A malformed KRON_KAFKA_TARGET_TOPICS stops start-up, naming the entry at fault.
        TopicGrants.parse(self.kafka_target_topics, own_prefix=self.topic_prefix)
        return self

    @field_validator("commands_file", "command_user", "tenants_file", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value

    @model_validator(mode="after")
    def _check_notify_keys(self) -> Self:
        self.notify_key_map  # noqa: B018 - a malformed KRON_NOTIFY_KEYS stops start-up
        return self

    @functools.cached_property
    def notify_key_map(self) -> dict[str, bytes]:
        """Each tenant's alert-signing key (KRON_NOTIFY_KEYS)."""
        return parse_notify_keys(self.notify_keys.get_secret_value())

    @model_validator(mode="after")
    def _check_commands(self) -> Self:
        self.commands  # noqa: B018 - read once here: a bad file stops the process at start
        return self

    @functools.cached_property
    def commands(self) -> CommandRegistry:
        """The operator's registry of programs jobs may run (KRON_COMMANDS_FILE); empty,
        refusing every command target, without a file. Read once per process."""
        return CommandRegistry.load(self.commands_file)

    @model_validator(mode="after")
    def _check_tenants(self) -> Self:
        self.tenants  # noqa: B018 - read once here: a bad file stops the process at start
        return self

    @functools.cached_property
    def tenants(self) -> TenantTable:
        """Each tenant's quotas (KRON_TENANTS_FILE); without a file, every tenant has the
        defaults: KRON_TENANT_RATE_PER_S, KRON_TENANT_BURST and KRON_TENANT_MAX_ACTIVE_JOBS
        for the API's limits, TenantQuotas' own for the rest. Read once per process."""
        return TenantTable.load(self.tenants_file, base=TenantQuotas(
            create_rate_per_s=self.tenant_rate_per_s, create_burst=self.tenant_burst,
            max_active_jobs=self.tenant_max_active_jobs))

    @property
    def topic_grants(self) -> TopicGrants:
        """The Kafka topics each tenant's jobs may publish to (KRON_KAFKA_TARGET_TOPICS)."""
        return TopicGrants.parse(self.kafka_target_topics, own_prefix=self.topic_prefix)

    @property
    def api_key_entries(self) -> tuple[ApiKey, ...]:
        """Every key with its tenant and scope, hashed: plaintext keys are never kept."""
        return parse_api_keys(self.api_keys)

    @property
    def history_ms(self) -> int:
        """KRON_HISTORY_DAYS in milliseconds; 0: retention is off."""
        return int(self.history_days * 86_400_000)

    def topic(self, name: str) -> str:
        return f"{self.topic_prefix}.{name}"

    @property
    def app_id(self) -> str:
        return f"{self.topic_prefix}-engine"


def parse_api_keys(raw: str) -> tuple[ApiKey, ...]:
    """Comma-separated `tenant=key` or `tenant:scope=key` entries, keys hashed. Errors name
    the entry (tenant and scope), never its key."""
    entries: list[ApiKey] = []
    named: dict[str, str] = {}  # hash -> the entry that gave it
    for pair in filter(None, (p.strip() for p in raw.split(","))):
        name, sep, key = pair.partition("=")
        tenant, colon, scope_name = (part.strip() for part in name.partition(":"))
        key = key.strip()
        if not sep or not tenant or not key or (colon and not scope_name):
            raise ValueError("KRON_API_KEYS must be comma-separated tenant=key or "
                             "tenant:scope=key entries")
        try:
            scope = Scope(scope_name) if colon else Scope.WRITE
        except ValueError:
            raise ValueError(f"KRON_API_KEYS entry {tenant}:{scope_name} has an unknown scope "
                             f"{scope_name!r}: a scope is read or write") from None
        if key.startswith(KEY_HASH_PREFIX) and not _KEY_HASH.fullmatch(key):
            # Never take a mistyped hash for a plaintext key: it would silently not match.
            raise ValueError(f"the key of tenant {tenant!r} looks like a hash but is "
                             f"not sha256: and 64 lowercase hex digits")
        entry = ApiKey(tenant=tenant, scope=scope, key=hash_api_key(key))
        if entry.key in named:
            # One key, one tenant and one scope: which would a request get otherwise?
            raise ValueError(f"KRON_API_KEYS entries {named[entry.key]} and {entry.entry} have "
                             f"the same key")
        named[entry.key] = entry.entry
        entries.append(entry)
    return tuple(entries)


def parse_notify_keys(raw: str) -> dict[str, bytes]:
    """`tenant=secret` entries, comma-separated. Errors name the tenant, never a key."""
    keys: dict[str, bytes] = {}
    for pair in filter(None, (p.strip() for p in raw.split(","))):
        tenant, sep, key = (part.strip() for part in pair.partition("="))
        if not sep or not tenant or not key:
            raise ValueError("KRON_NOTIFY_KEYS must be comma-separated tenant=key entries")
        if tenant in keys:
            raise ValueError(f"KRON_NOTIFY_KEYS has two keys for tenant {tenant!r}")
        keys[tenant] = key.encode()
    return keys


def format_api_keys(entries: tuple[ApiKey, ...]) -> str:
    """The stored form of KRON_API_KEYS: every key hashed; parse_api_keys reads it back."""
    return ",".join(f"{e.entry}={hash_api_key(e.key)}" for e in entries)


def hash_api_key(key: str) -> str:
    """The stored form of a key: ``sha256:<hex>``. A hashed key is returned unchanged."""
    if _KEY_HASH.fullmatch(key):
        return key
    return KEY_HASH_PREFIX + hashlib.sha256(key.encode()).hexdigest()
