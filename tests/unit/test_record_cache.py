"""The TableStore's cache of decoded records, over a real RocksDB (rocksdict).

A table write's changelog half needs a broker: the integration tests cover it. The tables
here write only the partition's DB, which is what the cache's correctness depends on (a
read trusts the cache only while the DB holds the bytes it cached).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from rocksdict import Rdict

from schemas import codec, names
from schemas.errors import EncodeError
from streams.engine.core import PlanCache
from streams.engine.faust_store import RecordCache, TableStore, TerminalMemo, job_encoder
from streams.engine.store import (
    MemoryStore,
    Record,
    copier_for_fields,
    copy_record,
    record_copier,
)
from tests.golden.make_golden import SAMPLES
from tests.support.stack import spec


class DbTable:
    """One partition's RocksDB behind the two calls TableStore makes on a table
    (partition_db and write, as streams.tables.FencedTable has them)."""

    def __init__(self, path: Path) -> None:
        self.db = Rdict(str(path))

    def partition_db(self, partition: int) -> Rdict:
        return self.db

    def write(self, partition: int, key: bytes, value: bytes | None, epoch: int) -> None:
        if value is None:
            self.db.delete(key)
        else:
            self.db.put(key, value)


def canonical(name: str) -> Record:
    return codec.decode(codec.encode(name, SAMPLES[(name, 1)][0])).record


@pytest.fixture()
def tables(tmp_path: Path) -> Any:
    made = {n: DbTable(tmp_path / n) for n in ("jobs", "executions", "timers")}
    yield made
    for t in made.values():
        t.db.close()


def store_of(tables: dict[str, DbTable], jobs: RecordCache, execs: RecordCache) -> TableStore:
    return TableStore(jobs=tables["jobs"], executions=tables["executions"],
                      timers=tables["timers"], partition=0, job_cache=jobs,
                      execution_cache=execs)


def test_a_record_written_here_reads_back_equal_without_a_decode(tables: Any) -> None:
    jobs, execs = RecordCache(), RecordCache()
    job, ex = canonical(names.JOB_STATE), canonical(names.EXECUTION_STATE)
    store = store_of(tables, jobs, execs)
    store.put_job(job)
    store.put_execution(ex)
    # A later event's store over the same caches, as the engine builds one per event.
    later = store_of(tables, jobs, execs)
    with mock.patch.object(codec, "decode", side_effect=AssertionError("decoded")):
        assert later.job(job["job_id"]) == job
        assert later.execution(ex["exec_id"]) == ex
    assert (jobs.hits, execs.hits) == (1, 1)
    assert later.job("no such job") is None


def test_a_job_written_without_caching_is_read_from_its_bytes(tables: Any) -> None:
    jobs = RecordCache()
    job = canonical(names.JOB_STATE)
    store = store_of(tables, jobs, RecordCache())
    store.put_job(job, cache=False)
    assert len(jobs) == 0
    assert store.job(job["job_id"]) == job and (jobs.hits, jobs.misses) == (0, 1)


def test_a_job_written_without_caching_lets_its_specs_bytes_go(tables: Any) -> None:
    """A cached job's spec bytes stay kept for its next write; an uncached job's object is
    never written again, so its spec's bytes are dropped with the write."""
    store = store_of(tables, RecordCache(), RecordCache())
    kept, dropped = canonical(names.JOB_STATE), canonical(names.JOB_STATE)
    dropped["job_id"] = "another"
    encoder = job_encoder()  # the process's, which put_job encodes with
    store.put_job(kept)
    store.put_job(dropped, cache=False)
    with mock.patch("schemas.codec.schemaless_writer", side_effect=AssertionError("encoded")):
        assert encoder.encode(kept) == codec.encode(names.JOB_STATE, kept)
        with pytest.raises(EncodeError, match="encoded"):
            encoder.encode(dropped)


def saved_execution(tables: Any) -> tuple[TableStore, RecordCache, Record, Record]:
    """A store over `tables` that has just written an execution: the store, its cache, the
    record it was given and a snapshot of that record as saved."""
    execs = RecordCache()
    ex = canonical(names.EXECUTION_STATE)
    store = store_of(tables, RecordCache(), execs)
    store.put_execution(ex)
    return store, execs, ex, copy.deepcopy(ex)


def test_reads_are_copies_the_caller_may_change(tables: Any) -> None:
    store, execs, ex, saved = saved_execution(tables)
    first = store.execution(ex["exec_id"])
    assert first is not None and first["attempts"]
    first["state"] = "failed"
    first["attempts"][0]["outcome"] = "changed"
    first["attempts"].append({"attempt": 99})
    assert store.execution(ex["exec_id"]) == saved
    assert execs.hits == 2


def test_changes_after_saving_do_not_reach_the_cache(tables: Any) -> None:
    store, execs, ex, saved = saved_execution(tables)
    ex["state"] = "failed"
    ex["attempts"][0]["error"] = "changed after the save"
    assert store.execution(ex["exec_id"]) == saved
    assert execs.hits == 1


def test_bytes_written_elsewhere_are_read_not_shadowed(tables: Any) -> None:
    """A restore, a standby's update or another owner's write changes the DB under the
    cache: the read decodes what the DB holds."""
    jobs = RecordCache()
    mine = canonical(names.JOB_STATE)
    store = store_of(tables, jobs, RecordCache())
    store.put_job(mine)
    theirs = {**copy.deepcopy(mine), "version": mine["version"] + 1, "status": "paused"}
    key = mine["job_id"].encode()
    tables["jobs"].db.put(key, codec.encode(names.JOB_STATE, theirs))
    assert store.job(mine["job_id"]) == theirs
    assert (jobs.hits, jobs.misses) == (0, 1)
    # The very bytes the cache holds are back: its copy is good again.
    tables["jobs"].db.put(key, codec.encode_trusted(names.JOB_STATE, mine))
    assert store.job(mine["job_id"]) == mine
    assert jobs.hits == 1
    tables["jobs"].db.delete(key)
    assert store.job(mine["job_id"]) is None


