"""streams.engine.records against the Avro schemas: each TypedDict has exactly the fields of
the latest version of its schema, each typed as that schema types it (primitives, nullable
unions, arrays, nested records, and enums as the StrEnum whose values are the symbols), so
a new schema version fails here until the types follow it."""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Iterator
from typing import Any, is_typeddict

import pytest

from schemas.registry import default_registry
from streams.domain.dag import TaskState
from streams.domain.retry import ErrorClass
from streams.domain.states import ExecutionStatus, JobStatus, Trigger
from streams.engine import records

# TypedDict -> (schema, record inside it: its own name for the schema's top record).
TYPED: dict[Any, tuple[str, str]] = {
    records.JobRecord: ("kron.state.JobState", "kron.state.JobState"),
    records.EnvelopeRecord: ("kron.state.JobState", "kron.Envelope"),
    records.ExecutionRecord: ("kron.executions.ExecutionState", "kron.executions.ExecutionState"),
    records.AttemptRecord: ("kron.executions.ExecutionState", "kron.Attempt"),
    records.DagRunProgress: ("kron.executions.ExecutionState", "kron.DagRunProgress"),
    records.TaskProgressRecord: ("kron.executions.ExecutionState", "kron.TaskProgress"),
    records.CreateJobCommand: ("kron.commands.CreateJob", "kron.commands.CreateJob"),
    records.UpdateJobCommand: ("kron.commands.UpdateJob", "kron.commands.UpdateJob"),
    records.PauseJobCommand: ("kron.commands.PauseJob", "kron.commands.PauseJob"),
    records.ResumeJobCommand: ("kron.commands.ResumeJob", "kron.commands.ResumeJob"),
    records.DeleteJobCommand: ("kron.commands.DeleteJob", "kron.commands.DeleteJob"),
    records.TriggerJobCommand: ("kron.commands.TriggerJob", "kron.commands.TriggerJob"),
    records.BackfillCommand: ("kron.commands.BackfillJob", "kron.commands.BackfillJob"),
    records.CancelRunCommand: ("kron.commands.CancelRun", "kron.commands.CancelRun"),
    records.RetryRunCommand: ("kron.commands.RetryRun", "kron.commands.RetryRun"),
    records.CreateJobsCommand: ("kron.commands.CreateJobs", "kron.commands.CreateJobs"),
    records.JobToCreate: ("kron.commands.CreateJobs", "kron.JobToCreate"),
    records.ExecutionSucceededReport: ("kron.executions.ExecutionSucceeded",
                                       "kron.executions.ExecutionSucceeded"),
    records.ExecutionFailedReport: ("kron.executions.ExecutionFailed",
                                    "kron.executions.ExecutionFailed"),
    records.ExecutionHeartbeatReport: ("kron.executions.ExecutionHeartbeat",
                                       "kron.executions.ExecutionHeartbeat"),
    records.AttemptsFinishedReport: ("kron.executions.AttemptsFinished",
                                     "kron.executions.AttemptsFinished"),
    records.AttemptResult: ("kron.executions.AttemptsFinished", "kron.executions.AttemptResult"),
}
# Records typed as a plain dict on purpose (see streams.engine.records).
UNTYPED = {"kron.JobSpec"}
PRIMITIVES: dict[str, type] = {"string": str, "int": int, "long": int, "double": float,
                               "float": float, "boolean": bool, "bytes": bytes}


def _walk(schema: Any) -> Iterator[dict[str, Any]]:
    """Every named type defined in a schema (a later use names it by a string)."""
    if isinstance(schema, list):
        for branch in schema:
            yield from _walk(branch)
    elif isinstance(schema, dict):
        if schema.get("type") in ("record", "enum", "fixed"):
            yield schema
        for f in schema.get("fields", ()):
            yield from _walk(f["type"])
        for key in ("items", "values"):
            if key in schema:
                yield from _walk(schema[key])


def _named(schema_name: str) -> dict[str, dict[str, Any]]:
    top = default_registry().latest(schema_name).schema
    return {t["name"]: t for t in _walk(top)}


def _record(schema_name: str, record: str) -> dict[str, Any]:
    return _named(schema_name)[record]


def _mismatches(avro: Any, hint: Any, named: dict[str, dict[str, Any]],
                where: str) -> Iterator[str]:
    """How `hint` (a resolved type hint) fails to type values of Avro type `avro`."""
    if isinstance(avro, str) and avro in named:
        avro = named[avro]
    if isinstance(avro, str):
        if hint is not PRIMITIVES[avro]:
            yield f"{where}: {avro} typed {hint}"
    elif isinstance(avro, list):
        yield from _union_mismatches(avro, hint, named, where)
    elif avro["type"] == "array":
        if typing.get_origin(hint) is not list:
            yield f"{where}: array typed {hint}"
            return
        yield from _mismatches(avro["items"], typing.get_args(hint)[0], named, f"{where}[]")
    elif avro["type"] == "enum":
        if not (isinstance(hint, type) and issubclass(hint, enum.StrEnum)):
            yield f"{where}: enum {avro['name']} typed {hint}"
        elif sorted(m.value for m in hint) != sorted(avro["symbols"]):
            yield f"{where}: {hint.__name__} is not {avro['name']} {avro['symbols']}"
    elif avro["type"] == "record":
        yield from _record_mismatches(avro, hint, named, where)
    elif avro["type"] in PRIMITIVES:  # {"type": "long"}, say
        yield from _mismatches(avro["type"], hint, named, where)
    else:
        yield f"{where}: no rule for {avro}"


