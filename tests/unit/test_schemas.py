"""Schema files, registry, fingerprints and golden encodings."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

# The project is not installed in the venv and pytest sets no `pythonpath`; the repository root is
# importable only as a side effect of tests/conftest.py. Make it explicit (ruff's E402 allows
# imports after a sys.path change). Drop this once pyproject sets pythonpath = ["."].
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pytest

from schemas import names
from schemas.codec import Codec
from schemas.envelope import make_envelope
from schemas.errors import SchemaRegistryError, UnknownSchemaError
from schemas.registry import (
    AVRO_DIR,
    SchemaEntry,
    SchemaRegistry,
    crc64_avro,
    default_registry,
    entry_from_schema,
    load_entry,
)
from tests.golden.make_golden import (
    GOLDEN_DIR,
    SAMPLES,
    generate,
    golden_paths,
    to_jsonable,
    write_golden,
)

REGISTRY = default_registry()
ENTRIES = list(REGISTRY)
PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


# --- independent reference implementations of the Avro spec -------------------------------------
# fastavro computes the real fingerprints; these re-derive them straight from the spec text so a
# fastavro bug cannot silently change what goes on the wire.

_EMPTY64 = 0xC15D213AA4D7A795


def _rabin_table() -> list[int]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_EMPTY64 & -(fp & 1))
        table.append(fp)
    return table


_TABLE = _rabin_table()


def reference_fingerprint64(text: str) -> int:
    """CRC-64-AVRO as the spec defines it, returned as Java's signed long."""
    fp = _EMPTY64
    for byte in text.encode("utf-8"):
        fp = (fp >> 8) ^ _TABLE[(fp ^ byte) & 0xFF]
    return fp - (1 << 64) if fp >= 1 << 63 else fp


def reference_canonical_form(schema: Any, namespace: str = "", seen: set[str] | None = None) -> str:
    """Parsing Canonical Form per the spec: PRIMITIVES, FULLNAMES, STRIP, ORDER, WHITESPACE."""
    seen = set() if seen is None else seen
    if isinstance(schema, list):
        return "[" + ",".join(reference_canonical_form(s, namespace, seen) for s in schema) + "]"
    if isinstance(schema, str):
        return json.dumps(schema if schema in PRIMITIVES else _fullname(schema, namespace))
    kind = schema["type"]
    if kind in PRIMITIVES:
        return json.dumps(kind)
    if kind == "array":
        items = reference_canonical_form(schema["items"], namespace, seen)
        return f'{{"type":"array","items":{items}}}'
    if kind == "map":
        values = reference_canonical_form(schema["values"], namespace, seen)
        return f'{{"type":"map","values":{values}}}'
    full = _fullname(schema["name"], schema.get("namespace", namespace))
    if full in seen:
        return json.dumps(full)
    seen.add(full)
    inner = full.rpartition(".")[0]
    head = f'{{"name":{json.dumps(full)},"type":"{"record" if kind == "error" else kind}"'
    if kind == "enum":
        return head + f',"symbols":{json.dumps(schema["symbols"], separators=(",", ":"))}}}'
    if kind == "fixed":
        return head + f',"size":{int(schema["size"])}}}'
    fields = ",".join(
        f'{{"name":{json.dumps(f["name"])},"type":{reference_canonical_form(t, inner, seen)}}}'
        for f in schema["fields"]
        for t in [f["type"]]
    )
    return head + f',"fields":[{fields}]}}'


def _fullname(name: str, namespace: str) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


