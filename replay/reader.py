"""Reads a topic from its first offset to its current end, decoding every record."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from schemas import codec
from schemas.errors import DecodeError


@dataclass(frozen=True, kw_only=True, slots=True)
class Entry:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    name: str | None  # None for a tombstone or undecodable bytes
    record: dict[str, Any] | None
    timestamp_ms: int


def read_topic(bootstrap: str, topic: str, *, timeout_s: float = 30.0) -> Iterator[Entry]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"kron-reader-{uuid.uuid4()}",
                         "enable.auto.commit": False, "log_level": 3})
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
        while ends:
            msg = consumer.poll(timeout_s)
            if msg is None:
                raise TimeoutError(f"no record from {topic} within {timeout_s}s")
            if msg.error():
                continue
            entry = _entry(msg)
            yield entry
            if entry.offset + 1 >= ends.get(entry.partition, 0):
                ends.pop(entry.partition, None)
    finally:
        consumer.close()


def _entry(msg: Any) -> Entry:
    name, record = None, None
    if msg.value() is not None:
        try:
            decoded = codec.decode(msg.value())
            name, record = decoded.name, decoded.record
        except DecodeError:
            pass
    return Entry(topic=msg.topic(), partition=msg.partition(), offset=msg.offset(),
                 key=msg.key(), name=name, record=record, timestamp_ms=msg.timestamp()[1])


def topic_offsets(bootstrap: str, topic: str, *,
                  timeout_s: float = 30.0) -> dict[int, tuple[int, int]]:
    """partition -> (low, high) watermarks of a topic: how much `read_topic` will read."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"kron-reader-{uuid.uuid4()}",
                         "enable.auto.commit": False, "log_level": 3})
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
