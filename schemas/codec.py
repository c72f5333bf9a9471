"""Avro single-object encoding of kron records.

Wire format (identical to Java's ``BinaryMessageEncoder``)::

    C3 01 | CRC-64-AVRO fingerprint of the writer schema, 8 bytes little-endian | Avro binary body

Records are plain dicts. A union of several record types (``JobSpec.schedule``,
``JobSpec.target``) is written and read as a ``(full_type_name, dict)`` tuple, e.g.
``("kron.HttpTarget", {"url": ...})``, so a consumer never has to guess the branch from its keys.
A plain dict is also accepted on encode; fastavro then picks the first branch it fits.

Throughput is dominated by fastavro (per-field cost ~0.3 us to write, ~0.2 us to read, ~0.3 us to
validate). Measured on the 2-core dev container, CPython 3.11, fastavro 1.13.1 (Cython), records/s:

    record (bytes)                    encode   encode(validate=False)   decode
    Tick (127)                         ~135k    ~235k                    ~210k
    ExecutionHeartbeat (154)           ~110k    ~190k                    ~180k
    ExecutionState, 2 attempts (293)    ~37k     ~65k                     ~74k
    CreateJob, full JobSpec (393)       ~34k     ~62k                     ~64k

Unvalidated encoding (``encode_trusted``, the engine's state writes) goes through a writer
compiled for the schema where it has one (``schemas.writer``): an ExecutionState in ~6 us
instead of 14. Decoding without schema resolution goes through a reader compiled for the
writer's schema (``schemas.reader``): a JobSpec in ~6 us instead of 12.5-22; bytes it does
not read exactly as fastavro would go to fastavro, for its record or its error, except an
enum or union index out of range, which it refuses where fastavro would read index -1 as
the last symbol or branch.

Re-measure from the repository root (not a test: timings are machine-dependent):

    .venv/bin/python -m timeit -s "from schemas.codec import encode, decode; \
    from tests.golden.make_golden import SAMPLES; n = 'kron.engine.Tick'; \
    r = SAMPLES[(n, 1)][0]; b = encode(n, r)" "decode(encode(n, r))"
"""

from __future__ import annotations

import functools
import re
import struct
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from io import BytesIO
from typing import Any, Final, cast

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.read import SchemaResolutionError
from fastavro.validation import ValidationError, validate

from schemas.errors import DecodeError, EncodeError
from schemas.reader import OutOfRange, Reader, Unfit, compile_reader, read_all, read_long
from schemas.registry import (
    HEADER_LEN,
    MARKER,
    SchemaEntry,
    SchemaRegistry,
    default_registry,
)
from schemas.writer import Writer, compile_writer