# Test data from Apache Avro's share/test/data/schema-tests.txt (input, canonical form, Java
# SchemaNormalization.parsingFingerprint64). Case 026's boolean default is written as JSON true
# (the file has the string "true", which fastavro rightly rejects); defaults are stripped anyway.
AVRO_SPEC_CASES = [
    ('"null"', '"null"', 7195948357588979594),
    ('{"type":"int"}', '"int"', 8247732601305521295),
    ('"string"', '"string"', -8142146995180207161),
    ('[ "int" , {"type":"boolean"} ]', '["int","boolean"]', 5392556393470105090),
    (
        '{"fields":[], "type":"record", "name":"foo", "namespace":"x.y"}',
        '{"name":"x.y.foo","type":"record","fields":[]}',
        5916914534497305771,
    ),
    (
        '{"fields":[], "type":"record", "name":"a.b.foo", "namespace":"x.y"}',
        '{"name":"a.b.foo","type":"record","fields":[]}',
        -4616218487480524110,
    ),
    (
        '{"fields":[{"type":"boolean", "aliases":[], "name":"f1", "default":true},'
        '{"order":"descending","name":"f2","doc":"Hello","type":"int"}],'
        '"type":"record", "name":"foo"}',
        '{"name":"foo","type":"record","fields":[{"name":"f1","type":"boolean"},'
        '{"name":"f2","type":"int"}]}',
        -4860222112080293046,
    ),
    (
        '{"namespace":"x.y.z", "type":"enum", "name":"foo", "doc":"foo bar",'
        ' "symbols":["A1", "A2"]}',
        '{"name":"x.y.z.foo","type":"enum","symbols":["A1","A2"]}',
        -4448647247586288245,
    ),
    (
        '{ "items":{"type":"null"}, "type":"array"}',
        '{"type":"array","items":"null"}',
        -589620603366471059,
    ),
    (
        '{ "values":"string", "type":"map"}',
        '{"type":"map","values":"string"}',
        -8732877298790414990,
    ),
    (
        '{"name":"PigValue","type":"record",'
        '"fields":[{"name":"value", "type":["null", "int", "long", "PigValue"]}]}',
        '{"name":"PigValue","type":"record","fields":[{"name":"value",'
        '"type":["null","int","long","PigValue"]}]}',
        -1759257747318642341,
    ),
]


# --- fingerprints -----------------------------------------------------------------------------


def test_fingerprint_of_int_matches_avro_test_vector() -> None:
    # Avro spec test data: CRC-64-AVRO of "int" is 0x7275d51a3f395c8f, written little-endian.
    assert crc64_avro('"int"') == bytes.fromhex("8f5c393f1ad57572")
    assert int.from_bytes(crc64_avro('"int"'), "little") == 0x7275D51A3F395C8F
    assert reference_fingerprint64('"int"') == 0x7275D51A3F395C8F


@pytest.mark.parametrize(("source", "canonical", "java_fp64"), AVRO_SPEC_CASES)
def test_canonical_form_and_fingerprint_match_avro_spec(
    source: str, canonical: str, java_fp64: int
) -> None:
    from fastavro.schema import to_parsing_canonical_form

    schema = json.loads(source)
    assert to_parsing_canonical_form(schema) == canonical
    assert reference_canonical_form(schema) == canonical
    assert int.from_bytes(crc64_avro(canonical), "little", signed=True) == java_fp64
    assert reference_fingerprint64(canonical) == java_fp64


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: f"{e.name}.v{e.version}")
def test_registry_fingerprints_agree_with_reference_implementation(entry: SchemaEntry) -> None:
    raw = json.loads(_path(entry).read_text(encoding="utf-8"))
    assert entry.canonical_form == reference_canonical_form(raw)
    assert entry.fingerprint64 == reference_fingerprint64(entry.canonical_form)
    assert entry.fingerprint == entry.fingerprint64.to_bytes(8, "little", signed=True)
    assert entry.header == b"\xc3\x01" + entry.fingerprint


# --- the committed schema files ---------------------------------------------------------------


def test_registry_holds_exactly_the_kron_records() -> None:
    assert len(set(names.ALL_RECORDS)) == len(names.ALL_RECORDS) == 26
    assert set(REGISTRY.names) == set(names.ALL_RECORDS)


