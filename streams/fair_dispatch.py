"""The executor's dispatch queue: which waiting attempt a free runner calls next.

Attempts wait here once due (the executor holds those decided ahead until then), and a free
runner takes the next one. The order, in that precedence:

- **Tiers.** A job's priority: `critical` before `normal` before `batch`. Strict, except
  that a lower tier with attempts waiting gets at least one pick in LOWER_TIER_SHARE (16)
  while a higher one keeps it waiting, so a flood of critical work slows batch work and
  never stops it.
- **Weighted fairness per tenant, within a tier.** A deficit round robin over the tenants
  with attempts waiting: each turn a tenant is credited its weight (the tenants table's
  `weight`, 1 without one) and takes an attempt per whole credit, so weights 3:1 split the
  picks 3:1 at any depth, and a tenant with 10,000 waiting delays another's single attempt
  by at most its own weight's worth of picks. Each tenant's attempts leave in the order
  they came (FIFO per tenant and tier).
- **Dispatch rate.** A tenant with a `dispatch_rate_per_s` has a token bucket in each worker,
  refilled at that rate times the share of the partitions the worker owns (a tenant's jobs
  spread over the partitions, so the workers' buckets add up to its rate), holding one
  second's worth (at least one token). An attempt without a token is not failed: its tenant
  is set aside until the next token is due, and other tenants' attempts pass it.

The bound. The queue cannot refuse an attempt: each one in it is already recorded as
started (dropping it would leave its slot to a lease expiry and a retry). So `bound` is
backpressure on what decides attempts, not a limit on `put`: `full` says `bound` attempts wait
only for a runner, and `room()` waits until that is no longer so. The worker's ticker decides
no due slot while the executor is full (streams/app.py, _TickerHost.tickable), and decides
with a fresh `now` once there is room again. Attempts set aside for their tenant's rate do not
count: they wait for time, not for a runner, and counting them would let one tenant over its
rate hold every other tenant's attempts back.

Cheap when nothing of this is used (no tenants table or one without weights or rates, one
tier): a put and a get cost what the plain round robin it replaced did. 100k put+get in one
process, best of 15: 0.55-0.57 us a pair against the old queue's 0.65-0.69 us (3.8 us both
with 64 getters woken one at a time); a weighted tenant 0.64-0.69 us, one with a rate
0.88-0.95 us. Through the executor (submit, pool, a runner that answers at once) 19.5-19.9
against 19.7-21.7 us an attempt.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar

from kron.clock import Clock, SystemClock
from streams.domain.policies import PRIORITY_RANK, Priority

T = TypeVar("T")

# A tier's rank by its Priority's value (0 is served first); any other value is `normal`.
_RANK = PRIORITY_RANK
_NORMAL = Priority.NORMAL.rank
assert sorted(_RANK.values()) == [0, 1, 2]  # three rounds, by rank
# A lower tier with attempts waiting gets at least one pick in this many.
LOWER_TIER_SHARE = 16
# Attempts waiting only for a runner before `full` (see the module's docstring).
DEFAULT_BOUND = 65_536
# A weight below this counts as this: every tenant is served eventually.
MIN_WEIGHT = 1 / 64

# A lane's state: no attempts; in its tier's round robin; set aside for its tenant's rate.
_IDLE, _RING, _PARKED = 0, 1, 2


class DispatchQuotas(Protocol):
    """A tenant's share of the dispatching (streams.domain.tenants.TenantQuotas)."""

    @property
    def weight(self) -> float: ...

    @property
    def dispatch_rate_per_s(self) -> float:
        """0: unlimited."""


class QuotaTable(Protocol):
    """The tenants table as the queue reads it (streams.domain.tenants.TenantTable)."""

    def quotas(self, tenant: str) -> DispatchQuotas: ...


