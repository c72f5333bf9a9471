"""Avro readers compiled to Python, the mirror of schemas.writer.

fastavro's reader walks the parsed schema at every value, looking each field's type up in
dicts: 12.5 us for a 98-byte JobSpec, a third of a batched create's CPU (py-spy). A
function generated once per schema reads the same record with a few lines per field, on the
bytes and an index, with no file object.

It is a fast path only, for `bytes` written with the schema it was compiled from (no schema
resolution). Where anything is off (bytes end early, a varint runs over 64 bits, more
empty items than bytes left, bad UTF-8), it raises Unfit and the caller asks fastavro,
which reads the bytes or names what is wrong with them: the record is fastavro's or the
error is, never a third answer (a hypothesis test compares the two on records and on
random bytes). An enum or union index out of range raises OutOfRange, an Unfit that is an
error in its own right: fastavro reads index -1 Python-style, as the last symbol or
branch, where Java refuses it, so damaged bytes would decode as a record that was never
written. (The codec also runs a schema's compiled reader over bytes it resolves to another
version, to check them.) Only an index the reader reaches is checked: one after an Unfit
above is left to fastavro with the rest. A schema with a type this does not compile
(fixed, logical types, recursion, named references in unions it cannot tag as fastavro
does) gets no compiled reader at all, and fastavro reads all of its bytes.

`tag` mirrors fastavro's `return_record_name` with `return_record_name_override`, as
schemas.codec reads: a union with two or more record branches reads as (name, record), a
union with one record branch as the record.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final

from schemas.codegen import CodeGen, Unsupported

# (bytes, position) -> (value, position after it)
Reader = Callable[[bytes, int], tuple[Any, int]]

_MAX_DEPTH: Final = 32
_PRIMITIVES: Final = frozenset(
    ("string", "bytes", "long", "int", "double", "float", "boolean", "null"))


class Unfit(Exception):
    """The bytes are not a record this reader reads as fastavro does: ask fastavro."""


class OutOfRange(Unfit):
    """An enum or union index outside the schema's: the bytes are damaged, whatever
    fastavro would make of them."""


def _varint(b: bytes, p: int) -> tuple[int, int]:
    """A zigzag varint whose first byte has its continuation bit set."""
    n = shift = 0
    while True:
        x = b[p]
        p += 1
        n |= (x & 0x7F) << shift
        if x < 0x80:
            break
        shift += 7
        if shift > 63:
            raise Unfit("a varint over 10 bytes")
    if n >> 64:
        raise Unfit("a varint over 64 bits")
    return (n >> 1) ^ -(n & 1), p


def read_long(b: bytes, p: int) -> tuple[int, int]:
    """An Avro long at `p`, and the position after it."""
    x = b[p]
    if x < 0x80:
        return (x >> 1) ^ -(x & 1), p + 1
    return _varint(b, p)


class _Compiler(CodeGen):
    def __init__(self, *, tag: bool, named: dict[str, Any]) -> None:
        super().__init__()
        self.tag = tag
        # Types the schema names but defines elsewhere (a part of a larger parsed schema).
        self._named.update(named)

    def value(self, schema: Any, out: str, depth: int, nesting: int = 0) -> None:
        """Lines reading one value of `schema` at `p` into the local `out`."""
        if nesting > _MAX_DEPTH:
            raise Unsupported("too deep or recursive")
        if isinstance(schema, str) and schema in self._named:
            schema = self._named[schema]
        if isinstance(schema, str):
            self.primitive(schema, out, depth)
        elif isinstance(schema, list):
            self.union(schema, out, depth, nesting)
        elif isinstance(schema, dict):
            self.complex(schema, out, depth, nesting)
        else:
            raise Unsupported(repr(schema))

    def long(self, out: str, depth: int) -> None:
        # One byte holds 0..63 and -64..-1: most lengths, counts, indexes and flags.
        self.emit(depth, "x = b[p]")
        self.emit(depth, "if x < 128:")
        self.emit(depth + 1, f"{out} = (x >> 1) ^ -(x & 1)")
        self.emit(depth + 1, "p += 1")
        self.emit(depth, "else:")
        self.emit(depth + 1, f"{out}, p = _varint(b, p)")

    def span(self, out: str, depth: int) -> str:
        """Lines reading a length and checking its bytes are there; returns their end."""
        n, end = self.fresh("n"), self.fresh("e")
        self.long(n, depth)
        self.emit(depth, f"{end} = p + {n}")
        self.emit(depth, f"if {n} < 0 or {end} > L: raise Unfit('bytes end early')")
        return end

    def primitive(self, schema: str, out: str, depth: int) -> None:
        if schema not in _PRIMITIVES:
            raise Unsupported(f"type {schema}")
        if schema in ("long", "int"):
            self.long(out, depth)
        elif schema in ("string", "bytes"):
            end = self.span(out, depth)
            decode = ".decode()" if schema == "string" else ""
            self.emit(depth, f"{out} = b[p:{end}]{decode}")
            self.emit(depth, f"p = {end}")
        elif schema in ("double", "float"):
            self.emit(depth, f"{out} = _{schema}(b, p)[0]")
            self.emit(depth, f"p += {8 if schema == 'double' else 4}")
        elif schema == "boolean":
            # Any byte but 0 is true, as fastavro reads it (Java: only 1), so a damaged
            # boolean is read here, and an index out of range after it is still seen.
            self.emit(depth, f"{out} = b[p] != 0")
            self.emit(depth, "p += 1")
        else:
            self.emit(depth, f"{out} = None")

    def complex(self, schema: dict[str, Any], out: str, depth: int, nesting: int) -> None:
        kind = schema.get("type")
        if "logicalType" in schema:
            raise Unsupported("logical types")
        if kind == "record":
            self._named[schema["name"]] = schema
            fields = []
            for field in schema["fields"]:
                val = self.fresh("v")
                self.value(field["type"], val, depth, nesting + 1)
                fields.append(f"{field['name']!r}: {val}")
            self.emit(depth, f"{out} = {{{', '.join(fields)}}}")
        elif kind == "enum":
            self._named[schema["name"]] = schema
            symbols = self.const("S", tuple(schema["symbols"]))
            i = self.fresh("i")
            self.long(i, depth)
            self.emit(depth, f"if not 0 <= {i} < {len(schema['symbols'])}: "
                             "raise OutOfRange('an enum index out of range')")
            self.emit(depth, f"{out} = {symbols}[{i}]")
        elif kind in ("array", "map"):
            self.block(schema, out, depth, nesting)
        elif isinstance(kind, str) and kind in _PRIMITIVES and len(schema) == 1:
            self.primitive(kind, out, depth)
        else:
            raise Unsupported(f"type {kind!r}")

    def block(self, schema: dict[str, Any], out: str, depth: int, nesting: int) -> None:
        """Blocks until a zero count; a negative count is followed by the block's size."""
        count, item = self.fresh("c"), self.fresh("v")
        is_map = schema["type"] == "map"
        self.emit(depth, f"{out} = {{}}" if is_map else f"{out} = []")
        self.emit(depth, "while True:")
        self.long(count, depth + 1)
        self.emit(depth + 1, f"if not {count}: break")
        self.emit(depth + 1, f"if {count} < 0:")
        self.emit(depth + 2, f"{count} = -{count}")
        self.long(self.fresh("z"), depth + 2)
        # Every item takes a byte or more but nulls and empty records, whose arrays fastavro
        # reads: a count past the bytes left is left to it rather than looped over here.
        self.emit(depth + 1, f"if {count} > L - p: raise Unfit('a count past the bytes')")
        self.emit(depth + 1, f"for _ in range({count}):")
        if is_map:
            key = self.fresh("k")
            self.primitive("string", key, depth + 2)
            self.value(schema["values"], item, depth + 2, nesting + 1)
            self.emit(depth + 2, f"{out}[{key}] = {item}")
        else:
            self.value(schema["items"], item, depth + 2, nesting + 1)
            self.emit(depth + 2, f"{out}.append({item})")

    def _is_record(self, branch: Any) -> bool:
        if isinstance(branch, str) and branch not in _PRIMITIVES:
            definition = self._named.get(branch)
            if definition is None or definition.get("type") != "record":
                # fastavro counts any named reference as a record (and tags it).
                raise Unsupported(f"a union branch naming {branch}")
            return True
        return isinstance(branch, dict) and branch.get("type") == "record"

    def union(self, branches: list[Any], out: str, depth: int, nesting: int) -> None:
        records = sum(map(self._is_record, branches))
        index = self.fresh("u")
        self.long(index, depth)
        for i, branch in enumerate(branches):
            self.emit(depth, f"{'if' if i == 0 else 'elif'} {index} == {i}:")
            self.value(branch, out, depth + 1, nesting + 1)
            if self.tag and records > 1 and self._is_record(branch):
                name = branch if isinstance(branch, str) else branch["name"]
                self.emit(depth + 1, f"{out} = ({name!r}, {out})")
        self.emit(depth, "else: raise OutOfRange('a union index out of range')")


