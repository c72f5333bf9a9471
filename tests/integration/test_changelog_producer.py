"""The changelog producer against the project's broker: what the dispatch barrier relies on.

flush() must return only once every write produced before it is in Kafka, and it must do
so while the event loop is busy: acks are served on the loop, between the slices of work
it yields, and never only when it is idle.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic

from kron.kafka_security import confluent_config
from kron.settings import Settings
from kron.topics import admin_client
from streams import changelog
from streams.changelog import (
    Changelog,
    ChildChangelogProducer,
    WriterKind,
    changelog_producer,
)

pytestmark = pytest.mark.integration

PARTITIONS = 4


@pytest.fixture(params=["inline", "process"])
def writer(request: pytest.FixtureRequest) -> WriterKind:
    kind: WriterKind = request.param
    return kind


def _producer(settings: Settings, offsets: dict[tuple[str, int], int],
              fatal: list[str], writer: WriterKind) -> Changelog:
    return changelog_producer(confluent_config(settings, {"client.id": "test-changelog"}),
                              writer=writer, on_offsets=offsets.update,
                              on_fatal=fatal.append)


def _high_watermarks(settings: Settings, topic: str) -> list[int]:
    consumer = Consumer(confluent_config(settings, {"group.id": "test-watermarks"}))
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1]
                for p in range(PARTITIONS)]
    finally:
        consumer.close()


def _topic(settings: Settings) -> str:
    name = settings.topic("changelog-test")
    admin = admin_client(settings)  # held: a collected client fails its futures
    admin.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(30)
    return name


def test_flush_returns_once_every_earlier_write_is_in_kafka(kafka_settings: Settings,
                                                              writer: WriterKind) -> None:
    topic = _topic(kafka_settings)
    offsets: dict[tuple[str, int], int] = {}
    fatal: list[str] = []

    async def run() -> tuple[list[int], int]:
        producer = _producer(kafka_settings, offsets, fatal, writer)
        for i in range(2_000):
            producer.produce(topic, i % PARTITIONS, b"k%d" % i, b"v%d" % i, None)
        await asyncio.wait_for(producer.flush(), 30)
        # Read before any later ack could be served: flush itself proved these durable.
        seen = _high_watermarks(kafka_settings, topic)
        published = producer.publish(topic, b"target", b"payload", [("h", b"1")])
        await asyncio.wait_for(published, 30)
        await producer.close()
        return seen, producer.writes

    seen, writes = asyncio.run(run())
    assert writes == 2_000 and seen == [500] * PARTITIONS
    # The acked offsets handed on (Faust's persisted offsets) are the last of each partition.
    assert offsets == {(topic, p): 499 for p in range(PARTITIONS)}
    assert fatal == []


def test_start_readies_the_producer_before_any_write(kafka_settings: Settings,
                                                     writer: WriterKind) -> None:
    """The worker starts its writer with the app: the producer (and a writer process) is
    up before the first decision's write; twice is once; a start with no write closes."""
    topic = _topic(kafka_settings)
    fatal: list[str] = []

    async def run() -> tuple[bool, int]:
        idle = _producer(kafka_settings, {}, fatal, writer)
        idle.start()
        await asyncio.sleep(0.2)
        await asyncio.wait_for(idle.close(), 30)
        producer = _producer(kafka_settings, {}, fatal, writer)
        producer.start()
        producer.start()
        await asyncio.sleep(0.2)
        if isinstance(producer, ChildChangelogProducer):
            child = producer._child
            ready = child is not None and child.poll() is None
        else:
            ready = isinstance(producer, changelog.ChangelogProducer) and (
                producer._producer is not None)
        producer.produce(topic, 1, b"first", b"v", None)
        await asyncio.wait_for(producer.flush(), 30)
        await producer.close()
        return ready, producer.writes

    ready, writes = asyncio.run(run())
    assert ready, "nothing started before the first write"
    assert writes == 1 and fatal == []
    assert _high_watermarks(kafka_settings, topic)[1] == 1


def test_a_busy_loop_still_gets_its_acks(kafka_settings: Settings, writer: WriterKind) -> None:
    """A loop that computes in 20 ms slices, yielding between them as the agent does
    between tick chunks, sees its flush resolve long before the 3 s of slices end (5
    slices here; serving acks only when the loop idles would take all 150)."""
    topic = _topic(kafka_settings)

    async def run() -> tuple[int | None, int]:
        producer = _producer(kafka_settings, {}, [], writer)
        producer.produce(topic, 0, b"warm-up", b"v", None)  # connected, producer id known
        await asyncio.wait_for(producer.flush(), 30)
        for i in range(2_000):
            producer.produce(topic, i % PARTITIONS, b"k%d" % i, b"v%d" % i, None)
        flushed = asyncio.ensure_future(producer.flush())
        resolved_at: int | None = None
        slices = 150
        for n in range(slices):
            end = time.perf_counter() + 0.02
            while time.perf_counter() < end:
                pass
            await asyncio.sleep(0)
            if flushed.done() and resolved_at is None:
                resolved_at = n
        await flushed
        await producer.close()
        return resolved_at, slices

    resolved_at, slices = asyncio.run(run())
    assert resolved_at is not None and resolved_at < slices // 3, resolved_at


def test_close_waits_for_what_is_in_flight(kafka_settings: Settings, writer: WriterKind) -> None:
    topic = _topic(kafka_settings)
    offsets: dict[tuple[str, int], int] = {}

    async def run() -> Any:
        producer = _producer(kafka_settings, offsets, [], writer)
        for i in range(500):
            producer.produce(topic, 0, b"k%d" % i, None if i % 7 == 0 else b"v", None)
        await producer.close()

    asyncio.run(run())
    assert _high_watermarks(kafka_settings, topic)[0] == 500
    assert offsets[(topic, 0)] == 499