_MARKER_LEN: Final = len(MARKER)
# fastavro's strict-writer messages, which name the offending field.
_WRITER_FIELD: Final = re.compile(
    r"^Field (\S+) is specified in the schema but missing"
    r"|more fields than the schema specifies: (.+)$"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Decoded:
    """A decoded record, shaped by the reader schema.

    ``version`` is the schema version that wrote the bytes; ``reader_version`` the one the record
    was resolved to (they differ after a schema upgrade: missing fields then hold their defaults).
    """

    name: str
    version: int
    reader_version: int
    record: dict[str, Any]


@dataclass(frozen=True, kw_only=True, slots=True)
class _ReadPlan:
    writer: SchemaEntry
    reader: SchemaEntry
    # None when writer and reader are the same version: fastavro then skips schema resolution.
    reader_schema: dict[str, Any] | None
    # Asking fastavro for branch names costs 10-15% of a decode even for schemas without record
    # unions, so only schemas that have one pay for it.
    tag_unions: bool
    # The writer's compiled reader (schemas.reader). With a schema to resolve, it only
    # checks the bytes (an index out of range) before fastavro reads them.
    compiled: Reader | None


class Codec:
    """Encoder/decoder bound to one registry; caches every per-schema decision."""

    __slots__ = ("_plans", "_registry", "_validate", "_writers")

    def __init__(self, registry: SchemaRegistry, *, validate: bool = True) -> None:
        # validate=False roughly doubles encode throughput; only for records known to be well
        # typed (e.g. re-encoding a record this codec just decoded). Unknown and missing keys
        # are still rejected either way.
        self._registry = registry
        self._validate = validate
        # Keyed by (writer fingerprint, reader name, reader version). Only fingerprints found in
        # the registry are cached, so garbage input cannot grow it.
        self._plans: dict[tuple[bytes, str | None, int | None], _ReadPlan] = {}
        # Compiled writers by (name, version), None where a schema does not compile.
        self._writers: dict[tuple[str, int], Writer | None] = {}

    @property
    def registry(self) -> SchemaRegistry:
        return self._registry

    def encode(self, name: str, record: Mapping[str, Any], *, version: int | None = None) -> bytes:
        """Write ``record`` with the latest version of ``name`` (or the given version)."""
        entry = (
            self._registry.latest(name) if version is None else self._registry.get(name, version)
        )
        # Validating or not: a record the compiled writer takes passes fastavro's validation
        # (schemas.writer), and the API's CreateJob took ~40 us to validate and write.
        fast = self._writer(entry)
        if fast is not None:
            # try, not contextlib.suppress: free when nothing is raised, where the context
            # manager's three calls were an eighth of an execution record's encode.
            try:
                return fast(record)
            except Exception:  # not canonical: fastavro writes it, or says what is wrong
                fast = None
        buf = BytesIO()
        buf.write(entry.header)
        try:
            # fastavro's writer alone would silently truncate 1.5 to 1 for an int field, write
            # ints outside the 32-bit range and take any truthy value as true; validating first
            # rejects all three. raise_errors=False is ~10x faster on unions (no exception per
            # rejected branch); the second call only runs to build the error report.
            if self._validate and not validate(record, entry.schema, raise_errors=False):
                validate(record, entry.schema, raise_errors=True)
            # strict_allow_default: unknown keys (typos) are errors; omitted keys take defaults.
            schemaless_writer(buf, entry.schema, record, strict_allow_default=True)
        except ValidationError as exc:
            # fastavro's own message embeds the offending value (maybe a secret header); ours
            # names only its type, so don't chain the original into tracebacks.
            raise _encode_error(entry, exc) from None
        except Exception as exc:
            raise _encode_error(entry, exc) from exc
        return buf.getvalue()

    def _writer(self, entry: SchemaEntry) -> Writer | None:
        key = (entry.name, entry.version)
        try:
            return self._writers[key]
        except KeyError:
            writer = self._writers[key] = compile_writer(entry.schema, prefix=entry.header)
            return writer

    def decode(
        self,
        data: bytes,
        reader_name: str | None = None,
        *,
        reader_version: int | None = None,
    ) -> Decoded:
        """Read single-object-encoded ``data``.

        The record is resolved to the latest version of ``reader_name`` (default: the writer's own
        record name), or to ``reader_version`` of it. Any problem with the bytes raises
        ``DecodeError``; an unknown ``reader_name`` raises ``UnknownSchemaError``.
        """
        if reader_name is not None:
            # A caller bug should surface on the first call, not wait for a well-formed message.
            self._reader_entry(reader_name, reader_version)
        plan = self._plan(data, reader_name, reader_version)
        record = _read_compiled(data, plan)
        if record is None:
            buf = BytesIO(data)
            buf.seek(HEADER_LEN)
            record = _read_body(buf, plan)
            if buf.tell() != len(data):
                raise DecodeError(
                    "truncated_or_corrupt",
                    f"{len(data) - buf.tell()} trailing bytes after a {plan.writer.name} "
                    f"v{plan.writer.version} body",
                )
        return Decoded(
            name=plan.reader.name,
            version=plan.writer.version,
            reader_version=plan.reader.version,
            record=record,
        )

    def _plan(self, data: bytes, reader_name: str | None, reader_version: int | None) -> _ReadPlan:
        if len(data) < HEADER_LEN:
            raise DecodeError(
                "too_short", f"{len(data)} bytes is shorter than the {HEADER_LEN}-byte header"
            )
        if data[:_MARKER_LEN] != MARKER:
            raise DecodeError(
                "bad_marker",
                f"expected marker {MARKER.hex()}, got {bytes(data[:_MARKER_LEN]).hex()}",
            )
        fp = bytes(data[_MARKER_LEN:HEADER_LEN])
        key = (fp, reader_name, reader_version)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._make_plan(fp, reader_name, reader_version)
            self._plans[key] = plan
        return plan

    def _make_plan(
        self, fp: bytes, reader_name: str | None, reader_version: int | None
    ) -> _ReadPlan:
        writer = self._registry.by_fingerprint(fp)
        if writer is None:
            raise DecodeError(
                "unknown_fingerprint",
                f"no schema in the registry has fingerprint {fp.hex()} (little-endian); "
                "the writer may be newer than this reader",
            )
        reader = self._reader_entry(reader_name or writer.name, reader_version)
        tag = _has_record_union(writer.schema) or _has_record_union(reader.schema)
        return _ReadPlan(
            writer=writer,
            reader=reader,
            reader_schema=None if reader is writer else reader.schema,
            tag_unions=tag,
            compiled=compile_reader(writer.schema, tag=tag),
        )

    def _reader_entry(self, name: str, version: int | None) -> SchemaEntry:
        if version is None:
            return self._registry.latest(name)
        return self._registry.get(name, version)


class SplicedEncoder:
    """Writes the latest version of a record schema, unvalidated like ``encode_trusted``,
    reusing one field's Avro bytes while that field holds the same object.

    A record's binary form is its fields' forms in order, so the bytes are the fields
    before the spliced one, its cached bytes, and the fields after. The engine rewrites a
    job at every fire, and its spec (half the encode: 19 -> 10 us) only changes by being
    replaced, never in place: the identity of the spec object is its version. A record
    with other keys than the schema's goes through the strict encoder instead, which
    names the problem. Bounded, oldest out.
    """

    def __init__(self, name: str, field: str, *, registry: SchemaRegistry | None = None,
                 capacity: int = 1 << 14) -> None:
        self._name = name
        self._registry = registry or default_registry()
        self._entry = self._registry.latest(name)
        fields = self._entry.schema["fields"]
        at = [f["name"] for f in fields].index(field)
        named: dict[str, Any] = {}
        # In definition order, so a part may name a type an earlier part defined.
        self._head = parse_schema({"type": "record", "name": f"{name}.Head",
                                   "fields": fields[:at]}, named_schemas=named)
        self._field_schema = parse_schema(fields[at]["type"], named_schemas=named)
        self._tail = parse_schema({"type": "record", "name": f"{name}.Tail",
                                   "fields": fields[at + 1:]}, named_schemas=named)
        self._field = field
        self._keys = frozenset(f["name"] for f in fields)
        self._fast = _spliced_fast_path(self._entry.header, self._head, self._tail)
        # Oldest out by popitem: evicting with next(iter()) from a plain dict walks the
        # slots deleted since its last resize (streams.engine.faust_store.TerminalMemo).
        self._blobs: OrderedDict[int, tuple[Any, bytes]] = OrderedDict()
        self._capacity = capacity
        # Per record name that adopt() saw: the writer of what precedes the field, or None.
        self._heads: dict[str, Writer | None] = {}

    def encode(self, record: Mapping[str, Any]) -> bytes:
        if record.keys() != self._keys:
            return trusted_codec().encode(self._name, record)
        fast = self._fast
        if fast is not None:
            head, tail = fast
            try:  # as in Codec.encode
                return b"".join((head(record), self._blob(record[self._field]), tail(record)))
            except Exception:
                fast = None
        buf = BytesIO()
        buf.write(self._entry.header)
        try:
            schemaless_writer(buf, self._head, record)
            buf.write(self._blob(record[self._field]))
            schemaless_writer(buf, self._tail, record)
        except Exception as exc:
            raise _encode_error(self._entry, exc) from exc
        return buf.getvalue()

    def adopt(self, data: bytes, decoded: Decoded) -> bool:
        """Take the spliced field's bytes from a record that was just decoded from `data`
        (a CreateJob's spec, say), so that writing the field's object does not encode it
        again: a new job's spec was 9% of the worker's samples while it applied creates.

        Only when the field is the last of the decoded record's schema, of the same type as
        here, and the bytes before it are exactly what the compiled writer gives for the
        decoded fields: the rest of `data` is then the field's bytes, as the decoder read
        them (it refuses trailing bytes). Otherwise nothing is taken, and the field is
        encoded when it is written, as before. True if taken.
        """
        if decoded.version != decoded.reader_version or self._field not in decoded.record:
            return False
        if decoded.name not in self._heads:
            self._heads[decoded.name] = self._head_of(decoded)
        head = self._heads[decoded.name]
        if head is None:
            return False
        try:
            before = head(decoded.record)
        except Exception:  # not in canonical form: the field is encoded when written
            return False
        if not data.startswith(before):
            return False
        self._keep(decoded.record[self._field], data[len(before):])
        return True

    def _head_of(self, decoded: Decoded) -> Writer | None:
        """A writer of `decoded`'s header and every field before its last, if its last is
        this encoder's field with the same schema."""
        entry = self._registry.get(decoded.name, decoded.version)
        fields = entry.schema["fields"]
        if fields[-1]["name"] != self._field or fields[-1]["type"] != _bare(self._field_schema):
            return None
        return compile_writer({"type": "record", "name": f"{decoded.name}.Head",
                               "fields": fields[:-1]}, prefix=entry.header, other_keys=True)

    def _blob(self, value: Any) -> bytes:
        # Keyed by id() and holding the object: an id is only reused once its object is
        # gone, and this entry keeps it alive.
        entry = self._blobs.get(id(value))
        if entry is not None and entry[0] is value:
            return entry[1]
        buf = BytesIO()
        schemaless_writer(buf, self._field_schema, value)
        blob = buf.getvalue()
        self._keep(value, blob)
        return blob

    @property
    def field_schema(self) -> Any:
        """The spliced field's schema, without fastavro's bookkeeping keys."""
        return _bare(self._field_schema)

    def keep(self, value: Any, blob: bytes) -> None:
        """Write `blob` for `value` while it is the field's object: the caller read `value`
        from exactly these bytes with this field's schema (ItemFieldReader)."""
        self._keep(value, blob)

    def forget(self, value: Any) -> None:
        """Let go of `value`'s bytes, if kept: nothing will write this object again. Dropped
        at once, the value is freed while its memory is still in the CPU's caches; kept and
        evicted later, a spec cost 1.8 us a batched create against 0.7 us freed at once."""
        entry = self._blobs.get(id(value))
        if entry is not None and entry[0] is value:
            del self._blobs[id(value)]

    def _keep(self, value: Any, blob: bytes) -> None:
        self._blobs[id(value)] = (value, blob)
        if len(self._blobs) > self._capacity:
            self._blobs.popitem(last=False)


class ItemFieldReader:
    """Decodes the latest version of a record whose last field is an array of records, and
    keeps the bytes of one field of each item: the last field of the item's schema.

    The mirror of ``SplicedEncoder.adopt`` for batches: the jobs of a CreateJobs record are
    written with their specs' bytes as they came (``SplicedEncoder.keep``), not encoded
    again (the spec encode was the largest part of a batched create). The parts are read
    one by one (by compiled readers, else by fastavro), so each field's bytes are where the
    reading stood before and after it. The record is the one ``Codec.decode`` returns;
    bytes of another schema version, or that this reader cannot read, are decoded by
    ``Codec.decode`` (with its errors), with no field bytes kept.
    """

    def __init__(self, name: str, *, registry: SchemaRegistry | None = None) -> None:
        self._codec = default_codec() if registry is None else Codec(registry)
        entry = self._codec.registry.latest(name)
        fields = entry.schema["fields"]
        items = _bare(fields[-1]["type"])
        if not (isinstance(items, dict) and items.get("type") == "array"):
            raise ValueError(f"the last field of {name} is not an array")
        named: dict[str, Any] = {}
        self._head = parse_schema({"type": "record", "name": f"{name}.Head",
                                   "fields": fields[:-1]}, named_schemas=named)
        item: Any = parse_schema(items["items"], named_schemas=named)
        item_fields = item["fields"]
        self._item_head = parse_schema({"type": "record", "name": f"{item['name']}.Head",
                                        "fields": item_fields[:-1]}, named_schemas=named)
        self._field_schema = parse_schema(item_fields[-1]["type"], named_schemas=named)
        self._array, self._field = fields[-1]["name"], item_fields[-1]["name"]
        self._entry = entry
        self._tag = _has_record_union(entry.schema)
        schemas = (self._head, self._item_head, self._field_schema)
        head, item, field = (_fastavro_reader(part, self._tag) for part in schemas)
        self._fastavro = head, item, field
        compiled = [compile_reader(part, tag=self._tag) for part in schemas]
        self._compiled = None if None in compiled else cast(tuple[Reader, Reader, Reader],
                                                            tuple(compiled))

    @property
    def field_schema(self) -> Any:
        """The kept field's schema, without fastavro's bookkeeping keys."""
        return _bare(self._field_schema)

    def decode(self, data: bytes) -> tuple[Decoded, list[bytes]]:
        if data[:HEADER_LEN] != self._entry.header:
            return self._codec.decode(data), []
        try:
            record, kept = self._read(data)
        except Exception:  # Codec.decode says what is wrong with the bytes
            return self._codec.decode(data), []
        version = self._entry.version
        return Decoded(name=self._entry.name, version=version, reader_version=version,
                       record=record), kept

    def _read(self, data: bytes) -> tuple[dict[str, Any], list[bytes]]:
        if type(data) is not bytes:
            data = bytes(data)  # as Codec.decode reads it: through the compiled readers
        if self._compiled is not None:
            try:
                return self._read_parts(data, *self._compiled)
            except OutOfRange:
                raise  # damaged, though fastavro might read it: see schemas.reader
            except (Unfit, IndexError, struct.error, UnicodeDecodeError):
                pass  # fastavro reads it, or says what is wrong with it
        return self._read_parts(data, *self._fastavro)

    def _read_parts(self, data: bytes, head: Reader, item_head: Reader,
                    field: Reader) -> tuple[dict[str, Any], list[bytes]]:
        record, p = head(data, HEADER_LEN)
        items: list[dict[str, Any]] = []
        kept: list[bytes] = []
        while True:
            count, p = read_long(data, p)
            if not count:
                break
            if count < 0:  # a block with its size in bytes after the count
                count = -count
                _, p = read_long(data, p)
            if count > len(data) - p:  # each item takes bytes: this is garbage
                raise Unfit("a count past the bytes")
            for _ in range(count):
                one, p = item_head(data, p)
                start = p
                one[self._field], p = field(data, p)
                kept.append(data[start:p])
                items.append(one)
        if p != len(data):
            raise Unfit("trailing bytes")
        record[self._array] = items
        return record, kept


def _fastavro_reader(schema: Any, tag: bool) -> Reader:
    """fastavro's schemaless_reader with a compiled reader's signature."""
    def read(data: bytes, p: int) -> tuple[Any, int]:
        buf = BytesIO(data)
        buf.seek(p)
        value = schemaless_reader(buf, schema, None, return_record_name=tag,
                                  return_record_name_override=tag)
        return value, buf.tell()
    return read


def _bare(parsed: Any) -> Any:
    """A parsed schema without the bookkeeping keys fastavro adds at the top of a parse, as
    the same type reads nested inside another parsed schema."""
    if not isinstance(parsed, dict):
        return parsed
    return {k: v for k, v in parsed.items() if not k.startswith("__")}


def _spliced_fast_path(header: bytes, head: Any,
                       tail: Any) -> tuple[Writer, Writer] | None:
    first = compile_writer(head, prefix=header, other_keys=True)
    rest = compile_writer(tail, other_keys=True)
    return None if first is None or rest is None else (first, rest)


@functools.cache
def default_codec() -> Codec:
    """The codec over the committed schemas (see ``schemas.registry.default_registry``)."""
    return Codec(default_registry())


@functools.cache
def trusted_codec() -> Codec:
    """For records the engine builds from state it decoded and checked itself: skipping
    validation halves encode time on the hot path (unknown keys still fail)."""
    return Codec(default_registry(), validate=False)


def encode_trusted(name: str, record: Mapping[str, Any]) -> bytes:
    return trusted_codec().encode(name, record)


def encode(name: str, record: Mapping[str, Any]) -> bytes:
    """Encode ``record`` with the latest committed version of schema ``name``."""
    return default_codec().encode(name, record)


def decode(data: bytes, reader_name: str | None = None) -> Decoded:
    """Decode bytes written by any committed schema version; see ``Codec.decode``."""
    return default_codec().decode(data, reader_name)


def _read_compiled(data: bytes, plan: _ReadPlan) -> dict[str, Any] | None:
    """The record by the compiled reader; None where fastavro must read (or refuse) it:
    bytes the compiled reader leaves to it, or a record to resolve to another version."""
    if plan.compiled is None:
        return None
    try:
        # Other buffers are read as a bytes copy, so their indexes are checked too.
        record = read_all(plan.compiled, data if type(data) is bytes else bytes(data),
                          HEADER_LEN)
    except OutOfRange as exc:
        raise DecodeError(
            "truncated_or_corrupt",
            f"cannot read {plan.writer.name} v{plan.writer.version} body: {exc}") from exc
    except Unfit:
        return None
    return cast(dict[str, Any], record) if plan.reader_schema is None else None


def _read_body(buf: BytesIO, plan: _ReadPlan) -> dict[str, Any]:
    try:
        record = schemaless_reader(
            buf,
            plan.writer.schema,
            plan.reader_schema,
            return_record_name=plan.tag_unions,
            # Tag only unions with several record branches; ["null", X] stays a plain value.
            return_record_name_override=plan.tag_unions,
        )
    except SchemaResolutionError as exc:
        raise DecodeError(
            "incompatible_schema",
            f"{plan.writer.name} v{plan.writer.version} cannot be read as "
            f"{plan.reader.name} v{plan.reader.version}: {exc}",
        ) from exc
    except Exception as exc:
        # fastavro reports bad bodies with whatever the failing primitive raised (EOFError,
        # UnicodeDecodeError, IndexError on an enum index, ...); callers need exactly one type.
        raise DecodeError(
            "truncated_or_corrupt",
            f"cannot read {plan.writer.name} v{plan.writer.version} body: {_explain(exc)}",
        ) from exc
    return cast(dict[str, Any], record)


def _has_record_union(schema: dict[str, Any]) -> bool:
    """Whether a parsed schema has a union with two or more record branches."""
    named: dict[str, Any] = schema.get("__named_schemas", {})

    def is_record(branch: Any) -> bool:
        definition = named.get(branch, {}) if isinstance(branch, str) else branch
        return isinstance(definition, dict) and definition.get("type") in ("record", "error")

    def walk(node: Any) -> bool:
        if isinstance(node, list):
            return sum(map(is_record, node)) > 1 or any(map(walk, node))
        if not isinstance(node, dict):
            return False  # a primitive, or a reference to a type walked where it is defined
        return any(walk(f["type"]) for f in node.get("fields", ())) or any(
            walk(node[key]) for key in ("items", "values") if key in node
        )

    return walk(schema)


def _explain(exc: Exception) -> str:
    if isinstance(exc, EOFError):
        return f"body ends early ({exc})" if str(exc) else "body ends early"
    return f"{type(exc).__name__}: {exc}"


def _encode_error(entry: SchemaEntry, exc: Exception) -> EncodeError:
    if isinstance(exc, ValidationError) and exc.errors:
        first = exc.errors[0]
        field = str(first.field) or None
        # Name the type of the bad value, not the value: records carry headers and payloads
        # that must not end up in logs.
        got = "null or missing" if first.datum is None else type(first.datum).__name__
        expected = _describe(first.schema)
        more = f" (+{len(exc.errors) - 1} more)" if len(exc.errors) > 1 else ""
        return EncodeError(entry.name, f"{field}: got {got}, expected {expected}{more}", field)
    match = _WRITER_FIELD.search(str(exc))
    field = next((g for g in match.groups() if g), None) if match else None
    return EncodeError(entry.name, f"{type(exc).__name__}: {exc}", field)


def _describe(schema: object) -> str:
    if isinstance(schema, str):
        return schema
    if isinstance(schema, list):
        return "[" + ", ".join(_describe(s) for s in schema) + "]"
    if isinstance(schema, dict):
        return str(schema.get("name") or schema.get("type"))
    return repr(schema)