def test_schema_files_are_named_after_their_record_and_version() -> None:
    files = sorted(p.name for p in AVRO_DIR.glob("*.avsc"))
    assert files == sorted(f"{e.name}.v{e.version}.avsc" for e in ENTRIES)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: f"{e.name}.v{e.version}")
def test_every_record_opens_with_the_envelope(entry: SchemaEntry) -> None:
    first = entry.schema["fields"][0]
    assert first["name"] == "envelope"
    assert first["type"]["name"] == "kron.Envelope"
    assert [f["name"] for f in first["type"]["fields"]] == [
        "event_id",
        "event_type",
        "schema_version",
        "occurred_at_ms",
        "tenant",
        "causation_id",
        "correlation_id",
        "producer",
    ]


def test_v1_files_define_each_shared_type_identically() -> None:
    # Shared types are inlined per file; in the initial set every copy must be the same type.
    definitions: dict[str, set[str]] = {}
    for entry in ENTRIES:
        if entry.version == 1:
            raw = json.loads(_path(entry).read_text(encoding="utf-8"))
            for name, canonical in _named_types(raw).items():
                definitions.setdefault(name, set()).add(canonical)
    differing = {name for name, forms in definitions.items() if len(forms) > 1}
    assert not differing
    assert {"kron.Envelope", "kron.JobSpec", "kron.TriggerKind", "kron.Attempt"} <= set(definitions)


def test_names_use_only_the_kron_namespaces() -> None:
    namespaces = {"kron", "kron.commands", "kron.state", "kron.executions", "kron.engine"}
    namespaces.add("kron.deadletter")
    for entry in ENTRIES:
        raw = json.loads(_path(entry).read_text(encoding="utf-8"))
        for name in _named_types(raw):
            assert name.rpartition(".")[0] in namespaces, name


# --- registry behaviour -------------------------------------------------------------------------


def test_default_registry_is_cached() -> None:
    assert default_registry() is default_registry()


def test_lookups() -> None:
    entry = REGISTRY.latest(names.CREATE_JOB)
    assert REGISTRY.get(names.CREATE_JOB, 1) is REGISTRY.versions(names.CREATE_JOB)[0]
    assert REGISTRY.by_fingerprint(entry.fingerprint) is entry
    assert REGISTRY.by_fingerprint(b"\x00" * 8) is None
    assert len(REGISTRY) == len(ENTRIES)
    with pytest.raises(UnknownSchemaError, match=r"kron\.commands\.Nope"):
        REGISTRY.latest("kron.commands.Nope")
    with pytest.raises(UnknownSchemaError):
        REGISTRY.get(names.CREATE_JOB, 99)
    with pytest.raises(UnknownSchemaError):
        REGISTRY.get(names.CREATE_JOB, 0)


def _copy_create_job(directory: Path) -> Path:
    return Path(shutil.copy(AVRO_DIR / "kron.commands.CreateJob.v1.avsc", directory))


def test_registry_rejects_a_gap_in_versions(tmp_path: Path) -> None:
    src = _copy_create_job(tmp_path)
    src.rename(tmp_path / "kron.commands.CreateJob.v2.avsc")
    with pytest.raises(SchemaRegistryError, match="never be removed"):
        SchemaRegistry.from_directory(tmp_path)


def test_registry_rejects_a_version_with_the_same_canonical_form(tmp_path: Path) -> None:
    src = _copy_create_job(tmp_path)
    raw = json.loads(src.read_text())
    raw["doc"] = "only the doc changed"
    (tmp_path / "kron.commands.CreateJob.v2.avsc").write_text(json.dumps(raw))
    with pytest.raises(SchemaRegistryError, match="same canonical form"):
        SchemaRegistry.from_directory(tmp_path)


def test_registry_rejects_file_name_that_disagrees_with_schema(tmp_path: Path) -> None:
    _copy_create_job(tmp_path).rename(tmp_path / "kron.commands.UpdateJob.v1.avsc")
    with pytest.raises(SchemaRegistryError, match="file name says"):
        SchemaRegistry.from_directory(tmp_path)


