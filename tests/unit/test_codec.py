"""Codec: wire layout, round trips, error classification, schema evolution."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import pickle
import sys
from io import BytesIO
from pathlib import Path
from typing import Any
from unittest import mock

# The project is not installed in the venv and pytest sets no `pythonpath`; the repository root is
# importable only as a side effect of tests/conftest.py. Make it explicit (ruff's E402 allows
# imports after a sys.path change). Drop this once pyproject sets pythonpath = ["."].
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pytest
from fastavro import schemaless_reader, schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import names
from schemas.codec import Codec, Decoded, ItemFieldReader, SplicedEncoder, decode, encode
from schemas.envelope import make_envelope
from schemas.errors import (
    DECODE_REASONS,
    DecodeError,
    EncodeError,
    UnknownSchemaError,
)
from schemas.registry import (
    AVRO_DIR,
    HEADER_LEN,
    MARKER,
    SchemaRegistry,
    crc64_avro,
    default_registry,
)
from tests.golden.make_golden import INT_MAX, LONG_MAX, SAMPLES, SPEC_NOTIFY_FULL, T0

REGISTRY = default_registry()


def _env(event_type: str = "job.create_requested") -> dict[str, Any]:
    return dict(make_envelope(event_id="e-1", event_type=event_type, occurred_at_ms=T0, tenant="t"))


def _create_job(**spec_overrides: Any) -> dict[str, Any]:
    spec = {
        "name": "job",
        "schedule": ("kron.CronSchedule", {"expr": "* * * * *"}),
        "target": ("kron.HttpTarget", {"url": "https://example.com"}),
        **spec_overrides,
    }
    return {"envelope": _env(), "command_id": "c-1", "job_id": "j-1", "spec": spec}


def _sample(name: str, index: int = 0) -> dict[str, Any]:
    """A golden sample record for the latest version of ``name``."""
    return SAMPLES[(name, REGISTRY.latest(name).version)][index]


def _valid(name: str = names.CREATE_JOB) -> bytes:
    return encode(name, _sample(name))


# --- wire layout --------------------------------------------------------------------------------


def test_single_object_header_for_int_schema_matches_avro() -> None:
    # The header Avro's own test suite expects for schema "int".
    assert MARKER + crc64_avro('"int"') == bytes(
        [0xC3, 0x01, 0x8F, 0x5C, 0x39, 0x3F, 0x1A, 0xD5, 0x75, 0x72]
    )


def test_wire_layout_byte_by_byte() -> None:
    entry = REGISTRY.latest(names.TICK)
    record = {"envelope": _env("engine.ticked"), "partition": 1, "now_ms": 2}
    data = encode(names.TICK, record)
    assert data[0] == 0xC3
    assert data[1] == 0x01
    fingerprint = entry.fingerprint64.to_bytes(8, "little", signed=True)
    for i in range(8):
        assert data[2 + i] == fingerprint[i]
    assert int.from_bytes(data[2:10], "little", signed=True) == entry.fingerprint64
    body = BytesIO()
    schemaless_writer(body, entry.schema, record)
    assert data[10:] == body.getvalue()
    # Body starts with envelope.event_id: zigzag varint length 3 ("e-1" -> 0x06), then the bytes.
    assert data[10:14] == b"\x06e-1"


# --- round trips --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", REGISTRY.names)
def test_round_trip_every_record(name: str) -> None:
    latest = REGISTRY.latest(name)
    for record in SAMPLES[(name, latest.version)]:
        data = encode(name, record)
        decoded = decode(data)
        assert decoded == Decoded(
            name=name, version=latest.version, reader_version=latest.version, record=decoded.record
        )
        _assert_contains(record, decoded.record)
        assert list(decoded.record) == [f["name"] for f in latest.schema["fields"]]
        # Decoded records are valid input: re-encoding gives the same bytes.
        assert encode(name, decoded.record) == data


def test_full_sample_spec_sets_every_job_spec_field() -> None:
    fields = REGISTRY.latest(names.CREATE_JOB).schema["fields"]
    spec = next(f for f in fields if f["name"] == "spec")["type"]
    assert list(SPEC_NOTIFY_FULL) == [f["name"] for f in spec["fields"]]


def test_omitted_fields_take_the_schema_defaults() -> None:
    spec = decode(encode(names.CREATE_JOB, _create_job())).record["spec"]
    assert spec["schedule"] == ("kron.CronSchedule", {"expr": "* * * * *", "timezone": "UTC"})
    assert spec["target"] == (
        "kron.HttpTarget",
        {
            "method": "POST",
            "url": "https://example.com",
            "headers": {},
            "body": None,
            "timeout_s": 30.0,
        },
    )
    assert spec["retry"] == {
        "max_attempts": 3,
        "backoff": "exponential",
        "base_s": 1.0,
        "max_s": 300.0,
    }
    assert spec["overlap"] == "allow"
    assert spec["misfire"] == {"kind": "fire_once", "late_by_s": None, "fire_all_cap": 100}
    assert spec["dst"] == {"nonexistent": "shift_forward", "ambiguous": "first"}
    assert (spec["jitter_s"], spec["lease_s"], spec["metadata"]) == (0.0, 60.0, {})
    assert (spec["start_at_ms"], spec["end_at_ms"]) == (None, None)
    assert spec["priority"] == "normal"
    assert spec["notify"] is None
    command = ("kron.CommandTarget", {"argv": ["true"]})
    target = decode(encode(names.CREATE_JOB, _create_job(target=command))).record["spec"]["target"]
    assert target[1] == {
        "argv": ["true"],
        "env": {},
        "cwd": None,
        "timeout_s": 300.0,
        "image": None,
    }


def test_plain_dict_union_branch_is_accepted_and_comes_back_tagged() -> None:
    record = _create_job(target={"topic": "t"}, schedule={"run_at_ms": 5})
    spec = decode(encode(names.CREATE_JOB, record)).record["spec"]
    assert spec["target"][0] == "kron.KafkaTarget"
    assert spec["schedule"] == ("kron.OneOffSchedule", {"run_at_ms": 5})


def test_only_unions_of_several_records_are_tagged(tmp_path: Path) -> None:
    a = {"type": "record", "name": "kron.test.A", "fields": [{"name": "x", "type": "int"}]}
    b = {"type": "record", "name": "kron.test.B", "fields": [{"name": "y", "type": "int"}]}
    schema = {
        "type": "record",
        "name": "kron.test.Holder",
        "fields": [
            {"name": "maybe", "type": ["null", a]},
            {"name": "many", "type": {"type": "array", "items": ["kron.test.A", b]}},
        ],
    }
    (tmp_path / "kron.test.Holder.v1.avsc").write_text(json.dumps(schema))
    codec = Codec(SchemaRegistry.from_directory(tmp_path))
    record = {"maybe": {"x": 1}, "many": [("kron.test.B", {"y": 2}), ("kron.test.A", {"x": 3})]}
    assert codec.decode(codec.encode("kron.test.Holder", record)).record == record


def test_decoded_is_frozen_and_keyword_only() -> None:
    decoded = decode(_valid())
    with pytest.raises(dataclasses.FrozenInstanceError):
        decoded.version = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        Decoded("n", 1, 1, {})  # type: ignore[call-arg]


# Hypothesis strategies for complete records (every field present, so equality is exact).

TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
INTS = st.integers(-(2**31), 2**31 - 1)
LONGS = st.integers(-(2**63), 2**63 - 1)
DOUBLES = st.floats(allow_nan=False)
STR_MAPS = st.dictionaries(TEXT, TEXT, max_size=3)


def _opt(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


def _tagged(name: str, fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    return st.fixed_dictionaries(fields).map(lambda record: (name, record))


ENVELOPES = st.fixed_dictionaries(
    {
        "event_id": TEXT,
        "event_type": TEXT,
        "schema_version": INTS,
        "occurred_at_ms": LONGS,
        "tenant": TEXT,
        "causation_id": _opt(TEXT),
        "correlation_id": _opt(TEXT),
        "producer": _opt(TEXT),
    }
)
SCHEDULES = _tagged("kron.CronSchedule", {"expr": TEXT, "timezone": TEXT}) | _tagged(
    "kron.OneOffSchedule", {"run_at_ms": LONGS}
)
TARGETS = st.one_of(
    _tagged(
        "kron.HttpTarget",
        {
            "method": TEXT,
            "url": TEXT,
            "headers": STR_MAPS,
            "body": _opt(st.binary(max_size=16)),
            "timeout_s": DOUBLES,
        },
    ),
    _tagged(
        "kron.KafkaTarget",
        {
            "topic": TEXT,
            "key": _opt(st.binary(max_size=8)),
            "value": _opt(st.binary(max_size=16)),
            "headers": STR_MAPS,
        },
    ),
    _tagged(
        "kron.CommandTarget",
        {
            "argv": st.lists(TEXT, max_size=4),
            "env": STR_MAPS,
            "cwd": _opt(TEXT),
            "timeout_s": DOUBLES,
            "image": _opt(TEXT),
        },
    ),
)
JOB_SPECS = st.fixed_dictionaries(
    {
        "name": TEXT,
        "schedule": SCHEDULES,
        "target": TARGETS,
        "retry": st.fixed_dictionaries(
            {
                "max_attempts": INTS,
                "backoff": st.sampled_from(["exponential", "fixed"]),
                "base_s": DOUBLES,
                "max_s": DOUBLES,
            }
        ),
        "overlap": st.sampled_from(["allow", "skip_if_running", "queue", "replace"]),
        "misfire": st.fixed_dictionaries(
            {
                "kind": st.sampled_from(["fire_once", "skip_if_late_by", "fire_all"]),
                "late_by_s": _opt(DOUBLES),
                "fire_all_cap": INTS,
            }
        ),
        "dst": st.fixed_dictionaries(
            {
                "nonexistent": st.sampled_from(["skip", "shift_forward"]),
                "ambiguous": st.sampled_from(["first", "last", "both"]),
            }
        ),
        "jitter_s": DOUBLES,
        "start_at_ms": _opt(LONGS),
        "end_at_ms": _opt(LONGS),
        "lease_s": DOUBLES,
        "metadata": STR_MAPS,
        "priority": st.sampled_from(["critical", "normal", "batch"]),
        "notify": st.none() | st.fixed_dictionaries({
            "webhook": st.text(max_size=40),
            "on": st.lists(st.sampled_from(["failed", "missed"]), max_size=2)}),
    }
)
CREATE_JOBS = st.fixed_dictionaries(
    {
        "envelope": ENVELOPES,
        "command_id": TEXT,
        "job_id": TEXT,
        "idempotency_key": _opt(TEXT),
        "spec": JOB_SPECS,
    }
)
ATTEMPTS = st.fixed_dictionaries(
    {
        "attempt": INTS,
        "fencing_token": LONGS,
        "worker": TEXT,
        "started_at_ms": LONGS,
        "finished_at_ms": _opt(LONGS),
        "outcome": _opt(TEXT),
        "status_code": _opt(INTS),
        "error": _opt(TEXT),
        "output": _opt(TEXT),
    }
)
TASK_PROGRESS = st.fixed_dictionaries(
    {
        "task_id": TEXT,
        "state": st.sampled_from(["pending", "running", "succeeded", "failed", "skipped",
                                  "upstream_failed", "cancelled"]),
        "pending": INTS,
        "succeeded": INTS,
        "failed": INTS,
        "skipped": INTS,
        "reason": _opt(TEXT),
    }
)
EXECUTION_STATES = st.fixed_dictionaries(
    {
        "envelope": ENVELOPES,
        "exec_id": TEXT,
        "job_id": TEXT,
        "scheduled_for_ms": LONGS,
        "owner_epoch": LONGS,
        "state": st.sampled_from(
            [
                "queued",
                "running",
                "retry_pending",
                "succeeded",
                "failed",
                "skipped",
                "missed",
                "cancelled",
            ]
        ),
        "trigger": st.sampled_from(["schedule", "manual", "backfill", "misfire"]),
        "attempt": INTS,
        "fencing_token": LONGS,
        "due_at_ms": LONGS,
        "worker": _opt(TEXT),
        "lease_until_ms": _opt(LONGS),
        "retry_at_ms": _opt(LONGS),
        "dst_outcome": _opt(TEXT),
        "reason": _opt(TEXT),
        "last_error": _opt(TEXT),
        "status_code": _opt(INTS),
        "attempts": st.lists(ATTEMPTS, max_size=3),
        "created_at_ms": LONGS,
        "updated_at_ms": LONGS,
        "run_id": _opt(TEXT),
        "task_id": _opt(TEXT),
        "dag": _opt(st.fixed_dictionaries({"tasks": st.lists(TASK_PROGRESS, max_size=3)})),
    }
)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(CREATE_JOBS)
def test_create_job_round_trips(record: dict[str, Any]) -> None:
    data = encode(names.CREATE_JOB, record)
    assert decode(data).record == record
    assert decode(data, names.CREATE_JOB).record == record


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(EXECUTION_STATES)
def test_execution_state_round_trips(record: dict[str, Any]) -> None:
    assert decode(encode(names.EXECUTION_STATE, record)).record == record


JOB_STATES = st.fixed_dictionaries(
    {
        "envelope": ENVELOPES,
        "job_id": TEXT,
        "version": INTS,
        "status": st.sampled_from(["active", "paused", "completed", "deleted"]),
        "spec": JOB_SPECS,
        "created_at_ms": LONGS,
        "updated_at_ms": LONGS,
        "next_run_at_ms": _opt(LONGS),
        "cursor_ms": _opt(LONGS),
        "applied_command_ids": st.lists(TEXT, max_size=3),
        "idempotency_key": _opt(TEXT),
        "owner_epoch": LONGS,
        "running": st.lists(TEXT, max_size=3),
        "queued_slot_ms": _opt(LONGS),
    }
)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(JOB_STATES, st.data())
def test_spliced_job_encoding_is_the_full_encoding(record: dict[str, Any],
                                                   data: st.DataObject) -> None:
    """The spec's bytes reused for a changed job, as at every fire, and for a new spec."""
    splice = SplicedEncoder(names.JOB_STATE, "spec")
    assert splice.encode(record) == encode(names.JOB_STATE, record)
    fired = {**record, "cursor_ms": data.draw(_opt(LONGS)), "running": data.draw(
        st.lists(TEXT, max_size=3)), "envelope": data.draw(ENVELOPES)}
    assert splice.encode(fired) == encode(names.JOB_STATE, fired)
    updated = {**fired, "spec": data.draw(JOB_SPECS)}
    assert splice.encode(updated) == encode(names.JOB_STATE, updated)