class TokenBucket:
    """`rate` tokens a second, at most `burst` banked; starts full."""

    __slots__ = ("burst", "last", "rate", "tokens")

    def __init__(self, rate: float, now: float) -> None:
        self.rate = rate
        self.burst = max(1.0, rate)
        self.tokens = self.burst
        self.last = now

    def refill(self, now: float) -> None:
        tokens = self.tokens + (now - self.last) * self.rate
        self.tokens = self.burst if tokens > self.burst else tokens
        self.last = now

    def take(self, now: float) -> bool:
        self.refill(now)
        if self.tokens >= 1.0 - 1e-9:  # a token due "now" counts, whatever the rounding
            self.tokens -= 1.0
            return True
        return False

    def ready_at(self, now: float) -> float:
        """When the next token is there (after a refused `take` at `now`)."""
        return now + (1.0 - self.tokens) / self.rate

    def set_rate(self, rate: float, now: float) -> None:
        """From `now` on; what the old rate earned until then stays banked."""
        self.refill(now)
        self.rate = rate
        self.burst = max(1.0, rate)
        self.tokens = min(self.tokens, self.burst)


class _Lane(Generic[T]):
    """One tenant's attempts of one tier."""

    __slots__ = ("bucket", "deficit", "items", "state", "tenant", "tier", "weight")

    def __init__(self, tenant: str, tier: int, weight: float,
                 bucket: TokenBucket | None) -> None:
        self.tenant = tenant
        self.tier = tier
        self.items: deque[T] = deque()
        self.weight = weight
        self.deficit = 0.0
        self.bucket = bucket
        self.state = _IDLE


