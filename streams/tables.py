"""Faust tables whose changelog writes carry the owner's epoch, and whose replays are fenced.

The active owner tags every changelog write with its epoch (a Kafka header, so no consumer
has to decode a value to judge it). Standbys and restores apply a partition's changelog
through an EpochFence: a write from an owner that had already been replaced is skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import faust

from streams.domain.fencing import EPOCH_HEADER, EpochFence, epoch_of_headers


class FencedTable(faust.Table[Any, Any]):
    """A table whose changelog is judged by owner epoch on every replay."""

    def __init__(self, *args: Any, epoch: Callable[[], int], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._epoch = epoch
        self.fence = EpochFence()

    def send_changelog(self, partition: int | None, key: Any, value: Any,
                       key_serializer: Any = None, value_serializer: Any = None) -> Any:
        epoch = self._epoch()
        if partition is not None and epoch > 0:
            # Our own writes raise the mark too: a replaced owner's late write after them
            # must lose to them when this process later replays the partition.
            self.fence.admit(partition, epoch, time.time_ns() // 1_000_000)
        return self.changelog_topic.send_soon(
            key=key, value=value, partition=partition,
            headers=[(EPOCH_HEADER, str(epoch).encode())] if epoch > 0 else None,
            key_serializer=key_serializer or self.key_serializer,
            value_serializer=value_serializer or self.value_serializer,
            callback=self._on_changelog_sent, eager_partitioning=True)

    def apply_changelog_batch(self, batch: Iterable[Any]) -> None:
        events = list(batch)
        admitted = [e for e in events if self.fence.admit(
            e.message.partition, epoch_of_headers(e.message.headers),
            int((e.message.timestamp or 0) * 1000))]
        super().apply_changelog_batch(admitted)
        if len(admitted) != len(events):
            # Skipped writes still count as read, or the next start would read them again.
            last: dict[Any, int] = {}
            for e in events:
                last[e.message.tp] = max(e.message.offset, last.get(e.message.tp, -1))
            for tp, offset in last.items():
                self.data.set_persisted_offset(tp, offset)
