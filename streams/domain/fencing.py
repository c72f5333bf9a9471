"""Owner epochs on the changelogs: a zombie owner's late writes never become state.

Every state write carries the writer's epoch (its consumer-group generation, which the
broker only ever raises). Within one partition's changelog, legitimate owners follow each
other with rising epochs, so a write with a lower epoch than one already seen came from an
owner that had lost the partition: a process paused or cut off while its writes sat in a
buffer. Replays (restore, standby, projections, audits) leave those writes out.

A group that was deleted and re-created starts its generations again from 1. Writes that
come long after the highest epoch's last write are therefore taken as a new lineage, not
as a zombie: a zombie's buffered writes go out within moments of it waking.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# A lower-epoch write this long after the latest higher-epoch write starts a new lineage.
LINEAGE_GAP_MS = 10 * 60 * 1000
EPOCH_HEADER = "kron-epoch"


@dataclass(kw_only=True, slots=True)
class _Mark:
    epoch: int
    last_ms: int


@dataclass(kw_only=True, slots=True)
class EpochFence:
    """Admits writes in log order; one instance per reader of a changelog."""

    gap_ms: int = LINEAGE_GAP_MS
    _marks: dict[Hashable, _Mark] = field(default_factory=dict)
    rejected: int = 0

    def admit(self, partition: Hashable, epoch: int | None, timestamp_ms: int) -> bool:
        """Whether the write at this position of the partition's log counts."""
        if epoch is None or epoch <= 0:
            return True  # unknown writer (old records, tools): nothing to judge by
        mark = self._marks.get(partition)
        if mark is not None and epoch == mark.epoch:
            mark.last_ms = timestamp_ms  # the common case: the same owner writing on
            return True
        if mark is None or epoch > mark.epoch or timestamp_ms - mark.last_ms > self.gap_ms:
            self._marks[partition] = _Mark(epoch=epoch, last_ms=timestamp_ms)
            return True
        self.rejected += 1
        return False


def epoch_of_headers(headers: Mapping[str, Any] | Iterable[tuple[str, Any]] | None
                     ) -> int | None:
    """The writer's epoch from Kafka headers given as a mapping or (key, value) pairs."""
    if not headers:
        return None
    items = headers.items() if isinstance(headers, Mapping) else headers
    for key, value in items:
        if key == EPOCH_HEADER and value:
            try:
                return int(value.decode() if isinstance(value, bytes | bytearray) else value)
            except (TypeError, ValueError):
                return None
    return None