def test_a_write_after_an_idle_spell_is_acked_without_waiting_out_the_idle_poll(
        kafka_settings: Settings, monkeypatch: pytest.MonkeyPatch, writer: WriterKind) -> None:
    """With nothing in flight the acks are served rarely; the next write must wake that
    service, or a spread-out load waits up to the idle period for every ack."""
    monkeypatch.setattr(changelog, "POLL_IDLE_S", 10.0)
    topic = _topic(kafka_settings)

    async def run() -> None:
        producer = _producer(kafka_settings, {}, [], writer)
        producer.produce(topic, 0, b"warm-up", b"v", None)
        await asyncio.wait_for(producer.flush(), 30)
        await asyncio.sleep(0.2)  # the last ack is served: the service waits idle
        producer.produce(topic, 1, b"after", b"v", None)
        await asyncio.wait_for(producer.flush(), 5)
        await producer.close()

    asyncio.run(run())


def test_a_record_over_the_size_limit_is_refused_at_the_write(kafka_settings: Settings,
                                                             writer: WriterKind) -> None:
    """The engine dead-letters a command whose state write librdkafka refuses at produce()
    (nothing was written locally yet); the writer process must refuse it there too, not
    later as a failure that restarts the worker."""
    topic = _topic(kafka_settings)
    fatal: list[str] = []

    async def run() -> None:
        producer = _producer(kafka_settings, {}, fatal, writer)
        with pytest.raises(KafkaException) as refused:
            producer.produce(topic, 0, b"big", b"x" * 1_100_000, [("kron-epoch", b"1")])
        assert refused.value.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
        producer.produce(topic, 0, b"small", b"v", None)
        await asyncio.wait_for(producer.flush(), 30)
        await producer.close()
        assert producer.writes == 1

    asyncio.run(run())
    assert fatal == [] and _high_watermarks(kafka_settings, topic)[0] == 1


async def _with_its_writer_killed(settings: Settings, topic: str,
                                  fatal: list[str]) -> ChildChangelogProducer:
    """A process writer that wrote one record, then had its child killed."""
    producer = _producer(settings, {}, fatal, "process")
    assert isinstance(producer, ChildChangelogProducer)
    producer.produce(topic, 0, b"before", b"v", None)
    await asyncio.wait_for(producer.flush(), 30)
    child = producer._child
    assert child is not None
    child.kill()
    child.wait(10)
    return producer


def test_the_writer_process_ending_is_fatal_and_fails_what_waits(
        kafka_settings: Settings) -> None:
    """Writes handed to a writer process that died may never reach Kafka: the barrier's
    waiters and the Kafka targets' publishes fail, and the worker is told to restart."""
    topic = _topic(kafka_settings)
    fatal: list[str] = []

    async def run() -> tuple[BaseException | None, BaseException | None]:
        producer = await _with_its_writer_killed(kafka_settings, topic, fatal)
        producer.produce(topic, 0, b"after", b"v", None)
        published = producer.publish(topic, b"target", b"payload", [])
        waited = await asyncio.wait_for(
            asyncio.gather(producer.flush(), published, return_exceptions=True), 30)
        return waited[0], waited[1]

    flushed, published = asyncio.run(run())
    # Whichever the worker notices first: the pipe broken at the next frame, or its end.
    assert isinstance(flushed, RuntimeError) and "writer process" in str(flushed)
    assert isinstance(published, RuntimeError)
    assert fatal and "writer process" in fatal[0]
    assert _high_watermarks(kafka_settings, topic)[0] == 1


def test_the_writer_process_outlives_ctrl_c_and_a_restart_reaps_it(
        kafka_settings: Settings) -> None:
    """Ctrl-C reaches the worker's whole process group: the writer must still be there for
    the graceful stop's flush. A restart (exec) abandons it, and it is gone, not a zombie
    left to the process image that follows."""
    topic = _topic(kafka_settings)

    async def run() -> tuple[int | None, int]:
        producer = _producer(kafka_settings, {}, [], "process")
        assert isinstance(producer, ChildChangelogProducer)
        producer.produce(topic, 0, b"before", b"v", None)
        await asyncio.wait_for(producer.flush(), 30)
        child = producer._child
        assert child is not None
        child.send_signal(signal.SIGINT)
        await asyncio.sleep(0.5)
        producer.produce(topic, 0, b"after", b"v", None)
        await asyncio.wait_for(producer.flush(), 30)
        producer.abandon()
        return child.returncode, child.pid

    returncode, pid = asyncio.run(run())
    assert returncode == 0  # ended at its input's end, and waited for
    assert not Path(f"/proc/{pid}").exists() or "Z" not in Path(f"/proc/{pid}/stat").read_text()
    assert _high_watermarks(kafka_settings, topic)[0] == 2


def test_closing_after_the_writer_process_died_fails_at_once(kafka_settings: Settings) -> None:
    topic = _topic(kafka_settings)
    fatal: list[str] = []

    async def run() -> float:
        producer = await _with_its_writer_killed(kafka_settings, topic, fatal)
        await asyncio.sleep(0.2)  # the loop reads the end of its output
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="writer process"):
            await producer.close(timeout_s=20)
        return time.monotonic() - started

    took = asyncio.run(run())
    assert took < 10, took  # not the close's whole timeout
    assert fatal