def test_spliced_encoding_reuses_the_field_by_identity_only() -> None:
    record = decode(encode(names.JOB_STATE, _sample(names.JOB_STATE))).record
    splice = SplicedEncoder(names.JOB_STATE, "spec", capacity=1)
    first = splice.encode(record)
    # Changed in place: not seen. That is why the engine replaces a spec, never edits it
    # (MemoryStore refuses in-place changes in the core's tests).
    record["spec"]["name"] = "edited in place"
    assert splice.encode(record) == first
    replaced = {**record, "spec": copy.deepcopy(record["spec"])}
    assert splice.encode(replaced) == encode(names.JOB_STATE, replaced) != first
    # Capacity 1: the first spec object was let go, so its bytes are made again.
    assert splice.encode(record) == encode(names.JOB_STATE, record)


def test_forget_lets_go_of_that_object_only() -> None:
    record = decode(encode(names.JOB_STATE, _sample(names.JOB_STATE))).record
    splice = SplicedEncoder(names.JOB_STATE, "spec")
    splice.encode(record)  # keeps the spec's bytes
    splice.forget(copy.deepcopy(record["spec"]))  # equal, but not the object kept
    splice.forget({"never": "kept"})
    with mock.patch("schemas.codec.schemaless_writer", side_effect=AssertionError("encoded")):
        assert splice.encode(record) == encode(names.JOB_STATE, record)
    splice.forget(record["spec"])
    with mock.patch("schemas.codec.schemaless_writer", side_effect=AssertionError("encoded")), \
            pytest.raises(EncodeError, match="encoded"):
        splice.encode(record)
    assert splice.encode(record) == encode(names.JOB_STATE, record)


