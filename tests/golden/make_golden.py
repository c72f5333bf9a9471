"""Write golden encodings for every schema version that does not have them yet.

Run from the repository root:  .venv/bin/python -m tests.golden.make_golden

For each ``schemas/avro/<name>.v<N>.avsc`` it writes, next to this file:

* ``<name>.v<N>.hex``  - one single-object-encoded event per line, hex;
* ``<name>.v<N>.json`` - what those events decode to with exactly that schema version.

Existing golden files are never rewritten (files are opened with mode "x"): they are the proof
that bytes written by old producers stay readable, so regenerating them would prove nothing.
Adding a schema version means adding its samples to ``SAMPLES`` below and running this once.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from schemas.codec import Codec
from schemas.envelope import make_envelope
from schemas.registry import SchemaEntry, SchemaRegistry, default_registry

GOLDEN_DIR = Path(__file__).resolve().parent

Record = dict[str, Any]

T0 = 1_700_000_000_000  # 2023-11-14T22:13:20Z
LONG_MAX = 2**63 - 1
LONG_MIN = -(2**63)
INT_MAX = 2**31 - 1
INT_MIN = -(2**31)


def golden_paths(name: str, version: int, directory: Path = GOLDEN_DIR) -> tuple[Path, Path]:
    stem = f"{name}.v{version}"
    return directory / f"{stem}.hex", directory / f"{stem}.json"


def to_jsonable(value: Any) -> Any:
    """Decoded record -> JSON value; bytes and tagged union branches get explicit wrappers."""
    if isinstance(value, bytes):
        return {"$bytes": value.hex()}
    if isinstance(value, tuple):
        branch, inner = value
        return {"$union": branch, "value": to_jsonable(inner)}
    if isinstance(value, dict):
        return {key: to_jsonable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [to_jsonable(item) for item in value]
    return value


# --- samples: a full and a minimal record per schema, exercising every union branch -------------


def _env(event_type: str, n: int = 1, *, full: bool = True) -> Record:
    if not full:
        return dict(
            make_envelope(
                event_id=f"evt-{n:04d}", event_type=event_type, occurred_at_ms=T0, tenant="t"
            )
        )
    return dict(
        make_envelope(
            event_id=f"0b9f6c1e-5a4e-4f7e-9a7c-{n:012d}",
            event_type=event_type,
            occurred_at_ms=T0 + n,
            tenant="acme-ünïcødé",
            causation_id=f"cause-{n}",
            correlation_id=f"corr-{n}",
            producer="kron-scheduler-0",
        )
    )


SPEC_HTTP_FULL: Record = {
    "name": "nightly report ☕",
    "schedule": ("kron.CronSchedule", {"expr": "0 3 * * MON-FRI", "timezone": "Europe/Berlin"}),
    "target": (
        "kron.HttpTarget",
        {
            "method": "PUT",
            "url": "https://example.com/hooks/report?x=1",
            "headers": {"content-type": "application/json", "x-kron": "1"},
            "body": b'{"ok":true}\x00\xff',
            "timeout_s": 12.5,
        },
    ),
    "retry": {"max_attempts": 7, "backoff": "fixed", "base_s": 0.25, "max_s": 60.0},
    "overlap": "skip_if_running",
    "misfire": {"kind": "skip_if_late_by", "late_by_s": 90.0, "fire_all_cap": 5},
    "dst": {"nonexistent": "skip", "ambiguous": "both"},
    "jitter_s": 2.5,
    "start_at_ms": T0,
    "end_at_ms": T0 + 86_400_000,
    "lease_s": 120.0,
    "metadata": {"owner": "data-team", "tier": "gold"},
}
SPEC_KAFKA_MIN: Record = {
    "name": "once",
    "schedule": ("kron.OneOffSchedule", {"run_at_ms": T0 + 5_000}),
    "target": ("kron.KafkaTarget", {"topic": "reports.requested"}),
}
SPEC_COMMAND: Record = {
    "name": "cleanup",
    "schedule": ("kron.CronSchedule", {"expr": "*/5 * * * *"}),
    "target": (
        "kron.CommandTarget",
        {
            "argv": ["/usr/bin/env", "bash", "-c", "echo 'hi'"],
            "env": {"LANG": "C.UTF-8"},
            "cwd": "/srv",
            "timeout_s": 600.0,
            "image": "ghcr.io/acme/cleanup:1.2",
        },
    ),
    "misfire": {"kind": "fire_all", "late_by_s": None, "fire_all_cap": INT_MAX},
    "overlap": "replace",
}
# v2 of the job commands and JobState: a command target names an operator-registered program.
SPEC_REGISTERED: Record = {
    "name": "nightly",
    "schedule": ("kron.CronSchedule", {"expr": "0 2 * * *", "timezone": "Asia/Kolkata"}),
    "target": (
        "kron.RegisteredCommandTarget",
        {"command": "reports.nightly", "args": {"day": "2026-12-01"},
         "env": {"REPORT_FORMAT": "csv"}, "timeout_s": 600.0},
    ),
}
SPEC_REGISTERED_MIN: Record = {
    **SPEC_REGISTERED,
    "target": ("kron.RegisteredCommandTarget", {"command": "x"}),
}
SPEC_KAFKA_FULL: Record = {
    **SPEC_KAFKA_MIN,
    "target": (
        "kron.KafkaTarget",
        {"topic": "t", "key": b"job-1", "value": b"", "headers": {"h": ""}},
    ),
    "overlap": "queue",
}


def _command(event_type: str, n: int, *, full: bool, **extra: Any) -> Record:
    return {
        "envelope": _env(event_type, n, full=full),
        "command_id": f"cmd-{n}",
        "job_id": f"job-{n}",
        **extra,
    }


def _simple_commands(event_type: str) -> list[Record]:
    return [_command(event_type, 1, full=True), _command(event_type, 2, full=False)]


def _exec(event_type: str, n: int, *, full: bool, **extra: Any) -> Record:
    base: Record = {
        "envelope": _env(event_type, n, full=full),
        "exec_id": f"exec-{n}",
        "job_id": f"job-{n}",
        "scheduled_for_ms": T0 + 60_000 * n,
    }
    if full:
        base["owner_epoch"] = 3 + n
    return {**base, **extra}


def _attempt(n: int, *, done: bool) -> Record:
    return {
        "attempt": n,
        "fencing_token": 1000 + n,
        "worker": f"worker-{n}",
        "started_at_ms": T0 + n,
        "finished_at_ms": T0 + n + 500 if done else None,
        "outcome": "failed" if done else None,
        "status_code": 503 if done else None,
        "error": "upstream 503" if done else None,
    }


def _v1_samples() -> dict[str, list[Record]]:
    return {
        "kron.commands.CreateJob": [
            _command(
                "job.create_requested", 1, full=True, idempotency_key="idem-1", spec=SPEC_HTTP_FULL
            ),
            _command("job.create_requested", 2, full=False, spec=SPEC_KAFKA_MIN),
            _command("job.create_requested", 3, full=True, spec=SPEC_COMMAND),
        ],
        "kron.commands.UpdateJob": [
            _command(
                "job.update_requested", 1, full=True, spec=SPEC_KAFKA_FULL, expected_version=INT_MAX
            ),
            _command("job.update_requested", 2, full=False, spec=SPEC_COMMAND),
        ],
        "kron.commands.PauseJob": _simple_commands("job.pause_requested"),
        "kron.commands.ResumeJob": _simple_commands("job.resume_requested"),
        "kron.commands.DeleteJob": _simple_commands("job.delete_requested"),
        "kron.commands.TriggerJob": _simple_commands("job.trigger_requested"),
        "kron.commands.BackfillJob": [
            _command(
                "job.backfill_requested",
                1,
                full=True,
                from_ms=LONG_MIN,
                to_ms=LONG_MAX,
                max_per_s=0.5,
            ),
            _command("job.backfill_requested", 2, full=False, from_ms=T0, to_ms=T0 + 1),
        ],
        "kron.state.JobState": [
            {
                "envelope": _env("job.updated", 1),
                "job_id": "job-1",
                "version": 4,
                "status": "active",
                "spec": SPEC_HTTP_FULL,
                "created_at_ms": T0,
                "updated_at_ms": T0 + 10,
                "next_run_at_ms": T0 + 3_600_000,
                "cursor_ms": T0,
                "applied_command_ids": ["cmd-1", "cmd-2", "cmd-3"],
                "idempotency_key": "idem-1",
                "owner_epoch": 9,
                "running": ["exec-1"],
                "queued_slot_ms": T0 + 60_000,
            },
            {
                "envelope": _env("job.deleted", 2, full=False),
                "job_id": "job-2",
                "version": 1,
                "status": "deleted",
                "spec": SPEC_KAFKA_MIN,
                "created_at_ms": 0,
                "updated_at_ms": 0,
                "next_run_at_ms": None,
                "cursor_ms": None,
            },
        ],
        "kron.executions.ExecutionQueued": [
            _exec(
                "execution.queued",
                1,
                full=True,
                trigger="misfire",
                due_at_ms=T0 + 7,
                dst_outcome="shifted_forward",
                coalesced_slots=12,
            ),
            _exec("execution.queued", 2, full=False, trigger="schedule", due_at_ms=T0),
        ],
        "kron.executions.ExecutionStarted": [
            _exec(
                "execution.started",
                1,
                full=True,
                attempt=1,
                fencing_token=LONG_MAX,
                worker="wörker-1",
                lease_until_ms=T0 + 60_000,
            ),
            _exec(
                "execution.started",
                2,
                full=False,
                attempt=INT_MAX,
                fencing_token=0,
                worker="w",
                lease_until_ms=-1,
            ),
        ],
        "kron.executions.ExecutionHeartbeat": [
            _exec(
                "execution.heartbeat",
                1,
                full=True,
                attempt=2,
                fencing_token=42,
                lease_until_ms=T0 + 90_000,
            ),
            _exec(
                "execution.heartbeat", 2, full=False, attempt=1, fencing_token=1, lease_until_ms=T0
            ),
        ],
        "kron.executions.ExecutionSucceeded": [
            _exec(
                "execution.succeeded",
                1,
                full=True,
                attempt=1,
                fencing_token=42,
                started_at_ms=T0,
                finished_at_ms=T0 + 1234,
                status_code=204,
                response_excerpt='{"ok": true}',
            ),
            _exec(
                "execution.succeeded",
                2,
                full=False,
                attempt=3,
                fencing_token=43,
                started_at_ms=T0,
                finished_at_ms=T0,
            ),
        ],
        "kron.executions.AttemptsFinished": [
            {
                "envelope": make_envelope(
                    event_id="attempts-1", event_type="execution.attempts_finished",
                    occurred_at_ms=T0, tenant="", producer="worker-1",
                ),
                "results": [
                    {"exec_id": "e1", "job_id": "j1", "scheduled_for_ms": T0, "attempt": 1,
                     "fencing_token": 1, "ok": True, "started_at_ms": T0,
                     "finished_at_ms": T0 + 12, "status_code": 200, "error_class": None,
                     "error": None, "retry_after_s": None, "response_excerpt": "ok"},
                    {"exec_id": "e2", "job_id": "j2", "scheduled_for_ms": LONG_MAX,
                     "attempt": INT_MAX, "fencing_token": LONG_MAX, "ok": False,
                     "started_at_ms": None, "finished_at_ms": T0, "status_code": 429,
                     "error_class": "transient", "error": "slow down",
                     "retry_after_s": 2.5, "response_excerpt": None},
                ],
            },
            {
                "envelope": make_envelope(
                    event_id="attempts-2", event_type="execution.attempts_finished",
                    occurred_at_ms=T0, tenant="",
                ),
                "results": [],
            },
        ],
        "kron.executions.ExecutionFailed": [
            _exec(
                "execution.failed",
                1,
                full=True,
                attempt=3,
                fencing_token=44,
                error_class="lease_expired",
                error="worker vanished",
                final=True,
                started_at_ms=T0,
                finished_at_ms=T0 + 60_000,
                status_code=None,
                retry_after_s=2.5,
            ),
            _exec(
                "execution.failed",
                2,
                full=False,
                attempt=1,
                fencing_token=45,
                error_class="transient",
                error="",
                final=False,
                finished_at_ms=T0,
            ),
            _exec(
                "execution.failed",
                3,
                full=True,
                attempt=1,
                fencing_token=46,
                error_class="permanent",
                error="404 Not Found",
                final=True,
                started_at_ms=None,
                finished_at_ms=T0,
                status_code=404,
            ),
        ],
        "kron.executions.ExecutionRetryScheduled": [
            _exec(
                "execution.retry_scheduled",
                1,
                full=True,
                attempt=1,
                next_attempt=2,
                retry_at_ms=T0 + 2_000,
                error="timeout after 30s",
            ),
            _exec(
                "execution.retry_scheduled",
                2,
                full=False,
                attempt=2,
                next_attempt=3,
                retry_at_ms=T0,
                error="x",
            ),
        ],
        "kron.executions.ExecutionSkipped": [
            _exec("execution.skipped", 1, full=True, reason="overlap:skip_if_running"),
            _exec("execution.skipped", 2, full=False, reason="dst:nonexistent"),
        ],
        "kron.executions.ExecutionMissed": [
            _exec("execution.missed", 1, full=True, reason="late by 120s > 90s"),
            _exec("execution.missed", 2, full=False, reason=""),
        ],
        "kron.executions.TriggerSuppressed": [
            _exec("trigger.suppressed", 1, full=True, reason="duplicate slot"),
            _exec("trigger.suppressed", 2, full=False, reason="duplicate manual trigger"),
        ],
        "kron.executions.ExecutionState": [
            _exec(
                "execution.retry_scheduled",
                1,
                full=True,
                state="retry_pending",
                trigger="backfill",
                attempt=2,
                fencing_token=1002,
                due_at_ms=T0 + 5,
                worker=None,
                lease_until_ms=None,
                retry_at_ms=T0 + 9_000,
                dst_outcome="ambiguous:first",
                reason=None,
                last_error="upstream 503",
                status_code=503,
                attempts=[_attempt(1, done=True), _attempt(2, done=False)],
                created_at_ms=T0,
                updated_at_ms=T0 + 9,
            ),
            _exec(
                "execution.queued",
                2,
                full=False,
                state="queued",
                trigger="manual",
                attempt=0,
                fencing_token=0,
                due_at_ms=T0,
                worker=None,
                lease_until_ms=None,
                retry_at_ms=None,
                dst_outcome=None,
                reason=None,
                last_error=None,
                status_code=None,
                created_at_ms=T0,
                updated_at_ms=T0,
            ),
        ],
        "kron.engine.Tick": [
            {"envelope": _env("engine.ticked", 1), "partition": 0, "now_ms": T0},
            {
                "envelope": _env("engine.ticked", 2, full=False),
                "partition": INT_MAX,
                "now_ms": LONG_MAX,
            },
        ],
        "kron.engine.CircuitOpened": [
            {
                "envelope": _env("circuit.opened", 1),
                "host": "api.example.com",
                "until_ms": T0 + 30_000,
                "failure_ratio": 0.75,
            },
            {
                "envelope": _env("circuit.opened", 2, full=False),
                "host": "[::1]:8080",
                "until_ms": T0,
                "failure_ratio": 1.0,
            },
        ],
        "kron.engine.CircuitClosed": [
            {"envelope": _env("circuit.closed", 1), "host": "api.example.com"},
            {"envelope": _env("circuit.closed", 2, full=False), "host": ""},
        ],
        "kron.deadletter.DeadLetter": [
            {
                "envelope": _env("message.dead_lettered", 1),
                "source_topic": "kron.commands",
                "source_partition": 7,
                "source_offset": LONG_MAX,
                "key": b"job-1",
                "value": b"\xc3\x01garbage",
                "error": "DecodeError: unknown_fingerprint",
                "error_class": "decode",
            },
            {
                "envelope": _env("message.dead_lettered", 2, full=False),
                "source_topic": "kron.jobs",
                "source_partition": 0,
                "source_offset": 0,
                "key": None,
                "value": None,
                "error": "tombstone",
                "error_class": "handler",
            },
        ],
    }


def _v2_job_samples() -> dict[tuple[str, int], list[Record]]:
    """v2 adds kron.RegisteredCommandTarget to the target union: v1's samples again (v2 writes
    every v1 record alike) and one of each with a registered command, full and minimal."""
    v1 = _v1_samples()
    out: dict[tuple[str, int], list[Record]] = {}
    for name in ("kron.commands.CreateJob", "kron.commands.UpdateJob", "kron.state.JobState"):
        extra = [{**v1[name][0], "spec": SPEC_REGISTERED},
                 {**v1[name][-1], "spec": SPEC_REGISTERED_MIN}]
        out[(name, 2)] = [*v1[name], *extra]
    out[("kron.commands.CreateJobs", 2)] = [
        {"envelope": _env("job.create_many_requested", 1), "command_id": "cmd-1",
         "jobs": [{"job_id": "job-1", "idempotency_key": "idem-1", "spec": SPEC_REGISTERED},
                  {"job_id": "job-2", "idempotency_key": None, "spec": SPEC_REGISTERED_MIN},
                  {"job_id": "job-3", "idempotency_key": None, "spec": SPEC_COMMAND}]},
    ]
    return out


# v3 adds kron.DagTarget: a workflow of tasks, each with its own target (any but a raw argv).
SPEC_DAG: Record = {
    **SPEC_HTTP_FULL,
    "name": "settlement",
    "target": ("kron.DagTarget", {"tasks": [
        {"id": "ingest", "target": ("kron.HttpTarget", {"url": "https://example.com/ingest"})},
        {"id": "fx", "target": ("kron.KafkaTarget", {"topic": "acme.fx", "key": b"k"}),
         "timeout_s": 5.0},
        {"id": "reconcile", "target": ("kron.RegisteredCommandTarget", {"command": "recon"}),
         "depends_on": ["ingest", "fx"], "trigger_rule": "all_success",
         "retry": {"max_attempts": 5, "backoff": "exponential", "base_s": 10.0, "max_s": 300.0}},
        {"id": "cleanup", "target": ("kron.HttpTarget", {"url": "https://example.com/c"}),
         "depends_on": ["reconcile"], "trigger_rule": "all_done"},
    ]}),
}
SPEC_DAG_MIN: Record = {
    **SPEC_KAFKA_MIN,
    "target": ("kron.DagTarget", {"tasks": [
        {"id": "a", "target": ("kron.KafkaTarget", {"topic": "t.a"})}]}),
}


def _v3_job_samples() -> dict[tuple[str, int], list[Record]]:
    """v3 (kron.DagTarget in the target union): v2's samples again and a DAG job, full and
    minimal."""
    v2 = _v2_job_samples()
    out: dict[tuple[str, int], list[Record]] = {}
    for name in ("kron.commands.CreateJob", "kron.commands.UpdateJob", "kron.state.JobState"):
        records = v2[(name, 2)]
        out[(name, 3)] = [*records, {**records[0], "spec": SPEC_DAG},
                          {**records[-1], "spec": SPEC_DAG_MIN}]
    out[("kron.commands.CreateJobs", 3)] = [
        {"envelope": _env("job.create_many_requested", 1), "command_id": "cmd-1",
         "jobs": [{"job_id": "job-1", "idempotency_key": "idem-1", "spec": SPEC_DAG},
                  {"job_id": "job-2", "idempotency_key": None, "spec": SPEC_DAG_MIN},
                  {"job_id": "job-3", "idempotency_key": None, "spec": SPEC_REGISTERED}]},
    ]
    return out


# v4 adds JobSpec.priority (enum kron.Priority, default normal): a job's tier.
SPEC_PRIORITY_FULL: Record = {**SPEC_HTTP_FULL, "priority": "critical"}


def _v4_job_samples() -> dict[tuple[str, int], list[Record]]:
    """v4 (JobSpec.priority): v3's samples again (they read as normal) and one job of each
    other tier, full and minimal, a DAG job among them."""
    v3 = _v3_job_samples()
    out: dict[tuple[str, int], list[Record]] = {}
    for name in ("kron.commands.CreateJob", "kron.commands.UpdateJob", "kron.state.JobState"):
        records = v3[(name, 3)]
        out[(name, 4)] = [*records, {**records[0], "spec": SPEC_PRIORITY_FULL},
                          {**records[-1], "spec": {**SPEC_DAG_MIN, "priority": "batch"}}]
    out[("kron.commands.CreateJobs", 4)] = [
        *v3[("kron.commands.CreateJobs", 3)],
        {"envelope": _env("job.create_many_requested", 2), "command_id": "cmd-2",
         "jobs": [{"job_id": "job-4", "idempotency_key": "idem-4", "spec": SPEC_PRIORITY_FULL},
                  {"job_id": "job-5", "idempotency_key": None,
                   "spec": {**SPEC_KAFKA_MIN, "priority": "batch"}},
                  {"job_id": "job-6", "idempotency_key": None,
                   "spec": {**SPEC_DAG, "priority": "normal"}}]},
    ]
    return out


# v5 adds JobSpec.notify (null, or kron.Notify {webhook, on}): where a job's failure alerts go.
SPEC_NOTIFY_FULL: Record = {**SPEC_PRIORITY_FULL, "notify": {
    "webhook": "https://hooks.example.com/kron?team=data", "on": ["failed", "missed"]}}


def _v5_job_samples() -> dict[tuple[str, int], list[Record]]:
    """v5 (JobSpec.notify): v4's samples again (they read as notify null) and a job that
    notifies on both events, one on failures only, full and minimal."""
    v4 = _v4_job_samples()
    out: dict[tuple[str, int], list[Record]] = {}
    failed_only = {"webhook": "http://10.0.0.1/a", "on": ["failed"]}
    for name in ("kron.commands.CreateJob", "kron.commands.UpdateJob", "kron.state.JobState"):
        records = v4[(name, 4)]
        out[(name, 5)] = [*records, {**records[0], "spec": SPEC_NOTIFY_FULL},
                          {**records[-1], "spec": {**SPEC_DAG_MIN, "notify": failed_only}}]
    out[("kron.commands.CreateJobs", 5)] = [
        *v4[("kron.commands.CreateJobs", 4)],
        {"envelope": _env("job.create_many_requested", 3), "command_id": "cmd-3",
         "jobs": [{"job_id": "job-7", "idempotency_key": "idem-7", "spec": SPEC_NOTIFY_FULL},
                  {"job_id": "job-8", "idempotency_key": None,
                   "spec": {**SPEC_KAFKA_MIN, "notify": {"webhook": "https://h.example/",
                                                         "on": []}}}]},
    ]
    return out


def _task_progress(task_id: str, state: str, **counts: int) -> Record:
    return {"task_id": task_id, "state": state, "pending": counts.get("pending", 0),
            "succeeded": counts.get("succeeded", 0), "failed": counts.get("failed", 0),
            "skipped": counts.get("skipped", 0), "reason": None}


def _v2_execution_samples() -> list[Record]:
    """v2 of ExecutionState: a DAG run's progress, and a task instance's run and task ids."""
    v1 = _v1_samples()["kron.executions.ExecutionState"]
    run = {**v1[1], "state": "running", "dag": {"tasks": [
        _task_progress("ingest", "succeeded"),
        _task_progress("fx", "failed"),
        {**_task_progress("reconcile", "upstream_failed", failed=1, succeeded=1),
         "reason": "trigger rule all_success: a parent failed"},
        _task_progress("cleanup", "running", failed=1),
        _task_progress("later", "pending", pending=1),
        _task_progress("x", "skipped", skipped=2),
        _task_progress("y", "cancelled"),
    ]}}
    task = {**v1[0], "run_id": "exec-2", "task_id": "fx", "dag": None}
    return [*v1, run, task]


# Outputs as targets give them back (streams.output): an HTTP status line and body start with
# multi-byte text, a command's tail with a replacement character and control bytes, a Kafka
# record's place.
OUTPUT_HTTP = 'HTTP/1.1 503 Service Unavailable\n{"error": "überlastet", "retry": true}'
OUTPUT_COMMAND = "\ufffd row 9 of 9\n\x1b[31merror\x1b[0m: disk full\r\n\x00"
OUTPUT_KAFKA = "topic team.events partition 3 offset 41"


def _output_report_samples() -> dict[tuple[str, int], list[Record]]:
    """v2 of the attempt reports: `output` (the lone success's and the batched result's
    replaces `response_excerpt`, which the core never kept)."""
    v1 = _v1_samples()
    succeeded = v1["kron.executions.ExecutionSucceeded"]
    full = {k: v for k, v in succeeded[0].items() if k != "response_excerpt"}
    batch = v1["kron.executions.AttemptsFinished"]
    results = [{k: v for k, v in r.items() if k != "response_excerpt"}
               for r in batch[0]["results"]]
    failed = v1["kron.executions.ExecutionFailed"]
    return {
        ("kron.executions.ExecutionSucceeded", 2): [
            {**full, "output": OUTPUT_KAFKA}, succeeded[1]],
        ("kron.executions.ExecutionFailed", 2): [
            {**failed[0], "output": OUTPUT_COMMAND}, failed[1],
            {**failed[2], "output": OUTPUT_HTTP}],
        ("kron.executions.AttemptsFinished", 2): [
            {**batch[0], "results": [{**results[0], "output": "HTTP/1.1 200 OK\nok"},
                                     {**results[1], "output": OUTPUT_HTTP},
                                     {**results[1], "exec_id": "e3", "output": None}]},
            batch[1]],
    }


def _v3_execution_samples() -> list[Record]:
    """v3 of ExecutionState: each attempt's `output`."""
    v2 = _v2_execution_samples()
    first = {**v2[0], "attempts": [{**v2[0]["attempts"][0], "output": OUTPUT_HTTP},
                                   {**v2[0]["attempts"][1], "output": None}]}
    command = {**v2[-1], "attempts": [{**_attempt(1, done=True), "output": OUTPUT_COMMAND}]}
    return [first, *v2[1:], command]