def _union_mismatches(avro: list[Any], hint: Any, named: dict[str, dict[str, Any]],
                      where: str) -> Iterator[str]:
    """kron's unions outside the spec are [null, T]: typed `T | None`."""
    branches = [b for b in avro if b != "null"]
    if len(branches) != 1 or "null" not in avro:
        yield f"{where}: union {avro} is not [null, T]"
        return
    args = typing.get_args(hint)
    if not isinstance(hint, types.UnionType) or type(None) not in args:
        yield f"{where}: nullable, typed {hint}"
        return
    rest = [a for a in args if a is not type(None)]
    yield from _mismatches(branches[0], rest[0] if len(rest) == 1 else hint, named, where)


def _record_mismatches(avro: dict[str, Any], hint: Any, named: dict[str, dict[str, Any]],
                       where: str) -> Iterator[str]:
    if avro["name"] in UNTYPED:
        if hint != dict[str, Any]:
            yield f"{where}: {avro['name']} typed {hint}"
    elif not is_typeddict(hint):
        yield f"{where}: record {avro['name']} typed {hint}"
    else:
        yield from _typeddict_mismatches(hint, avro, named, where)


def _typeddict_mismatches(td: Any, record: dict[str, Any], named: dict[str, dict[str, Any]],
                          where: str) -> Iterator[str]:
    fields = [f["name"] for f in record["fields"]]
    hints = typing.get_type_hints(td)
    if sorted(hints) != sorted(fields):
        yield (f"{where or td.__name__}: keys {sorted(hints)} are not {record['name']}'s "
               f"fields {sorted(fields)}")
        return
    if td.__required_keys__ != set(fields):
        yield f"{where or td.__name__}: not every field is required"
    for f in record["fields"]:
        yield from _mismatches(f["type"], hints[f["name"]], named,
                               f"{where or td.__name__}.{f['name']}")


@pytest.mark.parametrize("td", list(TYPED), ids=lambda td: td.__name__)
def test_keys_are_the_schema_fields(td: Any) -> None:
    schema, name = TYPED[td]
    fields = [f["name"] for f in _record(schema, name)["fields"]]
    assert sorted(typing.get_type_hints(td)) == sorted(fields)
    assert td.__required_keys__ == frozenset(fields)  # a decoded record has every field


@pytest.mark.parametrize("td", list(TYPED), ids=lambda td: td.__name__)
def test_field_types_follow_the_schema(td: Any) -> None:
    schema, name = TYPED[td]
    assert list(_typeddict_mismatches(td, _record(schema, name), _named(schema), "")) == []


def test_every_record_typeddict_is_checked() -> None:
    """A TypedDict added to records.py is added here too (the bases excepted)."""
    declared = {v for k, v in vars(records).items()
                if is_typeddict(v) and not k.startswith("_") and v.__module__ == records.__name__}
    assert declared == set(TYPED) - {records.EnvelopeRecord}


@pytest.mark.parametrize(("td", "key", "enum_type"), [
    (records.JobRecord, "status", JobStatus),
    (records.ExecutionRecord, "state", ExecutionStatus),
    (records.ExecutionRecord, "trigger", Trigger),
    (records.TaskProgressRecord, "state", TaskState),
    (records.ExecutionFailedReport, "error_class", ErrorClass),
    (records.AttemptResult, "error_class", ErrorClass | None),
])
def test_enum_fields_are_the_domain_enums(td: Any, key: str, enum_type: Any) -> None:
    assert typing.get_type_hints(td)[key] == enum_type


def test_attempt_outcome_is_a_plain_string() -> None:
    """An Avro string: the compiled writer takes only `str` itself (streams.domain.states)."""
    assert typing.get_type_hints(records.AttemptRecord)["outcome"] == str | None


def test_the_checker_sees_a_drift() -> None:
    """The comparison fails for a TypedDict that lost a field or typed one wrongly."""

    class Short(typing.TypedDict):
        task_id: str
        state: TaskState

    class Wrong(typing.TypedDict):
        task_id: str
        state: str  # not the enum
        pending: int
        succeeded: int
        failed: int
        skipped: int
        reason: str  # not nullable

    named = _named("kron.executions.ExecutionState")
    record = named["kron.TaskProgress"]
    assert list(_typeddict_mismatches(Short, record, named, "Short"))
    wrong = list(_typeddict_mismatches(Wrong, record, named, "Wrong"))
    assert len(wrong) == 2, wrong