def test_spliced_encoding_of_other_keys_goes_through_the_strict_encoder() -> None:
    record = decode(encode(names.JOB_STATE, _sample(names.JOB_STATE))).record
    splice = SplicedEncoder(names.JOB_STATE, "spec")
    with pytest.raises(EncodeError, match="typo"):
        splice.encode({**record, "typo": 1})
    partial = {k: v for k, v in record.items() if k != "queued_slot_ms"}
    assert splice.encode(partial) == encode(names.JOB_STATE, {**partial, "queued_slot_ms": None})


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(CREATE_JOBS, JOB_STATES)
def test_a_job_written_with_the_create_commands_spec_bytes_is_the_full_encoding(
        command: dict[str, Any], state: dict[str, Any]) -> None:
    """adopt() takes a CreateJob's spec bytes for the new job: the job's bytes must be what
    encoding the whole job gives, for any command and any job around the spec."""
    data = encode(names.CREATE_JOB, command)
    decoded = decode(data)
    splice = SplicedEncoder(names.JOB_STATE, "spec")
    assert splice.adopt(data, decoded)
    job = {**state, "spec": decoded.record["spec"]}
    with mock.patch("schemas.codec.schemaless_writer", side_effect=AssertionError("encoded")):
        spliced = splice.encode(job)  # the spec is not encoded again
    assert spliced == encode(names.JOB_STATE, job)


