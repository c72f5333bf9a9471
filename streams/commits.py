"""Guards on Faust's offset commits, so no source record is committed without being processed.

faust-streaming 0.15 can lose a record at a rebalance in two ways, both seen in fault tests:

1. After an assignment, a record fetched while the flow is still suspended is dropped, or
   skipped by the stream as belonging to an old generation, yet the fetch position has moved
   past it. Faust seeks back to the committed offset only when the partition has one above 0.
2. Its commit check lets the acked list start one past the committed offset
   (`min(acked) - committed > 1`), so exactly one skipped record is committed over and never
   read again (the broker-restart fault test lost one acknowledged create this way).

The guard keeps the commit contiguous: when the lowest acked offset of a source partition is
above its committed offset, a record at the head was skipped. Nothing is committed for that
partition and it is sought back to the committed offset, so the skipped records are read
again; the handlers are idempotent, so re-reading the rest is harmless. It also commits only
after `before_commit` (the engine's wait for its own state writes) returns.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from streams.runtime.group import CommitControl

log = logging.getLogger("kron.commits")

# A hole is sought back at most this often per partition: the re-read needs time to arrive.
RESEEK_S = 2.0


def head_offset(acked: Iterable[int], gaps: Iterable[Any]) -> int | None:
    """The lowest offset Faust would count as done: acked records and known gaps."""
    starts = [*acked, *(int(iv.begin) for iv in gaps)]
    return min(starts) if starts else None


def has_hole(*, head: int | None, committed: int | None) -> bool:
    """Is a record between the committed offset (the next to read) and `head` missing?
    Faust records a committed 0 and "never committed" both as None: the log's start."""
    return head is not None and head > (committed or 0)


class CommitGuard:
    def __init__(self, *, commits: CommitControl, sources: set[str], monotonic: Any,
                 before_commit: Callable[[], Awaitable[None]] | None = None,
                 before_commit_timeout_s: float = 5.0,
                 generation: Callable[[], int] = lambda: 0) -> None:
        self._commits = commits
        self._before_commit = before_commit
        # A commit during a revoke runs inside the rebalance: it must not wait longer than
        # the group's patience. Skipping one is safe, the next one covers the same writes.
        self._before_commit_timeout_s = before_commit_timeout_s
        self._generation = generation
        self._sources = sources
        self._monotonic = monotonic
        self._sought: dict[Any, float] = {}
        self._seeks: set[asyncio.Task[Any]] = set()
        self.holes = 0

    def install(self) -> None:
        commits = self._commits

        def after_seek(seek: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
            async def perform_seek() -> None:
                await seek()
                await self._seek_uncommitted_from_start()
            return perform_seek

        def guarded(new_offset: Callable[[Any], int | None]) -> Callable[[Any], int | None]:
            def guarded_new_offset(tp: Any) -> int | None:
                return None if self._hole(tp) else new_offset(tp)
            return guarded_new_offset

        def sources_without_gaps(add_gap: Callable[[Any, int, int], Awaitable[None]],
                                 ) -> Callable[[Any, int, int], Awaitable[None]]:
            async def guarded_add_gap(tp: Any, offset_from: int, offset_to: int) -> None:
                # Source topics are neither compacted nor transactional, so a jump in their
                # offsets is never a real gap: it is a record delivered from a fetch made
                # before a seek back. Counting the jump as done would commit over the
                # records sought.
                if tp.topic not in self._sources:
                    await add_gap(tp, offset_from, offset_to)
            return guarded_add_gap

        commits.wrap_perform_seek(after_seek)
        commits.wrap_new_offset(guarded)
        commits.wrap_add_gap(sources_without_gaps)
        if self._before_commit is not None:
            commits.wrap_commit(self._durable_first)

    def _durable_first(self, commit: Callable[[Any], Awaitable[bool]]) -> Any:
        """Commit source offsets only once the state writes of those records are acked.
        Faust flushes its own producer before a commit; state writes that bypass it must be
        waited for here, or a kill -9 right after a commit loses writes whose records are
        never read again."""
        before = self._before_commit
        assert before is not None

        async def commit_when_durable(offsets: Any) -> bool:
            try:
                await asyncio.wait_for(before(), self._before_commit_timeout_s)
            except Exception as exc:  # not durable: keep the offsets, the records are re-read
                log.warning("commit skipped: state writes not acknowledged (%s)", exc)
                return False
            return await commit(offsets)

        return commit_when_durable

    async def _seek_uncommitted_from_start(self) -> None:
        # aiokafka seeks only to committed offsets above 0, so a partition nobody has
        # committed yet keeps its position past records dropped during the assignment.
        commits = self._commits
        for tp in commits.assignment():
            if tp.topic in self._sources and not commits.committed(tp):
                await commits.seek(tp, 0)

    def _hole(self, tp: Any) -> bool:
        commits = self._commits
        if tp.topic not in self._sources:
            return False
        committed = commits.committed(tp)
        head = head_offset(commits.acked(tp), commits.gaps(tp))
        if not has_hole(head=head, committed=committed):
            return False
        now = self._monotonic()
        if now - self._sought.get(tp, -RESEEK_S) >= RESEEK_S:
            self._sought[tp] = now
            self.holes += 1
            log.warning("records %s..%s of %s[%s] were skipped; reading them again",
                        committed, head - 1 if head is not None else None, tp.topic,
                        tp.partition)
            task = asyncio.ensure_future(
                self._read_again(tp, committed or 0, self._generation()))
            self._seeks.add(task)
            task.add_done_callback(self._seek_done)
        return True

    async def _read_again(self, tp: Any, committed: int, generation: int) -> None:
        commits = self._commits
        earliest = (await commits.earliest_offsets(tp)).get(tp)
        if (generation != self._generation() or tp not in commits.assignment()
                or (commits.committed(tp) or 0) != committed):
            return  # a rebalance came in between: Faust has sought to the committed offset
        if earliest is not None and earliest > committed:
            # Retention deleted them (the group was away longer than the topic keeps
            # records): nothing is left to read, and waiting would stall commits for good.
            log.warning("records %s..%s of %s[%s] are gone (retention); committing from %s",
                        committed, earliest - 1, tp.topic, tp.partition, earliest)
            commits.set_committed(tp, earliest)
            return
        await commits.seek(tp, committed)

    def _seek_done(self, task: asyncio.Task[Any]) -> None:
        self._seeks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # The next commit sees the hole again and retries after RESEEK_S.
            log.warning("seek back failed: %r", task.exception())
