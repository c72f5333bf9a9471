"""Compiled Avro readers: fastavro's record or fastavro's error, never a third answer,
except that an enum or union index out of range is refused (OutOfRange) where fastavro
reads index -1 as the last symbol or branch."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator
from io import BytesIO
from typing import Any

import fastavro._read_py
import pytest
from fastavro import schemaless_reader, schemaless_writer
from fastavro.io.binary_decoder import BinaryDecoder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import codec, names
from schemas.codec import _has_record_union
from schemas.errors import DecodeError
from schemas.reader import OutOfRange, Unfit, compile_reader, read_all
from schemas.registry import HEADER_LEN, default_registry
from tests.golden.make_golden import SAMPLES
from tests.unit.test_codec import CREATE_JOBS, EXECUTION_STATES, JOB_STATES

REGISTRY = default_registry()
ENTRIES = [REGISTRY.get(name, version) for (name, version) in sorted(SAMPLES)]


def _tag(schema: Any) -> bool:
    return isinstance(schema, dict) and _has_record_union(schema)


def _fastavro(schema: Any, body: bytes) -> Any:
    tag = _tag(schema)
    buf = BytesIO(body)
    value = schemaless_reader(buf, schema, None, return_record_name=tag,
                              return_record_name_override=tag)
    if buf.tell() != len(body):
        raise ValueError("trailing bytes")
    return value


def _compiled(schema: Any, body: bytes) -> Any:
    reader = compile_reader(schema, tag=_has_record_union(schema))
    assert reader is not None
    return read_all(reader, body, 0)


def _encoded(name: str, record: dict[str, Any]) -> bytes:
    buf = BytesIO()
    schemaless_writer(buf, REGISTRY.latest(name).schema, record)
    return buf.getvalue()


def _same(a: Any, b: Any) -> bool:
    """Equal, with floats compared bit for bit (damaged bytes read as NaN too)."""
    if isinstance(a, float) and isinstance(b, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return (type(a) is type(b) and len(a) == len(b)
                and all(_same(x, y) for x, y in zip(a, b, strict=True)))
    return type(a) is type(b) and bool(a == b)


class _Negative(Exception):
    pass


@contextlib.contextmanager
def _negative_indexes_refused() -> Iterator[None]:
    """fastavro's pure-Python decoder, refusing an enum or union index below zero."""
    enum, index = BinaryDecoder.read_enum, BinaryDecoder.read_index

    def strict(read: Any) -> Any:
        def read_strictly(self: BinaryDecoder) -> int:
            i: int = read(self)
            if i < 0:
                raise _Negative(i)
            return i
        return read_strictly

    BinaryDecoder.read_enum, BinaryDecoder.read_index = strict(enum), strict(index)
    try:
        yield
    finally:
        BinaryDecoder.read_enum, BinaryDecoder.read_index = enum, index


def _strict_fastavro_refuses(schema: Any, body: bytes) -> bool:
    tag = _tag(schema)
    with _negative_indexes_refused():
        try:
            fastavro._read_py.schemaless_reader(BytesIO(body), schema, None,
                                                return_record_name=tag,
                                                return_record_name_override=tag)
        except Exception:
            return True
    return False


def _same_or_unfit(schema: Any, body: bytes) -> None:
    """Where the compiled reader answers, fastavro gives the same record; where it refuses
    an index, fastavro refuses the bytes too once it refuses negative indexes."""
    try:
        got = _compiled(schema, body)
    except OutOfRange:
        assert _strict_fastavro_refuses(schema, body)
        return
    except Unfit:
        return
    assert _same(got, _fastavro(schema, body))


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: f"{e.name}.v{e.version}")
def test_every_committed_schema_compiles(entry: Any) -> None:
    assert compile_reader(entry.schema, tag=_has_record_union(entry.schema)) is not None


def test_every_golden_sample_reads_as_fastavro_reads_it() -> None:
    checked = 0
    for (name, version), records in SAMPLES.items():
        schema = REGISTRY.get(name, version).schema
        for record in records:
            buf = BytesIO()
            schemaless_writer(buf, schema, record)
            body = buf.getvalue()
            assert _compiled(schema, body) == _fastavro(schema, body), name
            checked += 1
    assert checked > 20


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=200)
@given(st.one_of(
    st.tuples(st.just(names.JOB_STATE), JOB_STATES),
    st.tuples(st.just(names.EXECUTION_STATE), EXECUTION_STATES),
    st.tuples(st.just(names.CREATE_JOB), CREATE_JOBS),  # CreateJob records
))
def test_records_read_as_fastavro_reads_them(case: tuple[str, dict[str, Any]]) -> None:
    name, record = case
    schema = REGISTRY.latest(name).schema
    body = _encoded(name, record)
    assert _compiled(schema, body) == _fastavro(schema, body)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=400)
@given(st.sampled_from(ENTRIES), st.data())
def test_damaged_bytes_read_as_fastavro_reads_them_or_are_left_to_it(
        entry: Any, data: st.DataObject) -> None:
    records = SAMPLES[(entry.name, entry.version)]
    record = records[data.draw(st.integers(0, len(records) - 1))]
    buf = BytesIO()
    schemaless_writer(buf, entry.schema, record)
    body = bytearray(buf.getvalue())
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(body) - 1))
        body[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(body)))
    _same_or_unfit(entry.schema, bytes(body[:cut]))