def test_adopt_takes_nothing_it_cannot_prove_is_the_fields_bytes() -> None:
    splice = SplicedEncoder(names.JOB_STATE, "spec")
    create = _sample(names.CREATE_JOB)
    data = encode(names.CREATE_JOB, create)
    # The spec is not the update's last field (expected_version follows it).
    update = encode(names.UPDATE_JOB, _sample(names.UPDATE_JOB))
    assert not splice.adopt(update, decode(update))
    # Read from another version than it was written with: the bytes are not the reader's.
    resolved = Decoded(name=names.CREATE_JOB, version=1, reader_version=2,
                       record=decode(data).record)
    assert not splice.adopt(data, resolved)
    # The bytes before the spec are not the canonical encoding of what was decoded (here a
    # record that does not match them at all): nothing taken.
    other = decode(encode(names.CREATE_JOB, {**create, "command_id": "another"}))
    assert not splice.adopt(data, other)
    # A record the compiled writer cannot take (a bool for a string): nothing taken.
    odd = Decoded(name=names.CREATE_JOB, version=1, reader_version=1,
                  record={**decode(data).record, "job_id": True})
    assert not splice.adopt(data, odd)
    assert splice.adopt(data, decode(data))


# --- decode errors ------------------------------------------------------------------------------


def _reason(data: bytes, reader_name: str | None = None) -> str:
    with pytest.raises(DecodeError) as info:
        decode(data, reader_name)
    assert info.value.reason in DECODE_REASONS
    assert info.value.reason in str(info.value)
    return info.value.reason