@pytest.mark.parametrize("file_name", ["CreateJob.avsc", "kron.X.v0.avsc", "kron.X.v01.avsc"])
def test_registry_rejects_bad_file_names(tmp_path: Path, file_name: str) -> None:
    path = tmp_path / file_name
    path.write_text('{"type": "record", "name": "kron.X", "fields": []}')
    with pytest.raises(SchemaRegistryError, match="file name"):
        load_entry(path)


def test_registry_rejects_a_file_that_is_not_self_contained(tmp_path: Path) -> None:
    schema = {
        "type": "record",
        "name": "kron.X",
        "fields": [{"name": "e", "type": "kron.Envelope"}],
    }
    (tmp_path / "kron.X.v1.avsc").write_text(json.dumps(schema))
    with pytest.raises(SchemaRegistryError, match="invalid Avro schema"):
        SchemaRegistry.from_directory(tmp_path)


@pytest.mark.parametrize("text", ["{not json", '"int"', '{"type": "enum", "name": "kron.X"}'])
def test_registry_rejects_unusable_files(tmp_path: Path, text: str) -> None:
    (tmp_path / "kron.X.v1.avsc").write_text(text)
    with pytest.raises(SchemaRegistryError):
        SchemaRegistry.from_directory(tmp_path)


def test_registry_rejects_invalid_defaults() -> None:
    schema = {
        "type": "record",
        "name": "kron.X",
        "fields": [{"name": "n", "type": "int", "default": "x"}],
    }
    with pytest.raises(SchemaRegistryError):
        entry_from_schema(schema, version=1)


# --- envelope helper ----------------------------------------------------------------------------


def test_make_envelope_defaults_and_is_keyword_only() -> None:
    env = make_envelope(event_id="e", event_type="job.created", occurred_at_ms=5, tenant="t")
    assert env == {
        "event_id": "e",
        "event_type": "job.created",
        "schema_version": 1,
        "occurred_at_ms": 5,
        "tenant": "t",
        "causation_id": None,
        "correlation_id": None,
        "producer": None,
    }
    with pytest.raises(TypeError):
        make_envelope("e", "job.created", 5, "t")  # type: ignore[call-arg]


# --- golden encodings ---------------------------------------------------------------------------


def _golden_cases() -> list[tuple[SchemaEntry, int, bytes, Any]]:
    cases = []
    for entry in ENTRIES:
        hex_path, json_path = golden_paths(entry.name, entry.version)
        if not (hex_path.exists() and json_path.exists()):
            continue  # reported by test_every_schema_version_has_golden_files
        lines = hex_path.read_text(encoding="utf-8").split()
        expected = json.loads(json_path.read_text(encoding="utf-8"))["records"]
        assert len(lines) == len(expected), hex_path
        for i, (line, record) in enumerate(zip(lines, expected, strict=True)):
            cases.append((entry, i, bytes.fromhex(line), record))
    return cases


GOLDEN_CASES = _golden_cases()


def test_every_schema_version_has_golden_files() -> None:
    missing = [
        f"{e.name}.v{e.version}"
        for e in ENTRIES
        if not all(p.exists() for p in golden_paths(e.name, e.version))
    ]
    assert not missing, f"run `.venv/bin/python -m tests.golden.make_golden` for {missing}"


def test_every_golden_file_belongs_to_a_schema_version() -> None:
    # Schema files are never deleted; a golden without one means a schema went missing.
    expected = {p.name for e in ENTRIES for p in golden_paths(e.name, e.version)}
    actual = {p.name for p in GOLDEN_DIR.iterdir() if p.suffix in (".hex", ".json")}
    assert actual == expected


def test_golden_metadata_matches_the_schema() -> None:
    for entry in ENTRIES:
        document = json.loads(golden_paths(entry.name, entry.version)[1].read_text("utf-8"))
        assert document["schema"] == entry.name
        assert document["version"] == entry.version
        assert document["fingerprint"] == entry.fingerprint.hex()


