"""`kron replay archive`: ended executions older than a time, as Parquet files.

Read from kron.executions, the latest state of each execution id (a tombstone does not
erase what was read before it: an archive keeps what history retention drops). An
execution is archived once it ended (a terminal state) before `before_ms`; its day is the
UTC date it ended on (its last write, `updated_at_ms`), the time history retention counts
from. One file per day and partition of kron.executions:

    DIR/date=2026-11-01/partition=3.parquet

(the Hive layout: pyarrow.dataset, DuckDB and Spark read DIR as one table with `date` and
`partition` columns). A rerun writes the same files again, merged with what they hold (the
latest state of each execution wins), so running it every day is idempotent, and a file
never loses a row because compaction removed the record since. Each file is written to a
temporary name and renamed over the old one: a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq

from replay.reader import Entry
from schemas.jsonable import jsonable
from streams.domain.states import ExecutionStatus

EXECUTION_STATE: Final = "kron.executions.ExecutionState"
TERMINAL: Final = ExecutionStatus.TERMINAL

SCHEMA: Final = pa.schema([
    ("exec_id", pa.string()),
    ("job_id", pa.string()),
    ("tenant", pa.string()),
    ("trigger", pa.string()),
    ("state", pa.string()),
    ("scheduled_for_ms", pa.int64()),
    ("due_at_ms", pa.int64()),
    ("created_at_ms", pa.int64()),
    ("updated_at_ms", pa.int64()),
    ("attempt", pa.int32()),
    ("fencing_token", pa.int64()),
    ("status_code", pa.int32()),
    ("reason", pa.string()),
    ("last_error", pa.string()),
    ("dst_outcome", pa.string()),
    ("run_id", pa.string()),
    ("task_id", pa.string()),
    ("worker", pa.string()),
    ("event_type", pa.string()),
    # Nested records as JSON text (schemas.jsonable): one column each, whatever they hold.
    ("attempts", pa.string()),
    ("dag", pa.string()),
    ("offset", pa.int64()),
])
_PLAIN: Final = ("exec_id", "job_id", "trigger", "state", "scheduled_for_ms", "due_at_ms",
                 "created_at_ms", "updated_at_ms", "attempt", "fencing_token", "status_code",
                 "reason", "last_error", "dst_outcome", "run_id", "task_id", "worker")


@dataclass(frozen=True, kw_only=True, slots=True)
class ArchivedFile:
    path: Path
    day: str
    partition: int
    rows: int


def latest(entries: Iterable[Entry]) -> dict[str, tuple[int, int, dict[str, Any]]]:
    """exec_id -> (partition, offset, record) of its latest ExecutionState record."""
    out: dict[str, tuple[int, int, dict[str, Any]]] = {}
    for entry in entries:
        if entry.name == EXECUTION_STATE and entry.record is not None:
            out[entry.record["exec_id"]] = (entry.partition, entry.offset, entry.record)
    return out


def row(record: Mapping[str, Any], offset: int) -> dict[str, Any]:
    """One execution as a row of SCHEMA."""
    out = {name: record.get(name) for name in _PLAIN}
    env = record.get("envelope") or {}
    out["tenant"] = env.get("tenant")
    out["event_type"] = env.get("event_type")
    out["attempts"] = json.dumps(jsonable(record.get("attempts") or []), separators=(",", ":"))
    dag = record.get("dag")
    out["dag"] = None if dag is None else json.dumps(jsonable(dag), separators=(",", ":"))
    out["offset"] = offset
    return out


def day_of(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d")


def select(found: Mapping[str, tuple[int, int, dict[str, Any]]], before_ms: int
           ) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """(day, partition) -> rows of the executions that ended before `before_ms`."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for partition, offset, rec in found.values():
        if rec["state"] in TERMINAL and rec["updated_at_ms"] < before_ms:
            key = (day_of(rec["updated_at_ms"]), partition)
            groups.setdefault(key, []).append(row(rec, offset))
    return groups


def file_of(root: Path, day: str, partition: int) -> Path:
    return root / f"date={day}" / f"partition={partition}.parquet"


def write_day(path: Path, rows: list[dict[str, Any]]) -> int:
    """Write the file with these rows and those it held (the later state of an execution
    wins), atomically; the rows written."""
    merged: dict[str, dict[str, Any]] = {}
    if path.exists():
        for old in pq.read_table(path, schema=SCHEMA).to_pylist():
            merged[old["exec_id"]] = old
    for new in rows:
        old = merged.get(new["exec_id"])
        if old is None or (old["updated_at_ms"], old["offset"]) <= (new["updated_at_ms"],
                                                                   new["offset"]):
            merged[new["exec_id"]] = new
    ordered = sorted(merged.values(), key=lambda r: (r["updated_at_ms"], r["exec_id"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(pa.Table.from_pylist(ordered, schema=SCHEMA), tmp)
    tmp.replace(path)
    return len(ordered)


def archive(entries: Iterable[Entry], *, before_ms: int, root: Path) -> list[ArchivedFile]:
    """Archive the executions of `entries` (kron.executions from its first offset) that
    ended before `before_ms` under `root`; the files written, by day and partition."""
    groups = select(latest(entries), before_ms)
    out = []
    for (day, partition), rows in sorted(groups.items()):
        path = file_of(root, day, partition)
        out.append(ArchivedFile(path=path, day=day, partition=partition,
                                rows=write_day(path, rows)))
    return out


def read_day(root: Path, day: str) -> list[dict[str, Any]]:
    """Every archived execution of one day, all partitions (for tests and operators)."""
    rows: list[dict[str, Any]] = []
    for path in sorted((root / f"date={day}").glob("partition=*.parquet")):
        rows += pq.read_table(path, schema=SCHEMA).to_pylist()
    return rows
