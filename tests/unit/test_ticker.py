"""The ticker outlives its own errors. Its host is a stand-in (streams.ticker.TickerHost: a
clock, the timer index, the partitions it may tick, the executor's load, and a way to submit
a tick); the real path is covered by the integration and fault suites."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from kron.clock import ManualClock
from schemas import codec
from streams import ticker as ticker_mod
from streams.domain.timer import TimerKind
from streams.ticker import Ticker


class FlakyEngine:
    """Owned partitions fail twice (as a DB closing under a rebalance may), then work."""

    def __init__(self) -> None:
        self.clock = ManualClock(now_ms=10_000, monotonic=50.0)
        self.settings = SimpleNamespace(worker_id="w1", fire_ahead_s=0.0)
        self.executor = SimpleNamespace(backlog=0)
        self.timers = SimpleNamespace(first=lambda p: None, first_after=lambda p, after: None,
                                      has_waiting=lambda p: False,
                                      fire_dues=lambda p, after, until, limit: [])
        self.failures = 2
        self.declined = 0
        self.sent: list[tuple[int, dict[str, Any]]] = []
        self.signals = SimpleNamespace(send=self._send)

    def tickable(self) -> frozenset[int]:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("partition DB closed")
        return frozenset({3})

    def backlog(self) -> int:
        return int(self.executor.backlog)

    def completed(self) -> int:
        return int(getattr(self.executor, "completed", 0))

    async def send_tick(self, partition: int, value: bytes) -> None:
        await self._send(key=b"tick", value=value, partition=partition)

    async def tick_here(self, record: dict[str, Any]) -> bool:
        self.declined += 1  # as a rebalancing engine does: the tick goes as an event
        return False

    async def _send(self, *, key: bytes, value: bytes, partition: int) -> None:
        self.sent.append((partition, codec.decode(value).record))


def test_ticker_survives_an_error_and_ticks_the_due_partition(
        monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FlakyEngine()
    due = (9_000).to_bytes(8, "big") + b"x"  # already due at now_ms=10_000
    engine.timers.first = lambda p: due
    monkeypatch.setattr(ticker_mod, "RESCAN_S", 0.01)

    async def run() -> None:
        t = ticker_for(engine)
        t.start()
        for _ in range(300):
            if engine.sent:
                break
            await asyncio.sleep(0.01)
        assert t._task is not None
        t._task.cancel()

    asyncio.run(run())
    assert engine.failures == 0
    assert engine.declined == 1
    assert [(p, r["now_ms"]) for p, r in engine.sent] == [(3, 10_000)]


def ticker_for(host: Any) -> Ticker:
    return Ticker(host=host, fire_ahead_s=host.settings.fire_ahead_s, worker_id="w1")


def _key(due_ms: int, eligible: bool, kind: TimerKind | None = None) -> bytes:
    kind = kind or (TimerKind.FIRE if eligible else TimerKind.LEASE)
    return due_ms.to_bytes(8, "big") + bytes((kind,)) + (b"E" if eligible else b"L")


class AheadEngine:
    """One partition whose timer index is a sorted list. A tick "fires" what a core with
    a 3 s fire-ahead window would: everything due, and the eligible keys (suffix E) in
    the window; ineligible ones (a lease, another overlap policy) stay until due. `local`:
    ticks are applied by tick_here, which reports back before it returns, as
    Engine.tick_here does; otherwise they are sent and reported back later, as the agent
    does."""

    def __init__(self, *, local: bool = False, fire_ahead_s: float = 3.0) -> None:
        self.clock = ManualClock(now_ms=10_000, monotonic=50.0)
        self.settings = SimpleNamespace(worker_id="w1", fire_ahead_s=fire_ahead_s)
        self.local = local
        self.executor = SimpleNamespace(backlog=0, completed=0)
        self.timers = SimpleNamespace(first=lambda p: None, first_after=lambda p, after: None,
                                      has_waiting=lambda p: False,
                                      fire_dues=lambda p, after, until, limit: [])
        self.keys: list[bytes] = []
        self.sent: list[int] = []
        self.windows: list[int] = []
        self.budget: int | None = None  # timers one tick may fire (TICK_BUDGET)
        self.ticker: Ticker | None = None
        self.deciding_seen: list[bool] = []
        self.signals = SimpleNamespace(send=self._send)

    def tickable(self) -> frozenset[int]:
        return frozenset({0})

    def backlog(self) -> int:
        return int(self.executor.backlog)

    def completed(self) -> int:
        return int(getattr(self.executor, "completed", 0))

    async def send_tick(self, partition: int, value: bytes) -> None:
        await self._send(key=b"tick", value=value, partition=partition)

    def first(self, after_ms: int = -1) -> bytes | None:
        return next((k for k in sorted(self.keys)
                     if int.from_bytes(k[:8], "big") > after_ms), None)

    async def tick_here(self, record: dict[str, Any]) -> bool:
        if not self.local:  # as Engine.tick_here with KRON_LOCAL_TICKS off
            return False
        assert self.ticker is not None
        self.deciding_seen.append(self.ticker.deciding())
        more = self._fire(record["now_ms"], record["fire_ahead_ms"])
        self.ticker.ticked(record["partition"], more=more)
        return True

    async def _send(self, *, key: bytes, value: bytes, partition: int) -> None:
        decoded = codec.decode(value)
        tick = decoded.record
        # A tick that decides nothing ahead is written as v1, which older workers read.
        assert decoded.version == (2 if tick["fire_ahead_ms"] else 1), decoded.version
        more = self._fire(tick["now_ms"], tick["fire_ahead_ms"])
        assert self.ticker is not None
        asyncio.get_running_loop().call_soon(lambda: self.ticker.ticked(partition, more=more))

    def _fire(self, now: int, window: int) -> bool:
        self.sent.append(now)
        self.windows.append(window)
        fired = [k for k in sorted(self.keys) if (
            int.from_bytes(k[:8], "big") <= now
            or (k.endswith(b"E") and int.from_bytes(k[:8], "big") <= now + window))]
        more = self.budget is not None and len(fired) > self.budget
        fired = fired[:self.budget]
        self.keys = [k for k in self.keys if k not in fired]
        return more

    def add(self, key: bytes) -> None:
        self.keys.append(key)
        assert self.ticker is not None
        self.ticker.timer_added(0, key)


@pytest.mark.parametrize("local", [False, True], ids=["as-events", "here"])
def test_fire_ahead_ticks_when_a_timer_enters_the_window_and_never_spins(
        monkeypatch: pytest.MonkeyPatch, local: bool) -> None:
    engine = AheadEngine(local=local)
    engine.timers.first = lambda p: engine.first()
    engine.timers.first_after = lambda p, after: engine.first(after)
    monkeypatch.setattr(ticker_mod, "RESCAN_S", 0.005)

    async def settle() -> None:
        for _ in range(40):  # ~40 turns of the ticker's loop at the same instant
            await asyncio.sleep(0.005)

    async def run() -> None:
        t = engine.ticker = ticker_for(engine)
        engine.keys = [_key(11_000, eligible=False), _key(12_000, eligible=True),
                       _key(16_000, eligible=True)]
        t.start()
        await settle()
        # 12,000 was decided ahead; the lease-like key at 11,000 stays in the window and
        # must not make the ticker tick again and again.
        assert engine.sent == [10_000]
        assert [int.from_bytes(k[:8], "big") for k in engine.keys] == [11_000, 16_000]
        engine.clock.advance(0.5)  # 10,500: nothing new in the window
        await settle()
        assert engine.sent == [10_000]
        engine.clock.advance(0.5)  # 11,000: the ineligible key is due
        await settle()
        assert engine.sent == [10_000, 11_000]
        engine.clock.advance(2.05)  # 13,050: 16,000 enters the window
        await settle()
        assert engine.sent == [10_000, 11_000, 13_050]
        assert engine.keys == []
        # A timer written inside the window already decided (a new one-off) is looked at
        # again, but not before AHEAD_EVERY_S after the last tick.
        engine.add(_key(14_000, eligible=True))
        await settle()
        assert engine.sent == [10_000, 11_000, 13_050]
        engine.clock.advance(ticker_mod.AHEAD_EVERY_S)
        await settle()
        assert engine.sent == [10_000, 11_000, 13_050,
                               13_050 + int(ticker_mod.AHEAD_EVERY_S * 1000)]
        assert engine.keys == []
        assert engine.windows == [3_000] * 4
        # A HELD timer (the slots a tick just decided) inside the window is no reason to
        # look at the window again.
        held = _key(15_000, eligible=False, kind=TimerKind.HELD)
        engine.add(held)
        engine.clock.advance(ticker_mod.AHEAD_EVERY_S)
        await settle()
        assert len(engine.sent) == 4
        engine.keys.remove(held)
        # Behind on calls (a long executor queue), not on decisions: a due tick still
        # decides the base window ahead (the queue serves tiers and tenants in turn, so
        # another tenant's held calls do not wait behind it).
        engine.executor.backlog = ticker_mod.BEHIND_BACKLOG + 1
        engine.add(_key(engine.clock.now_ms() + 2_000, eligible=True))
        engine.add(_key(engine.clock.now_ms() + 500, eligible=False))
        engine.clock.advance(1.0)
        await settle()
        assert engine.windows[4:] == [3_000]
        assert engine.keys == []  # the eligible one was decided ahead, behind or not
        assert t._task is not None
        t._task.cancel()

    asyncio.run(run())


@pytest.mark.parametrize("local", [False, True], ids=["as-events", "here"])
def test_a_spike_decided_ahead_over_several_ticks_is_not_being_behind(
        monkeypatch: pytest.MonkeyPatch, local: bool) -> None:
    """A tick that hit its budget deciding ahead says "more", yet nothing is due: the next
    tick goes out at once and keeps its window (being behind would send 0)."""
    engine = AheadEngine(local=local)
    engine.budget = 5
    engine.timers.first = lambda p: engine.first()
    engine.timers.first_after = lambda p, after: engine.first(after)
    monkeypatch.setattr(ticker_mod, "RESCAN_S", 0.005)

    async def run() -> None:
        t = engine.ticker = ticker_for(engine)
        engine.keys = [_key(12_000 + i, eligible=True) for i in range(23)]
        t.start()
        for _ in range(100):
            if not engine.keys:
                break
            await asyncio.sleep(0.005)
        assert engine.keys == []
        assert engine.windows == [3_000] * 5, engine.windows
        assert t._task is not None
        t._task.cancel()

    asyncio.run(run())


def test_a_tick_applied_here_that_leaves_more_due_is_followed_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A tick applied here reports back before the ticker's pass ends. Its "more" must
    start the next pass at once: a wake-up cleared after the pass slept until the rescan
    (RESCAN_S, long here), one budget of a spike per rescan."""
    engine = AheadEngine(local=True, fire_ahead_s=0.0)
    engine.budget = 5
    engine.timers.first = lambda p: engine.first()
    monkeypatch.setattr(ticker_mod, "RESCAN_S", 30.0)

    async def run() -> None:
        t = engine.ticker = ticker_for(engine)
        engine.keys = [_key(9_000 + i, eligible=False) for i in range(23)]  # all due
        t.start()
        for _ in range(200):  # 2 s at most, far short of one rescan
            if not engine.keys:
                break
            await asyncio.sleep(0.01)
        assert engine.keys == []
        assert engine.sent == [10_000] * 5  # 23 timers, 5 a tick
        # Results that may wait do while the ticker is deciding (Engine._results_may_wait).
        assert engine.deciding_seen == [True] * 5
        assert not t.deciding()
        assert t._task is not None
        t._task.cancel()

    asyncio.run(run())


