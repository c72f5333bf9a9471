"""api.batcher: when keyless creates leave together, and that every batch is one a worker
accepts. The publish is a stand-in that records what it was given and acks when the test
says so (the API's integration tests send real batches to a real broker)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.batcher import MAX_PARTITIONS, CreateBatcher, size_bound
from schemas import codec, names
from schemas.errors import EncodeError
from streams.engine.batch import check_partition, item_command, partition_for
from tests.unit.test_codec import CREATE_JOBS

PARTITIONS = 8
SPEC = {"name": "x"}


class Publisher:
    """Records each publish; holds its ack while `gate` is clear, fails it with `error`,
    and refuses to encode a record holding a spec named "bad" (as the codec would raise)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any], str]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.error: Exception | None = None

    async def __call__(self, name: str, record: dict[str, Any], key: str) -> None:
        specs = [j["spec"] for j in record["jobs"]] if "jobs" in record else [record["spec"]]
        if any(spec.get("name") == "bad" for spec in specs):
            raise EncodeError(name, "spec.name: bad")
        self.sent.append((name, record, key))
        await self.gate.wait()
        if self.error is not None:
            raise self.error


def batcher(publish: Publisher, max_jobs: int = 100) -> CreateBatcher:
    counter = itertools.count()
    return CreateBatcher(publish, partitions=PARTITIONS, new_id=lambda: f"{next(counter):032x}",
                         now_ms=lambda: 1_000, max_jobs=max_jobs)


async def settle() -> None:
    """A few turns of the loop: a batch's send is scheduled, then its task starts."""
    for _ in range(5):
        await asyncio.sleep(0)


async def one_in_flight(b: CreateBatcher, publish: Publisher) -> Any:
    """A lone create of acme's, sent and held unacknowledged; returns its awaitable."""
    publish.gate.clear()
    acked = b.add("acme", b.job_id("acme"), SPEC)[1]
    await settle()
    return acked


def jobs_of(publish: Publisher) -> list[list[str]]:
    return [[j["job_id"] for j in record["jobs"]] for name, record, _ in publish.sent
            if name == names.CREATE_JOBS]


