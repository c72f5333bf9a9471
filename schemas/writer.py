"""Avro writers compiled to Python for the records the engine writes at every execution.

fastavro's writer walks the schema at every call: 14 us for an ExecutionState (260 bytes),
two of them per execution, a tenth of a worker's CPU at 4,000 executions/s (py-spy). A
function generated once per schema writes the same bytes in ~6 us: a few lines per field,
varints for the small numbers and the recent large ones looked up instead of computed.

It is a fast path only, for records in their canonical form: plain str, int, float, bytes,
dict and list values, exactly the schema's keys, and (name, value) tuples for a union of
several types. Anything else raises, and the caller then uses fastavro, which writes the
record or names what is wrong with it; so the bytes are fastavro's or the error is, never a
third answer (a hypothesis test compares the two). What it writes, fastavro's validation
accepts too (its checks are a subset of these), so a validating codec uses it as well. A
schema with a type this does not compile (logical types, fixed, recursion) gets no compiled
writer at all.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any, Final

from schemas.codegen import CodeGen, Unsupported

Writer = Callable[[Mapping[str, Any]], bytes]

_LONG_MIN: Final = -(1 << 63)
_LONG_MAX: Final = (1 << 63) - 1
_MAX_DEPTH: Final = 32
# Timestamps repeat: a spike's slots share their due time, and a busy second its clock
# readings. Cleared when full rather than evicted one by one.
_RECENT_MAX: Final = 1 << 14


class Unfit(Exception):
    """The record is not in the canonical form the compiled writer handles."""


def _varint(n: int) -> bytes:
    if not _LONG_MIN <= n <= _LONG_MAX:
        raise Unfit("long out of range")
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL: Final = tuple(_varint(n) for n in range(1 << 14))
_recent: dict[int, bytes] = {}


def _long(n: Any) -> bytes:
    if type(n) is not int:  # bool, IntEnum, float: fastavro's rules decide those
        raise Unfit("not an int")
    if 0 <= n < 16384:
        return _SMALL[n]
    b = _recent.get(n)
    if b is None:
        b = _varint(n)
        if len(_recent) >= _RECENT_MAX:
            _recent.clear()
        _recent[n] = b
    return b


def _int(n: Any) -> bytes:
    if type(n) is not int or not -(1 << 31) <= n < (1 << 31):
        raise Unfit("not a 32-bit int")
    return _long(n)


def _str(s: Any) -> bytes:
    if not isinstance(s, str):
        raise Unfit("not a str")
    b = s.encode()
    n = len(b)
    # _SMALL inline: a Python call less for each of an execution record's ~18 strings.
    return (_SMALL[n] if n < 16384 else _long(n)) + b


def _bytes(b: Any) -> bytes:
    if type(b) is not bytes:
        raise Unfit("not bytes")
    return _long(len(b)) + b


def _double(x: Any) -> bytes:
    if type(x) is not float:
        raise Unfit("not a float")
    return struct.pack("<d", x)


def _float(x: Any) -> bytes:
    if type(x) is not float:
        raise Unfit("not a float")
    return struct.pack("<f", x)


def _bool(x: Any) -> bytes:
    if type(x) is not bool:
        raise Unfit("not a bool")
    return b"\x01" if x else b"\x00"


def _null(x: Any) -> bytes:
    if x is not None:
        raise Unfit("not None")
    return b""


def _list(v: Any) -> Any:
    if type(v) is not list:
        raise Unfit("not a list")
    return v


_PRIMITIVES: Final = {"string": "_str", "bytes": "_bytes", "long": "_long", "int": "_int",
                      "double": "_double", "float": "_float", "boolean": "_bool",
                      "null": "_null"}


class _Compiler(CodeGen):
    def __init__(self, *, other_keys: bool) -> None:
        super().__init__()
        self.other_keys = other_keys

    def value(self, schema: Any, expr: str, depth: int, nesting: int = 0) -> None:
        """Lines appending the Avro bytes of `expr` (a local name) to `out`."""
        if nesting > _MAX_DEPTH:
            raise Unsupported("too deep or recursive")
        if isinstance(schema, str) and schema in self._named:
            schema = self._named[schema]
        if isinstance(schema, str):
            if schema not in _PRIMITIVES:
                raise Unsupported(f"type {schema}")
            if schema == "string":
                self.string(expr, depth)
            elif schema in ("long", "int"):
                self.integer(expr, depth, bits=64 if schema == "long" else 32)
            else:
                self.emit(depth, f"a({_PRIMITIVES[schema]}({expr}))")
        elif isinstance(schema, list):
            self.union(schema, expr, depth, nesting)
        elif isinstance(schema, dict):
            self.complex(schema, expr, depth, nesting)
        else:
            raise Unsupported(repr(schema))

    # Strings and numbers, most of an execution record's fields, are written inline: a
    # Python call per field was a fifth of its encode (bench.instructions).
    def string(self, expr: str, depth: int) -> None:
        raw = self.fresh("b")
        self.emit(depth, f"if type({expr}) is not str: raise Unfit('not a str')")
        self.emit(depth, f"{raw} = {expr}.encode()")
        self.emit(depth, f"a(_SMALL[len({raw})] if len({raw}) < 16384 else _long(len({raw})))")
        self.emit(depth, f"a({raw})")

    def integer(self, expr: str, depth: int, *, bits: int) -> None:
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        self.emit(depth, f"if type({expr}) is not int or not {lo} <= {expr} <= {hi}:")
        self.emit(depth + 1, f"raise Unfit('not a {bits}-bit int')")
        # A recent value's bytes are never empty, so `or` falls through only on a miss.
        self.emit(depth, f"a(_SMALL[{expr}] if 0 <= {expr} < 16384 "
                         f"else _recent.get({expr}) or _long({expr}))")

    def complex(self, schema: dict[str, Any], expr: str, depth: int, nesting: int) -> None:
        kind = schema.get("type")
        if "logicalType" in schema:
            raise Unsupported("logical types")
        if kind == "record":
            self._named[schema["name"]] = schema
            rec = self.fresh("r")
            self.emit(depth, f"{rec} = {expr}")
            if nesting > 0 or not self.other_keys:
                # Every field is read below (a missing one raises KeyError), so a dict with
                # as many keys has no other: a length, not a key-set comparison (~0.7 us).
                n = len(schema["fields"])
                self.emit(depth, f"if type({rec}) is not dict or len({rec}) != {n}:")
                self.emit(depth + 1, "raise Unfit('not a dict of the schema keys')")
            for field in schema["fields"]:
                val = self.fresh("v")
                self.emit(depth, f"{val} = {rec}[{field['name']!r}]")
                self.value(field["type"], val, depth, nesting + 1)
        elif kind == "enum":
            self._named[schema["name"]] = schema
            table = self.const("E", {s: _long(i) for i, s in enumerate(schema["symbols"])})
            self.emit(depth, f"a({table}[{expr}])")
        elif kind in ("array", "map"):
            self.block(schema, expr, depth, nesting)
        elif isinstance(kind, str) and kind in _PRIMITIVES and len(schema) == 1:
            self.value(kind, expr, depth, nesting)
        else:
            raise Unsupported(f"type {kind!r}")

    def block(self, schema: dict[str, Any], expr: str, depth: int, nesting: int) -> None:
        # fastavro writes a non-empty array or map as one block: its count, the items, 0.
        seq, item = self.fresh("s"), self.fresh("i")
        if schema["type"] == "array":
            self.emit(depth, f"{seq} = _list({expr})")
            self.emit(depth, f"if {seq}:")
            self.emit(depth + 1, f"a(_long(len({seq})))")
            self.emit(depth + 1, f"for {item} in {seq}:")
            self.value(schema["items"], item, depth + 2, nesting + 1)
        else:
            key = self.fresh("k")
            self.emit(depth, f"{seq} = {expr}")
            self.emit(depth, f"if type({seq}) is not dict: raise Unfit('not a dict')")
            self.emit(depth, f"if {seq}:")
            self.emit(depth + 1, f"a(_long(len({seq})))")
            self.emit(depth + 1, f"for {key}, {item} in {seq}.items():")
            self.emit(depth + 2, f"a(_str({key}))")
            self.value(schema["values"], item, depth + 2, nesting + 1)
        self.emit(depth, "a(b'\\x00')")

    def union(self, branches: list[Any], expr: str, depth: int, nesting: int) -> None:
        if len(branches) == 2 and "null" in branches and branches[0] != branches[1]:
            null_at = branches.index("null")
            self.emit(depth, f"if {expr} is None:")
            self.emit(depth + 1, f"a({_SMALL[null_at]!r})")
            self.emit(depth, "else:")
            self.emit(depth + 1, f"a({_SMALL[1 - null_at]!r})")
            self.value(branches[1 - null_at], expr, depth + 1, nesting + 1)
        else:
            self.tagged_union(branches, expr, depth, nesting)

    def tagged_union(self, branches: list[Any], expr: str, depth: int, nesting: int) -> None:
        """A union of several types takes fastavro's tuple notation only, (branch name,
        value), as the API builds a spec's target and schedule. fastavro picks any other
        value's branch by validating it against each in turn (records by the most fields
        matched); such values are left to it."""
        names = [_branch_name(b) for b in branches]
        named = [n for n in names if n is not None]
        if len(set(named)) != len(named):
            raise Unsupported("a union naming a type twice")
        # A branch without a name (an inline enum, array or map) is never picked here:
        # fastavro's validation cannot match a tuple to one, so its values go to fastavro.
        table = self.const("U", {n: i for i, n in enumerate(names) if n is not None})
        tag, inner, index = self.fresh("t"), self.fresh("v"), self.fresh("x")
        if "null" in names:
            self.emit(depth, f"if {expr} is None:")
            self.emit(depth + 1, f"{tag}, {inner} = 'null', None")
            self.emit(depth, f"elif type({expr}) is tuple and len({expr}) == 2:")
        else:
            self.emit(depth, f"if type({expr}) is tuple and len({expr}) == 2:")
        self.emit(depth + 1, f"{tag}, {inner} = {expr}")
        self.emit(depth, "else:")
        self.emit(depth + 1, "raise Unfit('not a tagged (name, value) tuple')")
        # An unknown or unhashable name raises here, and fastavro then names the error.
        self.emit(depth, f"{index} = {table}[{tag}]")
        self.emit(depth, f"a(_SMALL[{index}])")
        for i, branch in enumerate(branches):
            self.emit(depth, f"{'if' if i == 0 else 'elif'} {index} == {i}:")
            self.value(branch, inner, depth + 1, nesting + 1)


def _branch_name(branch: Any) -> str | None:
    """The name both fastavro's writer and its validation match a tuple's first item
    against: an inline record's full name, or a branch given by name (a primitive, or a
    named type defined earlier). None for the inline branches validation never matches."""
    if isinstance(branch, str):
        return branch
    if isinstance(branch, dict) and branch.get("type") == "record":
        name = branch.get("name")
        if not isinstance(name, str):
            raise Unsupported(repr(branch))
        return name
    return None


def compile_writer(schema: Any, *, prefix: bytes = b"",
                   other_keys: bool = False) -> Writer | None:
    """A function writing `prefix` and then a record of (parsed) `schema`, or None when the
    schema uses a type this module does not compile. `other_keys`: the record may have keys
    besides the schema's (a part of a larger record, as SplicedEncoder writes them)."""
    c = _Compiler(other_keys=other_keys)
    try:
        c.value(schema, "record", 1)
    except Unsupported:
        return None
    source = "\n".join(["def write(record):", "    out = [PREFIX]", "    a = out.append",
                        *c.lines, "    return b''.join(out)"])
    namespace: dict[str, Any] = {
        "_long": _long, "_int": _int, "_str": _str, "_bytes": _bytes, "_double": _double,
        "_float": _float, "_bool": _bool, "_null": _null, "_list": _list,
        "_SMALL": _SMALL, "_recent": _recent,
        "Unfit": Unfit, "PREFIX": prefix, **c.consts}
    name = schema.get("name", "?") if isinstance(schema, dict) else "?"
    exec(compile(source, f"<avro writer {name}>", "exec"), namespace)
    write: Writer = namespace["write"]
    return write