@pytest.mark.parametrize(
    ("entry", "index", "data", "expected"),
    GOLDEN_CASES,
    ids=[f"{c[0].name}.v{c[0].version}#{c[1]}" for c in GOLDEN_CASES],
)
def test_golden_event_decodes_as_written(
    entry: SchemaEntry, index: int, data: bytes, expected: Any
) -> None:
    codec = Codec(REGISTRY)
    exact = codec.decode(data, entry.name, reader_version=entry.version)
    assert (exact.name, exact.version) == (entry.name, entry.version)
    assert to_jsonable(exact.record) == expected
    # Re-encoding with the same version reproduces the committed bytes exactly.
    assert codec.encode(entry.name, exact.record, version=entry.version) == data

    # And the current reader (latest version) can still read it; shared fields keep their values.
    latest = codec.decode(data)
    assert latest.version == entry.version
    assert latest.reader_version == REGISTRY.latest(entry.name).version
    _assert_compatible(expected, to_jsonable(latest.record))


def test_golden_samples_exist_for_every_schema_version() -> None:
    assert {(e.name, e.version) for e in ENTRIES} <= set(SAMPLES)


def test_make_golden_never_overwrites(tmp_path: Path) -> None:
    written = generate(REGISTRY, SAMPLES, tmp_path)
    assert len(written) == len(ENTRIES)
    hex_path, json_path = golden_paths(names.TICK, 1, tmp_path)
    hex_path.write_text("tampered\n")
    assert generate(REGISTRY, SAMPLES, tmp_path) == []
    assert hex_path.read_text() == "tampered\n"
    with pytest.raises(FileExistsError):
        write_golden(
            REGISTRY.latest(names.TICK), SAMPLES[(names.TICK, 1)], Codec(REGISTRY), tmp_path
        )
    json_path.unlink()
    with pytest.raises(SystemExit, match="half a golden pair"):
        generate(REGISTRY, SAMPLES, tmp_path)


def test_committed_goldens_match_a_fresh_generation(tmp_path: Path) -> None:
    # The committed goldens are authoritative; this only flags SAMPLES in make_golden.py drifting
    # from them (put the samples back; never regenerate a golden).
    generate(REGISTRY, SAMPLES, tmp_path)
    for entry in ENTRIES:
        for fresh in golden_paths(entry.name, entry.version, tmp_path):
            assert fresh.read_text("utf-8") == (GOLDEN_DIR / fresh.name).read_text("utf-8")


# --- helpers ------------------------------------------------------------------------------------


def _path(entry: SchemaEntry) -> Path:
    assert entry.path is not None
    return entry.path


def _named_types(raw: Any, found: dict[str, str] | None = None) -> dict[str, str]:
    """Full name -> canonical form of every named type defined inline in a schema."""
    found = {} if found is None else found
    if isinstance(raw, list):
        for item in raw:
            _named_types(item, found)
    elif isinstance(raw, dict):
        if raw.get("type") in ("record", "enum", "fixed"):
            found[raw["name"]] = reference_canonical_form(raw)
        for field in raw.get("fields", []):
            _named_types(field["type"], found)
        for key in ("items", "values"):
            if key in raw:
                _named_types(raw[key], found)
    return found


