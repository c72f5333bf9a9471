"""The lanes of one partition's timer index, each with its floor, by floor due time.

A lane (streams.domain.timer) is a queue: fired timers are deleted from its front, and
RocksDB keeps their tombstones until compaction. A seek into the lane from its first key
steps over all of them (8 ms per seek with 190k tombstones, measured); seeking from the
lane's floor, a key no live key of the lane sorts below, skips them. The floor's due time
also bounds the lane's: a lane whose floor is not due has nothing due and is not read, and
the lanes whose floors are due come out of a heap by due time, so a round costs the lanes
it reads, not every lane the partition holds.
"""

from __future__ import annotations

import heapq
from collections.abc import Generator, Iterator, Mapping

from streams.domain.timer import due_of, lane_prefix_of


class LaneFloors:
    """Lane prefix -> floor, for every lane holding a live key, with a heap of (floor due,
    prefix) entries. The heap is lazy: an entry whose lane was dropped or whose floor moved
    since is stale, passed over when it comes up (and dropped, if popped); the heap is
    rebuilt when stale entries outnumber the lanes."""

    __slots__ = ("_floors", "_heap")

    def __init__(self, floors: Mapping[bytes, bytes] | None = None) -> None:
        self._floors: dict[bytes, bytes] = dict(floors or {})
        self._heap: list[tuple[int, bytes]] = []
        self._rebuild()

    def _rebuild(self) -> None:
        # In place: an iteration (ascending) holds the list.
        self._heap[:] = [(due_of(key), prefix) for prefix, key in self._floors.items()]
        heapq.heapify(self._heap)

    def _push(self, due: int, prefix: bytes) -> None:
        heapq.heappush(self._heap, (due, prefix))
        if len(self._heap) > 2 * len(self._floors) + 64:
            self._rebuild()

    def __len__(self) -> int:
        return len(self._floors)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._floors)

    def __contains__(self, prefix: object) -> bool:
        return prefix in self._floors

    def get(self, prefix: bytes) -> bytes | None:
        return self._floors.get(prefix)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(self._floors.items())

    def lower(self, key: bytes) -> None:
        """A key was written: its lane's floor comes down to it, or its lane is new."""
        prefix = lane_prefix_of(key)
        if prefix is None:
            return
        current = self._floors.get(prefix)
        if current is None or key < current:
            self._floors[prefix] = key
            due = due_of(key)
            if current is None or due < due_of(current):
                self._push(due, prefix)

    def raise_to(self, prefix: bytes, key: bytes) -> None:
        """Nothing live in the lane sorts below `key`: the caller just scanned up to it."""
        current = self._floors.get(prefix)
        if current is not None and key > current:
            self._floors[prefix] = key
            due = due_of(key)
            if due != due_of(current):
                self._push(due, prefix)

    def drop(self, prefix: bytes) -> None:
        """The lane holds no live key: the caller just scanned it from its floor."""
        self._floors.pop(prefix, None)

    def due(self, upto_ms: int) -> list[bytes]:
        """The lanes whose floor is due at or before upto_ms, in key order. The heap is
        walked, not popped: from the root, into an entry's children only while it is due
        (they are no earlier), so the cost is the due entries', and nothing moves."""
        heap, floors = self._heap, self._floors
        size = len(heap)
        found: set[bytes] = set()
        stale = 0
        stack = [0] if size and heap[0][0] <= upto_ms else []
        while stack:
            i = stack.pop()
            due, prefix = heap[i]
            key = floors.get(prefix)
            if key is not None and due_of(key) == due:
                found.add(prefix)
            else:
                stale += 1
            for child in (2 * i + 1, 2 * i + 2):
                if child < size and heap[child][0] <= upto_ms:
                    stack.append(child)
        if stale > 16 and stale > len(found):
            # Each round raises the floors it reads, leaving an entry behind: walked over
            # again by every later call until they are gone.
            self._rebuild()
        return sorted(found)

    def ascending(self) -> Generator[tuple[int, bytes]]:
        """(floor due, prefix) of every lane, by floor due time, taken from the heap as the
        caller goes on. The caller may raise floors and drop lanes meanwhile: the lanes
        taken go back, at their floors' due times then, when the iteration ends (close
        it). An entry a raise pushed meanwhile may come up and be passed over here."""
        heap, floors = self._heap, self._floors
        seen: set[bytes] = set()
        try:
            while heap:
                due, prefix = heapq.heappop(heap)
                key = floors.get(prefix)
                if key is None or prefix in seen or due_of(key) != due:
                    continue
                seen.add(prefix)
                yield due, prefix
        finally:
            for prefix in seen:
                key = floors.get(prefix)
                if key is not None:
                    heapq.heappush(heap, (due_of(key), prefix))
