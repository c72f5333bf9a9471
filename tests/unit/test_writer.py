"""Compiled Avro writers: fastavro's bytes or fastavro's error, never a third answer."""

from __future__ import annotations

import enum
from io import BytesIO
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer, validate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import names
from schemas.codec import Codec, trusted_codec
from schemas.errors import EncodeError
from schemas.registry import default_registry
from schemas.writer import compile_writer
from tests.golden.make_golden import SAMPLES
from tests.unit.test_codec import (
    CREATE_JOBS,
    EXECUTION_STATES,
    INTS,
    JOB_STATES,
    LONGS,
    SCHEDULES,
    TARGETS,
    TEXT,
)

REGISTRY = default_registry()


def _fastavro(name: str, record: dict[str, Any]) -> bytes:
    """What the trusted codec wrote before compiled writers: the reference."""
    entry = REGISTRY.latest(name)
    buf = BytesIO()
    buf.write(entry.header)
    schemaless_writer(buf, entry.schema, record, strict_allow_default=True)
    return buf.getvalue()


def _same_answer(name: str, record: dict[str, Any]) -> None:
    try:
        expected = _fastavro(name, record)
    except Exception:
        with pytest.raises(EncodeError):
            trusted_codec().encode(name, record)
        return
    assert trusted_codec().encode(name, record) == expected


def test_every_committed_schema_compiles() -> None:
    # A spec's target and schedule are unions of records, compiled for tagged tuples.
    for name in REGISTRY.names:
        assert compile_writer(REGISTRY.latest(name).schema) is not None, name


def test_every_golden_sample_is_written_as_fastavro_writes_it() -> None:
    checked = 0
    for (name, version), records in SAMPLES.items():
        if version != REGISTRY.latest(name).version:
            continue
        for record in records:
            assert trusted_codec().encode(name, record) == _fastavro(name, record), name
            checked += 1
    assert checked > 20


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300)
@given(EXECUTION_STATES)
def test_execution_states_are_written_as_fastavro_writes_them(record: dict[str, Any]) -> None:
    writer = compile_writer(REGISTRY.latest(names.EXECUTION_STATE).schema,
                            prefix=REGISTRY.latest(names.EXECUTION_STATE).header)
    assert writer is not None
    assert writer(record) == _fastavro(names.EXECUTION_STATE, record)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(JOB_STATES)
def test_job_states_through_the_codec_are_fastavros(record: dict[str, Any]) -> None:
    _same_answer(names.JOB_STATE, record)


class Level(enum.IntEnum):
    ONE = 1


class State(enum.StrEnum):
    RUNNING = "running"


# Values a caller might pass that are not the canonical form: each must get fastavro's
# answer (bytes or an error), whatever the compiled writer would have made of it.
ODD_VALUES = st.one_of(
    st.booleans(), st.floats(allow_nan=False), st.just(Level.ONE), st.just(State.RUNNING),
    st.none(), st.binary(max_size=3), st.just(2**64), st.just(-(2**63) - 1), TEXT, LONGS,
    st.lists(INTS, max_size=2), st.dictionaries(TEXT, INTS, max_size=2))


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=400)
@given(EXECUTION_STATES, st.data())
def test_a_field_of_any_value_gets_fastavros_answer(record: dict[str, Any],
                                                     data: st.DataObject) -> None:
    field = data.draw(st.sampled_from(sorted(record)))
    odd = {**record, field: data.draw(ODD_VALUES)}
    _same_answer(names.EXECUTION_STATE, odd)
    nested = {**record, "envelope": {**record["envelope"],
                                     "occurred_at_ms": data.draw(ODD_VALUES)}}
    _same_answer(names.EXECUTION_STATE, nested)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(EXECUTION_STATES, st.data())
def test_missing_and_unknown_keys_get_fastavros_answer(record: dict[str, Any],
                                                       data: st.DataObject) -> None:
    field = data.draw(st.sampled_from(sorted(record)))
    _same_answer(names.EXECUTION_STATE, {k: v for k, v in record.items() if k != field})
    _same_answer(names.EXECUTION_STATE, {**record, "typo": 1})
    if record["attempts"]:
        extra = [{**record["attempts"][0], "typo": 1}]
        _same_answer(names.EXECUTION_STATE, {**record, "attempts": extra})


def test_an_unknown_key_is_still_an_error() -> None:
    record = SAMPLES[(names.EXECUTION_STATE, 1)][0]
    with pytest.raises(EncodeError, match="typo"):
        trusted_codec().encode(names.EXECUTION_STATE, {**record, "typo": 1})


