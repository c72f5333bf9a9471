"""The state enums match their Avro enums, and the records the core writes with them take the
compiled Avro writers' fast path (no fallback to fastavro) and the same bytes."""

from __future__ import annotations

from typing import Any

import fastavro

from schemas import names
from schemas.registry import default_registry
from schemas.writer import compile_writer
from streams.domain.retry import ErrorClass
from streams.domain.states import AttemptOutcome, ExecutionStatus, JobStatus, Trigger
from streams.engine.core import Dispatch
from tests.unit.test_core_scenarios import MIN, SEC, Partition, utc


def _symbols(schema_name: str, field: str) -> list[str]:
    schema = default_registry().latest(schema_name).schema
    for f in schema["fields"]:
        if f["name"] == field:
            t = f["type"]
            return list((t if isinstance(t, dict) else next(b for b in t if b != "null"))
                        ["symbols"])
    raise AssertionError(f"{schema_name} has no field {field}")


def test_enums_are_the_avro_symbols() -> None:
    assert [s.value for s in ExecutionStatus] == _symbols(names.EXECUTION_STATE, "state")
    assert [s.value for s in Trigger] == _symbols(names.EXECUTION_STATE, "trigger")
    assert [s.value for s in JobStatus] == _symbols(names.JOB_STATE, "status")
    assert {e.value for e in ErrorClass} == AttemptOutcome.FAILURES


def test_state_sets_partition_the_states() -> None:
    assert set(ExecutionStatus) == ExecutionStatus.TERMINAL | ExecutionStatus.ACTIVE
    assert not ExecutionStatus.TERMINAL & ExecutionStatus.ACTIVE
    assert ExecutionStatus.RAN <= ExecutionStatus.TERMINAL
    assert ExecutionStatus.RERUNNABLE <= ExecutionStatus.TERMINAL
    assert ExecutionStatus.CANCELLED not in ExecutionStatus.RERUNNABLE
    assert {"active", "paused"} == JobStatus.LIVE
    assert {"schedule", "misfire"} == Trigger.OWN_SCHEDULE
    # Plain strings in the sets: a decoded value is looked up at a literal's cost.
    for named in (ExecutionStatus.TERMINAL, ExecutionStatus.ACTIVE, JobStatus.LIVE):
        assert all(type(s) is str for s in named)


def test_core_records_take_the_compiled_writers() -> None:
    """Every job and execution record a busy partition writes (starts, successes, retries,
    final failures, skips, cancels) encodes through the compiled writer, as fastavro would."""
    p = Partition(utc(2026, 3, 1))
    p.create("cron", cron="* * * * *",
             retry={"max_attempts": 2, "backoff": "fixed", "base_s": 1.0, "max_s": 1.0})
    p.create("skip", cron="* * * * *", overlap="skip_if_running")
    effects = p.tick(p.now + MIN)
    for d in [e for e in effects if isinstance(e, Dispatch)]:
        p.report(d, "success" if d.job_id == "skip" else "transient")
    effects = p.tick(p.now + 2 * SEC)
    for d in [e for e in effects if isinstance(e, Dispatch)]:
        p.report(d, "permanent")
    p.tick(p.now + MIN)  # "skip" runs again, "cron" is due
    p.command("PauseJob", "cron")
    p.command("DeleteJob", "skip")
    kinds = {(kind, rec.get("state") or rec.get("status")) for kind, rec in p.store.log}
    assert {("execution", "failed"), ("execution", "succeeded"),
            ("execution", "retry_pending"), ("job", "deleted")} <= kinds
    schemas = {"job": names.JOB_STATE, "execution": names.EXECUTION_STATE}
    for kind, rec in p.store.log:
        schema = default_registry().latest(schemas[kind]).schema
        write = compile_writer(schema)
        assert write is not None
        assert write(rec) == _fastavro(schema, rec), (kind, rec)


def _fastavro(schema: Any, rec: dict[str, Any]) -> bytes:
    import io

    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema, rec)
    return out.getvalue()
