"""The precise layer: wakes when a partition's earliest timer is due and sends it a tick.

It keeps, per owned partition, the due time of the earliest durable timer (one RocksDB
seek) and sleeps until the soonest one. The agent tells it when a write adds an earlier
timer and when a tick has been processed. The tick carries the ticker's clock reading and
firing uses that time, so firing is a pure function of the tick and the state. A tick for
a partition this process owns is applied here at once (TickerHost.tick_here); otherwise, or
if the host declines (rebalancing, stopping, lease lapsed), it goes through kron.signals
(TickerHost.send_tick) and whichever process owns the partition applies it.

With fire-ahead on, a tick also decides the eligible slots due within the next
`fire_ahead_s` (the window travels in the tick). The ticker then also watches, per
partition, the earliest timer past the window the last tick decided, and sends a tick when
it enters the window: at most every AHEAD_EVERY_S, as timers left in the window (leases,
other overlap policies) are read again by each tick. A worker behind on decisions (a
partition with more due than its last tick fired) decides nothing ahead; one behind only
on calls keeps the base window (not a spike's grown one): its held calls are released into
a queue served by tier and tenant, not behind the calls already there.

The window grows past `fire_ahead_s` when a spike is coming (streams.domain.lookahead): at
each rescan the ticker counts the FIRE timers due in the next PILE_CAP_MS across its
partitions, and takes in a spike early enough to decide it at DECIDE_PER_S by its due time.
A worker already making calls at half that rate keeps the base window.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from typing import Any, Protocol

from kron.clock import Clock
from schemas import codec, names
from schemas.envelope import make_envelope
from streams.domain import lookahead
from streams.domain.timer import TimerKind, due_of, kind_of

log = logging.getLogger("kron.ticker")

# A tick that got no answer (rebalance, recovery) is sent again after this long.
RESEND_S = 5.0
# Even with no notification, re-read the durable index this often.
RESCAN_S = 0.5
# Ticks sent only to decide ahead go out at most this often per partition.
AHEAD_EVERY_S = 0.25
# Behind: more attempts than this waiting for an executor slot, or a partition with more
# due than its last tick could fire.
BEHIND_BACKLOG = 256
# The window grows for a spike due within this long, and never past it.
PILE_CAP_MS = 8000
# Timers counted per partition and rescan: 0.25 us a key, ~2 ms a partition at most.
PILE_SCAN = 8192
# The deciding rate a grown window assumes. One worker decided a burst of 20,000 at
# ~4,300/s with nothing else running (bench burst, ticks logged): assuming 6,000/s left a
# quarter of it to decide after its due second. Lower starts a spike earlier, which costs
# only memory for the held calls.
DECIDE_PER_S = 3500
# The calls-a-second rate that tells a stream from a spike is averaged over this long.
STREAM_S = 5.0


def _due_of(key: bytes | None) -> int | None:
    return None if key is None else due_of(key)


class TimerIndex(Protocol):
    """The durable timer index of a partition (streams.engine.faust_store.TableTimerIndex)."""

    def first(self, partition: int) -> bytes | None:
        """The earliest timer's key."""

    def first_after(self, partition: int, after_ms: int) -> bytes | None:
        """The earliest timer due after `after_ms`."""

    def fire_dues(self, partition: int, after_ms: int, until_ms: int,
                  limit: int) -> list[int]:
        """Due times of the FIRE timers due in (after_ms, until_ms], at most `limit`."""

    def has_waiting(self, partition: int) -> bool:
        """The partition may hold executions queued for their tenant's max_running (their
        timers are not among those `first` and `first_after` give)."""


class TickerHost(Protocol):
    """All the ticker knows of the worker: a clock, the timer index, the partitions it may
    tick, the executor's load, and a way to submit a tick."""

    @property
    def clock(self) -> Clock: ...

    @property
    def timers(self) -> TimerIndex: ...

    def tickable(self) -> frozenset[int]:
        """The partitions this process owns, inside its ownership lease (else none)."""

    def backlog(self) -> int:
        """Attempts waiting for an executor slot."""

    def completed(self) -> int:
        """Calls the executor finished so far."""

    async def tick_here(self, record: dict[str, Any]) -> bool:
        """Apply the tick in this process now, if it may; False: declined."""

    async def send_tick(self, partition: int, value: bytes) -> None:
        """Send the encoded tick through kron.signals, to whoever owns the partition."""