# Every type the compiler handles, in both union orders.
KITCHEN = parse_schema({
    "type": "record", "name": "t.Kitchen", "fields": [
        {"name": "s", "type": "string"}, {"name": "b", "type": "bytes"},
        {"name": "i", "type": "int"}, {"name": "l", "type": "long"},
        {"name": "d", "type": "double"}, {"name": "f", "type": "float"},
        {"name": "t", "type": "boolean"}, {"name": "n", "type": "null"},
        {"name": "e", "type": {"type": "enum", "name": "t.E", "symbols": ["a", "b", "c"]}},
        {"name": "e2", "type": "t.E"},
        {"name": "m", "type": {"type": "map", "values": ["long", "null"]}},
        {"name": "a", "type": {"type": "array", "items": {
            "type": "record", "name": "t.Item", "fields": [{"name": "x", "type": "long"}]}}},
        {"name": "o", "type": ["null", "t.Item"]},
        {"name": "u", "type": ["int", "string", "t.Item", "null", {
            "type": "record", "name": "t.Other", "fields": [{"name": "y", "type": "t.E"}]}]},
    ]})
KITCHENS = st.fixed_dictionaries({
    "s": TEXT, "b": st.binary(max_size=20), "i": INTS, "l": LONGS,
    "d": st.floats(allow_nan=False), "f": st.floats(width=32, allow_nan=False),
    "t": st.booleans(), "n": st.none(), "e": st.sampled_from("abc"),
    "e2": st.sampled_from("abc"),
    "m": st.dictionaries(TEXT, st.none() | LONGS, max_size=3),
    "a": st.lists(st.fixed_dictionaries({"x": LONGS}), max_size=3),
    "o": st.none() | st.fixed_dictionaries({"x": LONGS}),
    # A union of several types, in fastavro's tuple notation (or None for its null).
    "u": st.one_of(INTS.map(lambda i: ("int", i)), TEXT.map(lambda t: ("string", t)),
                   st.fixed_dictionaries({"x": LONGS}).map(lambda d: ("t.Item", d)),
                   st.sampled_from("abc").map(lambda e: ("t.Other", {"y": e})),
                   st.none(), st.just(("null", None)))})


@given(KITCHENS)
def test_every_compiled_type_is_written_as_fastavro_writes_it(record: dict[str, Any]) -> None:
    writer = compile_writer(KITCHEN, prefix=b"P")
    assert writer is not None
    buf = BytesIO()
    schemaless_writer(buf, KITCHEN, record)
    assert writer(record) == b"P" + buf.getvalue()


@pytest.mark.parametrize("schema", [
    {"type": "record", "name": "t.L", "fields": [
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}}]},
    {"type": "record", "name": "t.F", "fields": [
        {"name": "f", "type": {"type": "fixed", "name": "t.Fx", "size": 2}}]},
    {"type": "record", "name": "t.R", "fields": [{"name": "next", "type": ["null", "t.R"]}]},
])
def test_what_it_does_not_compile_is_left_to_fastavro(schema: dict[str, Any]) -> None:
    assert compile_writer(parse_schema(schema)) is None


def _validated(name: str, record: dict[str, Any]) -> bytes:
    """What the validating codec wrote before it used compiled writers: the reference."""
    entry = REGISTRY.latest(name)
    validate(record, entry.schema, raise_errors=True)
    return _fastavro(name, record)


def _validating_same_answer(name: str, record: dict[str, Any]) -> None:
    """The validating codec gives the old answer, and what the compiled writer takes,
    fastavro's validation takes too (so skipping it loses no check)."""
    entry = REGISTRY.latest(name)
    writer = compile_writer(entry.schema, prefix=entry.header)
    assert writer is not None
    try:
        fast: bytes | None = writer(record)
    except Exception:
        fast = None
    try:
        expected = _validated(name, record)
    except Exception:
        assert fast is None, "compiled writer took a record fastavro refuses"
        with pytest.raises(EncodeError):
            Codec(REGISTRY).encode(name, record)
        return
    assert fast is None or fast == expected
    assert Codec(REGISTRY).encode(name, record) == expected


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300)
@given(CREATE_JOBS)
def test_create_jobs_with_tagged_unions_are_written_as_fastavro_writes_them(
        record: dict[str, Any]) -> None:
    entry = REGISTRY.latest(names.CREATE_JOB)
    writer = compile_writer(entry.schema, prefix=entry.header)
    assert writer is not None
    assert writer(record) == _fastavro(names.CREATE_JOB, record)
    _validating_same_answer(names.CREATE_JOB, record)


class Tagged(tuple[Any, ...]):
    """A tuple subclass, as a caller might pass one: fastavro unpacks it, the compiled
    writer leaves it to fastavro."""


