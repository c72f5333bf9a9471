"""Reads a topic from its first offset to its current end, decoding every record."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from kron.kafka_security import confluent_config
from kron.settings import Settings
from schemas import codec
from schemas.errors import DecodeError
from streams.domain.fencing import EpochFence, epoch_of_headers


@dataclass(frozen=True, kw_only=True, slots=True)
class Entry:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    name: str | None  # None for a tombstone or undecodable bytes
    record: dict[str, Any] | None
    timestamp_ms: int
    epoch: int | None = None  # the writer's owner epoch, from the kron-epoch header
    tombstone: bool = False  # no value: the key's deletion (compacted topics)


def _consumer(source: str | Settings) -> Consumer:
    """Given Settings, the cluster's security settings apply; a bare bootstrap string (tests,
    bench against the local plaintext broker) means PLAINTEXT."""
    conf = {"group.id": f"kron-reader-{uuid.uuid4()}", "enable.auto.commit": False,
            "log_level": 3}
    if isinstance(source, Settings):
        return Consumer(confluent_config(source, conf))
    return Consumer({**conf, "bootstrap.servers": source})


def read_topic(source: str | Settings, topic: str, *, timeout_s: float = 30.0,
               fenced: bool = True) -> Iterator[Entry]:
    """Every record from the first offset to the current end. `fenced`: leave out writes a
    replaced owner made after losing its partition (see streams.domain.fencing)."""
    consumer = _consumer(source)
    try:
        md = consumer.list_topics(topic, timeout=timeout_s)
        parts = sorted(md.topics[topic].partitions)
        ends: dict[int, int] = {}
        for p in parts:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout_s)
            if high > low:
                ends[p] = high
        if not ends:
            return
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        # A replaced owner's late writes never became state; a replay leaves them out too.
        fence = EpochFence()
        while ends:
            msg = consumer.poll(timeout_s)
            if msg is None:
                raise TimeoutError(f"no record from {topic} within {timeout_s}s")
            if msg.error():
                continue
            partition, offset = int(msg.partition() or 0), int(msg.offset() or 0)
            epoch = epoch_of_headers(msg.headers())
            if not fenced or fence.admit(partition, epoch, msg.timestamp()[1]):
                yield _entry(msg, epoch)
            if offset + 1 >= ends.get(partition, 0):
                ends.pop(partition, None)
    finally:
        consumer.close()


def _entry(msg: Any, epoch: int | None) -> Entry:
    name, record = None, None
    if msg.value() is not None:
        try:
            decoded = codec.decode(msg.value())
            name, record = decoded.name, decoded.record
        except DecodeError:
            pass
    return Entry(topic=msg.topic(), partition=msg.partition(), offset=msg.offset(),
                 key=msg.key(), name=name, record=record, timestamp_ms=msg.timestamp()[1],
                 epoch=epoch, tombstone=msg.value() is None)


def topic_offsets(source: str | Settings, topic: str, *,
                  timeout_s: float = 30.0) -> dict[int, tuple[int, int]]:
    """partition -> (low, high) watermarks of a topic: how much `read_topic` will read."""
    consumer = _consumer(source)
    try:
        md = consumer.list_topics(topic, timeout=timeout_s)
        meta = md.topics.get(topic)
        if meta is None or meta.error is not None:
            raise KeyError(f"topic {topic} does not exist")
        out: dict[int, tuple[int, int]] = {}
        for p in sorted(meta.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout_s)
            out[p] = (low, high)
        return out
    finally:
        consumer.close()
