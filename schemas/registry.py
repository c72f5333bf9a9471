"""Registry of every committed Avro schema version, keyed by wire fingerprint.

Each file ``schemas/avro/<full.record.Name>.v<N>.avsc`` holds one self-contained record schema:
every named type it uses is defined inside the file. That makes the file's Parsing Canonical Form,
and so its fingerprint, a function of that file alone; editing a shared type in a new version can
never change what an old version's bytes mean.

Files are never edited or removed once committed: old events on Kafka carry their writer's
fingerprint forever. A new version is a new file.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

from fastavro import parse_schema
from fastavro.schema import fingerprint, to_parsing_canonical_form

from schemas.errors import SchemaRegistryError, UnknownSchemaError

AVRO_DIR: Final = Path(__file__).resolve().parent / "avro"

# Avro single-object encoding: marker, then the writer schema's CRC-64-AVRO fingerprint.
MARKER: Final = b"\xc3\x01"
FINGERPRINT_LEN: Final = 8
HEADER_LEN: Final = len(MARKER) + FINGERPRINT_LEN

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_FILE_NAME: Final = re.compile(
    rf"^(?P<name>{_NAME}(?:\.{_NAME})*)\.v(?P<version>[1-9][0-9]*)\.avsc$"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class SchemaEntry:
    """One version of one record schema, parsed once and ready for fastavro."""

    name: str
    version: int
    # The 8 fingerprint bytes exactly as they appear on the wire (little-endian).
    fingerprint: bytes
    canonical_form: str
    # fastavro's parsed form; pass it straight to schemaless_writer/reader.
    schema: dict[str, Any]
    header: bytes
    path: Path | None

    @property
    def fingerprint64(self) -> int:
        """The fingerprint as Java's ``SchemaNormalization.parsingFingerprint64`` returns it."""
        return int.from_bytes(self.fingerprint, "little", signed=True)


def crc64_avro(canonical_form: str) -> bytes:
    """CRC-64-AVRO (Rabin) fingerprint of a canonical form, as the 8 little-endian wire bytes."""
    return bytes.fromhex(fingerprint(canonical_form, "CRC-64-AVRO"))


def entry_from_schema(
    raw: dict[str, Any], *, version: int, path: Path | None = None
) -> SchemaEntry:
    """Parse one self-contained record schema into an entry."""
    if raw.get("type") != "record":
        raise SchemaRegistryError(f"{_where(path)}: top-level schema must be a record")
    try:
        # A fresh named-type table per file: a reference to a type the file does not define
        # fails here instead of silently borrowing another file's definition.
        parsed = parse_schema(raw, named_schemas={})
        canonical = to_parsing_canonical_form(raw)
    except Exception as exc:
        raise SchemaRegistryError(f"{_where(path)}: invalid Avro schema: {exc}") from exc
    parsed_dict = cast(dict[str, Any], parsed)
    fp = crc64_avro(canonical)
    return SchemaEntry(
        name=str(parsed_dict["name"]),
        version=version,
        fingerprint=fp,
        canonical_form=canonical,
        schema=parsed_dict,
        header=MARKER + fp,
        path=path,
    )


def load_entry(path: Path) -> SchemaEntry:
    """Load ``<full.Name>.v<N>.avsc``, checking the file name agrees with its content."""
    match = _FILE_NAME.match(path.name)
    if match is None:
        raise SchemaRegistryError(f"{path}: file name must look like kron.ns.Record.v1.avsc")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SchemaRegistryError(f"{path}: cannot read JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise SchemaRegistryError(f"{path}: top-level schema must be a record")
    entry = entry_from_schema(raw, version=int(match["version"]), path=path)
    if entry.name != match["name"]:
        raise SchemaRegistryError(
            f"{path}: file name says {match['name']}, schema says {entry.name}"
        )
    return entry


class SchemaRegistry:
    """Immutable lookup of schema entries by fingerprint, by name, and by (name, version)."""

    __slots__ = ("_by_fingerprint", "_by_name")

    def __init__(self, entries: Iterable[SchemaEntry]) -> None:
        self._by_fingerprint: dict[bytes, SchemaEntry] = {}
        by_name: dict[str, dict[int, SchemaEntry]] = {}
        for entry in entries:
            self._add(entry, by_name)
        self._by_name: dict[str, tuple[SchemaEntry, ...]] = {
            name: _contiguous_versions(name, versions) for name, versions in sorted(by_name.items())
        }

    @classmethod
    def from_directory(cls, directory: Path = AVRO_DIR) -> SchemaRegistry:
        return cls(load_entry(path) for path in sorted(directory.glob("*.avsc")))

    def _add(self, entry: SchemaEntry, by_name: dict[str, dict[int, SchemaEntry]]) -> None:
        clash = self._by_fingerprint.get(entry.fingerprint)
        if clash is not None:
            # Same canonical form: the versions differ only in docs/defaults/aliases, which the
            # wire cannot tell apart, so a reader could not know which version wrote the bytes.
            raise SchemaRegistryError(
                f"{entry.name} v{entry.version} has the same canonical form as "
                f"{clash.name} v{clash.version}; a new version must change the wire format"
            )
        versions = by_name.setdefault(entry.name, {})
        if entry.version in versions:
            raise SchemaRegistryError(f"{entry.name} v{entry.version} is defined twice")
        versions[entry.version] = entry
        self._by_fingerprint[entry.fingerprint] = entry

    def by_fingerprint(self, fingerprint: bytes) -> SchemaEntry | None:
        return self._by_fingerprint.get(fingerprint)

    def latest(self, name: str) -> SchemaEntry:
        try:
            return self._by_name[name][-1]
        except KeyError:
            raise UnknownSchemaError(name) from None

    def get(self, name: str, version: int) -> SchemaEntry:
        versions = self.versions(name)
        if not 1 <= version <= len(versions):
            raise UnknownSchemaError(name, version)
        return versions[version - 1]

    def versions(self, name: str) -> tuple[SchemaEntry, ...]:
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownSchemaError(name) from None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._by_name)

    def __iter__(self) -> Iterator[SchemaEntry]:
        for versions in self._by_name.values():
            yield from versions

    def __len__(self) -> int:
        return len(self._by_fingerprint)


@functools.cache
def default_registry() -> SchemaRegistry:
    """The registry of the committed schemas, loaded on first use and shared afterwards."""
    return SchemaRegistry.from_directory(AVRO_DIR)


def _contiguous_versions(name: str, versions: dict[int, SchemaEntry]) -> tuple[SchemaEntry, ...]:
    # A gap means a historical version was deleted, and events written with it became unreadable.
    expected = list(range(1, len(versions) + 1))
    if sorted(versions) != expected:
        raise SchemaRegistryError(
            f"{name}: versions {sorted(versions)} are not 1..{len(versions)}; "
            "historical versions must never be removed"
        )
    return tuple(versions[v] for v in expected)


def _where(path: Path | None) -> str:
    return str(path) if path is not None else "<schema>"