# Samples are pinned per (name, version): a golden file records what that version's producers
# wrote, so later versions add their own entries rather than editing these.
SAMPLES: dict[tuple[str, int], list[Record]] = {
    **{(name, 1): records for name, records in _v1_samples().items()},
    ("kron.commands.CreateJobs", 1): [
        {"envelope": _env("job.create_many_requested", 1), "command_id": "cmd-1",
         "jobs": [{"job_id": "job-1", "idempotency_key": "idem-1", "spec": SPEC_HTTP_FULL},
                  {"job_id": "job-2", "idempotency_key": None, "spec": SPEC_KAFKA_MIN},
                  {"job_id": "job-3", "idempotency_key": None, "spec": SPEC_COMMAND}]},
        {"envelope": _env("job.create_many_requested", 2, full=False), "command_id": "cmd-2",
         "jobs": []},
    ],
    **_v2_job_samples(),
    **_v3_job_samples(),
    **_v4_job_samples(),
    **_v5_job_samples(),
    ("kron.executions.ExecutionState", 2): _v2_execution_samples(),
    ("kron.executions.ExecutionState", 3): _v3_execution_samples(),
    **_output_report_samples(),
    ("kron.commands.CancelRun", 1): [
        _command("run.cancel_requested", 1, full=True, run_id="exec-1", reason="operator"),
        _command("run.cancel_requested", 2, full=False, run_id="", reason=None),
    ],
    ("kron.commands.RetryRun", 1): [
        _command("run.retry_requested", 1, full=True, run_id="exec-1"),
        _command("run.retry_requested", 2, full=False, run_id="exec-2"),
    ],
    ("kron.engine.Tick", 2): [
        {"envelope": _env("engine.ticked", 1), "partition": 0, "now_ms": T0,
         "fire_ahead_ms": 3_000},
        {"envelope": _env("engine.ticked", 2, full=False), "partition": INT_MAX,
         "now_ms": LONG_MAX, "fire_ahead_ms": 0},
    ],
    # v2 adds `held_for`: the attempt waits in the worker (its tenant's dispatch rate).
    ("kron.executions.ExecutionHeartbeat", 2): [
        _exec("execution.held", 1, full=True, attempt=2, fencing_token=42,
              lease_until_ms=T0 + 90_000, held_for="dispatch rate"),
        _exec("execution.heartbeat", 2, full=False, attempt=1, fencing_token=1,
              lease_until_ms=T0, held_for=None),
    ],
    # v2 adds `rerun` (default false): a v1 backfill reads as one that leaves recorded slots.
    ("kron.commands.BackfillJob", 2): [
        _command("job.backfill_requested", 1, full=True, from_ms=LONG_MIN, to_ms=LONG_MAX,
                 max_per_s=0.5, rerun=True),
        _command("job.backfill_requested", 2, full=False, from_ms=T0, to_ms=T0 + 1,
                 max_per_s=10.0, rerun=False),
    ],
}


