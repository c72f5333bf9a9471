"""Errors raised by the schema registry and the codec.

Consumers catch exactly one type per direction: ``DecodeError`` for bytes that cannot become a
record (send them to the dead-letter topic), ``EncodeError`` for records that cannot become bytes
(a producer bug). ``UnknownSchemaError`` is a programming error: a schema name no file defines.
"""

from __future__ import annotations

from typing import Literal, get_args

DecodeReason = Literal[
    "too_short",
    "bad_marker",
    "unknown_fingerprint",
    "truncated_or_corrupt",
    # The bytes are intact and written with a known schema, but the requested reader schema
    # cannot resolve it (e.g. reader_name names a different record). Still a poison message to
    # the consumer, so it is a DecodeError rather than a separate type.
    "incompatible_schema",
]

DECODE_REASONS: tuple[DecodeReason, ...] = get_args(DecodeReason)


class DecodeError(Exception):
    """Bytes that are not a single-object-encoded kron record readable by this registry."""

    # Args are (reason, message) so the exception pickles and unpickles intact across processes.
    def __init__(self, reason: DecodeReason, message: str) -> None:
        super().__init__(reason, message)
        self.reason: DecodeReason = reason
        self.message = message

    def __str__(self) -> str:
        return f"{self.message} [reason={self.reason}]"


class EncodeError(Exception):
    """A record that does not fit the schema it is being written with."""

    def __init__(self, schema_name: str, message: str, field: str | None = None) -> None:
        super().__init__(schema_name, message, field)
        self.schema_name = schema_name
        self.message = message
        self.field = field

    def __str__(self) -> str:
        return f"cannot encode {self.schema_name}: {self.message}"


class UnknownSchemaError(LookupError):
    """No schema file defines this record name (or this version of it)."""

    def __init__(self, name: str, version: int | None = None) -> None:
        super().__init__(name, version)
        self.name = name
        self.version = version

    def __str__(self) -> str:
        which = self.name if self.version is None else f"{self.name} v{self.version}"
        return f"unknown schema {which}"


class SchemaRegistryError(Exception):
    """The schema directory is inconsistent (bad file name, unparsable schema, gap in versions)."""