@pytest.mark.parametrize(("spike", "calls_per_s", "decided_after"),
                         [(400, 0, 0), (300, 0, 1_000), (400, 50, 3_500)])
def test_a_spike_grows_the_window_to_be_decided_by_its_due_time(
        monkeypatch: pytest.MonkeyPatch, spike: int, calls_per_s: int,
        decided_after: int) -> None:
    """A 0.5 s window and `spike` one-offs due 4 s after they are written. Deciding at
    100/s with 50 left to the base window, 400 need 3.5 s + 0.5 s: decided at once; 300
    need 2.5 s + 0.5 s: decided 1 s later, not before. A worker that has been making 50
    calls a second (half the deciding rate) is carrying a stream: the base window."""
    engine = AheadEngine(local=True, fire_ahead_s=0.5)
    engine.timers.first = lambda p: engine.first()
    engine.timers.first_after = lambda p, after: engine.first(after)
    engine.timers.fire_dues = lambda p, after, until, limit: [
        d for d in (int.from_bytes(k[:8], "big") for k in engine.keys) if after < d <= until]
    monkeypatch.setattr(ticker_mod, "RESCAN_S", 0.005)
    monkeypatch.setattr(ticker_mod, "DECIDE_PER_S", 100)

    async def turn(s: float) -> None:
        for _ in range(20):
            await asyncio.sleep(0.005)
        engine.clock.advance(s)
        engine.executor.completed += int(calls_per_s * s)

    async def run() -> None:
        t = engine.ticker = ticker_for(engine)
        t.start()
        for _ in range(12):  # 6 s of calls (or none) before the spike is written
            await turn(0.5)
        written = engine.clock.now_ms()
        due = written + 4_000
        engine.keys = [_key(due, eligible=True)] * spike
        while engine.keys and engine.clock.now_ms() < due:
            await turn(0.5)
        assert engine.keys == []
        assert engine.sent == [written + decided_after]
        assert engine.windows == [4_000 - decided_after]
        assert t._task is not None
        t._task.cancel()

    asyncio.run(run())


