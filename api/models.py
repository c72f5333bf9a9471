"""Request models for ``POST /v1/jobs`` and ``PATCH /v1/jobs/{id}``, and their translation
into the Avro ``kron.JobSpec`` the engine consumes.

Layers, from the outside in:

1. :class:`JobRequest` / :class:`JobPatch` (pydantic) check shapes and types: unknown fields are
   rejected (``extra="forbid"``), numbers must be finite, enums must be known values. The other
   seed's shorthand is normalised into the canonical body here (see :class:`JobRequest`).
   The API's routes take them as FastAPI request bodies; :func:`invalid_of` words pydantic's
   errors (FastAPI's, or :func:`parse_request` / :func:`parse_patch`'s) as an
   :class:`InvalidField` carrying an API field path.
2. :data:`JOB_SPEC` validates a body (or a parsed :class:`JobRequest`) into its Avro spec
   with a :class:`BuildContext` (``JOB_SPEC.validate_python(body, context=BuildContext(...))``):
   its validator, ``_in_context``, checks what needs the context (times against now, URL
   safety, the tenant's topic grants, the operator's registered commands) and semantics the
   types can't express (header syntax, sizes), assembles the Avro dict and runs
   ``streams.engine.spec.plan_of`` -- the engine's own validation, so the API can never
   accept a spec the engine would dead-letter. Domain errors (``PermanentError.field``) are
   translated into API field paths. :func:`build_spec` and :func:`spec_in` wrap it.
3. :func:`merge_patch` applies a JSON merge patch (RFC 7396) to the canonical form of an
   existing spec and re-runs 1 and 2 on the result.

Every ``InvalidField`` is a 422 for the caller. ``field`` is a dotted path into the request body
(``schedule.cron``, ``run_at``, ``target.headers.X-Api-Key``, ``metadata.owner``...).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError, PydanticKnownError

from kron.timefmt import iso
from streams.domain.commands import ENABLE_HINT, CommandRegistry
from streams.domain.dag import MAX_EDGES, MAX_TASKS, TASK_ID_PATTERN, TriggerRule, parse_dag
from streams.domain.errors import PermanentError
from streams.domain.schedule import OneOffSchedule, bounded_next_slot, parse_cron
from streams.domain.topics import TopicGrants
from streams.engine.spec import JobPlan, plan_of
from streams.guard import LEGACY_COMMAND
from streams.netguard import BLOCKED_HOSTNAMES, check_url, is_blocked_ip, parse_ip

__all__ = [
    "JOB_SPEC",
    "BuildContext",
    "CommandTargetIn",
    "DagIn",
    "DagTaskIn",
    "DstIn",
    "HttpTargetIn",
    "InvalidField",
    "JobPatch",
    "JobRequest",
    "KafkaTargetIn",
    "MisfireIn",
    "RetryIn",
    "ScheduleIn",
    "TargetPatch",
    "build_spec",
    "invalid_of",
    "iso",
    "merge_patch",
    "parse_patch",
    "parse_request",
    "parse_time",
    "request_of",
    "spec_fingerprint",
    "spec_in",
    "upcoming",
]

# --- limits -----------------------------------------------------------------------------------
# A CreateJob command must fit in one Kafka record (1 MiB by default) with room to spare; the
# variable-size parts below add up to well under that.
NAME_MAX = 200
IDEMPOTENCY_KEY_MAX = 200
CRON_MAX = 512  # streams.domain.cron.MAX_EXPR_LEN
TIMEZONE_MAX = 64
URL_MAX = 2048
HEADERS_MAX = 50
HEADER_NAME_MAX = 256
HEADER_VALUE_MAX = 8192
HEADERS_TOTAL_MAX = 32 * 1024
BODY_MAX = 256 * 1024  # bytes of UTF-8; also the Kafka target's value
KAFKA_KEY_MAX = 16 * 1024
ARGV_MAX = 256
ARGV_TOTAL_MAX = 64 * 1024
ENV_MAX = 100
ENV_TOTAL_MAX = 32 * 1024
PATH_MAX = 4096
IMAGE_MAX = 255
METADATA_MAX = 64
METADATA_KEY_MAX = 128
METADATA_VALUE_MAX = 1024
METADATA_TOTAL_MAX = 16 * 1024
PREVIEW_MAX = 100

_MS = timedelta(milliseconds=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_DAY_MS = 86_400_000

# RFC 7230 token: the only characters allowed in an HTTP header name.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
# A container image reference, loosely: registry/name[:tag][@digest]. No leading '-', so the
# image can't be read as an option by `docker run --rm IMAGE`.
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]*")
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_HOST_LABELS = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"(?P<offset>[Zz]|[+-]\d{2}:\d{2})?"
)

# Headers the worker sets on every attempt (streams/targets.py): a job can't override them.
_KRON_HEADERS = frozenset({"idempotency-key"})
_KRON_HEADER_PREFIX = "x-kron-"
# Framing and routing headers are the HTTP client's business; letting a job set them invites
# request smuggling (Content-Length vs body) or virtual-host games (Host).
_CLIENT_HEADERS = frozenset({
    "host", "content-length", "transfer-encoding", "connection", "keep-alive",
    "proxy-connection", "te", "trailer", "upgrade",
})
_KRON_ENV = frozenset({"KRON_EXEC_ID", "KRON_JOB_ID", "KRON_ATTEMPT", "KRON_SCHEDULED_FOR"})

# Names that can only mean "this host" or "this private network"; checked without DNS.
_LOCAL_HOSTNAMES = BLOCKED_HOSTNAMES | {
    "localhost.localdomain", "ip6-localhost", "ip6-loopback", "instance-data",
    "instance-data.ec2.internal",
}
_LOCAL_SUFFIXES = (".localhost", ".local", ".localdomain", ".internal", ".home.arpa", ".lan")

TargetType = Literal["http", "kafka", "command"]
HttpMethod = Literal["GET", "POST", "PUT", "PATCH", "DELETE"]
Concurrency = Literal["allow", "skip_if_running", "queue", "replace"]
# streams.domain.policies.Priority's values (a test holds them together).
PriorityIn = Literal["critical", "normal", "batch"]
# streams.domain.notify.NotifyEvent's values.
NotifyEventIn = Literal["failed", "missed"]
MisfireKindIn = Literal["fire_once", "fire_all", "skip_if_late_by"]
BackoffIn = Literal["exponential", "fixed"]
_TARGET_RECORDS: dict[str, str] = {
    "http": "kron.HttpTarget", "kafka": "kron.KafkaTarget",
    "command": "kron.RegisteredCommandTarget",
}


class InvalidField(Exception):
    """A request the API must refuse with 422.

    ``field`` is a dotted path into the request body, ``message`` says what is wrong in words a
    caller can act on. ``errors`` lists every problem found as ``(field, message)`` pairs (the
    first is ``(field, message)``); pydantic may report several at once.
    """

    def __init__(self, field: str, message: str, *,
                 errors: Sequence[tuple[str, str]] = (), kind: str = "invalid-input",
                 title: str | None = None) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        # A size limit has a problem type (and title) of its own so clients can tell which
        # limit they hit without parsing `detail`; everything else is plain invalid-input.
        self.kind = kind
        self.title = title
        self.errors: list[tuple[str, str]] = list(errors) or [(field, message)]


# The now-relative checks a BuildContext can ask for, by the request field they judge.
TIME_FIELDS = frozenset({"schedule", "run_at", "start_at", "end_at"})


@dataclass(frozen=True, kw_only=True, slots=True)
class BuildContext:
    """What the checks of a :class:`JobRequest` need beyond its body: the validation context
    of ``JOB_SPEC.validate_python(body, context=BuildContext(...))``.

    ``now_ms`` and ``times`` (which of :data:`TIME_FIELDS` to judge against now: all for a
    create, none for a replayed one, a patch's own) with ``past_skew_s`` and
    ``max_future_days`` bound the times; ``allow_private`` admits private URLs;
    ``topic_prefix``, ``tenant`` and ``topic_grants`` say which Kafka topics a job may
    publish to, ``commands`` (with ``tenant``) which registered commands it may run.
    """

    now_ms: int
    allow_private: bool
    past_skew_s: float = 60
    max_future_days: int = 3660
    topic_prefix: str = "kron"
    times: frozenset[str] = TIME_FIELDS
    tenant: str | None = None
    topic_grants: TopicGrants | None = None
    commands: CommandRegistry | None = None
    # KRON_DAG_MAX_TASKS / KRON_DAG_MAX_EDGES: at most the worker's own limits.
    dag_max_tasks: int = MAX_TASKS
    dag_max_edges: int = MAX_EDGES


# The type of a pydantic error that carries an InvalidField (see _in_context, invalid_of).
_INVALID_FIELD = "kron_invalid_field"
# A field's value in ValidationInfo.data once it failed its own validation.
_INVALID = object()


def _pydantic_error(exc: InvalidField) -> PydanticCustomError:
    """``exc`` as an error a validator can raise: the field, message, kind and title ride in
    its context, and :func:`invalid_of` makes the same InvalidField of it again."""
    return PydanticCustomError(_INVALID_FIELD, "{message}", {
        "field": exc.field, "message": exc.message, "kind": exc.kind, "title": exc.title})


# --- request models ---------------------------------------------------------------------------


class _Model(BaseModel):
    # strict: no "3" -> 3 or true -> 1 coercion; allow_inf_nan: NaN/Infinity are rejected in
    # every float field, which JSON parsers (Python's included) otherwise let through.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class ScheduleIn(_Model):
    """``{cron, timezone}`` or ``{run_at}``. A bare string is shorthand for ``{"cron": s}``.

    Every field is optional at this level so that the same model serves PATCH (change only the
    timezone); :func:`build_spec` demands exactly one of ``cron`` and ``run_at``. ``timezone``
    defaults to UTC.
    """

    cron: str | None = Field(default=None, max_length=CRON_MAX)
    timezone: str | None = Field(default=None, max_length=TIMEZONE_MAX)
    run_at: str | None = None


class HttpTargetIn(_Model):
    type: Literal["http"] = "http"
    method: HttpMethod = "POST"
    url: str = Field(max_length=URL_MAX)
    headers: dict[str, str] = Field(default_factory=dict)
    body: str | None = None
    timeout_s: float = 30.0

    @field_validator("method", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


class KafkaTargetIn(_Model):
    type: Literal["kafka"] = "kafka"
    topic: str
    key: str | None = None
    value: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)


class CommandTargetIn(_Model):
    """A command the operator registered (``KRON_COMMANDS_FILE``), named with its
    parameters: ``{"type": "command", "command": "reports.nightly", "args": {"day": "..."}}``.
    A job never names a program, an image or a working directory (``argv``, ``image`` and
    ``cwd`` are refused with a message that says so)."""

    type: Literal["command"] = "command"
    command: str | None = None
    args: dict[str, str] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    timeout_s: float | None = None
    # Accepted only to be refused by name (see _command_target): the old shape of a target.
    argv: list[str] | None = None
    image: str | None = None
    cwd: str | None = None


TargetIn = Annotated[HttpTargetIn | KafkaTargetIn | CommandTargetIn, Field(discriminator="type")]


_FAILED_ONLY: list[NotifyEventIn] = ["failed"]


class NotifyIn(_Model):
    """A job's failure alerts: the webhook kron POSTs a signed event to (checked as an HTTP
    target's URL is: the SSRF guard), and the outcomes that send one."""

    webhook: str = Field(max_length=URL_MAX)
    on: list[NotifyEventIn] = Field(default_factory=lambda: list(_FAILED_ONLY), max_length=8)


class NotifyPatch(_Model):
    webhook: str | None = Field(default=None, max_length=URL_MAX)
    on: list[NotifyEventIn] | None = Field(default=None, max_length=8)


class RetryIn(_Model):
    """Shorthand: ``max`` for ``max_attempts``; ``backoff: "exp"`` for ``exponential``."""

    max_attempts: int = 3
    backoff: BackoffIn = "exponential"
    base_s: float = 1.0
    max_s: float = 300.0

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        value = dict(value)
        if "max" in value:
            if "max_attempts" in value:
                raise ValueError("give retry.max_attempts or its shorthand retry.max, not both")
            value["max_attempts"] = value.pop("max")
        if value.get("backoff") == "exp":
            value["backoff"] = "exponential"
        return value


class MisfireIn(_Model):
    """A bare string is shorthand for ``{"kind": s}``."""

    kind: MisfireKindIn = "fire_once"
    late_by_s: float | None = None
    fire_all_cap: int = 100


class DstIn(_Model):
    nonexistent: Literal["skip", "shift_forward"] = "shift_forward"
    ambiguous: Literal["first", "last", "both"] = "first"


def _infer_target_type(value: Any) -> Any:
    """``{"url": ...}`` is http, ``{"command"|"argv"|"image": ...}`` command, ``{"topic": ...}``
    kafka."""
    if not isinstance(value, dict):
        return value
    kind = value.get("type")
    if isinstance(kind, str):
        return {**value, "type": kind.lower()}
    if kind is not None:
        return value
    if "url" in value:
        return {**value, "type": "http"}
    if "command" in value or "argv" in value or "image" in value:
        return {**value, "type": "command"}
    if "topic" in value:
        return {**value, "type": "kafka"}
    return value


def _schedule_shorthand(value: Any) -> Any:
    return {"cron": value} if isinstance(value, str) else value


def _misfire_shorthand(value: Any) -> Any:
    return {"kind": value} if isinstance(value, str) else value


class DagTaskIn(_Model):
    """One task of a DAG job: an ``id`` (``[a-z0-9][a-z0-9_.-]{0,63}``, unique in the DAG), a
    ``target`` as a job's own (shorthand included), the ids it ``depends_on``, its
    ``trigger_rule`` (Apache Airflow's: all_success, all_failed, all_done, one_success,
    one_failed, none_failed, always), and a ``retry`` policy and ``timeout_s`` of its own
    (null: the job's retry, the target's timeout). The ids, references, rules, policy and the
    graph are judged by ``streams.domain.dag.parse_dag``, as the engine judges them."""

    # Patterns and rules are parse_dag's to judge (with its messages); the schema shows them.
    id: str = Field(json_schema_extra={"pattern": f"^{TASK_ID_PATTERN}$"})
    target: Annotated[TargetIn, BeforeValidator(_infer_target_type)]
    depends_on: list[str] = Field(default_factory=list)
    trigger_rule: str = Field(default="all_success",
                              json_schema_extra={"enum": [r.value for r in TriggerRule]})
    retry: RetryIn | None = None
    timeout_s: float | None = None


class DagIn(_Model):
    """A DAG job's ``dag``: its tasks, released as their parents finish (at most
    ``streams.domain.dag.MAX_TASKS`` (500) tasks and ``MAX_EDGES`` (5,000) dependencies,
    without a cycle)."""

    tasks: list[DagTaskIn]


class JobRequest(_Model):
    """The body of ``POST /v1/jobs``.

    Canonical form::

        {"name": "nightly", "schedule": {"cron": "0 2 * * *", "timezone": "Europe/Berlin"},
         "target": {"type": "http", "method": "POST", "url": "https://...", "headers": {},
                    "body": "...", "timeout_s": 30},
         "retry": {"max_attempts": 3, "backoff": "exponential", "base_s": 1, "max_s": 300},
         "concurrency": "allow", "priority": "normal", "misfire": {"kind": "fire_once"},
         "dst": {"nonexistent": "shift_forward", "ambiguous": "first"},
         "jitter_s": 0, "start_at": null, "end_at": null, "lease_s": 60, "metadata": {},
         "idempotency_key": "..."}

    ``priority`` is the job's tier, ``critical``, ``normal`` or ``batch``: a worker calls the
    waiting attempts of a higher tier first (docs/semantics.md, Priority); a DAG's tasks take
    their job's.

    A one-off job gives ``run_at`` (RFC 3339 with an offset) instead of ``schedule``
    (``schedule: {"run_at": ...}`` is accepted too), and ``fire_now_if_past: true`` to accept a
    ``run_at`` already in the past (it then fires at once, subject to the misfire policy).

    A DAG job gives ``dag`` (:class:`DagIn`: ``{"tasks": [{"id", "target", "depends_on",
    "trigger_rule", "retry", "timeout_s"}, ...]}``) instead of ``target``; everything else is
    as for any job. Each task's target is checked as a job's target is, named by its place
    (``dag.tasks[2].target.url``).

    Shorthand accepted and normalised to the above:

    * ``"schedule": "0 2 * * *"`` -> ``{"cron": "0 2 * * *"}`` (timezone UTC);
    * a target without ``type``: ``url`` -> http, ``command`` -> command, ``topic`` -> kafka;
      ``method`` and ``type`` are case-insensitive;
    * ``"retry": {"max": 3, "backoff": "exp"}`` -> ``{"max_attempts": 3, "backoff":
      "exponential"}``;
    * ``"misfire": "fire_all"`` -> ``{"kind": "fire_all"}``.

    ``name`` is optional: without it the job is named after its target (``POST host/path``,
    ``kafka topic``, or the registered command's name); a DAG job is named ``dag:`` and its
    first task's id (``dag:ingest``).

    Validated as a :data:`JOB_SPEC` with a :class:`BuildContext` as its context, a request is
    also checked as :func:`build_spec` describes, and becomes its Avro spec.
    """

    name: str | None = Field(default=None, min_length=1, max_length=NAME_MAX)
    schedule: Annotated[ScheduleIn | None, BeforeValidator(_schedule_shorthand)] = None
    run_at: str | None = None
    fire_now_if_past: bool = False
    # dag before target: _target_or_dag, target's validator, reads dag's outcome.
    dag: DagIn | None = None
    target: Annotated[TargetIn | None, BeforeValidator(_infer_target_type)] = Field(
        default=None, validate_default=True)
    retry: RetryIn = Field(default_factory=RetryIn)
    concurrency: Concurrency = "allow"
    priority: PriorityIn = Field(default="normal", description=(
        "the job's tier: a worker calls waiting attempts of critical jobs before normal "
        "ones and normal before batch (a lower tier still gets 1 call in 16); a DAG's "
        "tasks take their job's"))
    misfire: Annotated[MisfireIn, BeforeValidator(_misfire_shorthand)] = Field(
        default_factory=MisfireIn)
    dst: DstIn = Field(default_factory=DstIn)
    jitter_s: float = 0.0
    start_at: str | None = None
    end_at: str | None = None
    lease_s: float = 60.0
    metadata: dict[str, str] = Field(default_factory=dict)
    notify: NotifyIn | None = Field(default=None, description=(
        "failure alerts: {webhook, on: [failed, missed]}; null: the tenant's default"))
    idempotency_key: str | None = Field(default=None, min_length=1,
                                        max_length=IDEMPOTENCY_KEY_MAX)

    # Exactly one of them (a null target is no target); see _target_or_dag.
    model_config = ConfigDict(json_schema_extra={
        "anyOf": [{"required": ["target"]}, {"required": ["dag"]}]})

    @field_validator("target", mode="after")
    @classmethod
    def _target_or_dag(cls, value: TargetIn | None, info: ValidationInfo) -> TargetIn | None:
        """A target or a dag: neither is a missing target, as when there were no DAG jobs;
        both, a refusal naming dag. A dag that failed its own validation (absent from
        ``info.data``) is neither: its own errors say what is wrong."""
        dag = info.data.get("dag", _INVALID)
        if value is None and dag is None:
            raise PydanticKnownError("missing")
        if value is not None and dag is not None and dag is not _INVALID:
            raise _pydantic_error(InvalidField("dag", "give either target or dag, not both"))
        return value

    @field_validator("name")
    @classmethod
    def _printable_name(cls, value: str | None) -> str | None:
        if value is not None and (not value.isprintable() or not value.strip()):
            raise ValueError("name must be printable text, not blank")
        return value

    @field_validator("idempotency_key")
    @classmethod
    def _printable_key(cls, value: str | None) -> str | None:
        if value is not None and not value.isprintable():
            raise ValueError("idempotency_key must be printable characters")
        return value


class TargetPatch(_Model):
    """Any subset of a target's fields. Without ``type`` (or with the current one) the fields
    are merged into the current target; a different ``type`` replaces the target outright."""

    type: TargetType | None = None
    method: str | None = None
    url: str | None = None
    headers: dict[str, str | None] | None = None
    body: str | None = None
    timeout_s: float | None = None
    topic: str | None = None
    key: str | None = None
    value: str | None = None
    command: str | None = None
    args: dict[str, str | None] | None = None
    env: dict[str, str | None] | None = None
    argv: list[str] | None = None
    cwd: str | None = None
    image: str | None = None

    @field_validator("type", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value


class JobPatch(_Model):
    """The body of ``PATCH /v1/jobs/{id}``: a JSON merge patch (RFC 7396) over the canonical
    :class:`JobRequest` form of the job. Absent fields are kept, ``null`` resets a field to its
    default (removes it from a map), objects are merged key by key. Shorthand as for
    :class:`JobRequest`; a bare-string ``schedule`` changes only the cron expression. A
    ``dag`` replaces the job's whole DAG (its ``tasks`` is a list: RFC 7396 replaces lists);
    a job switches between ``target`` and ``dag`` with the other one set to ``null`` in the
    same patch."""

    name: str | None = None
    schedule: Annotated[ScheduleIn | None, BeforeValidator(_schedule_shorthand)] = None
    run_at: str | None = None
    fire_now_if_past: bool = False
    target: Annotated[TargetPatch | None, BeforeValidator(_infer_target_type)] = None
    dag: DagIn | None = None
    retry: RetryIn | None = None
    concurrency: Concurrency | None = None
    priority: PriorityIn | None = None
    misfire: Annotated[MisfireIn | None, BeforeValidator(_misfire_shorthand)] = None
    dst: DstIn | None = None
    jitter_s: float | None = None
    start_at: str | None = None
    end_at: str | None = None
    lease_s: float | None = None
    metadata: dict[str, str | None] | None = None
    notify: NotifyPatch | None = None


# --- pydantic errors -> InvalidField ---------------------------------------------------------

_NESTED_FIELDS: dict[str, list[str]] = {
    "schedule": list(ScheduleIn.model_fields),
    "retry": [*RetryIn.model_fields, "max"],
    "misfire": list(MisfireIn.model_fields),
    "dst": list(DstIn.model_fields),
    "notify": list(NotifyIn.model_fields),
    "target": list(TargetPatch.model_fields),
    "dag": list(DagIn.model_fields),
    "dag.tasks": list(DagTaskIn.model_fields),
    "dag.tasks.target": list(TargetPatch.model_fields),
    "dag.tasks.retry": [*RetryIn.model_fields, "max"],
}
_INDEX = re.compile(r"\[\d+\]")
_TASK_TARGET = re.compile(r"dag\.tasks\[\d+\]\.target")


def _path(loc: Sequence[int | str]) -> str:
    """A pydantic location as an API field path. A discriminated union puts the tag into the
    location: target.http.url -> target.url. Under ``dag`` a list index is written as
    ``streams.domain.dag`` writes it, dag.tasks[2].id; elsewhere as before, a part."""
    path = ""
    for i, part in enumerate(loc):
        if i and loc[i - 1] == "target" and part in _TARGET_RECORDS:
            continue
        if isinstance(part, int) and loc[0] == "dag":
            path += f"[{part}]"
        else:
            path += f".{_printable(str(part))}" if i else _printable(str(part))
    return path or "body"


def _message(err: Mapping[str, Any], path: str, top: Sequence[str]) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        parent, _, name = path.rpartition(".")
        known = _NESTED_FIELDS.get(_INDEX.sub("", parent), []) if parent else list(top)
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {(parent + '.' if parent else '') + close[0]!r}?" if close else ""
        return f"unknown field {path!r}{hint}"
    if kind == "missing":
        return f"{path} is required"
    if kind == "union_tag_not_found":
        return (f"{path}.type is required (http, kafka or command) unless the target has a "
                "url, topic or command")
    if kind == "finite_number":
        return f"{path} must be a finite number (NaN and Infinity are not allowed)"
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{path}: {msg}"


def _pair(err: Mapping[str, Any], top: Sequence[str]) -> tuple[str, str]:
    if err["type"] == _INVALID_FIELD:  # a check with a context, named as it named itself
        return err["ctx"]["field"], err["ctx"]["message"]
    path = _path(err["loc"])
    return path, _message(err, path, top)


def invalid_of(errors: Sequence[Mapping[str, Any]], model: type[BaseModel]) -> InvalidField:
    """pydantic's errors for a body of ``model`` (locations relative to the body) as one
    :class:`InvalidField`: the API field path and a message a caller can act on. Used for
    :func:`parse_request` and for the 422 FastAPI's body parsing gives (api/problems.py)."""
    # A typo ("nmae") also makes the real field missing; the unknown name is the better lead.
    ordered = sorted(errors, key=lambda e: e["type"] != "extra_forbidden")
    top = list(model.model_fields)
    pairs = [_pair(e, top) for e in ordered]
    first = ordered[0]
    if first["type"] == _INVALID_FIELD:
        ctx = first["ctx"]
        return InvalidField(pairs[0][0], pairs[0][1], errors=pairs, kind=ctx["kind"],
                            title=ctx["title"])
    return InvalidField(pairs[0][0], pairs[0][1], errors=pairs)


# The request bodies whose pydantic errors read as invalid_of words them.
BODY_MODELS: tuple[type[BaseModel], ...] = (JobRequest, JobPatch)


def parse_request(body: Any) -> JobRequest:
    """Validate a decoded JSON body as a :class:`JobRequest`; raises :class:`InvalidField`."""
    try:
        return JobRequest.model_validate(body)
    except ValidationError as exc:
        raise invalid_of(exc.errors(include_url=False), JobRequest) from None


def spec_in(body: Any, context: BuildContext) -> dict[str, Any]:
    """The Avro JobSpec of a decoded JSON body, or of a :class:`JobRequest` (FastAPI's: only
    the checks that need ``context`` run again), validated as a :data:`JOB_SPEC`; raises
    :class:`InvalidField`."""
    try:
        spec: dict[str, Any] = JOB_SPEC.validate_python(body, context=context)
    except ValidationError as exc:
        raise invalid_of(exc.errors(include_url=False), JobRequest) from None
    return spec


def parse_patch(body: Any) -> JobPatch:
    """Validate a decoded JSON body as a :class:`JobPatch`; raises :class:`InvalidField`."""
    try:
        return JobPatch.model_validate(body)
    except ValidationError as exc:
        raise invalid_of(exc.errors(include_url=False), JobPatch) from None


# --- time -------------------------------------------------------------------------------------


def parse_time(value: str, field: str) -> int:
    """RFC 3339 date-time WITH a UTC offset (``Z`` or ``+01:00``) -> epoch milliseconds.

    A naive time is refused rather than guessed: the server's zone is an accident of
    deployment. Sub-millisecond digits are truncated.
    """
    example = "e.g. 2026-11-30T09:00:00Z or 2026-11-30T10:00:00+01:00"
    if not isinstance(value, str):
        raise InvalidField(field, f"{field} must be an RFC 3339 string, {example}")
    m = _RFC3339.fullmatch(value)
    if m is None:
        raise InvalidField(field, f"{field} {value!r} is not an RFC 3339 date-time; {example}")
    if m["offset"] is None:
        raise InvalidField(field, f"{field} {value!r} has no UTC offset; add 'Z' or '+hh:mm', "
                                  f"{example}")
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    micro = int((m.group(7) or "").ljust(6, "0")[:6])
    off = m["offset"]
    try:
        if off in ("Z", "z"):
            tz = UTC
        else:
            oh, om = int(off[1:3]), int(off[4:6])
            if oh > 23 or om > 59:
                raise ValueError(f"offset {off} is out of range")
            sign = -1 if off[0] == "-" else 1
            tz = timezone(sign * timedelta(hours=oh, minutes=om))
        t = datetime(year, month, day, hour, minute, second, micro, tzinfo=tz)
    except ValueError as exc:
        raise InvalidField(field, f"{field} {value!r} is not a valid date-time: {exc}") from None
    return (t - _EPOCH) // _MS


# --- spec building ----------------------------------------------------------------------------


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _utf8(text: str, field: str) -> bytes:
    # surrogateescape round-trips bytes that are not UTF-8 (a body written by another service,
    # shown by request_of) back into the same bytes.
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise InvalidField(field, f"{field} is not valid Unicode text") from None


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", "surrogateescape")


def _check_host(host: str, field: str) -> None:
    """Private hosts recognisable without DNS: names, and IPs in any encoding."""
    host = host.rstrip(".").lower()
    if host in _LOCAL_HOSTNAMES or host.endswith(_LOCAL_SUFFIXES):
        raise InvalidField(field, f"{field} host {host!r} is a private name")
    ip = parse_ip(host)
    if ip is not None:
        if is_blocked_ip(ip):
            raise InvalidField(field, f"{field} host {host!r} is a private, loopback, "
                                      f"link-local or otherwise non-public address")
        return
    if "." not in host:
        # A single label ("db", "metadata") resolves through the search domains: internal.
        raise InvalidField(field, f"{field} host {host!r} is a single-label (internal) name")


def _check_url(url: str, allow_private: bool, base: str = "target",
               field: str | None = None) -> None:
    field = field or f"{base}.url"
    if any(c.isspace() or not c.isprintable() or c == "\\" for c in url):
        raise InvalidField(field, f"{field} must not contain whitespace, control characters "
                                  f"or backslashes")
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError on a bad port
    except ValueError as exc:
        raise InvalidField(field, f"{field} {url!r} is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise InvalidField(field, f"{field} must be an http:// or https:// URL; got "
                                  f"{parts.scheme + ':' if parts.scheme else 'no scheme'}")
    if not parts.hostname:
        raise InvalidField(field, f"{field} {url!r} has no host")
    if parts.username is not None or parts.password is not None:
        # Parsers disagree on '@' (a classic SSRF trick) and the URL is stored and shown.
        where = (f"send them in {base}.headers (e.g. Authorization)" if field.endswith(".url")
                 else "the X-Kron-Signature header authenticates kron to it")
        raise InvalidField(field, f"{field} must not hold credentials; {where}")
    try:
        check_url(url, allow_private=allow_private, resolve=False)
    except PermanentError as exc:
        raise InvalidField(field, _under(base, exc.message)) from None
    host = parts.hostname
    if ":" in host:  # an IPv6 literal; urlsplit has checked its syntax
        ascii_host = host
    else:
        try:
            # IDNA folds look-alikes ("①②⑦。0。0。1" -> "127.0.0.1") the way resolvers would.
            ascii_host = host.encode("idna").decode("ascii").lower()
        except UnicodeError:
            raise InvalidField(field, f"{field} host {host!r} is not a valid host name") from None
        if parse_ip(ascii_host) is None and not _HOST_LABELS.fullmatch(ascii_host.rstrip(".")):
            raise InvalidField(field, f"{field} host {host!r} is not a valid host name")
    if not allow_private:
        _check_host(ascii_host, field)
        if host != ascii_host:  # the same name passes the same checks
            _check_host(host, field)


def _check_headers(headers: Mapping[str, str], *, http: bool,
                   base: str = "target") -> dict[str, str]:
    field = f"{base}.headers"
    if len(headers) > HEADERS_MAX:
        raise InvalidField(field, f"{field} has {len(headers)} entries; at most {HEADERS_MAX}",
                           kind="target-headers-too-many", title="Too many target headers")
    total = sum(len(k) + len(v) for k, v in headers.items())
    if total > HEADERS_TOTAL_MAX:
        raise InvalidField(field, f"{field} total {total} characters; at most "
                                  f"{HEADERS_TOTAL_MAX}",
                           kind="target-headers-too-large", title="Target headers too large")
    seen: set[str] = set()
    for name, value in headers.items():
        where = f"{field}.{_printable(name)}"
        if any(c in f"{name}{value}" for c in "\r\n\x00"):
            raise InvalidField(where, f"header {_printable(name)!r}: names and values can't "
                                      f"contain CR, LF or NUL")
        if not name:
            raise InvalidField(where, "header names can't be empty")
        if len(name) > HEADER_NAME_MAX or len(value) > HEADER_VALUE_MAX:
            raise InvalidField(where, f"header names are limited to {HEADER_NAME_MAX} and "
                                      f"values to {HEADER_VALUE_MAX} characters",
                               kind="target-header-too-long", title="Target header too long")
        lower = name.lower()
        if lower in seen:
            raise InvalidField(where, f"duplicate header {name!r} (names are case-insensitive)")
        seen.add(lower)
        if lower in _KRON_HEADERS or lower.startswith(_KRON_HEADER_PREFIX):
            raise InvalidField(where, f"header {name!r} is set by kron on every attempt")
        if not http:
            continue
        if not _TOKEN.fullmatch(name):
            raise InvalidField(where, f"header name {name!r} is not an RFC 7230 token")
        if any((ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F for c in value):
            raise InvalidField(where, f"header {name!r}: value holds control characters")
        if not value.isascii():
            raise InvalidField(where, f"header {name!r}: value must be ASCII")
        if lower in _CLIENT_HEADERS:
            raise InvalidField(where, f"header {name!r} is managed by the HTTP client")
    return dict(headers)


def _string_map(values: Mapping[str, str], field: str, *, max_entries: int, key_max: int,
                value_max: int, total_max: int) -> dict[str, str]:
    if len(values) > max_entries:
        raise InvalidField(field, f"{field} has {len(values)} entries; at most {max_entries}")
    total = sum(len(k) + len(v) for k, v in values.items())
    if total > total_max:
        raise InvalidField(field, f"{field} holds {total} characters; at most {total_max}")
    for key, value in values.items():
        where = f"{field}.{_printable(key)}"
        if not key or len(key) > key_max or not key.isprintable():
            raise InvalidField(where, f"{field} keys must be 1..{key_max} printable characters")
        if len(value) > value_max or "\x00" in value:
            raise InvalidField(where, f"{where} must be at most {value_max} characters, "
                                      f"without NUL")
    return dict(values)


def _under(base: str, message: str) -> str:
    """A message about a job's target (``target.url ...``, ``target host ...``), from the
    domain or the registry, about the target at ``base`` instead (a DAG task's)."""
    if base != "target" and message.startswith(("target.", "target ")):
        return base + message[len("target"):]
    return message


def _domain_error(exc: PermanentError, base: str, default: str) -> InvalidField:
    """A PermanentError about a job's target (its field ``target.*``, or ``default``) as
    the InvalidField of the target at ``base``."""
    field = exc.field or default
    if field.startswith("target"):
        field = base + field[len("target"):]
    return InvalidField(field, _under(base, exc.message))


def _http_target(t: HttpTargetIn, allow_private: bool,
                 base: str = "target") -> tuple[str, dict[str, Any]]:
    _check_url(t.url, allow_private, base)
    field = f"{base}.body"
    body = None if t.body is None else _utf8(t.body, field)
    if body is not None and len(body) > BODY_MAX:
        raise InvalidField(field, f"{field} is {len(body)} bytes; at most {BODY_MAX}",
                           kind="target-body-too-large", title="Target body too large")
    return "kron.HttpTarget", {
        "method": t.method, "url": t.url,
        "headers": _check_headers(t.headers, http=True, base=base),
        "body": body, "timeout_s": float(t.timeout_s),
    }


def _kafka_target(t: KafkaTargetIn, topic_prefix: str, tenant: str | None = None,
                  grants: TopicGrants | None = None,
                  base: str = "target") -> tuple[str, dict[str, Any]]:
    field = f"{base}.topic"
    if not _TOPIC.fullmatch(t.topic) or t.topic in (".", ".."):
        raise InvalidField(field, f"{field} {t.topic!r} is not a valid Kafka topic name "
                                  f"(1..249 of A-Z a-z 0-9 . _ -)")
    reserved = (f"{topic_prefix}.", f"{topic_prefix}-", "__") if topic_prefix else ("__",)
    if t.topic.startswith(reserved):
        raise InvalidField(field, f"{field} {t.topic!r} is an internal topic")
    if tenant is not None and grants is not None:
        try:  # the tenant's own <tenant>.* topics and what KRON_KAFKA_TARGET_TOPICS grants
            grants.check(tenant, t.topic)
        except PermanentError as exc:
            raise _domain_error(exc, base, field) from None
    key_field, value_field = f"{base}.key", f"{base}.value"
    key = None if t.key is None else _utf8(t.key, key_field)
    value = None if t.value is None else _utf8(t.value, value_field)
    if key is not None and len(key) > KAFKA_KEY_MAX:
        raise InvalidField(key_field, f"{key_field} is {len(key)} bytes; at most "
                                      f"{KAFKA_KEY_MAX}")
    if value is not None and len(value) > BODY_MAX:
        raise InvalidField(value_field, f"{value_field} is {len(value)} bytes; at most "
                                        f"{BODY_MAX}",
                           kind="target-body-too-large", title="Target body too large")
    return "kron.KafkaTarget", {"topic": t.topic, "key": key, "value": value,
                                "headers": _check_headers(t.headers, http=False, base=base)}


def _command_target(t: CommandTargetIn, tenant: str | None, commands: CommandRegistry | None,
                    base: str = "target") -> tuple[str, dict[str, Any]]:
    for legacy in ("argv", "image", "cwd"):
        if getattr(t, legacy) is not None:
            raise InvalidField(f"{base}.{legacy}", f"{base}.{legacy}: {LEGACY_COMMAND}")
    field = f"{base}.command"
    if not t.command:
        raise InvalidField(field, f"{field} must name a command the operator registered "
                                  f"({ENABLE_HINT})")
    target = {"command": t.command, "args": dict(t.args), "env": dict(t.env),
              "timeout_s": None if t.timeout_s is None else float(t.timeout_s)}
    try:
        (commands or CommandRegistry()).resolve(tenant or "", target)
    except PermanentError as exc:
        raise _domain_error(exc, base, field) from None
    return "kron.RegisteredCommandTarget", target


def _default_name(kind: str, target: Mapping[str, Any]) -> str:
    if kind == "kron.DagTarget":
        return f"dag:{target['tasks'][0]['id']}"  # a checked id: [a-z0-9][a-z0-9_.-]{0,63}
    if kind == "kron.HttpTarget":
        parts = urlsplit(target["url"])
        name = f"{target['method']} {parts.hostname}{parts.path}"
    elif kind == "kron.KafkaTarget":
        name = f"kafka {target['topic']}"
    else:
        name = target["command"]
    name = _printable(name)[:NAME_MAX]
    return name if name.strip() else "job"


def _api_field(field: str | None, run_at_path: str) -> str:
    """A domain/engine ``PermanentError.field`` as a path into the request body."""
    if field is None:
        return "body"
    if field in ("schedule.run_at_ms", "run_at"):
        return run_at_path
    if field == "overlap":
        return "concurrency"
    return field


def build_spec(
    req: JobRequest,
    *,
    now_ms: int,
    allow_private: bool,
    past_skew_s: float = 60,
    max_future_days: int = 3660,
    topic_prefix: str = "kron",
    check_times: bool = True,
    tenant: str | None = None,
    topic_grants: TopicGrants | None = None,
    commands: CommandRegistry | None = None,
    dag_max_tasks: int = MAX_TASKS,
    dag_max_edges: int = MAX_EDGES,
) -> dict[str, Any]:
    """The Avro ``kron.JobSpec`` for a request, validated; raises :class:`InvalidField`.

    :func:`spec_in` with the :class:`BuildContext` of these arguments (``check_times`` is
    ``times``: all of :data:`TIME_FIELDS` or none), for a request parsed without one.

    Every JobSpec field is present; unions are ``(record_name, dict)`` tuples and times epoch
    milliseconds, so the dict can go straight into ``schemas.codec.encode``. The result has
    passed ``streams.engine.spec.plan_of``.

    Mapping choices:

    * ``concurrency`` is the spec's ``overlap``; ``misfire`` as a string is ``{"kind": s}``.
    * the cron expression is stored whitespace-normalised (as the domain evaluates it), the
      timezone defaults to UTC.
    * strings for ``body``/``key``/``value`` become UTF-8 bytes.
    * a command target names a command of ``commands`` (the operator's registry) granted to
      ``tenant``, with parameters that match its declarations; without a registry, command
      targets are refused.
    * a missing ``name`` is derived from the target.

    Time checks relative to ``now_ms`` (``check_times=False`` skips them, e.g. to fingerprint a
    replayed idempotent request whose ``run_at`` has since passed): ``run_at`` not more than
    ``past_skew_s`` in the past unless ``fire_now_if_past``, ``run_at``/``start_at`` at most
    ``max_future_days`` ahead, ``end_at`` not in the past, and at least one run inside
    ``start_at``..``end_at``.

    ``allow_private`` permits targets on private networks. Without it, URLs whose host is a
    private/loopback/link-local/metadata address in any encoding, or an obviously local name,
    are refused; other names are NOT resolved here (the worker re-checks DNS at send time).
    Kafka targets may not publish to kron's own topics (``{topic_prefix}.*``,
    ``{topic_prefix}-*``) or Kafka's (``__*``); with ``tenant`` and ``topic_grants``, only to
    the topics ``topic_grants`` allows the tenant (streams/domain/topics.py).
    """
    return spec_in(req, BuildContext(
        now_ms=now_ms, allow_private=allow_private, past_skew_s=past_skew_s,
        max_future_days=max_future_days, topic_prefix=topic_prefix,
        times=TIME_FIELDS if check_times else frozenset(), tenant=tenant,
        topic_grants=topic_grants, commands=commands, dag_max_tasks=dag_max_tasks,
        dag_max_edges=dag_max_edges))


def _check_unicode(value: Any, path: str) -> None:
    """Python strings may hold unpaired surrogates (JSON "\\ud800"), which Avro can't encode."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidField(path, f"{path} is not valid Unicode text (unpaired "
                                     f"surrogate)") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{_printable(str(key))}"
            _check_unicode(key, where)
            _check_unicode(item, where)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_unicode(item, f"{path}[{i}]" if path.startswith("dag") else f"{path}.{i}")


# What _check_text leaves to _utf8: a target's body, key and value, a DAG task's included.
_BYTES = {"body", "key", "value"}
_NOT_TEXT: dict[str, Any] = {"target": _BYTES}
_NOT_TEXT_DAG: dict[str, Any] = {"dag": {"tasks": {"__all__": {"target": _BYTES}}}}


def _check_text(req: JobRequest) -> None:
    """Every string but the targets' body/key/value (bytes, through surrogateescape: see
    _utf8) must be text Avro can encode."""
    raw = req.model_dump(exclude=_NOT_TEXT if req.dag is None else _NOT_TEXT_DAG)
    try:
        orjson.dumps(raw)  # fast path (the walk below is ~10% of a create): orjson refuses
    except orjson.JSONEncodeError:  # unpaired surrogates; the walk then names the field
        for key, value in raw.items():
            _check_unicode(value, key)


def _schedule_of(req: JobRequest) -> tuple[tuple[str, dict[str, Any]], int | None, str]:
    """The spec's schedule, the one-off's run_at (ms) and the field that gave it: exactly one
    of schedule.cron, schedule.run_at and run_at."""
    sched = req.schedule
    run_at_text, run_at_path = req.run_at, "run_at"
    if sched is not None and req.run_at is not None:
        raise InvalidField("run_at", "give either schedule or run_at, not both")
    if sched is not None and sched.run_at is not None:
        if sched.cron is not None or sched.timezone is not None:
            field = "schedule.cron" if sched.cron is not None else "schedule.timezone"
            raise InvalidField(field, "schedule takes either cron (with timezone) or run_at")
        run_at_text, run_at_path = sched.run_at, "schedule.run_at"
    if run_at_text is not None:
        run_at_ms = parse_time(run_at_text, run_at_path)
        return ("kron.OneOffSchedule", {"run_at_ms": run_at_ms}), run_at_ms, run_at_path
    if sched is not None and sched.cron is not None:
        try:
            cron = parse_cron(sched.cron, "UTC" if sched.timezone is None else sched.timezone)
        except PermanentError as exc:
            raise InvalidField(_api_field(exc.field, run_at_path), exc.message) from None
        return ("kron.CronSchedule", {"expr": cron.expr, "timezone": cron.timezone}), None, \
            run_at_path
    if sched is not None:
        raise InvalidField("schedule.cron", "schedule.cron is required (or give run_at for a "
                                            "one-off job)")
    raise InvalidField("schedule", "a schedule is required: schedule.cron (e.g. "
                                   "'0 2 * * *') or run_at for a one-off job")


def _target_of(t: TargetIn, ctx: BuildContext, base: str = "target"
               ) -> tuple[str, dict[str, Any]]:
    """The Avro target of a job's ``target`` (or of the one at ``base``, a DAG task's)."""
    if isinstance(t, HttpTargetIn):
        return _http_target(t, ctx.allow_private, base)
    if isinstance(t, KafkaTargetIn):
        return _kafka_target(t, ctx.topic_prefix, ctx.tenant, ctx.topic_grants, base)
    return _command_target(t, ctx.tenant, ctx.commands, base)


def _retry_of(retry: RetryIn) -> dict[str, Any]:
    return {"max_attempts": retry.max_attempts, "backoff": retry.backoff,
            "base_s": float(retry.base_s), "max_s": float(retry.max_s)}


def _dag_of(dag: DagIn, ctx: BuildContext) -> tuple[str, dict[str, Any]]:
    """The Avro kron.DagTarget of a ``dag``. Its structure first, as the engine judges it
    (parse_dag: ids, references, limits, trigger rules, task policies, cycles), so that a
    graph it refuses costs no target checks; then each task's target as a job's own."""
    tasks: list[dict[str, Any]] = [
        {"id": t.id, "target": None, "depends_on": list(t.depends_on),
         "trigger_rule": t.trigger_rule,
         "retry": None if t.retry is None else _retry_of(t.retry),
         "timeout_s": None if t.timeout_s is None else float(t.timeout_s)}
        for t in dag.tasks]
    try:
        parse_dag({"tasks": tasks}, max_tasks=ctx.dag_max_tasks, max_edges=ctx.dag_max_edges)
    except PermanentError as exc:
        raise InvalidField(exc.field or "dag", exc.message) from None
    for i, (task, t) in enumerate(zip(tasks, dag.tasks, strict=True)):
        task["target"] = _target_of(t.target, ctx, f"dag.tasks[{i}].target")
    return "kron.DagTarget", {"tasks": tasks}


def _spec_of(req: JobRequest, ctx: BuildContext) -> dict[str, Any]:
    """The Avro JobSpec of a request judged in ``ctx`` (JOB_SPEC's validator)."""
    _check_text(req)
    schedule, run_at_ms, run_at_path = _schedule_of(req)
    start_at_ms = None if req.start_at is None else parse_time(req.start_at, "start_at")
    end_at_ms = None if req.end_at is None else parse_time(req.end_at, "end_at")
    _check_instants(run_at_ms, start_at_ms, end_at_ms, ctx=ctx, run_at_path=run_at_path,
                    fire_now_if_past=req.fire_now_if_past)
    if req.target is not None:
        target = _target_of(req.target, ctx)
    else:
        assert req.dag is not None  # JobRequest._target_or_dag
        target = _dag_of(req.dag, ctx)
    metadata = _string_map(req.metadata, "metadata", max_entries=METADATA_MAX,
                           key_max=METADATA_KEY_MAX, value_max=METADATA_VALUE_MAX,
                           total_max=METADATA_TOTAL_MAX)
    misfire = req.misfire
    spec: dict[str, Any] = {
        "name": req.name if req.name is not None else _default_name(*target),
        "schedule": schedule,
        "target": target,
        "retry": _retry_of(req.retry),
        "overlap": req.concurrency,
        "misfire": {"kind": misfire.kind,
                    "late_by_s": (None if misfire.late_by_s is None
                                  else float(misfire.late_by_s)),
                    "fire_all_cap": misfire.fire_all_cap},
        "dst": {"nonexistent": req.dst.nonexistent, "ambiguous": req.dst.ambiguous},
        "jitter_s": float(req.jitter_s),
        "start_at_ms": start_at_ms,
        "end_at_ms": end_at_ms,
        "lease_s": float(req.lease_s),
        "metadata": metadata,
        "priority": req.priority,
        "notify": _notify_of(req.notify, ctx),
    }
    try:
        plan = plan_of(spec)
    except PermanentError as exc:
        field = _api_field(exc.field, run_at_path)
        task = _TASK_TARGET.match(field)  # the engine names a task's field, not its message
        raise InvalidField(field, _under(task.group(), exc.message) if task else exc.message
                           ) from None
    if ctx.times:
        _check_window(plan, now_ms=ctx.now_ms, run_at_path=run_at_path)
    return spec


def _notify_of(notify: NotifyIn | None, ctx: BuildContext) -> dict[str, Any] | None:
    """The Avro kron.Notify: its webhook judged as an HTTP target's URL (SSRF guard), its
    events once each, in the enum's order."""
    if notify is None:
        return None
    _check_url(notify.webhook, ctx.allow_private, "notify", field="notify.webhook")
    return {"webhook": notify.webhook,
            "on": [e for e in get_args(NotifyEventIn) if e in notify.on]}


def _in_context(req: JobRequest, info: ValidationInfo) -> dict[str, Any]:
    """JOB_SPEC's validator: the checks that need the validation's :class:`BuildContext`,
    after JobRequest's own; their InvalidField rides out in a pydantic error."""
    context = info.context
    if not isinstance(context, BuildContext):
        raise TypeError("JOB_SPEC is validated with a BuildContext as its context")
    try:
        return _spec_of(req, context)
    except InvalidField as exc:
        raise _pydantic_error(exc) from None


# A request validated into its Avro JobSpec: ``JOB_SPEC.validate_python(body,
# context=BuildContext(...))`` checks the body as a JobRequest (a JobRequest instance passes
# as it is), then as _spec_of does with the context, and returns the spec (a dict).
JOB_SPEC: TypeAdapter[Any] = TypeAdapter(Annotated[JobRequest, AfterValidator(_in_context)])


def _check_instants(run_at: int | None, start: int | None, end: int | None, *,
                    ctx: BuildContext, run_at_path: str, fire_now_if_past: bool) -> None:
    """The now-relative checks on the times ``ctx.times`` names (all, none, or a patch's)."""
    times, max_future_days = ctx.times, ctx.max_future_days
    horizon_ms = ctx.now_ms + max_future_days * _DAY_MS
    oldest_ms = ctx.now_ms - ctx.past_skew_s * 1000
    far = f"more than {max_future_days} days ahead; check the date (seconds vs milliseconds?)"
    if run_at is not None and "run_at" in times:
        if run_at < oldest_ms and not fire_now_if_past:
            raise InvalidField(run_at_path, f"{run_at_path} {iso(run_at)} is in the past; set "
                                            f"fire_now_if_past to run it at once")
        if run_at > horizon_ms:
            raise InvalidField(run_at_path, f"{run_at_path} {iso(run_at)} is {far}")
    if start is not None and "start_at" in times and start > horizon_ms:
        raise InvalidField("start_at", f"start_at {iso(start)} is {far}")
    if end is not None and "end_at" in times and end < oldest_ms:
        raise InvalidField("end_at", f"end_at {iso(end)} is in the past; the job would never run")


def _check_window(plan: JobPlan, *, now_ms: int, run_at_path: str) -> None:
    """At least one run between start_at and end_at."""
    schedule, start, end = plan.schedule, plan.start_at_ms, plan.end_at_ms
    if isinstance(schedule, OneOffSchedule):
        at = schedule.run_at_ms
        if (start is not None and at < start) or (end is not None and at > end):
            raise InvalidField(run_at_path, f"{run_at_path} {iso(at)} is outside "
                                            f"start_at..end_at; the job would never run")
    elif end is not None and bounded_next_slot(schedule, after_ms=now_ms - 1, dst=plan.dst,
                                               start_at_ms=start, end_at_ms=end) is None:
        raise InvalidField("end_at", "no run of schedule.cron falls between now/start_at and "
                                     "end_at; the job would never run")


# --- canonical form, patches ------------------------------------------------------------------


def request_of(spec: Mapping[str, Any]) -> dict[str, Any]:
    """An Avro JobSpec in the canonical request form (inverse of :func:`build_spec`).

    One-offs come back as top-level ``run_at``; times as :func:`iso` strings; bytes as text
    (bytes that aren't UTF-8 via ``surrogateescape``, which :func:`build_spec` reverses).
    Absent times are omitted. Also usable as the ``spec`` part of a GET response.
    """
    out: dict[str, Any] = {"name": spec["name"]}
    sched_name, sched = _tagged(spec["schedule"], "expr", "kron.CronSchedule",
                                "kron.OneOffSchedule")
    if sched_name == "kron.CronSchedule":
        out["schedule"] = {"cron": sched["expr"], "timezone": sched.get("timezone") or "UTC"}
    else:
        out["run_at"] = iso(sched["run_at_ms"])
    kind, t = _target_kind(spec["target"])
    if kind == "kron.DagTarget":
        out["dag"] = {"tasks": [_task_request(task) for task in t["tasks"]]}
    else:
        out["target"] = _target_request(kind, t)
    retry, mis, dst = spec["retry"], spec["misfire"], spec["dst"]
    out["retry"] = {k: retry[k] for k in _RETRY_KEYS}
    out["concurrency"] = spec["overlap"]
    out["priority"] = spec.get("priority") or "normal"  # a spec from before v4 has none
    out["misfire"] = {"kind": mis["kind"], "late_by_s": mis.get("late_by_s"),
                      "fire_all_cap": mis.get("fire_all_cap", 100)}
    out["dst"] = {"nonexistent": dst["nonexistent"], "ambiguous": dst["ambiguous"]}
    out["jitter_s"] = spec.get("jitter_s", 0.0)
    for key in ("start_at", "end_at"):
        if spec.get(f"{key}_ms") is not None:
            out[key] = iso(spec[f"{key}_ms"])
    out["lease_s"] = spec.get("lease_s", 60.0)
    out["metadata"] = dict(spec.get("metadata") or {})
    if spec.get("notify") is not None:  # absent before v5, and null by default
        out["notify"] = {"webhook": spec["notify"]["webhook"], "on": list(spec["notify"]["on"])}
    return out


def _target_kind(value: Any) -> tuple[str, dict[str, Any]]:
    """The record name and record of a spec's target, a union value either way the codec and
    the callers give it: a ``(name, record)`` tuple or the record alone."""
    if isinstance(value, tuple):
        return value[0], value[1]
    kind = ("kron.HttpTarget" if "url" in value else
            "kron.RegisteredCommandTarget" if "command" in value else
            "kron.CommandTarget" if "argv" in value else
            "kron.DagTarget" if "tasks" in value else "kron.KafkaTarget")
    return kind, value


def _target_request(kind: str, t: Mapping[str, Any]) -> dict[str, Any]:
    if kind == "kron.HttpTarget":
        return {"type": "http", "method": t.get("method", "POST"), "url": t["url"],
                "headers": dict(t.get("headers") or {}), "body": _text(t.get("body")),
                "timeout_s": t.get("timeout_s", 30.0)}
    if kind == "kron.KafkaTarget":
        return {"type": "kafka", "topic": t["topic"], "key": _text(t.get("key")),
                "value": _text(t.get("value")), "headers": dict(t.get("headers") or {})}
    if kind == "kron.RegisteredCommandTarget":
        return {"type": "command", "command": t["command"], "args": dict(t.get("args") or {}),
                "env": dict(t.get("env") or {}), "timeout_s": t.get("timeout_s")}
    # written before commands were registered; shown as it is, never run again
    return {"type": "command", "argv": list(t["argv"]), "env": dict(t.get("env") or {}),
            "cwd": t.get("cwd"), "timeout_s": t.get("timeout_s", 300.0), "image": t.get("image")}


def _task_request(task: Mapping[str, Any]) -> dict[str, Any]:
    """A DAG task of a spec in the request form (every field, nulls included)."""
    retry = task.get("retry")
    return {"id": task["id"], "target": _target_request(*_target_kind(task["target"])),
            "depends_on": list(task.get("depends_on") or ()),
            "trigger_rule": task.get("trigger_rule") or "all_success",
            "retry": None if retry is None else {k: retry[k] for k in _RETRY_KEYS},
            "timeout_s": task.get("timeout_s")}


_RETRY_KEYS = ("max_attempts", "backoff", "base_s", "max_s")


def _tagged(value: Any, probe: str, with_probe: str,
            without: str | None) -> tuple[str | None, dict[str, Any]]:
    if isinstance(value, tuple):
        return value[0], value[1]
    return (with_probe if probe in value else without), value


def _merge(base: Any, patch: Any) -> Any:
    """RFC 7396: objects merge key by key, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    out = dict(base) if isinstance(base, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


def _patch_schedule(merged: dict[str, Any], changes: dict[str, Any]) -> None:
    """A patch's schedule or run_at into ``merged`` (both taken out of ``changes``)."""
    if changes.get("schedule") is not None and changes.get("run_at") is not None:
        raise InvalidField("run_at", "give either schedule or run_at, not both")
    if "schedule" in changes:
        new_sched = changes.pop("schedule")
        if new_sched is None:
            merged.pop("schedule", None)
        elif new_sched.get("run_at") is not None or "run_at" in merged:
            # A change of kind: the patch's schedule is the whole schedule.
            merged.pop("run_at", None)
            merged["schedule"] = {k: v for k, v in new_sched.items() if v is not None}
        else:
            merged["schedule"] = _merge(merged.get("schedule"), new_sched)
    if "run_at" in changes:
        run_at = changes.pop("run_at")
        merged.pop("run_at", None)
        if run_at is not None:
            merged.pop("schedule", None)
            merged["run_at"] = run_at


def _patch_dag(base: dict[str, Any], merged: dict[str, Any], changes: dict[str, Any]) -> None:
    """A patch's dag, the whole DAG, into ``merged``; on a job with a target only together
    with ``"target": null``."""
    if "dag" not in changes:
        return
    new_dag = changes.pop("dag")
    if new_dag is None:
        merged.pop("dag", None)
        return
    if "target" in base and not ("target" in changes and changes["target"] is None):
        raise InvalidField("dag", 'this job has a target; to make it a DAG job, give '
                                  '"target": null with the dag')
    merged["dag"] = new_dag


def _patch_target(base: dict[str, Any], merged: dict[str, Any],
                  changes: dict[str, Any]) -> None:
    """A patch's target into ``merged``: merged into the job's own, or the whole target if
    of another type or if the job had none (a DAG job, only together with ``"dag": null``)."""
    if "target" not in changes:
        return
    new_target = changes.pop("target")
    if new_target is None:
        merged.pop("target", None)
    elif "target" not in base:
        if "dag" in merged:
            raise InvalidField("target", 'this job is a DAG job; to give it a target instead, '
                                         'give "dag": null with the target')
        merged["target"] = {k: v for k, v in new_target.items() if v is not None}
    elif new_target.get("type", base["target"]["type"]) != base["target"]["type"]:
        merged["target"] = {k: v for k, v in new_target.items() if v is not None}
    else:
        merged["target"] = _merge(base["target"], new_target)


def merge_patch(
    existing_spec: Mapping[str, Any],
    patch: JobPatch,
    *,
    now_ms: int,
    allow_private: bool,
    past_skew_s: float = 60,
    max_future_days: int = 3660,
    topic_prefix: str = "kron",
    tenant: str | None = None,
    topic_grants: TopicGrants | None = None,
    commands: CommandRegistry | None = None,
    dag_max_tasks: int = MAX_TASKS,
    dag_max_edges: int = MAX_EDGES,
) -> dict[str, Any]:
    """The spec after ``patch`` (a JSON merge patch over :func:`request_of` of the existing
    spec), fully re-validated by :func:`build_spec`; raises :class:`InvalidField`.

    Beyond plain RFC 7396:

    * a ``target`` with a different ``type`` replaces the target instead of merging into it;
    * ``run_at`` (or ``schedule.run_at``) replaces a cron schedule and ``schedule.cron``
      replaces a one-off; ``schedule.timezone`` alone keeps the cron expression;
    * changing ``misfire.kind`` away from ``skip_if_late_by`` drops ``late_by_s``;
    * the now-relative time checks apply only to the times the patch touches, so renaming a job
      whose one-off already ran, or whose ``end_at`` has passed, still works;
    * ``dag`` replaces the whole DAG; a job becomes a DAG job with ``"target": null`` and a
      ``dag``, and a DAG job a plain one with ``"dag": null`` and a (whole) ``target``. Either
      without the other's null is refused, naming the field given.
    """
    base = request_of(existing_spec)
    changes = patch.model_dump(exclude_unset=True, exclude={"fire_now_if_past"})
    merged = dict(base)
    _patch_schedule(merged, changes)
    _patch_dag(base, merged, changes)
    _patch_target(base, merged, changes)
    if changes.get("misfire") is not None:
        new_mis = changes.pop("misfire")
        mis = _merge(base["misfire"], new_mis)
        if mis.get("kind") != "skip_if_late_by" and "late_by_s" not in new_mis:
            mis.pop("late_by_s", None)
        merged["misfire"] = mis
    merged = _merge(merged, changes)
    merged["fire_now_if_past"] = patch.fire_now_if_past

    touched: set[str] = set()
    if {"schedule", "run_at"} & patch.model_fields_set:
        touched |= {"schedule", "run_at"}
    touched |= {"start_at", "end_at"} & patch.model_fields_set
    return spec_in(merged, BuildContext(
        now_ms=now_ms, allow_private=allow_private, past_skew_s=past_skew_s,
        max_future_days=max_future_days, topic_prefix=topic_prefix, times=frozenset(touched),
        tenant=tenant, topic_grants=topic_grants, commands=commands,
        dag_max_tasks=dag_max_tasks, dag_max_edges=dag_max_edges))


# --- fingerprint, preview ---------------------------------------------------------------------


def _canonical(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str)
            and isinstance(value[1], Mapping)):
        return {"$union": value[0], "value": _canonical(value[1])}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return {"$bytes": bytes(value).hex()}
    if isinstance(value, float) and value.is_integer():
        return int(value)  # 60 and 60.0 are the same double in Avro
    if value is None or isinstance(value, str | int | float):
        return value
    raise TypeError(f"not a JobSpec value: {type(value).__name__}")


def spec_fingerprint(spec: Mapping[str, Any]) -> str:
    """A stable SHA-256 (hex) of a JobSpec as :func:`build_spec` returns it.

    Independent of dict key order; unions, bytes and integral floats have one canonical
    representation each. Two requests that normalise to the same spec (shorthand vs canonical,
    ``"get"`` vs ``"GET"``, cron whitespace) share a fingerprint; any change to the spec
    changes it. Use it to tell a replayed idempotent create (same fingerprint) from a reused
    idempotency key with a different body (422).

    A normal ``priority`` (the default) is left out, so that a spec keeps the fingerprint it
    had before JobSpec had a priority (v4): the views keep fingerprints across the upgrade.
    """
    if spec.get("priority", "normal") == "normal":
        spec = {k: v for k, v in spec.items() if k != "priority"}
    if spec.get("notify") is None:  # likewise across v5
        spec = {k: v for k, v in spec.items() if k != "notify"}
    text = json.dumps(_canonical(spec), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(b"kron.JobSpec/v1\n" + text.encode("utf-8", "surrogatepass")).hexdigest()


def upcoming(spec: Mapping[str, Any], *, now_ms: int, count: int = 5) -> list[int]:
    """The next ``count`` run times (epoch ms) at or after ``now_ms``, as the engine would arm
    them: DST policy and ``start_at``..``end_at`` honoured, jitter not applied (it depends on
    the job id). A one-off gives ``[run_at]`` (even when past: it fires once armed) unless it
    lies outside ``start_at``..``end_at``. Raises ``PermanentError`` for an invalid spec."""
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= PREVIEW_MAX:
        raise InvalidField("count", f"count must be an integer in 0..{PREVIEW_MAX}")
    plan = plan_of(dict(spec))
    if count == 0:
        return []
    if isinstance(plan.schedule, OneOffSchedule):
        at = plan.schedule.run_at_ms
        if ((plan.start_at_ms is not None and at < plan.start_at_ms)
                or (plan.end_at_ms is not None and at > plan.end_at_ms)):
            return []
        return [at]
    out: list[int] = []
    after = now_ms - 1  # as the engine arms a new job: a slot exactly at now is due
    while len(out) < count:
        slot = bounded_next_slot(plan.schedule, after_ms=after, dst=plan.dst,
                                 start_at_ms=plan.start_at_ms, end_at_ms=plan.end_at_ms)
        if slot is None:
            break
        out.append(slot.scheduled_for_ms)
        after = slot.scheduled_for_ms
    return out