def test_too_short() -> None:
    assert _reason(b"") == "too_short"
    assert _reason(b"\xc3") == "too_short"
    assert _reason(_valid()[:9]) == "too_short"


def test_bad_marker() -> None:
    valid = _valid()
    assert _reason(b"\xc3\x02" + valid[2:]) == "bad_marker"
    assert _reason(b"\x01\xc3" + valid[2:]) == "bad_marker"
    assert _reason(b"\x00" * 32) == "bad_marker"
    # Confluent wire format (magic 0 + schema id) is rejected, not misread.
    assert _reason(b"\x00\x00\x00\x00\x01" + valid[10:]) == "bad_marker"


def test_unknown_fingerprint() -> None:
    valid = _valid()
    assert _reason(MARKER + b"\x00" * 8 + valid[10:]) == "unknown_fingerprint"
    # A big-endian fingerprint is a different, unknown one.
    assert _reason(MARKER + valid[2:10][::-1] + valid[10:]) == "unknown_fingerprint"
    with pytest.raises(DecodeError, match="no schema in the registry has fingerprint 0000"):
        decode(MARKER + b"\x00" * 8)


def test_truncated_body() -> None:
    valid = _valid()
    assert _reason(valid[:10]) == "truncated_or_corrupt"
    assert _reason(valid[:-1]) == "truncated_or_corrupt"
    assert _reason(valid[: len(valid) // 2]) == "truncated_or_corrupt"


def test_garbage_after_valid_header() -> None:
    header = REGISTRY.latest(names.CREATE_JOB).header
    assert _reason(header + b"\xff" * 40) == "truncated_or_corrupt"
    assert _reason(header + bytes(range(256))) == "truncated_or_corrupt"


def test_trailing_bytes_after_a_valid_body() -> None:
    with pytest.raises(DecodeError, match="1 trailing bytes") as info:
        decode(_valid() + b"\x00")
    assert info.value.reason == "truncated_or_corrupt"


def _tiny_codec(directory: Path) -> tuple[Codec, bytes]:
    """A one-record registry whose body layout is easy to write by hand."""
    schema = {
        "type": "record",
        "name": "kron.test.Tiny",
        "fields": [
            {
                "name": "kind",
                "type": {"type": "enum", "name": "kron.test.Kind", "symbols": ["a", "b"]},
            },
            {"name": "note", "type": ["null", "string"]},
            {"name": "text", "type": "string"},
        ],
    }
    (directory / "kron.test.Tiny.v1.avsc").write_text(json.dumps(schema))
    codec = Codec(SchemaRegistry.from_directory(directory))
    return codec, codec.registry.latest("kron.test.Tiny").header


def test_corrupt_values_inside_the_body(tmp_path: Path) -> None:
    codec, header = _tiny_codec(tmp_path)
    # enum index 1 (zigzag 0x02), union branch 1 (string "n"), string "hi".
    assert codec.decode(header + b"\x02\x02\x02n\x04hi").record == {
        "kind": "b",
        "note": "n",
        "text": "hi",
    }
    corrupt = {
        "enum index past the symbols": b"\x04\x00\x04hi",
        "union branch past the branches": b"\x00\x04\x04hi",
        "invalid UTF-8": b"\x00\x00\x04\xff\xfe",
        "negative string length": b"\x00\x00\x03hi",
        "string longer than the data": b"\x00\x00\x7ehi",
        "unterminated varint": b"\x00\x00\xff\xff\xff",
    }
    for case, body in corrupt.items():
        with pytest.raises(DecodeError) as info:
            codec.decode(header + body)
        assert info.value.reason == "truncated_or_corrupt", case


NEGATIVE_INDEXES = {"enum index -1": b"\x01\x00\x04hi", "union index -1": b"\x00\x01\x02n\x04hi"}


def test_negative_enum_or_union_index_is_rejected(tmp_path: Path) -> None:
    """fastavro indexes symbols and branches Python-style, so index -1 reads the last one;
    Java refuses it, and so does the codec: damaged bytes must not read as a record."""
    codec, header = _tiny_codec(tmp_path)
    for case, body in NEGATIVE_INDEXES.items():
        for kind in (bytes, bytearray, memoryview):
            with pytest.raises(DecodeError) as info:
                codec.decode(kind(header + body))  # type: ignore[arg-type]
            assert info.value.reason == "truncated_or_corrupt", (case, kind)
            assert "out of range" in info.value.message, (case, kind)


def test_negative_index_is_rejected_when_resolving_to_a_later_version(tmp_path: Path) -> None:
    """Bytes of an older version are read by fastavro, which resolves them; the writer's
    compiled reader checks them first."""
    _tiny_codec(tmp_path)
    v1 = json.loads((tmp_path / "kron.test.Tiny.v1.avsc").read_text())
    v2 = {**v1, "fields": [*v1["fields"], {"name": "extra", "type": "int", "default": 7}]}
    (tmp_path / "kron.test.Tiny.v2.avsc").write_text(json.dumps(v2))
    codec = Codec(SchemaRegistry.from_directory(tmp_path))
    header = codec.registry.get("kron.test.Tiny", 1).header
    assert codec.decode(header + b"\x02\x02\x02n\x04hi").record == {
        "kind": "b", "note": "n", "text": "hi", "extra": 7}
    for case, body in NEGATIVE_INDEXES.items():
        with pytest.raises(DecodeError) as info:
            codec.decode(header + body)
        assert info.value.reason == "truncated_or_corrupt", case


def test_incompatible_reader_schema() -> None:
    assert _reason(_valid(), names.TICK) == "incompatible_schema"


def test_unknown_reader_name_is_a_caller_error() -> None:
    with pytest.raises(UnknownSchemaError):
        decode(_valid(), "kron.commands.Nope")
    with pytest.raises(UnknownSchemaError):
        decode(b"", "kron.commands.Nope")  # reported before looking at the bytes


def test_decode_error_pickles() -> None:
    with pytest.raises(DecodeError) as info:
        decode(b"")
    clone = pickle.loads(pickle.dumps(info.value))
    assert (clone.reason, clone.message) == (info.value.reason, info.value.message)


@settings(max_examples=300)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_raise_decode_error(data: bytes) -> None:
    try:
        decode(data)
    except DecodeError as err:
        assert err.reason in DECODE_REASONS


@settings(max_examples=500)
@given(st.sampled_from([e.header for e in REGISTRY]), st.binary(max_size=200))
def test_arbitrary_body_after_known_header_decodes_or_raises_decode_error(
    header: bytes, body: bytes
) -> None:
    try:
        decoded = decode(header + body)
    except DecodeError as err:
        assert err.reason == "truncated_or_corrupt"
    else:
        assert REGISTRY.latest(decoded.name).header == header


@settings(max_examples=300)
@given(st.data())
def test_mutated_valid_messages_decode_or_raise_decode_error(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(REGISTRY.names))
    message = bytearray(encode(name, _sample(name)))
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(message) - 1))
        message[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(message)))
    try:
        decode(bytes(message[:cut]))
    except DecodeError as err:
        assert err.reason in DECODE_REASONS