def test_a_partition_with_queued_executions_is_ticked_at_each_rescan_and_when_woken() -> None:
    """Queued executions (their tenant at its max_running) are no timer the ticker waits
    for: a partition that holds some is ticked at every rescan, and at once when the
    worker says their tenant has room (wake)."""
    engine = FlakyEngine()
    engine.failures = 0
    engine.timers.has_waiting = lambda p: p == 3
    t = ticker_for(engine)
    t._rescan(frozenset({3, 4}))
    assert t._next == {3: 0, 4: None}
    t._next[3] = None  # ticked: nothing but queued executions left
    t.wake(3)
    assert t._next == {3: 0, 4: None}
    t.wake(9)  # not ours: not made up
    assert 9 not in t._next


def test_others_due_says_whether_another_partition_waits_for_its_tick() -> None:
    """A tick keeps to a small budget while another partition has timers due
    (PartitionDriver.SHARED_TICK_BUDGET), so partitions take turns in small rounds."""
    engine = FlakyEngine()
    t = ticker_for(engine)
    t._next = {1: 900, 2: None, 3: 1_500}
    assert t.others_due(2, now_ms=1_000)  # partition 1 is due
    assert not t.others_due(1, now_ms=1_000)  # only itself; 3 not yet
    assert t.others_due(1, now_ms=1_500)
    t._next = {1: 0, 2: None}  # 0: its last tick left more due
    assert t.others_due(2, now_ms=1) and not t.others_due(1, now_ms=1)
