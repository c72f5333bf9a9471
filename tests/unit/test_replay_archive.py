"""`kron replay archive` (replay/archive.py): the latest state of each ended execution, as
Parquet, one file per day and partition; a rerun rewrites the same files with the same
rows, and keeps rows whose records compaction removed since."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from replay.archive import SCHEMA, archive, file_of, read_day
from replay.cli import _before
from replay.reader import Entry
from streams.domain.ids import exec_id
from tests.unit.test_core_scenarios import MIN, utc

DAY1 = utc(2026, 11, 1, 0, 0)
DAY2 = utc(2026, 11, 2, 0, 0)


def record(ex_id: str, state: str, updated_at_ms: int, *, attempt: int = 1) -> dict[str, Any]:
    return {
        "envelope": {"event_id": f"{ex_id}-{state}", "event_type": f"execution.{state}",
                     "schema_version": 1, "occurred_at_ms": updated_at_ms, "tenant": "acme",
                     "causation_id": None, "correlation_id": "j", "producer": "w1"},
        "exec_id": ex_id, "job_id": "j", "scheduled_for_ms": updated_at_ms - MIN,
        "owner_epoch": 1, "state": state, "trigger": "schedule", "attempt": attempt,
        "fencing_token": attempt, "due_at_ms": updated_at_ms - MIN, "worker": "w1",
        "lease_until_ms": None, "retry_at_ms": None, "dst_outcome": None, "reason": None,
        "last_error": None, "status_code": 200 if state == "succeeded" else None,
        "attempts": [{"attempt": attempt, "fencing_token": attempt, "worker": "w1",
                      "started_at_ms": updated_at_ms - 1000, "finished_at_ms": updated_at_ms,
                      "outcome": "succeeded" if state == "succeeded" else None,
                      "status_code": None, "error": None}],
        "created_at_ms": updated_at_ms - MIN, "updated_at_ms": updated_at_ms,
        "run_id": None, "task_id": None, "dag": None,
    }


def entries(*items: tuple[int, dict[str, Any] | None, str]) -> list[Entry]:
    """(partition, record or None for a tombstone, exec id), offsets in order per partition."""
    out, offsets = [], {0: 0, 1: 0, 2: 0, 3: 0}
    for partition, rec, ex_id in items:
        out.append(Entry(topic="t.executions", partition=partition, offset=offsets[partition],
                         key=ex_id.encode(), tombstone=rec is None,
                         name=None if rec is None else "kron.executions.ExecutionState",
                         record=rec, timestamp_ms=0))
        offsets[partition] += 1
    return out


A, B, C, D = (exec_id("j", DAY1 + n * MIN) for n in range(4))
HISTORY = entries(
    (0, record(A, "running", DAY1 + 10 * MIN), A),
    (0, record(A, "succeeded", DAY1 + 11 * MIN), A),   # day 1, partition 0
    (1, record(B, "failed", DAY1 + 12 * MIN), B),      # day 1, partition 1
    (1, record(C, "succeeded", DAY2 + 5 * MIN), C),    # day 2: after --before
    (0, record(D, "running", DAY1 + 13 * MIN), D),     # still running: not history yet
    (0, None, A),                                      # A's tombstone: archived all the same
)


def test_a_day_is_written_per_partition_and_reads_back(tmp_path: Path) -> None:
    files = archive(HISTORY, before_ms=DAY2, root=tmp_path)
    assert [(f.day, f.partition, f.rows) for f in files] == [("2026-11-01", 0, 1),
                                                             ("2026-11-01", 1, 1)]
    assert files[0].path == tmp_path / "date=2026-11-01" / "partition=0.parquet"
    rows = read_day(tmp_path, "2026-11-01")
    assert [(r["exec_id"], r["state"], r["tenant"]) for r in rows] == [
        (A, "succeeded", "acme"), (B, "failed", "acme")]
    assert json.loads(rows[0]["attempts"])[0]["outcome"] == "succeeded"
    assert pq.read_schema(files[0].path).equals(SCHEMA)
    assert not (tmp_path / "date=2026-11-02").exists()


def test_a_rerun_rewrites_the_same_files_and_keeps_rows_compaction_removed(
        tmp_path: Path) -> None:
    archive(HISTORY, before_ms=DAY2, root=tmp_path)
    path = file_of(tmp_path, "2026-11-01", 0)
    first = path.read_bytes()
    archive(HISTORY, before_ms=DAY2, root=tmp_path)
    assert path.read_bytes() == first
    # Later, compaction has removed A's records (its tombstone too): the file keeps A.
    later = [e for e in HISTORY if e.key != A.encode()]
    archive(later, before_ms=DAY2 + 86_400_000, root=tmp_path)
    assert [r["exec_id"] for r in read_day(tmp_path, "2026-11-01")] == [A, B]
    assert [r["exec_id"] for r in read_day(tmp_path, "2026-11-02")] == [C]
    assert list(tmp_path.rglob(".*.tmp")) == []


def test_before_in_days_is_the_start_of_that_utc_day() -> None:
    now = utc(2026, 12, 5, 7, 30)
    assert _before("30d", now) == utc(2026, 11, 5, 0, 0)
    assert _before("2026-11-01", now) == DAY1
    assert _before(str(DAY2), now) == DAY2