# --- encode errors ------------------------------------------------------------------------------


def _encode_error(record: Any, name: str = names.CREATE_JOB) -> EncodeError:
    with pytest.raises(EncodeError) as info:
        encode(name, record)
    assert info.value.schema_name == name
    return info.value


def test_encode_rejects_wrong_type_and_names_the_field() -> None:
    record = _create_job()
    record["job_id"] = 42
    err = _encode_error(record)
    assert err.field is not None and err.field.endswith("job_id")
    assert "job_id" in str(err) and "int" in str(err)


def test_encode_rejects_values_fastavro_would_silently_corrupt() -> None:
    assert "max_attempts" in str(_encode_error(_create_job(retry={"max_attempts": 1.5})))
    assert "max_attempts" in str(_encode_error(_create_job(retry={"max_attempts": INT_MAX + 1})))
    assert "fire_all_cap" in str(_encode_error(_create_job(misfire={"fire_all_cap": "7"})))
    failed = {**_sample(names.EXECUTION_FAILED), "final": "no"}
    assert "final" in str(_encode_error(failed, names.EXECUTION_FAILED))
    state = {**_sample(names.EXECUTION_STATE), "fencing_token": LONG_MAX + 1}
    assert "fencing_token" in str(_encode_error(state, names.EXECUTION_STATE))


def test_encode_rejects_unknown_and_missing_fields() -> None:
    record = _create_job()
    record["jbo_id"] = "typo"
    assert _encode_error(record).field == "jbo_id"
    record = _create_job()
    del record["command_id"]
    assert "command_id" in str(_encode_error(record))