def _assert_compatible(old: Any, new: Any, path: str = "record") -> None:
    """Values present in both the old and the upgraded decoding must agree."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in old.keys() & new.keys():
            _assert_compatible(old[key], new[key], f"{path}.{key}")
    elif isinstance(old, list) and isinstance(new, list):
        assert len(old) == len(new), path
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            _assert_compatible(a, b, f"{path}[{i}]")
    else:
        assert old == new, path


def test_a_v1_tick_reads_as_one_that_decides_nothing_ahead() -> None:
    """The first schema evolution: v2 added the fire-ahead window, with a default, so a tick
    a v1 producer wrote (still on the signals topic during an upgrade) fires only what is
    due."""
    codec = Codec(REGISTRY)
    old = codec.encode(names.TICK, SAMPLES[(names.TICK, 1)][0], version=1)
    decoded = codec.decode(old)
    assert (decoded.version, decoded.reader_version) == (1, 2)
    assert decoded.record["fire_ahead_ms"] == 0
    assert decoded.record["now_ms"] == SAMPLES[(names.TICK, 1)][0]["now_ms"]


@pytest.mark.parametrize("name", [names.CREATE_JOB, names.UPDATE_JOB, names.JOB_STATE])
def test_a_v3_job_reads_as_a_normal_priority_one(name: str) -> None:
    """v4 appended JobSpec.priority (enum kron.Priority, default normal): a job written by a
    v3 producer, or kept in a v3 state record, is a normal one; v4 bytes read by a reader
    pinned to v3 lose only the tier."""
    codec = Codec(REGISTRY)
    for record in SAMPLES[(name, 3)]:
        # Read as v4 (the version that added the tier); v5 only appends notify after it.
        decoded = codec.decode(codec.encode(name, record, version=3), name, reader_version=4)
        assert (decoded.version, decoded.reader_version) == (3, 4)
        assert decoded.record["spec"]["priority"] == "normal"
        assert list(decoded.record["spec"])[-1] == "priority"
    batch = {**SAMPLES[(name, 4)][-1]}
    assert batch["spec"]["priority"] == "batch"
    old = codec.decode(codec.encode(name, batch, version=4), name, reader_version=3)
    assert "priority" not in old.record["spec"]
    assert to_jsonable(old.record["spec"]) == to_jsonable(
        {k: v for k, v in codec.decode(codec.encode(name, batch, version=4), name,
                                       reader_version=4).record["spec"].items()
         if k != "priority"})


def test_every_job_spec_v4_defines_the_same_priority_enum() -> None:
    for name in (names.CREATE_JOB, names.CREATE_JOBS, names.UPDATE_JOB, names.JOB_STATE):
        raw = json.loads(_path(REGISTRY.get(name, 4)).read_text(encoding="utf-8"))
        types = _named_types(raw)
        assert types["kron.Priority"] == (
            '{"name":"kron.Priority","type":"enum","symbols":["critical","normal","batch"]}')


@pytest.mark.parametrize("name", [names.CREATE_JOB, names.UPDATE_JOB, names.JOB_STATE])
def test_a_v4_job_reads_as_one_without_its_own_notify(name: str) -> None:
    """v5 appended JobSpec.notify (null or kron.Notify, default null): a job written by a v4
    producer, or kept in a v4 state record, has none (its tenant's default applies); v5 bytes
    read by a reader pinned to v4 lose only the notify."""
    codec = Codec(REGISTRY)
    for record in SAMPLES[(name, 4)]:
        decoded = codec.decode(codec.encode(name, record, version=4))
        assert (decoded.version, decoded.reader_version) == (4, 5)
        assert decoded.record["spec"]["notify"] is None
        assert list(decoded.record["spec"])[-1] == "notify"
    full = SAMPLES[(name, 5)][-2]
    assert full["spec"]["notify"]["on"] == ["failed", "missed"]
    old = codec.decode(codec.encode(name, full), name, reader_version=4)
    assert "notify" not in old.record["spec"]
    assert old.record["spec"]["priority"] == "critical"


def test_every_job_spec_v5_defines_the_same_notify_record() -> None:
    for name in (names.CREATE_JOB, names.CREATE_JOBS, names.UPDATE_JOB, names.JOB_STATE):
        raw = json.loads(_path(REGISTRY.get(name, 5)).read_text(encoding="utf-8"))
        types = _named_types(raw)
        assert types["kron.NotifyEvent"] == (
            '{"name":"kron.NotifyEvent","type":"enum","symbols":["failed","missed"]}')
        assert '"name":"kron.Notify"' in types["kron.Notify"]