@settings(max_examples=300)
@given(st.binary(max_size=64))
def test_random_bytes_never_get_a_third_answer(body: bytes) -> None:
    _same_or_unfit(REGISTRY.latest(names.JOB_STATE).schema, body)


def test_bytes_that_end_early_are_left_to_fastavro() -> None:
    reader = compile_reader(["null", "boolean"])
    assert reader is not None
    with pytest.raises(Unfit) as info:  # union branch 1 (boolean), then nothing
        read_all(reader, b"\x02", 0)
    assert not isinstance(info.value, OutOfRange)


def test_a_boolean_byte_above_one_reads_true_as_fastavro_reads_it() -> None:
    reader = compile_reader(["null", "boolean"])
    assert reader is not None
    for byte in (1, 2, 0x80, 0xFF):
        body = bytes([2, byte])
        assert read_all(reader, body, 0) is True is _fastavro(["null", "boolean"], body)
    assert read_all(reader, b"\x02\x00", 0) is False


@pytest.mark.parametrize(("body", "why"), [
    (b"\x04", "union index 2 of 2 branches"),
    (b"\x01", "union index -1, which fastavro reads as the last branch"),
    (b"\x02\x05\x03", "a damaged boolean, then enum index -2"),
])
def test_an_index_out_of_range_is_refused(body: bytes, why: str) -> None:
    schema = ["null", {"type": "record", "name": "R", "fields": [
        {"name": "flag", "type": "boolean"},
        {"name": "kind", "type": {"type": "enum", "name": "K", "symbols": ["a", "b"]}}]}]
    reader = compile_reader(schema)
    assert reader is not None
    with pytest.raises(OutOfRange):
        read_all(reader, body, 0)
    assert _strict_fastavro_refuses(schema, body), why


def test_a_long_over_64_bits_is_left_to_fastavro() -> None:
    reader = compile_reader("long")
    assert reader is not None
    assert read_all(reader, b"\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01", 0) == 2**63 - 1
    with pytest.raises(Unfit):
        read_all(reader, b"\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x03", 0)
    with pytest.raises(Unfit):
        read_all(reader, b"\xff" * 11 + b"\x01", 0)


def test_negative_counts_are_blocks_with_their_size() -> None:
    reader = compile_reader({"type": "array", "items": "string"})
    assert reader is not None
    # -2 items, 4 bytes, "ab", "c"; then 1 item "d"; then the end.
    body = b"\x03\x08\x04ab\x02c\x02\x02d\x00"
    assert read_all(reader, body, 0) == ["ab", "c", "d"]
    assert schemaless_reader(BytesIO(body), {"type": "array", "items": "string"}, None) == \
        ["ab", "c", "d"]


def test_the_codec_reads_through_the_compiled_reader_and_keeps_its_errors() -> None:
    data = codec.encode(names.CREATE_JOB, SAMPLES[(names.CREATE_JOB, 1)][0])
    plan = codec.default_codec()._plan(data, None, None)
    assert plan.compiled is not None
    assert codec.decode(data).record == _fastavro(REGISTRY.latest(names.CREATE_JOB).schema,
                                                  data[HEADER_LEN:])
    with pytest.raises(DecodeError) as truncated:
        codec.decode(data[:-3])
    assert truncated.value.reason == "truncated_or_corrupt"
    with pytest.raises(DecodeError):
        codec.decode(data + b"\x00")


def test_a_nan_read_from_damaged_bytes_is_fastavros_nan() -> None:
    schema = {"type": "record", "name": "N", "fields": [{"name": "x", "type": "double"}]}
    body = b"\x00\x00\x00\x00\x00\x00\xf8\x7f"
    _same_or_unfit(schema, body)
    assert _compiled(schema, body)["x"] != _compiled(schema, body)["x"]  # a NaN


@pytest.mark.parametrize("kind", [bytearray, memoryview])
def test_other_buffers_read_as_bytes_do(kind: type) -> None:
    record = SAMPLES[(names.DEAD_LETTER, 1)][0]
    data = codec.encode(names.DEAD_LETTER, record)
    decoded = codec.decode(kind(data)).record  # type: ignore[arg-type]
    assert decoded == codec.decode(data).record
    assert all(type(v) is not bytearray for v in decoded.values())


def test_counts_of_empty_items_past_the_bytes_are_left_to_fastavro() -> None:
    reader = compile_reader({"type": "array", "items": "null"})
    assert reader is not None
    assert read_all(reader, b"\x02\x00", 0) == [None]
    with pytest.raises(Unfit):  # fastavro reads [None, None]: more items than bytes left
        read_all(reader, b"\x04\x00", 0)
    with pytest.raises(Unfit):  # -2**31 items in a block of 0 bytes: not looped over here
        read_all(reader, b"\xff\xff\xff\xff\x0f\x00\x00", 0)


def test_a_schema_whose_code_would_explode_is_left_to_fastavro() -> None:
    # Each level holds two fields of the level below: inline, the code doubles per level.
    schema: Any = {"type": "record", "name": "L0", "fields": [{"name": "x", "type": "long"}]}
    for level in range(1, 16):
        schema = {"type": "record", "name": f"L{level}",
                  "fields": [{"name": "a", "type": schema},
                             {"name": "b", "type": f"L{level - 1}"}]}
    assert compile_reader(schema) is None