def test_encode_rejects_bad_enum_union_and_shape() -> None:
    assert "overlap" in str(_encode_error(_create_job(overlap="sometimes")))
    assert "target" in str(_encode_error(_create_job(target=("kron.SmtpTarget", {}))))
    _encode_error(["not", "a", "record"])
    _encode_error(None)


def test_encode_error_does_not_leak_values() -> None:
    record = _create_job()
    record["spec"]["target"][1]["headers"] = {"authorization": 12345}
    assert "12345" not in str(_encode_error(record))


def test_encode_unknown_name_is_a_caller_error() -> None:
    with pytest.raises(UnknownSchemaError):
        encode("kron.commands.Nope", {})


def test_encode_error_pickles() -> None:
    err = _encode_error({})
    clone = pickle.loads(pickle.dumps(err))
    assert (clone.schema_name, clone.message, clone.field) == (
        err.schema_name,
        err.message,
        err.field,
    )


def test_unvalidated_codec_still_rejects_unknown_fields() -> None:
    fast = Codec(REGISTRY, validate=False)
    record = _create_job()
    assert fast.encode(names.CREATE_JOB, record) == encode(names.CREATE_JOB, record)
    record["extra"] = 1
    with pytest.raises(EncodeError):
        fast.encode(names.CREATE_JOB, record)


# --- schema evolution ---------------------------------------------------------------------------


# The test-only version follows the newest committed one.
NEXT = REGISTRY.latest(names.CREATE_JOB).version + 1
REGISTRY_CODEC = Codec(REGISTRY)


def _registry_with_create_job_v2(directory: Path) -> SchemaRegistry:
    """Committed schemas plus a test-only next CreateJob version that adds fields with
    defaults to v1."""
    for path in AVRO_DIR.glob("*.avsc"):
        (directory / path.name).write_bytes(path.read_bytes())
    v2 = copy.deepcopy(json.loads((AVRO_DIR / "kron.commands.CreateJob.v1.avsc").read_text()))
    v2["fields"].append({"name": "priority", "type": "int", "default": 5})
    spec = next(f for f in v2["fields"] if f["name"] == "spec")["type"]
    spec["fields"].append(
        {"name": "labels", "type": {"type": "array", "items": "string"}, "default": []}
    )
    (directory / f"kron.commands.CreateJob.v{NEXT}.avsc").write_text(json.dumps(v2))
    return SchemaRegistry.from_directory(directory)


def test_v1_bytes_resolve_to_the_v2_reader(tmp_path: Path) -> None:
    codec = Codec(_registry_with_create_job_v2(tmp_path))
    assert codec.registry.latest(names.CREATE_JOB).version == NEXT
    record = SAMPLES[(names.CREATE_JOB, 1)][0]
    v1_bytes = codec.encode(names.CREATE_JOB, record, version=1)
    # the same bytes the committed v1 writes
    assert v1_bytes == REGISTRY_CODEC.encode(names.CREATE_JOB, record, version=1)

    upgraded = codec.decode(v1_bytes)
    assert (upgraded.version, upgraded.reader_version) == (1, NEXT)
    assert upgraded.record["priority"] == 5
    assert upgraded.record["spec"]["labels"] == []
    _assert_contains(record, upgraded.record)


def test_v2_bytes_resolve_to_a_pinned_v1_reader(tmp_path: Path) -> None:
    codec = Codec(_registry_with_create_job_v2(tmp_path))
    record = {**SAMPLES[(names.CREATE_JOB, 1)][1], "priority": 9}
    v2_bytes = codec.encode(names.CREATE_JOB, record)
    assert v2_bytes[2:10] == codec.registry.get(names.CREATE_JOB, NEXT).fingerprint
    old = codec.decode(v2_bytes, names.CREATE_JOB, reader_version=1)
    assert (old.version, old.reader_version) == (NEXT, 1)
    assert "priority" not in old.record and "labels" not in old.record["spec"]
    # A process that only knows v1 cannot even identify v2 bytes: deploy readers first.
    assert _reason(v2_bytes) == "unknown_fingerprint"


# --- ItemFieldReader: a batch's items with their specs' bytes ----------------------------------

BATCHES = st.fixed_dictionaries({
    "envelope": ENVELOPES, "command_id": TEXT,
    "jobs": st.lists(st.fixed_dictionaries(
        {"job_id": TEXT, "idempotency_key": _opt(TEXT), "spec": JOB_SPECS}), max_size=4)})