class FairQueue(Generic[T]):
    """See the module's docstring. `put` never blocks; `get` waits for an attempt it may
    hand out; items must not be None.

    Each put wakes one idle getter, not all of them: with an Event shared by 1,024 pool
    tasks, every put under a spread-out load woke the whole pool (17% of the worker's CPU
    at 500 executions/s).
    """

    def __init__(self, *, tenants: QuotaTable | None = None, clock: Clock | None = None,
                 bound: int = DEFAULT_BOUND, partitions: int = 1,
                 owned_partitions: int | None = None) -> None:
        self._tenants = tenants
        self._clock = clock or SystemClock()
        self.bound = bound
        self._partitions = max(1, partitions)
        self._owned = self._partitions if owned_partitions is None else owned_partitions
        self._lanes: tuple[dict[str, _Lane[T]], ...] = ({}, {}, {})
        self._rings: tuple[deque[_Lane[T]], ...] = (deque(), deque(), deque())
        # The same rounds by name: the hot path reads them without an index.
        self._critical, self._normal, self._batch = self._rings
        self._skips = [0, 0, 0]
        self._buckets: dict[str, TokenBucket] = {}
        self._parked: list[tuple[float, int, _Lane[T]]] = []
        self._parked_seq = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._getters: deque[asyncio.Future[None]] = deque()
        self._room: deque[asyncio.Future[None]] = deque()
        self.size = 0  # every attempt in the queue
        self.throttled = 0  # of them, those set aside for their tenant's rate

    # --- feeding ----------------------------------------------------------------------------

    def put(self, tenant: str, item: T, tier: str = Priority.NORMAL) -> None:
        rank = _RANK.get(tier, _NORMAL)
        lane = self._lanes[rank].get(tenant)
        if lane is None:
            lane = self._lanes[rank][tenant] = self._new_lane(tenant, rank)
        lane.items.append(item)
        self.size += 1
        if lane.state == _PARKED:
            self.throttled += 1  # it waits for its tenant's token: no getter may take it
            return
        if lane.state == _IDLE:
            lane.state = _RING
            self._rings[rank].append(lane)
        self._wake_one()

    @property
    def ready(self) -> int:
        """Attempts waiting only for a runner."""
        return self.size - self.throttled

    @property
    def full(self) -> bool:
        return self.size - self.throttled >= self.bound

    async def room(self) -> None:
        """Return once the queue is not `full`."""
        while self.size - self.throttled >= self.bound:
            waiter = asyncio.get_running_loop().create_future()
            self._room.append(waiter)
            await waiter

    # --- taking -----------------------------------------------------------------------------

    async def get(self) -> T:
        while True:
            item = self.pop()
            if item is not None:
                if self._room and self.size - self.throttled < self.bound:
                    self._free_room()
                if self._normal or self._critical or self._batch:
                    self._wake_one()  # more than this getter: another may start at once
                return item
            if self._parked:
                self._arm_timer()
            getter = asyncio.get_running_loop().create_future()
            self._getters.append(getter)
            try:
                await getter
            except asyncio.CancelledError:
                # Woken and cancelled at once: pass the wake-up on, or an item waits.
                if getter.done() and not getter.cancelled():
                    self._wake_one()
                raise

    def pop(self) -> T | None:
        """The next attempt to call, or None if none may go now."""
        if self._parked:
            self._unpark(self._clock.monotonic())
        while True:
            if self._normal and not self._critical and not self._batch:
                ring = self._normal
            elif self._normal or self._critical or self._batch:
                ring = self._rings[self._tier()]
            else:
                return None
            lane = ring[0]
            if lane.weight == 1.0 and lane.bucket is None:
                # The plain case, one pick a turn: what _serve does for it, inline.
                item = lane.items.popleft()
                self.size -= 1
                if not lane.items:
                    ring.popleft()
                    lane.state = _IDLE
                elif len(ring) > 1:
                    ring.rotate(-1)
                return item
            served = self._serve(ring)
            if served is not None:
                return served
            # Each lane of that tier was set aside for its rate (its ring is empty now).

    def _tier(self) -> int:
        """The tier to serve: the highest waiting, unless a lower one is owed its share."""
        rings = self._rings
        top = 0 if rings[0] else 1 if rings[1] else 2
        skips, owed = self._skips, -1
        for low in range(top + 1, 3):
            if rings[low]:
                skips[low] += 1  # each waiting lower tier counts every pick it waits
                if skips[low] >= LOWER_TIER_SHARE and owed < 0:
                    owed = low
        if owed < 0:
            return top
        skips[owed] = 0
        return owed

    def _serve(self, ring: deque[_Lane[T]]) -> T | None:
        """Deficit round robin over the ring's lanes: one attempt, or None if each lane's
        tenant is out of tokens."""
        while ring:
            lane = ring[0]
            if lane.deficit < 1.0:
                lane.deficit += lane.weight
                if lane.deficit < 1.0:  # a weight under 1: credit builds over turns
                    ring.rotate(-1)
                    continue
            bucket = lane.bucket
            if bucket is not None:
                now = self._clock.monotonic()
                if not bucket.take(now):
                    ring.popleft()
                    self._park(lane, bucket.ready_at(now))
                    continue
            item = lane.items.popleft()
            self.size -= 1
            lane.deficit -= 1.0
            if not lane.items:
                ring.popleft()
                lane.state = _IDLE
                lane.deficit = 0.0
            elif lane.deficit < 1.0:
                ring.rotate(-1)  # back of the line: the next tenant goes first
            return item
        return None

    # --- rate -------------------------------------------------------------------------------

    def set_partitions(self, owned: int, total: int | None = None) -> None:
        """The worker owns `owned` of `total` partitions now (a rebalance): each tenant's
        rate here is its rate times owned/total."""
        if total is not None:
            self._partitions = max(1, total)
        self._owned = owned
        now = self._clock.monotonic()
        for tenant, bucket in self._buckets.items():
            bucket.set_rate(self._rate_here(self._quotas_rate(tenant)), now)

    def set_tenants(self, tenants: QuotaTable | None) -> None:
        """A new tenants table: weights and rates from now on."""
        self._tenants = tenants
        self._buckets.clear()
        for lanes in self._lanes:
            for tenant, lane in lanes.items():
                lane.weight, lane.bucket = self._quotas(tenant)

    @property
    def owned_partitions(self) -> int:
        return self._owned

    def discard(self, drop: Callable[[T], bool]) -> list[T]:
        """Take out every attempt `drop` says no longer belongs here (a rebalance took its
        partition), and return them. They must not spend their tenant's tokens."""
        dropped: list[T] = []
        for lanes in self._lanes:
            for lane in lanes.values():
                if lane.state == _IDLE:
                    continue
                keep: deque[T] = deque()
                for item in lane.items:
                    (dropped if drop(item) else keep).append(item)
                gone = len(lane.items) - len(keep)
                if not gone:
                    continue
                self.size -= gone
                lane.items = keep
                if lane.state == _PARKED:
                    self.throttled -= gone  # an emptied lane goes idle when its time comes
                elif not keep:
                    self._rings[lane.tier].remove(lane)
                    lane.state = _IDLE
                    lane.deficit = 0.0
        return dropped

    def depths(self) -> dict[str, int]:
        """Attempts in the queue per tenant, every tier (a scrape's, not the hot path's)."""
        out: dict[str, int] = {}
        for lanes in self._lanes:
            for tenant, lane in lanes.items():
                if lane.items:
                    out[tenant] = out.get(tenant, 0) + len(lane.items)
        return out

    def throttled_items(self) -> Iterator[T]:
        """The attempts set aside for their tenant's rate."""
        for _, _, lane in self._parked:
            yield from lane.items

    def _new_lane(self, tenant: str, rank: int) -> _Lane[T]:
        if self._tenants is None:
            return _Lane(tenant, rank, 1.0, None)
        weight, bucket = self._quotas(tenant)
        return _Lane(tenant, rank, weight, bucket)

    def _quotas(self, tenant: str) -> tuple[float, TokenBucket | None]:
        """A tenant's weight and its bucket (shared by its lanes of every tier)."""
        if self._tenants is None:
            return 1.0, None
        quotas = self._tenants.quotas(tenant)
        bucket = self._buckets.get(tenant)
        if bucket is None and quotas.dispatch_rate_per_s > 0:
            bucket = self._buckets[tenant] = TokenBucket(
                self._rate_here(quotas.dispatch_rate_per_s), self._clock.monotonic())
        return max(float(quotas.weight), MIN_WEIGHT), bucket

    def _quotas_rate(self, tenant: str) -> float:
        return 0.0 if self._tenants is None else self._tenants.quotas(tenant).dispatch_rate_per_s

    def _rate_here(self, rate: float) -> float:
        # A worker that owns none dispatches nothing; keep the bucket's arithmetic finite.
        return max(rate * max(self._owned, 1) / self._partitions, 1e-6)

    def _park(self, lane: _Lane[T], until: float) -> None:
        lane.state = _PARKED
        self.throttled += len(lane.items)
        heapq.heappush(self._parked, (until, next(self._parked_seq), lane))

    def _unpark(self, now: float) -> None:
        parked = self._parked
        while parked and parked[0][0] <= now:
            lane = heapq.heappop(parked)[2]
            self.throttled -= len(lane.items)
            if lane.items:
                lane.state = _RING
                self._rings[lane.tier].append(lane)
            else:  # emptied by discard
                lane.state = _IDLE
                lane.deficit = 0.0

    def _arm_timer(self) -> None:
        """Wake a getter when the first tenant set aside has its token."""
        at = self._parked[0][0]
        if self._timer is not None:
            if self._timer_at <= at:
                return
            self._timer.cancel()
        self._timer_at = at
        self._timer = asyncio.get_running_loop().call_later(
            max(0.0, at - self._clock.monotonic()), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._wake_one()  # it takes what is due, and arms the timer again if need be

    # --- waking -----------------------------------------------------------------------------

    def _wake_one(self) -> None:
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():
                getter.set_result(None)
                return

    def _free_room(self) -> None:
        while self._room:
            waiter = self._room.popleft()
            if not waiter.done():
                waiter.set_result(None)