def test_the_cache_keeps_the_newest_capacity_records() -> None:
    cache = RecordCache(capacity=2)
    for i in range(3):
        cache.put(f"k{i}".encode(), b"raw%d" % i, {"i": i})
    cache.put(b"k1", b"raw1", {"i": 1})  # written again: now the newest
    cache.put(b"k3", b"raw3", {"i": 3})
    assert len(cache) == 2
    assert cache.get(b"k0", b"raw0") is None and cache.get(b"k2", b"raw2") is None
    assert cache.get(b"k1", b"raw1") == {"i": 1}
    assert cache.get(b"k3", b"raw3") == {"i": 3}
    off = RecordCache(capacity=0)
    off.put(b"k", b"raw", {"i": 0})
    assert len(off) == 0 and off.get(b"k", b"raw") is None


def test_the_terminal_memo_and_plan_cache_keep_the_newest() -> None:
    memo = TerminalMemo(capacity=3)
    for i in range(5):
        memo.add(f"e{i}")
    memo.add("e2")  # seen again: keeps its place, so it is the next out
    assert [f"e{i}" in memo for i in range(5)] == [False, False, True, True, True]
    memo.add("e5")
    assert "e2" not in memo and all(f"e{i}" in memo for i in (3, 4, 5))
    plans = PlanCache(capacity=2)
    jobs = [{"job_id": f"j{i}", "version": 1, "created_at_ms": 0,
             "spec": spec(target={"url": "http://x.invalid/"}, run_at_ms=i)} for i in range(3)]
    first = [plans.plan(job) for job in jobs]
    assert plans.plan(jobs[2]) is first[2] and plans.plan(jobs[1]) is first[1]
    assert plans.plan(jobs[0]) is not first[0]  # evicted, planned again
    assert plans.plan(jobs[0]) == first[0]


def test_memory_store_refuses_a_record_not_in_its_canonical_form() -> None:
    job = canonical(names.JOB_STATE)
    del job["queued_slot_ms"]  # the bytes would read back with the default
    with pytest.raises(AssertionError, match="form its Avro bytes read back as"):
        MemoryStore().put_job(job)


def test_memory_store_catches_a_nested_change_after_the_save() -> None:
    """The cache shares nested records (spec, envelope) between its copies; the core must
    replace them, never change them in place."""
    store = MemoryStore()
    job = canonical(names.JOB_STATE)
    store.put_job(job)
    job["status"] = "paused"  # top level: the store holds its own dict
    assert store.job(job["job_id"])["status"] != "paused"  # type: ignore[index]
    job["envelope"]["producer"] = "changed in place"
    with pytest.raises(AssertionError, match="changed in place after it was saved"):
        store.job(job["job_id"])


def test_a_fired_timer_is_deleted_without_reading_it_again(tables: Any) -> None:
    store = store_of(tables, RecordCache(), RecordCache())
    store.put_timer(b"t-1", b"{}")
    with mock.patch.object(TableStore, "_get", side_effect=AssertionError("read")):
        store.delete_timer(b"t-1", read=True)
    assert tables["timers"].db.get(b"t-1") is None
    store.delete_timer(b"t-2")  # never written: nothing to delete, no tombstone either
    assert store.due_lanes(2**64 - 1) == []


@pytest.mark.parametrize("name", [names.JOB_STATE, names.EXECUTION_STATE])
def test_a_schemas_copier_copies_as_copy_record_does(name: str) -> None:
    # The cache's copies follow copy_record's rule (new top-level dict, new lists, new
    # dicts in them; nested records shared), visiting only the schema's array fields.
    copier = record_copier(name)
    records = SAMPLES[(name, 1)]
    assert records
    for record in records:
        before = copy.deepcopy(record)
        out, ref = copier(record), copy_record(record)
        assert out == ref == record and out is not record
        for key, value in record.items():
            if type(value) is list:
                assert out[key] is not value
                out[key].append("changed")
                for i, item in enumerate(value):
                    if type(item) is dict:
                        assert out[key][i] is not item
                        out[key][i]["changed"] = True
            elif type(value) is dict:
                assert out[key] is value is ref[key]  # shared, as copy_record shares it
        out["job_id"] = "changed"
        assert record == before, "a change to the copy reached the original"


def test_a_copier_leaves_out_an_array_the_record_lacks() -> None:
    record = {k: v for k, v in SAMPLES[(names.JOB_STATE, 1)][0].items() if k != "running"}
    assert record_copier(names.JOB_STATE)(record) == record


def test_a_copier_copies_a_nullable_array_too() -> None:
    # A field may become ["null", array] in a later schema: its list must still be copied,
    # or the core's in-place appends would reach the cached record.
    fields = [{"name": "ids", "type": ["null", {"type": "array", "items": "string"}]},
              {"name": "items", "type": {"type": "array", "items": {
                  "type": "record", "name": "t.Item", "fields": [{"name": "x", "type": "long"}]}}},
              {"name": "n", "type": "long"}]
    record: Record = {"ids": ["a"], "items": [{"x": 1}], "n": 3}
    out = copier_for_fields(fields)(record)
    out["ids"].append("b")
    out["items"][0]["x"] = 2
    assert record == {"ids": ["a"], "items": [{"x": 1}], "n": 3}
    assert copier_for_fields(fields)({"ids": None, "items": [], "n": 1}) == {
        "ids": None, "items": [], "n": 1}