def _zigzag(n: int) -> bytes:
    z, out = (n << 1) ^ (n >> 63), bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    return bytes([*out, z])


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=60)
@given(BATCHES)
def test_item_reader_reads_what_decode_reads_and_each_specs_bytes(batch: dict[str, Any]) -> None:
    data = encode(names.CREATE_JOBS, batch)
    decoded, kept = ItemFieldReader(names.CREATE_JOBS).decode(data)
    assert decoded == decode(data)
    # The bytes kept are what the job's own encoder would write for the spec it holds.
    fresh = SplicedEncoder(names.JOB_STATE, "spec")
    assert kept == [fresh._blob(job["spec"]) for job in decoded.record["jobs"]]


def test_item_reader_reads_arrays_written_in_sized_blocks() -> None:
    """Avro lets a writer split an array into blocks, each count negative and followed by
    its size in bytes; fastavro writes one plain block, other writers may not."""
    batch = SAMPLES[(names.CREATE_JOBS, 1)][0]
    reader = ItemFieldReader(names.CREATE_JOBS)
    head = {k: v for k, v in batch.items() if k != "jobs"}
    plain = encode(names.CREATE_JOBS, {**head, "jobs": []})  # ends with the count 0
    one_block = encode(names.CREATE_JOBS, batch)
    _, blobs = reader.decode(one_block)
    # A one-job batch is `plain` without its final 0, then the count 1 (one byte), the item
    # and the final 0.
    items = [encode(names.CREATE_JOBS, {**head, "jobs": [job]})[len(plain):-1]
             for job in batch["jobs"]]
    first, rest = items[:1], items[1:]
    body = b"".join([_zigzag(-1), _zigzag(len(first[0])), *first,
                     _zigzag(len(rest)), *rest, _zigzag(0)])
    data = plain[:-1] + body
    decoded, kept = reader.decode(data)
    assert decoded.record == decode(one_block).record == decode(data).record
    assert kept == blobs and len(kept) == 3


def test_a_batchs_spec_is_written_as_a_jobs_spec() -> None:
    """The worker keeps a batch's spec bytes for the job's record only while the two
    fields' schemas agree (Engine._keep_specs); a later version of one must keep them so
    or see the splice switched off."""
    reader = ItemFieldReader(names.CREATE_JOBS)
    assert reader.field_schema == SplicedEncoder(names.JOB_STATE, "spec").field_schema
    assert reader.field_schema != SplicedEncoder(names.JOB_STATE, "envelope").field_schema


def test_item_reader_refuses_a_damaged_index_as_decode_does() -> None:
    """Each byte of a batch in turn set to 0x01 (zigzag -1): the item reader answers as
    decode does, record or error. Some of those bytes are enum or union indexes, which
    fastavro alone would read as the last symbol or branch."""
    batch = encode(names.CREATE_JOBS, SAMPLES[(names.CREATE_JOBS, 1)][0])
    reader, schema = ItemFieldReader(names.CREATE_JOBS), default_registry().latest(
        names.CREATE_JOBS).schema
    refused_though_fastavro_reads = 0
    for at in range(HEADER_LEN, len(batch)):
        damaged = batch[:at] + b"\x01" + batch[at + 1:]
        try:
            expected: Any = decode(damaged)
        except DecodeError as exc:
            expected = exc.reason
            with contextlib.suppress(Exception):
                schemaless_reader(BytesIO(damaged[HEADER_LEN:]), schema, None)
                refused_though_fastavro_reads += 1
        try:
            got: Any = reader.decode(damaged)[0]
        except DecodeError as exc:
            got = exc.reason
        assert got == expected, at
    assert refused_though_fastavro_reads > 0


def test_item_reader_leaves_other_records_and_bad_bytes_to_decode() -> None:
    reader = ItemFieldReader(names.CREATE_JOBS)
    tick = _valid(names.TICK)
    assert reader.decode(tick) == (decode(tick), [])
    batch = encode(names.CREATE_JOBS, SAMPLES[(names.CREATE_JOBS, 1)][0])
    with pytest.raises(DecodeError) as info:
        reader.decode(batch[:-5])
    assert info.value.reason == _reason(batch[:-5])
    with pytest.raises(ValueError, match="not an array"):
        ItemFieldReader(names.CREATE_JOB)


# --- helpers ------------------------------------------------------------------------------------


def _assert_contains(expected: Any, actual: Any, path: str = "record") -> None:
    """Every value given in ``expected`` is in ``actual``; omitted keys may hold defaults."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), path
        for key, value in expected.items():
            assert key in actual, f"{path}.{key}"
            _assert_contains(value, actual[key], f"{path}.{key}")
    elif isinstance(expected, tuple):
        assert isinstance(actual, tuple) and actual[0] == expected[0], path
        _assert_contains(expected[1], actual[1], f"{path}<{expected[0]}>")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), path
        for i, (a, b) in enumerate(zip(expected, actual, strict=True)):
            _assert_contains(a, b, f"{path}[{i}]")
    else:
        assert actual == expected, path