# What a caller might put where a union of several types is: each gets fastavro's answer.
ODD_BRANCHES = st.one_of(
    SCHEDULES.map(lambda t: t[1]), TARGETS.map(lambda t: t[1]),  # plain dicts
    TARGETS.map(lambda t: ("kron.Nope", t[1])), TARGETS.map(lambda t: ("HttpTarget", t[1])),
    SCHEDULES.map(lambda t: (*t, 1)), SCHEDULES.map(lambda t: t[:1]),
    SCHEDULES.map(Tagged), SCHEDULES.map(list), TARGETS.map(lambda t: (t[0], None)),
    SCHEDULES.map(lambda t: (t[0].encode(), t[1])), st.none(), ODD_VALUES)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=400)
@given(CREATE_JOBS, st.data())
def test_a_union_of_any_value_gets_fastavros_answer_validated_or_not(
        record: dict[str, Any], data: st.DataObject) -> None:
    field = data.draw(st.sampled_from(["schedule", "target"]))
    odd = {**record, "spec": {**record["spec"], field: data.draw(ODD_BRANCHES)}}
    _validating_same_answer(names.CREATE_JOB, odd)
    _same_answer(names.CREATE_JOB, odd)
    # Swapped: a target where the schedule goes, and the other way.
    swapped = {**record, "spec": {**record["spec"], "schedule": record["spec"]["target"],
                                  "target": record["spec"]["schedule"]}}
    _validating_same_answer(names.CREATE_JOB, swapped)


# Every kind of branch a union of several types can have, inline and by name.
BRANCHES = parse_schema({
    "type": "record", "name": "t.Branches", "fields": [
        {"name": "r", "type": {"type": "record", "name": "t.R1", "fields": [
            {"name": "x", "type": "long"}]}},
        {"name": "u", "type": [
            "null", "int", "t.R1",
            {"type": "enum", "name": "t.E1", "symbols": ["A", "B"]},
            {"type": "array", "items": "long"}, {"type": "map", "values": "string"},
            {"type": "record", "name": "t.R2", "fields": [{"name": "y", "type": "t.E1"}]}]},
        {"name": "v", "type": ["t.E1", {"type": "string"}, "t.R2"]}]})
BRANCH_VALUES = st.one_of(
    st.none(), INTS.map(lambda i: ("int", i)), LONGS.map(lambda x: ("t.R1", {"x": x})),
    st.sampled_from("AB").map(lambda e: ("t.E1", e)),
    st.sampled_from("AB").map(lambda e: ("t.R2", {"y": e})),
    st.lists(LONGS, max_size=2).map(lambda a: ("array", a)),
    st.dictionaries(TEXT, TEXT, max_size=2).map(lambda m: ("map", m)),
    TEXT.map(lambda t: ("string", t)), st.just(("null", None)), ODD_VALUES)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=400)
@given(LONGS, BRANCH_VALUES, BRANCH_VALUES)
def test_a_tagged_branch_of_any_kind_is_written_only_where_validation_takes_it(
        x: int, u: Any, v: Any) -> None:
    record = {"r": {"x": x}, "u": u, "v": v}
    writer = compile_writer(BRANCHES)
    assert writer is not None
    try:
        fast: bytes | None = writer(record)
    except Exception:
        fast = None
    if fast is None:
        return
    assert validate(record, BRANCHES, raise_errors=False), record
    buf = BytesIO()
    schemaless_writer(buf, BRANCHES, record, strict_allow_default=True)
    assert fast == buf.getvalue()


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300)
@given(EXECUTION_STATES, st.data())
def test_a_validating_codec_gives_its_old_answer_for_any_field_value(
        record: dict[str, Any], data: st.DataObject) -> None:
    field = data.draw(st.sampled_from(sorted(record)))
    _validating_same_answer(names.EXECUTION_STATE, {**record, field: data.draw(ODD_VALUES)})
    _validating_same_answer(names.EXECUTION_STATE, {k: v for k, v in record.items()
                                                    if k != field})


def test_a_validating_codec_uses_the_compiled_writer_and_still_names_errors() -> None:
    codec = Codec(REGISTRY)
    record = SAMPLES[(names.EXECUTION_STATE, 2)][-2]  # a DAG run, with its progress
    assert codec.encode(names.EXECUTION_STATE, record) == _fastavro(names.EXECUTION_STATE,
                                                                    record)
    latest = REGISTRY.latest(names.EXECUTION_STATE).version
    assert codec._writers[(names.EXECUTION_STATE, latest)] is not None
    with pytest.raises(EncodeError, match="attempt"):
        codec.encode(names.EXECUTION_STATE, {**record, "attempt": 1.5})
