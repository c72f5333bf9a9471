"""The worker's view of its consumer group, through Faust's and aiokafka's internals: which
partitions it owns, the ownership epoch, the group coordinator's requests, fetch tuning,
commit control and the rebalance hooks."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from streams.runtime.check import verify

# The real objects whose classes the start-up check covers.
CONSUMER_CLASS = "faust.transport.drivers.aiokafka:Consumer"
ASSIGNOR_CLASS = "faust.assignor.partition_assignor:PartitionAssignor"

SendReq = Callable[[Any], Awaitable[Any]]


class FaustRuntime:
    """One Faust app, as the rest of the worker sees it. Built before the app starts; it
    refuses to be built (RuntimeMismatch) when a name it relies on is not there."""

    def __init__(self, app: Any, *, owned_topic: str) -> None:
        verify(objects=[(app.consumer, CONSUMER_CLASS), (app.assignor, ASSIGNOR_CLASS)])
        self.app = app
        self._owned_topic = owned_topic
        self._owned: frozenset[int] = frozenset()
        self._owned_for: object = None

    # --- ownership ---------------------------------------------------------------------------

    def coordinator(self) -> Any:
        """aiokafka's group coordinator, or None before the consumer started."""
        consumer = self.app.consumer._thread._consumer
        return None if consumer is None else consumer._coordinator

    def epoch(self) -> int:
        """The consumer group generation: it only grows, so it fences older owners."""
        coordinator = self.coordinator()
        if coordinator is None:
            return 0
        generation = coordinator.generation
        return generation if isinstance(generation, int) and generation > 0 else 0

    def owned_partitions(self) -> frozenset[int]:
        """Asked before every dispatch: rebuilt only when Faust installs a new assignment
        (it replaces the object, never mutates it), not per call (3% of the loop at 1.5k/s)."""
        assignment = self.app.assignor._assignment
        if assignment is not self._owned_for:
            self._owned = frozenset(assignment.actives.get(self._owned_topic, ()))
            self._owned_for = assignment
        return self._owned

    @property
    def rebalancing(self) -> bool:
        return bool(self.app.rebalancing)

    # --- fetches -----------------------------------------------------------------------------

    def tune_fetches(self, *, min_bytes: int, max_wait_ms: int) -> bool:
        """Set fetch.min.bytes and fetch.max.wait.ms of the running consumer (Faust does not
        expose them). False before the consumer started: call again later."""
        consumer = self.app.consumer._thread._consumer
        fetcher = None if consumer is None else consumer._fetcher
        if fetcher is None:
            return False
        fetcher._fetch_min_bytes = min_bytes
        fetcher._fetch_max_wait_ms = max_wait_ms
        return True

    def fetch_settings(self) -> tuple[int, int] | None:
        """(fetch.min.bytes, fetch.max.wait.ms) of the running consumer, or None."""
        consumer = self.app.consumer._thread._consumer
        fetcher = None if consumer is None else consumer._fetcher
        if fetcher is None:
            return None
        return fetcher._fetch_min_bytes, fetcher._fetch_max_wait_ms

    # --- commits and rebalances --------------------------------------------------------------

    def commit_control(self) -> CommitControl:
        return CommitControl(self.app.consumer)

    def follow_rebalances(self, *, started: Callable[[int], None],
                          ended: Callable[[int], None]) -> None:
        follow_rebalances(self.app, started=started, ended=ended)


def wrap_group_requests(coordinator: Any, wrap: Callable[[SendReq], SendReq]) -> None:
    """Route the coordinator's group requests (heartbeats, syncs, commits) through
    `wrap(original)`."""
    coordinator._send_req = wrap(coordinator._send_req)


def follow_rebalances(app: Any, *, started: Callable[[int], None],
                      ended: Callable[[int], None]) -> None:
    """`started(generation held)` as soon as Faust learns of a rebalance (in the consumer
    thread), `ended(generation recovered)` after the new assignment's tables recovered."""
    start, end = app.on_rebalance_start, app.on_rebalance_end

    def on_rebalance_start() -> None:
        started(int(app.consumer_generation_id or 0))
        start()

    def on_rebalance_end() -> None:
        end()
        ended(int(app.consumer_generation_id or 0))

    app.on_rebalance_start = on_rebalance_start
    app.on_rebalance_end = on_rebalance_end


class CommitControl:
    """Faust's commit bookkeeping of one consumer, and hooks around its commit steps."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer

    def committed(self, tp: Any) -> int | None:
        """The committed offset (the next to read); None for never committed, and for 0."""
        offset: int | None = self._consumer._committed_offset.get(tp)
        return offset

    def set_committed(self, tp: Any, offset: int) -> None:
        self._consumer._committed_offset[tp] = offset

    def acked(self, tp: Any) -> Iterable[int]:
        acked: Iterable[int] = self._consumer._acked.get(tp, ())
        return acked

    def gaps(self, tp: Any) -> Iterable[Any]:
        """Known offset gaps, as intervals (`.begin`, `.end`)."""
        gaps: Iterable[Any] = self._consumer._gap.get(tp, ())
        return gaps

    def assignment(self) -> Any:
        return self._consumer.assignment()

    async def seek(self, tp: Any, offset: int) -> None:
        await self._consumer.seek(tp, offset)

    async def earliest_offsets(self, *tps: Any) -> Any:
        return await self._consumer.earliest_offsets(*tps)

    def wrap_new_offset(self, wrap: Callable[[Callable[[Any], int | None]],
                                             Callable[[Any], int | None]]) -> None:
        """The offset Faust would commit for a partition."""
        self._consumer._new_offset = wrap(self._consumer._new_offset)

    def wrap_add_gap(self, wrap: Callable[[Callable[[Any, int, int], Awaitable[None]]],
                                          Callable[[Any, int, int], Awaitable[None]]]) -> None:
        """Faust's record of an offset jump as done."""
        self._consumer._add_gap = wrap(self._consumer._add_gap)

    def wrap_commit(self, wrap: Callable[[Callable[[Any], Awaitable[bool]]],
                                         Callable[[Any], Awaitable[bool]]]) -> None:
        """The commit of offsets to the broker."""
        self._consumer._commit = wrap(self._consumer._commit)

    def wrap_perform_seek(self, wrap: Callable[[Callable[[], Awaitable[None]]],
                                               Callable[[], Awaitable[None]]]) -> None:
        """The seek to committed offsets after an assignment."""
        self._consumer.perform_seek = wrap(self._consumer.perform_seek)