class Ticker:
    def __init__(self, *, host: TickerHost, fire_ahead_s: float, worker_id: str) -> None:
        self._host = host
        self._worker_id = worker_id
        self._ahead_ms = int(fire_ahead_s * 1000)
        # The window in force: _ahead_ms, or longer while a spike is coming.
        self._lookahead_ms = self._ahead_ms
        self._calls: collections.deque[tuple[float, int]] = collections.deque()
        self._next: dict[int, int | None] = {}
        # Fire-ahead, per partition: every eligible timer due by `_decided` was decided;
        # `_early` is the first timer due after that; `_window` the end of the window the
        # outstanding tick decides; `_low` the earliest timer written since it was sent.
        self._decided: dict[int, int] = {}
        self._early: dict[int, int | None] = {}
        self._window: dict[int, int] = {}
        self._low: dict[int, int] = {}
        self._early_sent: dict[int, float] = {}
        self._outstanding: dict[int, float] = {}
        self._more: set[int] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.sent = 0

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def timer_added(self, partition: int, key: bytes) -> None:
        due = _due_of(key)
        if due is None:
            return
        current = self._next.get(partition)
        if current is None or due < current:
            self._next[partition] = due
            self._wake.set()
        # Only a FIRE timer may be decided ahead; a HELD one marks slots already decided.
        if self._ahead_ms and kind_of(key) == TimerKind.FIRE:
            self._timer_added_ahead(partition, due)

    def _timer_added_ahead(self, p: int, due: int) -> None:
        # Inside the decided window (a new one-off, a cron's next slot): look again.
        if due <= self._decided.get(p, -1):
            self._decided[p] = due - 1
        if p in self._window:
            self._low[p] = min(self._low.get(p, due), due)
        early = self._early.get(p)
        if early is None or due < early:
            self._early[p] = due
            self._wake.set()

    def others_due(self, partition: int, now_ms: int) -> bool:
        """Another partition has timers due (or more than its last tick fired): a long
        tick of this one would keep their slots waiting, whatever their tier."""
        return any(p != partition and due is not None and due <= now_ms
                   for p, due in self._next.items())

    def wake(self, partition: int) -> None:
        """Tick the partition now: a tenant with executions queued there has room."""
        if partition in self._next:
            self._next[partition] = 0
            self._wake.set()

    def ticked(self, partition: int, *, more: bool) -> None:
        self._outstanding.pop(partition, None)
        first = (None if more and not self._ahead_ms
                 else _due_of(self._host.timers.first(partition)))
        # Behind only if what is left is due already: a full window of decisions ahead (a
        # spike being decided) is what fire-ahead is for.
        if more and first is not None and first <= self._host.clock.now_ms():
            self._more.add(partition)
        else:
            self._more.discard(partition)
        self._next[partition] = 0 if more else first
        if self._ahead_ms:
            window = self._window.pop(partition, None)
            low = self._low.pop(partition, None)
            if window is not None and not more:
                # The tick's scan did not see timers written while it ran.
                self._decided[partition] = window if low is None else min(window, low - 1)
            self._early[partition] = self._first_undecided(partition)
        self._wake.set()

    def deciding(self) -> bool:
        """A tick is being applied or awaited, or a partition has more due than its last
        tick fired: slots are due now and not yet decided."""
        return bool(self._outstanding) or bool(self._more)

    def _first_undecided(self, partition: int) -> int | None:
        # From now at the earliest: a seek from the start would walk every tombstone that
        # the due scan's key floor skips.
        after = max(self._decided.get(partition, -1), self._host.clock.now_ms())
        return _due_of(self._host.timers.first_after(partition, after))

    def _rescan(self, owned: frozenset[int]) -> None:
        for p in list(self._next):
            if p not in owned:
                self._forget(p)
        for p in owned:
            with contextlib.suppress(Exception):  # a DB closing under a rebalance
                self._next[p] = _due_of(self._host.timers.first(p))
                if self._host.timers.has_waiting(p):
                    self._next[p] = 0  # queued executions: whether they may start now
                if self._ahead_ms:
                    self._early[p] = self._first_undecided(p)
        if self._ahead_ms and self._ahead_ms < PILE_CAP_MS:
            with contextlib.suppress(Exception):
                self._size_window(owned)

    def _calls_per_s(self) -> float:
        """Calls the executor finished a second over the last STREAM_S."""
        mono, done = self._host.clock.monotonic(), self._host.completed()
        if not self._calls or mono > self._calls[-1][0]:
            self._calls.append((mono, done))
        while len(self._calls) > 2 and mono - self._calls[1][0] >= STREAM_S:
            self._calls.popleft()
        first_mono, first_done = self._calls[0]
        return (done - first_done) / (mono - first_mono) if mono > first_mono else 0.0

    def _size_window(self, owned: frozenset[int]) -> None:
        """The window for what is coming: longer than _ahead_ms only for a spike."""
        now, base = self._host.clock.now_ms(), self._ahead_ms
        dues: list[int] = []
        if lookahead.carrying_stream(self._calls_per_s(), DECIDE_PER_S):
            window = base  # nothing to count: its piles are the stream itself
        else:
            for p in owned:
                dues += self._host.timers.fire_dues(p, now + base, now + PILE_CAP_MS,
                                                    PILE_SCAN)
            window = lookahead.window_ms(dues, now_ms=now, base_ms=base, cap_ms=PILE_CAP_MS,
                                         decide_per_s=DECIDE_PER_S,
                                         slack=int(DECIDE_PER_S * base / 1000))
        if window != self._lookahead_ms:
            log.info("fire-ahead window %d ms", window,
                     extra={"window_ms": window, "coming": len(dues),
                            "worker": self._worker_id})
        self._lookahead_ms = window

    def _forget(self, p: int) -> None:
        """A partition no longer owned: its next owner keeps its own books."""
        known: list[dict[int, Any]] = [self._next, self._outstanding, self._decided,
                                       self._early, self._window, self._low, self._early_sent]
        for state in known:
            state.pop(p, None)
        self._more.discard(p)

    async def _run(self) -> None:
        while True:
            try:
                await self._loop()
            except Exception:  # a dead ticker would leave every owned partition silent
                log.exception("ticker failed; starting over")
                await asyncio.sleep(RESCAN_S)

    async def _loop(self) -> None:
        clock = self._host.clock
        last_scan = 0.0
        while True:
            # Cleared before the reads, not after the sends: a tick applied here takes a
            # while, and a timer added meanwhile must wake the next pass, not wait RESCAN_S.
            self._wake.clear()
            mono = clock.monotonic()
            owned = self._host.tickable()
            if mono - last_scan >= RESCAN_S:
                self._rescan(owned)
                last_scan = mono
            now = clock.now_ms()
            wait = RESCAN_S
            for p in owned:
                wait_ms = self._wait_ms(p, now, mono)
                if wait_ms is None:
                    continue
                if wait_ms > 0:
                    wait = min(wait, wait_ms / 1000)
                elif mono - self._outstanding.get(p, -RESEND_S) >= RESEND_S:
                    self._outstanding[p] = mono
                    # Read again: ticks applied here before this one took time.
                    await self._send_tick(p, clock.now_ms())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=wait)

    def _wait_ms(self, p: int, now: int, mono: float) -> float | None:
        """How long until partition p wants a tick: 0 or less is now, None is never."""
        waits: list[float] = []
        due = self._next.get(p)
        if due is not None:
            waits.append(due - now)
        window = self._window_ms()
        early = self._early.get(p) if window else None
        if early is not None:
            spacing = (self._early_sent.get(p, -AHEAD_EVERY_S) + AHEAD_EVERY_S - mono) * 1000
            waits.append(max(early - window - now, spacing))
        return min(waits) if waits else None

    def _window_ms(self) -> int:
        if not self._ahead_ms or self._more:
            return 0
        if self._host.backlog() > BEHIND_BACKLOG:
            # Behind on calls, not on decisions: the base window still, not a spike's. The
            # calls it holds go into a queue served by tier and tenant, not behind the
            # calls already there; closed, a small tenant's slots were decided only at
            # their due time, after a long tick of another's (kron bench noisy --steady).
            return self._ahead_ms
        return self._lookahead_ms

    async def _send_tick(self, partition: int, now_ms: int) -> None:
        window = self._window_ms()
        if self._ahead_ms:
            self._window[partition] = now_ms + window
            self._low.pop(partition, None)
            self._early_sent[partition] = self._host.clock.monotonic()
        self.sent += 1
        record = {
            "envelope": make_envelope(event_id=f"tick:{partition}:{now_ms}:{self.sent}",
                                      event_type="engine.ticked", occurred_at_ms=now_ms,
                                      tenant="", producer=self._worker_id),
            "partition": partition,
            "now_ms": now_ms,
            "fire_ahead_ms": window,
        }
        # Applied in this process unless the host declines: it is not the owner now, or
        # KRON_LOCAL_TICKS is off.
        if await self._host.tick_here(record):
            return
        if window:
            value = codec.encode(names.TICK, record)
        else:  # as v1, which workers from before fire-ahead read too (a rolling upgrade)
            del record["fire_ahead_ms"]
            value = codec.default_codec().encode(names.TICK, record, version=1)
        await self._host.send_tick(partition, value)
