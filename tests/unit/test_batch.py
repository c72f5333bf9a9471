"""CreateJobs batches: routing, grouping, and applying each job as its own CreateJob."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest
from aiokafka.partitioner import murmur2 as reference_murmur2
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import codec, names
from streams.domain.errors import PermanentError
from streams.engine import batch as batch_module
from streams.engine.batch import (
    MAX_JOBS,
    apply_batch,
    check_partition,
    group_by_partition,
    item_command,
    murmur2,
    partition_for,
)
from streams.engine.core import Context, PartitionCore
from streams.engine.store import MemoryStore
from tests.support.stack import spec

PARTITIONS = 8
HOME = 3
NOW = 1_767_225_600_000
TARGET = {"url": "http://target.invalid/hook"}
FAR_FUTURE = 253_402_300_800_001  # year 10000: a spec the core refuses


# Kafka's own vectors for Utils.murmur2 (UtilsTest.testMurmur2), as signed 32-bit ints.
@pytest.mark.parametrize(("key", "signed"), [
    ("21", -973932308), ("foobar", -790332482), ("a-little-bit-long-string", -985981536),
    ("a-little-bit-longer-string", -1486304829),
    ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971), ("abc", 479470107),
])
def test_partition_for_is_javas_default_partitioner(key: str, signed: int) -> None:
    for partitions in (1, 7, 8, 64):
        assert partition_for(key, partitions) == (signed & 0x7FFFFFFF) % partitions


@given(st.binary(max_size=80))
def test_murmur2_agrees_with_aiokafkas_word_by_word_version(data: bytes) -> None:
    assert murmur2(data) == reference_murmur2(data)


@settings(max_examples=300)
@given(job_id=st.text(max_size=80), partitions=st.integers(1, 1000))
def test_librdkafkas_partitioner_agrees_with_the_python_murmur2(job_id: str,
                                                                 partitions: int) -> None:
    """partition_for calls librdkafka's partitioner where the wheel has it (it does here):
    the same partition as the Python murmur2, NULs and all."""
    assert batch_module._native_partitioner is not None
    assert partition_for(job_id, partitions) == (
        murmur2(job_id.encode()) & 0x7FFFFFFF) % partitions


def ids_in(partition: int, prefix: str = "job") -> Any:
    return (i for i in (f"{prefix}-{n}" for n in itertools.count())
            if partition_for(i, PARTITIONS) == partition)


def item(job_id: str, *, run_at_ms: int = NOW + 60_000, key: str | None = None) -> dict[str, Any]:
    return {"job_id": job_id, "idempotency_key": key,
            "spec": spec(target=TARGET, run_at_ms=run_at_ms)}


def batch_of(jobs: list[dict[str, Any]], command_id: str = "batch-1") -> dict[str, Any]:
    return {"envelope": {"event_id": command_id, "event_type": "job.create_many_requested",
                         "schema_version": 1, "occurred_at_ms": NOW, "tenant": "acme",
                         "causation_id": None, "correlation_id": None, "producer": "tests"},
            "command_id": command_id, "jobs": jobs}


def context() -> Context:
    return Context(now_ms=NOW, causation_id="batch-1", worker="w1", epoch=1)


def apply(store: MemoryStore, batch: dict[str, Any], partition: int = HOME,
          refusable: Any = lambda exc: True, **chunk: int) -> list[Any]:
    effects, refused = apply_batch(PartitionCore(store), batch, partitions=PARTITIONS,
                                   partition=partition, context=context,
                                   refusable=refusable, **chunk)
    assert effects == []  # creating a job decides nothing yet
    return refused


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.text(min_size=1, max_size=12), max_size=60),
       size=st.integers(min_value=1, max_value=7))
def test_groups_hold_each_job_once_in_its_partition_and_order(ids: list[str], size: int) -> None:
    jobs = [{"job_id": i, "n": n} for n, i in enumerate(ids)]
    groups = list(group_by_partition(jobs, PARTITIONS, size=size))
    assert sorted(j["n"] for _, g in groups for j in g) == list(range(len(jobs)))
    for partition, group in groups:
        assert 0 < len(group) <= size
        assert {partition_for(j["job_id"], PARTITIONS) for j in group} == {partition}
    for partition in range(PARTITIONS):
        mine = [j["n"] for p, g in groups if p == partition for j in g]
        assert mine == sorted(mine)


@pytest.mark.parametrize("size", [0, MAX_JOBS + 1])
def test_group_size_is_bounded(size: int) -> None:
    with pytest.raises(ValueError, match="1 to"):
        list(group_by_partition([{"job_id": "a"}], PARTITIONS, size=size))


def test_item_command_is_a_createjob_with_derived_ids() -> None:
    batch = batch_of([item("a"), item("b", key="k")])
    commands = [item_command(batch, i) for i in range(2)]
    assert [c["command_id"] for c in commands] == ["batch-1#0", "batch-1#1"]
    assert [c["envelope"]["event_id"] for c in commands] == ["batch-1#0", "batch-1#1"]
    assert {c["envelope"]["event_type"] for c in commands} == {"job.create_requested"}
    assert batch["envelope"]["event_id"] == "batch-1"  # the batch itself is left alone
    assert commands[1]["idempotency_key"] == "k"
    for command in commands:  # the lone CreateJob's schema accepts it as it is
        assert codec.decode(codec.encode(names.CREATE_JOB, command)).record == command
    assert codec.decode(codec.encode(names.CREATE_JOBS, batch)).record == batch


def test_check_partition_names_the_home_partition() -> None:
    job_id = next(ids_in(5))
    check_partition(job_id, PARTITIONS, 5)
    with pytest.raises(PermanentError, match="belongs to partition 5, not 2") as info:
        check_partition(job_id, PARTITIONS, 2)
    assert info.value.field == "job_id"


def test_each_job_is_created_as_a_lone_create_would_be() -> None:
    ids = list(itertools.islice(ids_in(HOME), 3))
    batch = batch_of([item(i) for i in ids])
    batched = MemoryStore()
    assert apply(batched, batch) == []
    alone = MemoryStore()
    for index in range(len(ids)):
        PartitionCore(alone).on_command(names.CREATE_JOB, item_command(batch, index), context())
    assert batched.jobs == alone.jobs
    assert batched.timers == alone.timers
    assert [j["applied_command_ids"] for j in batched.jobs.values()] == [
        ["batch-1#0"], ["batch-1#1"], ["batch-1#2"]]
    event_ids = [j["envelope"]["event_id"] for j in batched.jobs.values()]
    assert len(set(event_ids)) == 3


def test_bad_jobs_are_refused_alone_and_the_rest_created() -> None:
    home = ids_in(HOME)
    good, dup, bad_spec = next(home), next(home), next(home)
    stranger = next(ids_in(HOME + 1))
    jobs = [item(good), item(stranger), item(dup), item(dup),
            item(bad_spec, run_at_ms=FAR_FUTURE)]
    store = MemoryStore()
    refused = apply(store, batch_of(jobs))
    assert {r.index: r.where for r in refused} == {1: "jobs[1]", 3: "jobs[3]", 4: "jobs[4]"}
    assert all(isinstance(r.error, PermanentError) for r in refused)
    assert "belongs to partition" in str(refused[0].error)
    assert "already exists" in str(refused[1].error)
    assert set(store.jobs) == {good, dup}


def test_a_batch_applied_in_chunks_is_the_batch_applied_at_once() -> None:
    home = ids_in(HOME)
    ids = [next(home) for _ in range(7)]
    jobs = [item(i) for i in ids[:6]] + [item(ids[0]), item(next(ids_in(HOME + 1)))]
    whole, chunked = MemoryStore(), MemoryStore()
    refused_whole = [r.index for r in apply(whole, batch_of(jobs))]
    refused_chunks = [r.index for start in range(0, len(jobs), 3)
                      for r in apply(chunked, batch_of(jobs), start=start, stop=start + 3)]
    assert refused_whole == refused_chunks == [6, 7]
    assert whole.jobs == chunked.jobs and whole.timers == chunked.timers


def test_a_batch_read_again_changes_no_job() -> None:
    ids = list(itertools.islice(ids_in(HOME), 4))
    batch = batch_of([item(i) for i in ids])
    store = MemoryStore()
    apply(store, batch)
    jobs, timers = dict(store.jobs), dict(store.timers)
    assert apply(store, batch) == []
    assert store.jobs == jobs
    assert store.timers == timers


class Unwritable(MemoryStore):
    def put_job(self, job: dict[str, Any], *, cache: bool = True) -> None:
        raise OSError(28, "No space left on device")


def test_an_error_not_of_the_jobs_making_is_raised_not_refused() -> None:
    batch = batch_of([item(next(ids_in(HOME)))])
    with pytest.raises(OSError, match="No space"):
        apply(Unwritable(), batch, refusable=lambda exc: not isinstance(exc, OSError))
    refused = apply(Unwritable(), batch)  # judged the job's fault: that job alone is refused
    assert [r.index for r in refused] == [0]


@settings(max_examples=40, deadline=None)
@given(picks=st.lists(st.tuples(st.integers(0, PARTITIONS - 1), st.integers(0, 5)),
                      max_size=25))
def test_every_job_is_created_once_or_refused(picks: list[tuple[int, int]]) -> None:
    """Random batches of jobs from several partitions, with repeats: a job is created iff
    it is of the batch's partition and its id was not seen earlier in the batch; every
    other index is refused, and a second delivery creates nothing more."""
    pools = {p: list(itertools.islice(ids_in(p, f"p{p}"), 6)) for p in range(PARTITIONS)}
    ids = [pools[p][n] for p, n in picks]
    batch = batch_of([item(i) for i in ids])
    store = MemoryStore()
    refused = {r.index for r in apply(store, batch)}
    seen: set[str] = set()
    expected_refused = set()
    for index, job_id in enumerate(ids):
        if partition_for(job_id, PARTITIONS) != HOME or job_id in seen:
            expected_refused.add(index)
        seen.add(job_id)
    assert refused == expected_refused
    created = Counter(job_id for kind, rec in store.log if kind == "job"
                      for job_id in [rec["job_id"]])
    assert set(created) == {i for i in ids if partition_for(i, PARTITIONS) == HOME}
    assert set(created.values()) <= {1}
    before = list(store.log)
    assert {r.index for r in apply(store, batch)} == expected_refused
    assert store.log == before


def _alone(store: MemoryStore, batch: dict[str, Any]) -> set[int]:
    """The batch applied the slow way: each job as the lone CreateJob it stands for."""
    refused = set()
    for index, job in enumerate(batch["jobs"]):
        try:
            check_partition(job["job_id"], PARTITIONS, HOME)
            PartitionCore(store).on_command(names.CREATE_JOB, item_command(batch, index),
                                            context())
        except PermanentError:
            refused.add(index)
    return refused


@settings(max_examples=60, deadline=None)
@given(picks=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 4), st.booleans(),
                                st.sampled_from([None, "k1", "k2"])), max_size=20),
       existing=st.lists(st.tuples(st.integers(0, 4), st.sampled_from([None, "k1"])),
                         max_size=4))
def test_the_batch_path_writes_what_lone_creates_write(
        picks: list[tuple[int, int, bool, str | None]],
        existing: list[tuple[int, str | None]]) -> None:
    """Byte for byte, in order: new jobs (which skip the CreateJob and its context), jobs
    that exist with or without the same idempotency key, strangers and bad specs."""
    home = list(itertools.islice(ids_in(HOME), 5))
    stranger = next(ids_in(HOME + 1))
    jobs = [item(stranger if where == 2 else home[n], key=key,
                 run_at_ms=FAR_FUTURE if bad else NOW + 60_000 * (n + 1))
            for where, n, bad, key in picks]
    batched, alone = MemoryStore(), MemoryStore()
    for store in (batched, alone):  # jobs created by an earlier batch
        earlier = batch_of([item(home[n], key=key) for n, key in existing], "batch-0")
        _alone(store, earlier)
    batch = batch_of(jobs)
    assert {r.index for r in apply(batched, batch, refusable=lambda exc: False)} == _alone(
        alone, batch)
    assert batched.log == alone.log
    assert batched.timers == alone.timers