# --- writing ------------------------------------------------------------------------------------


def write_golden(
    entry: SchemaEntry, records: Sequence[Mapping[str, Any]], codec: Codec, directory: Path
) -> None:
    """Encode ``records`` with exactly ``entry``'s version; refuse to touch existing files."""
    hex_path, json_path = golden_paths(entry.name, entry.version, directory)
    lines: list[str] = []
    expected: list[Any] = []
    for record in records:
        data = codec.encode(entry.name, record, version=entry.version)
        decoded = codec.decode(data, entry.name, reader_version=entry.version)
        lines.append(data.hex())
        expected.append(to_jsonable(decoded.record))
    document = {
        "schema": entry.name,
        "version": entry.version,
        "fingerprint": entry.fingerprint.hex(),
        "records": expected,
    }
    # Mode "x" fails if the file exists, so an old golden can never be regenerated.
    with hex_path.open("x", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    with json_path.open("x", encoding="utf-8") as f:
        f.write(json.dumps(document, indent=2, ensure_ascii=False) + "\n")


def generate(
    registry: SchemaRegistry,
    samples: Mapping[tuple[str, int], Sequence[Mapping[str, Any]]],
    directory: Path = GOLDEN_DIR,
) -> list[str]:
    """Write goldens for every registry entry lacking them; returns the stems written."""
    codec = Codec(registry)
    written: list[str] = []
    for entry in registry:
        paths = golden_paths(entry.name, entry.version, directory)
        present = [p.exists() for p in paths]
        if all(present):
            continue
        if any(present):
            raise SystemExit(
                f"half a golden pair exists for {entry.name} v{entry.version}; "
                "restore the missing file from git instead of regenerating"
            )
        records = samples.get((entry.name, entry.version))
        if not records:
            raise SystemExit(f"no SAMPLES for {entry.name} v{entry.version}; add some first")
        write_golden(entry, records, codec, directory)
        written.append(f"{entry.name}.v{entry.version}")
    return written


def main() -> int:
    written = generate(default_registry(), SAMPLES)
    for stem in written:
        print(f"wrote {stem}.hex and {stem}.json")
    if not written:
        print("every schema version already has golden files; nothing written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