def test_a_lone_create_leaves_at_once_as_a_batch_of_one() -> None:
    async def run() -> None:
        publish = Publisher()
        b = batcher(publish)
        job_id = b.job_id("acme")
        command_id, acked = b.add("acme", job_id, SPEC)
        await asyncio.wait_for(acked, 1)
        (name, record, key), = publish.sent
        assert name == names.CREATE_JOBS and key == job_id
        assert command_id == f"{record['command_id']}#0"
        assert record["envelope"]["tenant"] == "acme"
        assert record["jobs"] == [{"job_id": job_id, "idempotency_key": None, "spec": SPEC}]
        # The CreateJob the worker applies for it carries the id the API handed out.
        assert item_command(record, 0)["command_id"] == command_id

    asyncio.run(run())


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 120), st.integers(1, 40))
def test_creates_during_a_flight_wait_for_its_ack_then_leave_together(
        waiting: int, max_jobs: int) -> None:
    async def run() -> None:
        publish = Publisher()
        b = batcher(publish, max_jobs=max_jobs)
        first = await one_in_flight(b, publish)
        later = [b.add("acme", b.job_id("acme"), SPEC)[1] for _ in range(waiting)]
        await asyncio.sleep(0.01)
        # Only full batches left while the first was in flight.
        assert [len(j) for j in jobs_of(publish)[1:]] == [max_jobs] * (waiting // max_jobs)
        publish.gate.set()
        await asyncio.wait_for(asyncio.gather(first, *later), 5)
        sizes = [len(j) for j in jobs_of(publish)]
        assert sizes[0] == 1 and sum(sizes) == waiting + 1 and max(sizes) <= max_jobs
        ids = [i for j in jobs_of(publish) for i in j]
        assert len(set(ids)) == len(ids)
        for record_jobs in jobs_of(publish):  # each a batch its partition's worker accepts
            home = partition_for(record_jobs[0], PARTITIONS)
            for job_id in record_jobs:
                check_partition(job_id, PARTITIONS, home)

    asyncio.run(run())


def test_a_tenants_batches_take_the_partitions_in_turn() -> None:
    async def run() -> None:
        publish = Publisher()
        b = batcher(publish)
        for _ in range(2 * PARTITIONS):
            await b.add("acme", b.job_id("acme"), SPEC)[1]
        homes = [partition_for(j[0], PARTITIONS) for j in jobs_of(publish)]
        assert homes == list(range(PARTITIONS)) * 2

    asyncio.run(run())


def test_one_tenants_flight_does_not_hold_another_tenants_creates() -> None:
    async def run() -> None:
        publish = Publisher()
        b = batcher(publish)
        held = await one_in_flight(b, publish)
        other = b.add("zeta", b.job_id("zeta"), SPEC)[1]
        await settle()
        assert [r["envelope"]["tenant"] for _, r, _ in publish.sent] == ["acme", "zeta"]
        publish.gate.set()
        await asyncio.wait_for(asyncio.gather(held, other), 1)

    asyncio.run(run())


def test_an_id_of_another_partition_goes_in_a_batch_of_its_own() -> None:
    async def run() -> None:
        publish = Publisher()
        b = batcher(publish)
        mine = b.job_id("acme")
        stray = next(f"j_{n}" for n in itertools.count()
                     if partition_for(f"j_{n}", PARTITIONS) != partition_for(mine, PARTITIONS))
        acks = [b.add("acme", mine, SPEC)[1], b.add("acme", stray, SPEC)[1]]
        await asyncio.wait_for(asyncio.gather(*acks), 1)
        assert jobs_of(publish) == [[mine], [stray]]

    asyncio.run(run())


def test_a_failed_publish_fails_every_create_of_its_batch_and_not_the_next() -> None:
    async def run() -> None:
        publish = Publisher()
        b = batcher(publish)
        first = await one_in_flight(b, publish)
        batch = [b.add("acme", b.job_id("acme"), SPEC)[1] for _ in range(3)]
        publish.error = RuntimeError("broker away")
        publish.gate.set()
        results = await asyncio.gather(first, *batch, return_exceptions=True)
        assert all(isinstance(r, RuntimeError) for r in results)
        publish.error = None
        await asyncio.wait_for(b.add("acme", b.job_id("acme"), SPEC)[1], 1)
        assert [len(j) for j in jobs_of(publish)] == [1, 3, 1]

    asyncio.run(run())


def test_close_sends_what_is_open_and_waits_for_it() -> None:
    async def run() -> None:
        publish = Publisher()
        b = batcher(publish)
        publish.gate.clear()
        b.add("acme", b.job_id("acme"), SPEC)
        await settle()
        waiting = b.add("acme", b.job_id("acme"), SPEC)[1]
        publish.gate.set()
        await b.close()
        assert waiting.done() and [len(j) for j in jobs_of(publish)] == [1, 1]

    asyncio.run(run())


def test_a_batch_size_outside_createjobs_limits_is_refused() -> None:
    with pytest.raises(ValueError, match="1 to 500"):
        batcher(Publisher(), max_jobs=501)
    with pytest.raises(ValueError, match="partitions"):
        CreateBatcher(Publisher(), partitions=MAX_PARTITIONS + 1, new_id=lambda: "x",
                      now_ms=lambda: 0)


def test_a_batch_leaves_before_its_bytes_could_pass_the_budget() -> None:
    async def run() -> None:
        publish = Publisher()
        counter = itertools.count()
        b = CreateBatcher(publish, partitions=PARTITIONS, new_id=lambda: f"{next(counter):032x}",
                          now_ms=lambda: 1, max_jobs=500, max_bytes=10_000)
        big = {"name": "x", "body": b"x" * 3_000}
        publish.gate.clear()
        first = b.add("acme", b.job_id("acme"), big)[1]
        await settle()
        rest = [b.add("acme", b.job_id("acme"), big)[1] for _ in range(7)]
        publish.gate.set()
        await asyncio.wait_for(asyncio.gather(first, *rest), 5)
        sizes = [len(j) for j in jobs_of(publish)]
        assert sum(sizes) == 8 and max(sizes) == 3  # 3 x ~3,050 bytes fit in 10,000
        for _, record, _ in publish.sent:
            assert sum(size_bound(j) for j in record["jobs"]) <= 10_000

    asyncio.run(run())


def test_a_batch_that_does_not_encode_fails_only_its_bad_create() -> None:
    async def run() -> None:
        publish = Publisher()
        b = batcher(publish)
        first = await one_in_flight(b, publish)
        ids = [b.add("acme", b.job_id("acme"), {"name": name}) for name in ("a", "bad", "c")]
        publish.gate.set()
        results = await asyncio.gather(first, *(acked for _, acked in ids),
                                       return_exceptions=True)
        assert results[:2] == [None, None] and results[3] is None
        assert isinstance(results[2], EncodeError)
        # The good ones went as the CreateJobs each stands for: the same command ids.
        alone = {r["command_id"] for name, r, _ in publish.sent if name == names.CREATE_JOB}
        assert alone == {ids[0][0], ids[2][0]}

    asyncio.run(run())


@settings(max_examples=100, deadline=None)
@given(st.lists(CREATE_JOBS, min_size=1, max_size=4))
def test_the_byte_bound_is_never_below_the_encoded_record(creates: list[dict[str, Any]]) -> None:
    record = {"envelope": creates[0]["envelope"], "command_id": creates[0]["command_id"],
              "jobs": [{"job_id": c["job_id"], "idempotency_key": c["idempotency_key"],
                        "spec": c["spec"]} for c in creates]}
    assert len(codec.encode(names.CREATE_JOBS, record)) <= size_bound(record)