def compile_reader(schema: Any, *, tag: bool = False) -> Reader | None:
    """A function reading a value of (parsed) `schema` from bytes at a position, or None
    when the schema uses a type this module does not compile."""
    named = schema.get("__named_schemas", {}) if isinstance(schema, dict) else {}
    c = _Compiler(tag=tag, named=named)
    try:
        c.value(schema, "out", 1)
    except Unsupported:
        return None
    source = "\n".join(["def read(b, p):", "    L = len(b)", *c.lines,
                        "    if p > L: raise Unfit('bytes end early')",
                        "    return out, p"])
    namespace: dict[str, Any] = {
        "_varint": _varint, "_double": struct.Struct("<d").unpack_from,
        "_float": struct.Struct("<f").unpack_from, "Unfit": Unfit, "OutOfRange": OutOfRange,
        **c.consts}
    name = schema.get("name", "?") if isinstance(schema, dict) else "?"
    exec(compile(source, f"<avro reader {name}>", "exec"), namespace)
    read: Reader = namespace["read"]
    return read


def read_all(reader: Reader, data: bytes, start: int) -> Any:
    """The value that fills data[start:] exactly; Unfit for anything else. Only `bytes`:
    a bytearray's slices are bytearrays, and a memoryview's have no decode()."""
    if type(data) is not bytes:
        raise Unfit("not bytes")
    try:
        value, end = reader(data, start)
    except Unfit:
        raise
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise Unfit(f"{type(exc).__name__}: {exc}") from exc
    if end != len(data):
        raise Unfit("trailing bytes")
    return value
