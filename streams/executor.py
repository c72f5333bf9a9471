"""The worker's asyncio executor pool: a fair queue (streams.fair_dispatch: tiers, tenants'
weights and dispatch rates) in front of N runners.

The stream agent stays at concurrency=1 and never waits on a target; it hands attempts to
this pool. Results go back as events to the execution's own partition, carrying the
attempt's fencing token, so the partition owner decides whether they still count.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import logging
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from kron.clock import Clock
from kron.timefmt import iso
from schemas.envelope import make_envelope
from streams.breaker import CircuitBreaker
from streams.domain.retry import ErrorClass
from streams.engine.core import HELD_REASON, Dispatch
from streams.fair_dispatch import DEFAULT_BOUND, FairQueue, QuotaTable
from streams.targets import AttemptInfo, Outcome, Runner
from streams.tasks import cancel_and_wait

if TYPE_CHECKING:
    from streams.metrics import WorkerCounts

log = logging.getLogger("kron.executor")

CANCELLED_MAX = 65_536
# Attempts held back for their tenant's dispatch rate are looked at this often, and those
# whose lease ends within a third of its length are extended (a heartbeat, as a long call's):
# they wait, they do not fail.
THROTTLED_BEAT_EVERY_S = 1.0
# An attempt held back that long for its tenant's rate is reported held (a heartbeat with
# `held_for`): its run shows `queued`, reason "dispatch rate", until it is called.
HELD_NOTICE_S = 1.0
# Held attempts are released into the queue by buckets of this width (of their due times,
# wall clock), when the bucket's earliest is due (the later ones up to this early: the
# runner waits out the rest), a bucket's higher tiers first, RELEASE_CHUNK per turn of the
# event loop.
HOLD_BUCKET_MS = 20
RELEASE_CHUNK = 512
# Connections for a bucket's HTTP calls are opened this long before it goes: early enough
# to connect on a busy loop, well within the 4 s a pooled connection stays (http1.IDLE_S;
# opened when the calls were decided, up to 8 s ahead for a spike, they were closed idle
# before their calls). At most WARM_ORIGINS origins a bucket, those with the most calls.
WARM_LEAD_S = 1.0
WARM_ORIGINS = 64
# An attempt whose partition is still ours but whose owner's lease lapsed (the broker away,
# a heartbeat late) waits for the lease this often, within the attempt's own lease.
REGAIN_POLL_S = 0.05

@dataclass(kw_only=True, slots=True)
class HoldBucket:
    """Held attempts due within one HOLD_BUCKET_MS: released together, when the earliest
    of them is due (`due`, monotonic), each tier's tenants in turn."""

    due: float
    turns: dict[tuple[int, str], int] = field(default_factory=dict)  # (tier rank, tenant)
    # Its HTTP calls per origin (scheme://host:port as written) and a URL of each: their
    # connections are opened WARM_LEAD_S before it goes (Executor._warm).
    origins: Counter[str] = field(default_factory=Counter)
    urls: dict[str, str] = field(default_factory=dict)
    warm_soon: bool = False  # a warm is scheduled (Executor._warm_soon)

    def hold_call(self, url: str) -> None:
        origin = _origin(url)
        self.origins[origin] += 1
        self.urls.setdefault(origin, url)

    def turn(self, rank: int, tenant: str) -> int:
        """The tenant's next turn in its tier: its first attempt 0, its second 1, ..."""
        n = self.turns.get((rank, tenant), 0)
        self.turns[(rank, tenant)] = n + 1
        return n


class Reporter(Protocol):
    """Sends a record to the partition's own signals. `wait_until_lease_ms`, given with a
    successful result no decision waits on, is the owner's lease end (wall clock): the
    result may wait behind other calls, well short of it."""

    def __call__(self, partition: int, name: str, record: dict[str, Any], /, *,
                 wait_until_lease_ms: int | None = None) -> Awaitable[None]: ...


@dataclass(kw_only=True, slots=True)
class Job:
    dispatch: Dispatch
    partition: int
    lease_deadline: float  # monotonic
    # Its start is known to be acknowledged by Kafka (see Executor._confirm_held).
    durable: bool = False
    queued_at: float = 0.0  # monotonic: when it went into the queue
    # Reported held for its tenant's rate: told again when it is called.
    held_noticed: bool = False
    # Revokes and assignments the executor had seen when it came (Executor._moved), and
    # revokes that handed partitions over with writes unacknowledged (Executor._run).
    rebalances: int = 0
    unsafe: int = 0
    # Its start was acknowledged while this worker could not act for its partition (the
    # lease lapsed, or not ours): perhaps after another member took it over (see _run).
    suspect: bool = False


class Executor:
    def __init__(self, *, runners: dict[str, Runner], report: Reporter, clock: Clock,
                 worker_id: str, concurrency: int = 256,
                 before_dispatch: Callable[[], Awaitable[None]] | None = None,
                 may_dispatch: Callable[[int], bool] | None = None,
                 generation: Callable[[], int] | None = None,
                 tenants: QuotaTable | None = None, partitions: int = 1,
                 owned_partitions: int | None = None,
                 max_queued: int = DEFAULT_BOUND) -> None:
        """`tenants`: weights and dispatch rates (none: weight 1, no rate); a tenant's rate
        is split over the `partitions` by the `owned_partitions` here (all until told,
        see set_owned_partitions). `max_queued`: see `room`."""
        # Awaited before each call: the engine passes its durability barrier here.
        self._before_dispatch = before_dispatch
        # Asked right before each call: does this process still own the partition?
        self._may_dispatch = may_dispatch
        self.runners = runners
        self._report = report
        self._clock = clock
        self._worker = worker_id
        self._queue: FairQueue[Job] = FairQueue(
            tenants=tenants, clock=clock, bound=max_queued, partitions=partitions,
            owned_partitions=owned_partitions)
        self._concurrency = concurrency
        self._tasks: list[asyncio.Task[None]] = []
        # Attempts whose call is under way, by the runner task making it; `_cancelling`:
        # those the engine cancelled (cancel), told apart from a stop's cancel (_attempt).
        self._inflight: dict[str, asyncio.Task[Any]] = {}
        self._cancelling: set[str] = set()
        # Attempts decided ahead of their slot, by release time (monotonic); cancelled ones
        # leave `_held_ids` and are dropped when their turn comes.
        # (due-time bucket, tier rank, tenant's turn, seq, job): see _hold.
        self._held: list[tuple[int, int, int, int, Job]] = []
        self._held_ids: dict[str, Job] = {}
        self._held_seq = itertools.count()
        # The buckets held attempts wait in (see _hold).
        self._buckets: dict[int, HoldBucket] = {}
        self._warm_at: asyncio.TimerHandle | None = None
        self._release_at: asyncio.TimerHandle | None = None
        self._unconfirmed: list[Job] = []
        self._confirm = asyncio.Event()
        # Cancelled while queued (released, waiting for a runner or the barrier): checked
        # right before the call. Bounded: an id for an attempt long gone is harmless.
        self._cancelled: OrderedDict[str, None] = OrderedDict()  # faust_store.TerminalMemo says why
        # Revokes and assignments seen: an attempt from before one may have been retried
        # by another owner (see _moved). `_unsafe`: revokes that handed partitions over
        # with our writes unacknowledged (handed_over_unacknowledged).
        self._rebalances = 0
        self._unsafe = 0
        # The group generation of each assignment: one we took no part in is unsafe too.
        self._generation_now = generation
        self._generation: int | None = None
        self._not_called: list[tuple[Job, str]] = []  # to report (_report_not_called)
        # exec_id -> attempt of those whose call waits for Kafka or the lease (see stuck)
        self._stuck: dict[str, int] = {}
        self._not_called_wake = asyncio.Event()
        self.breaker = CircuitBreaker(clock=clock)
        self.completed = 0
        self.fenced = 0
        self.paused = 0  # attempts held back by an open circuit, each time
        # Counts each call's outcome and lateness (streams/metrics.py); None: not counted.
        self.metrics: WorkerCounts | None = None

    def start(self) -> None:
        self._tasks = [asyncio.ensure_future(self._loop()) for _ in range(self._concurrency)]
        if self._before_dispatch is not None:
            self._tasks.append(asyncio.ensure_future(self._confirm_held()))
        self._tasks.append(asyncio.ensure_future(self._keep_throttled()))
        self._tasks.append(asyncio.ensure_future(self._report_not_called()))

    async def stop(self) -> None:
        # Held attempts are not called: their leases run out and the next owner retries them.
        if self._release_at is not None:
            self._release_at.cancel()
        self._held.clear()
        self._held_ids.clear()
        self._buckets.clear()
        if self._warm_at is not None:
            self._warm_at.cancel()
        await cancel_and_wait(*self._tasks)

    def submit(self, dispatch: Dispatch, partition: int) -> None:
        mono = self._clock.monotonic()
        hold_s = max(0.0, (dispatch.not_before_ms - self._clock.now_ms()) / 1000)
        # A full lease from the due time, or from now. Not from the end of the owner's lease:
        # an event redelivered to a new owner after a takeover is processed seconds after
        # its time, and dropping those calls left a slot to its lease expiry (a fault run
        # lost attempts that way); calling races the owner's retry only as a new attempt.
        job = Job(dispatch=dispatch, partition=partition,
                  lease_deadline=mono + hold_s + dispatch.lease_s, queued_at=mono + hold_s,
                  rebalances=self._rebalances, unsafe=self._unsafe)
        if hold_s <= 0:
            self._queue.put(dispatch.tenant, job, dispatch.priority)
            return
        self._hold(job, mono + hold_s, dispatch.not_before_ms, warm=True)
        if self._before_dispatch is not None:
            self._unconfirmed.append(job)
            self._confirm.set()

    def _hold(self, job: Job, release: float, due_ms: int, *, warm: bool = False) -> None:
        """Queue the attempt at `release` (monotonic: its due time `due_ms` on the wall
        clock), not before; a cancel drops it. `warm`: open its connection beforehand."""
        # Released by HOLD_BUCKET_MS buckets, higher tiers first within one and a tier's
        # tenants in turn: a spike of a tenant's calls held for the same second must not be
        # queued before another's calls due with it (the runner still waits for the exact
        # time: _run). In turn, as the queue's weights then apply to what is in it: in
        # submit order, a small tenant's normal calls came in the spike's last chunks.
        # Buckets of the due time, not of `release`: that carries the wall clock's
        # millisecond floor, so calls due at the same ms fell on both sides of a bucket's
        # edge, each second alike when the second's edge was near one (kron bench noisy:
        # a tenant's critical calls went after another's 2,700 normal ones, 60-100 ms
        # late). A bucket goes when its earliest is due, not at its start: released early,
        # a second's calls all slept to their time in the runners and woke in the timer
        # heap's order, not their tiers'.
        key, rank = due_ms // HOLD_BUCKET_MS, job.dispatch.priority.rank
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = HoldBucket(due=release)
        turn = bucket.turn(rank, job.dispatch.tenant)
        url = job.dispatch.target.get("url")
        if warm and isinstance(url, str):
            bucket.hold_call(url)
            self._warm_soon(key, bucket, release)
        heapq.heappush(self._held, (key, rank, turn, next(self._held_seq), job))
        self._held_ids[job.dispatch.exec_id] = job
        if release < bucket.due or self._held[0][4] is job:
            bucket.due = min(bucket.due, release)
            if self._held[0][0] == key:
                self._schedule_release()

    async def _confirm_held(self) -> None:
        """Pass the durability barrier for held attempts while they wait, one barrier for
        all held since the last: at the due time only the call is left."""
        assert self._before_dispatch is not None
        while True:
            await self._confirm.wait()
            self._confirm.clear()
            batch, self._unconfirmed = self._unconfirmed, []
            try:
                await self._before_dispatch()
            except Exception:  # each waits at its release instead
                continue
            # Acknowledged only after partitions were handed over without waiting for it,
            # a start may be missing from what the next owner restored: _run judges it.
            owned: dict[int, bool] = {}
            for job in batch:
                if job.unsafe != self._unsafe:
                    continue
                job.durable = True
                if job.partition not in owned:
                    owned[job.partition] = (self._may_dispatch is None
                                            or self._may_dispatch(job.partition))
                job.suspect = not owned[job.partition]

    def _schedule_release(self) -> None:
        if self._release_at is not None:
            self._release_at.cancel()
        key = self._held[0][0]
        delay = max(0.0, self._released_at(key) - self._clock.monotonic())
        loop = asyncio.get_running_loop()
        self._release_at = loop.call_later(delay, self._release)
        if self._warm_at is not None:
            self._warm_at.cancel()
        self._warm_at = None
        bucket = self._buckets[key]
        if bucket.origins and delay > WARM_LEAD_S:
            self._warm_at = loop.call_later(delay - WARM_LEAD_S, self._warm_timer, key)
        elif bucket.origins:  # held when it was not the head: warm it now
            self._warm_soon(key, bucket, bucket.due)

    def _released_at(self, bucket: int) -> float:
        return self._buckets[bucket].due

    def _release(self) -> None:
        """Queue the held attempts whose time has come, RELEASE_CHUNK at a time: the
        runners take the first (the highest tier's) while the rest are still released,
        instead of waiting for a spike's 50,000 puts (~250 ms) to end."""
        self._release_at = None
        now = self._clock.monotonic()
        for _ in range(RELEASE_CHUNK):
            if not self._held or self._released_at(self._held[0][0]) > now:
                break
            bucket, _rank, _turn, _seq, job = heapq.heappop(self._held)
            if not self._held or self._held[0][0] != bucket:
                del self._buckets[bucket]
            exec_id = job.dispatch.exec_id
            if self._held_ids.get(exec_id) is job:
                del self._held_ids[exec_id]
                self._queue.put(job.dispatch.tenant, job, job.dispatch.priority)
        else:
            if self._held and self._released_at(self._held[0][0]) <= now:
                loop = asyncio.get_running_loop()
                self._release_at = loop.call_later(0, self._release)
                return
        if self._held:
            self._schedule_release()

    def _warm_soon(self, key: int, bucket: HoldBucket, release: float) -> None:
        """A call held into the bucket: if it goes within WARM_LEAD_S, warm it again soon
        (once for all held meanwhile); later ones wait for the head bucket's timer."""
        if not bucket.warm_soon and release - self._clock.monotonic() <= WARM_LEAD_S:
            bucket.warm_soon = True
            asyncio.get_running_loop().call_soon(self._warm, key)

    def _warm_timer(self, key: int) -> None:
        self._warm_at = None
        self._warm(key)

    def _warm(self, key: int) -> None:
        """Have the HTTP runner open connections for the bucket's calls, WARM_ORIGINS of
        its origins with the most calls, each as many as it has calls (the client opens
        only what is missing)."""
        bucket = self._buckets.get(key)
        warm = getattr(self.runners.get("http"), "warm", None)
        if bucket is None or warm is None:
            return
        bucket.warm_soon = False
        warm({bucket.urls[origin]: n
              for origin, n in bucket.origins.most_common(WARM_ORIGINS)})

    def cancel(self, exec_id: str) -> None:
        if self._held_ids.pop(exec_id, None) is not None:
            return  # not called yet, and now never
        task = self._inflight.get(exec_id)
        if task is not None:
            if exec_id not in self._cancelling:
                self._cancelling.add(exec_id)
                task.cancel()
            return
        self._cancelled[exec_id] = None  # maybe queued: never called either
        if len(self._cancelled) > CANCELLED_MAX:
            self._cancelled.popitem(last=False)

    @property
    def backlog(self) -> int:
        """Attempts waiting for a runner (not those held back for their tenant's rate)."""
        return self._queue.ready

    @property
    def throttled(self) -> int:
        """Attempts due but held back for their tenant's dispatch rate."""
        return self._queue.throttled

    @property
    def full(self) -> bool:
        return self._queue.full

    async def room(self) -> None:
        """Return once fewer than `max_queued` attempts wait for a runner. `submit` cannot
        refuse (the attempt is recorded as started), so the bound is backpressure on what
        decides attempts: it waits for room first, then decides with a fresh `now`. The
        worker's ticker does (it reads `full`, streams/app.py), which covers due slots,
        retries and lease expiries, and the partition agent before each command or report
        record it reads (streams/partition_driver.py). What one record decides still comes
        in whole: at most a tick's chunk, a CreateJobs chunk, or the tasks one result
        releases over the bound."""
        await self._queue.room()

    def set_owned_partitions(self, owned: Collection[int]) -> None:
        """A rebalance: this worker owns these partitions now. Tenants' rates here follow
        their number; attempts of the others leave the queue without spending their
        tenants' tokens, and are reported not called (_run's ownership check would have
        found the same)."""
        self._rebalances += 1
        if self._generation_now is not None:
            generation = self._generation_now()
            if self._generation is not None and generation != self._generation + 1:
                # A generation without us (the coordinator dropped us while we were cut
                # off): another member held our partitions, and restored them without the
                # writes we had not had acknowledged.
                log.warning("group generation %s after %s: our partitions may have had "
                            "another owner; starts not yet acknowledged are not called",
                            generation, self._generation)
                self.handed_over_unacknowledged()
            self._generation = generation
        self._queue.set_partitions(len(owned))
        for job in self._queue.discard(lambda job: job.partition not in owned):
            self._skip(job, f"partition {job.partition} went to another owner")

    def rebalance_started(self) -> None:
        """Our partitions are being revoked (every rebalance starts so, and a member the
        coordinator dropped while it was cut off learns of it so at its rejoin): attempts
        that came before are not called once they were held up (see _moved)."""
        self._rebalances += 1

    def handed_over_unacknowledged(self) -> None:
        """A revoke handed partitions over with our writes not yet acknowledged: the
        attempts those writes started are not called here (see _run)."""
        self._unsafe += 1

    def set_tenants(self, tenants: QuotaTable | None) -> None:
        """A new tenants table: weights and rates from now on."""
        self._queue.set_tenants(tenants)

    @property
    def in_flight(self) -> int:
        """Attempts whose call is under way."""
        return len(self._inflight)

    def queue_depths(self) -> dict[str, int]:
        """Attempts due and waiting for a runner or their tenant's rate, per tenant."""
        return self._queue.depths()

    def releases_within(self, seconds: float) -> bool:
        """Attempts held for their due time are released within `seconds`."""
        return bool(self._held) and (self._released_at(self._held[0][0])
                                     <= self._clock.monotonic() + seconds)

    @property
    def held(self) -> int:
        """Attempts waiting here for a time: decided ahead (their due time) or paused by
        an open circuit (its end)."""
        return len(self._held_ids)

    async def _keep_throttled(self) -> None:
        while True:
            await asyncio.sleep(THROTTLED_BEAT_EVERY_S)
            if self._queue.throttled:
                try:
                    await self._beat_throttled()
                except Exception:  # the next round tries again; the owner's lease decides
                    log.exception("extending held-back attempts' leases failed")

    async def _beat_throttled(self) -> None:
        """Extend the leases of attempts held back for their tenant's rate that would run out
        soon; those whose lease ran out already are left to the owner (it retries them)."""
        now = self._clock.monotonic()
        due = [job for job in self._queue.throttled_items()
               if now < job.lease_deadline
               and (job.lease_deadline < now + job.dispatch.lease_s / 3
                    or (not job.held_noticed and now - job.queued_at >= HELD_NOTICE_S))
               and job.dispatch.exec_id not in self._cancelled
               and (self._may_dispatch is None or self._may_dispatch(job.partition))]
        if not due:
            return
        if self._before_dispatch is not None and not all(job.durable for job in due):
            await self._before_dispatch()  # no heartbeat for a start Kafka may not have
        for job in due:
            job.durable = job.unsafe == self._unsafe
            job.held_noticed = True
            job.lease_deadline = self._clock.monotonic() + job.dispatch.lease_s
            await self._beat(job, job.dispatch.lease_s, held_for=HELD_REASON)

    async def _loop(self) -> None:
        while True:
            job = await self._queue.get()
            try:
                await self._run(job)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in one attempt must not shrink the pool
                log.exception("attempt crashed", extra={"exec_id": job.dispatch.exec_id})

    async def _run(self, job: Job) -> None:
        d = job.dispatch
        if self._clock.monotonic() >= job.lease_deadline:
            # The lease ran out while queued; the owner's lease timer retries it.
            return
        if self._before_dispatch is not None and not job.durable:
            self._stuck[d.exec_id] = d.attempt
            try:
                await self._before_dispatch()
            except Exception:  # not durable: don't call; the lease timer retries it
                log.warning("attempt not dispatched: its start was not acknowledged",
                            extra={"exec_id": job.dispatch.exec_id})
                return
            finally:
                self._stuck.pop(d.exec_id, None)
            if job.unsafe != self._unsafe:
                # Its partition was handed over before this start was acknowledged (a
                # revoke waits a bounded time; a member dropped by the coordinator is not
                # waited for): the next owner may have restored its tables without it and
                # decided the same attempt again.
                self._skip(job, "its start was acknowledged only after its partition was "
                                "handed over")
                return
            job.durable = True
            owned = self._may_dispatch is None or self._may_dispatch(job.partition)
            job.suspect = not owned
        else:
            owned = self._may_dispatch is None or self._may_dispatch(job.partition)
        if not owned and not await self._regain(job):
            self._skip(job, f"partition {job.partition} is no longer ours")
            return
        if job.suspect and job.rebalances != self._rebalances:
            # Acknowledged while we could not tell whether the coordinator had dropped us,
            # and the group rebalanced since: as above, the next owner may lack it.
            self._skip(job, "its start was acknowledged while this worker's lease had "
                            "lapsed, and the group rebalanced since")
            return
        early_ms = d.not_before_ms - self._clock.now_ms()
        if early_ms > 0:  # the release timer and the wall clock disagree by a hair
            await asyncio.sleep(early_ms / 1000)
        if d.exec_id in self._cancelled:
            del self._cancelled[d.exec_id]
            return  # the owner recorded it cancelled; its token is fenced already
        if job.held_noticed:  # its run shows it held for the rate: no more
            job.lease_deadline = self._clock.monotonic() + d.lease_s
            await self._beat(job, d.lease_s)
        started = self._clock.now_ms()
        target = d.target
        host = (urlsplit(target["url"]).hostname or "") if "url" in target else ""
        if host and not self.breaker.allow(host):
            await self._pause(job, self.breaker.closes_in_s(host))
            return
        outcome = await self._attempt(job, started)
        if self.metrics is not None:
            self.metrics.attempt(d, "succeeded" if outcome.ok else str(outcome.error_class),
                                 started)
        if host:
            opened = self.breaker.record(host, ok=outcome.ok or
                                         outcome.error_class == ErrorClass.PERMANENT)
            if opened is not None:
                await self._report(job.partition, "kron.engine.CircuitOpened", opened)
        may_wait = outcome.ok and d.result_may_wait and d.lease_until_ms > 0
        await self._report(job.partition, *self._result(d, outcome, started),
                           wait_until_lease_ms=d.lease_until_ms if may_wait else None)
        self.completed += 1

    def _moved(self, job: Job) -> bool:
        """Has a rebalance begun since the attempt came? Then another member may have
        owned its partition meanwhile and retried it: it must not be called, even with the
        partition ours again. Any rebalance, not only one that took the partition: a member
        the coordinator dropped is told only by its rejoin's revoke."""
        return job.rebalances != self._rebalances

    async def _regain(self, job: Job) -> bool:
        """The owner's lease lapsed, the partition still ours (a broker restart: the
        heartbeats wait for it): wait for the lease rather than give the attempt up, while
        its own lease lasts. Given up, the slot waited for its lease timer (60 s)."""
        assert self._may_dispatch is not None
        d = job.dispatch
        self._stuck[d.exec_id] = d.attempt
        try:
            while not self._moved(job) and self._clock.monotonic() < job.lease_deadline:
                await asyncio.sleep(REGAIN_POLL_S)
                if self._may_dispatch(job.partition):
                    return not self._moved(job)
            return False
        finally:
            self._stuck.pop(d.exec_id, None)

    def stuck(self, exec_id: str, attempt: int) -> bool:
        """Does this attempt's call wait here for Kafka to acknowledge its start, or for
        the owner's lease? Asked when its HELD timer falls due (Context.stuck)."""
        return self._stuck.get(exec_id) == attempt

    def _skip(self, job: Job, why: str) -> None:
        """Not called, and never will be here: reported so, an attempt that ended without a
        call, so that the partition's owner (perhaps this worker again) retries it now,
        not when its lease runs out. The attempt's fencing token fences the word: an owner
        that has moved on (a HELD hand-over, a lease expiry) drops it."""
        self.fenced += 1
        log.warning("attempt not called: %s", why, extra={"exec_id": job.dispatch.exec_id})
        self._not_called.append((job, why))
        self._not_called_wake.set()

    async def _report_not_called(self) -> None:
        while True:
            await self._not_called_wake.wait()
            self._not_called_wake.clear()
            batch, self._not_called = self._not_called, []
            for job, why in batch:
                outcome = Outcome(ok=False, error_class=ErrorClass.LEASE_EXPIRED,
                                  error=f"not called: {why}")
                # started 0: no call started (the attempt keeps its decided start time)
                await self._report(job.partition, *self._result(job.dispatch, outcome, 0))

    async def _pause(self, job: Job, wait_s: float) -> None:
        """The host's circuit is open: hold the attempt until it half-opens, then call it.
        Not a failure: no call was made, so it spends none of the job's attempts (failing
        it fast burnt a job's three attempts within the 30 s and left it `failed` while the
        host was back). A pause the lease would not outlast extends it first, so the owner
        does not retry what this process still holds."""
        self.paused += 1
        release = self._clock.monotonic() + wait_s
        d = job.dispatch
        if release + d.lease_s / 3 > job.lease_deadline:
            job.lease_deadline = release + d.lease_s
            await self._beat(job, wait_s + d.lease_s)
        self._hold(job, release, self._clock.now_ms() + int(wait_s * 1000))

    async def _attempt(self, job: Job, started_ms: int) -> Outcome:
        d = job.dispatch
        kind = ("http" if "url" in d.target else "kafka" if "topic" in d.target
                else "command")
        info = AttemptInfo(exec_id=d.exec_id, job_id=d.job_id, tenant=d.tenant,
                           scheduled_for_iso=_iso(d.scheduled_for_ms), attempt=d.attempt,
                           fencing_token=d.fencing_token, now_ms=started_ms,
                           run_id=d.run_id, task_id=d.task_id)
        # The call runs in this runner's task, not a task of its own: that cost a task and
        # a turn of the loop before each request went out, so at the top of a second the
        # first calls (the highest tier's) waited for every runner's step before theirs.
        # The engine's cancel cancels this task (cancel, marked in _cancelling).
        me = asyncio.current_task()
        assert me is not None
        self._inflight[d.exec_id] = me
        # Most attempts end long before their first heartbeat is due: a timer handle costs
        # far less than a heartbeat task per attempt.
        beats: list[asyncio.Task[None]] = []
        later = asyncio.get_running_loop().call_later(
            d.lease_s / 3, lambda: beats.append(asyncio.ensure_future(self._heartbeat(job))))
        try:
            return await self.runners[kind].run(d.target, info)
        except asyncio.CancelledError:
            # Only the engine's cancel is an outcome. When the pool itself is cancelled
            # (stop), the task stays "cancelling": swallowing that left the pool task
            # waiting on the queue and a SIGTERM'd worker hung in its stop, still holding
            # its partitions in the group.
            if d.exec_id in self._cancelling:
                self._cancelling.discard(d.exec_id)
                if me.uncancel() == 0:
                    return Outcome(ok=False, error_class=ErrorClass.CANCELLED,
                                   error="cancelled")
            raise
        finally:
            later.cancel()
            for beat in beats:
                beat.cancel()
            self._inflight.pop(d.exec_id, None)
            if d.exec_id in self._cancelling:  # cancelled as the call ended: not raised
                self._cancelling.discard(d.exec_id)
                me.uncancel()

    async def _heartbeat(self, job: Job) -> None:
        """Long attempts extend their lease at a third of its length."""
        d = job.dispatch
        while True:
            job.lease_deadline = self._clock.monotonic() + d.lease_s
            await self._beat(job, d.lease_s)
            await asyncio.sleep(d.lease_s / 3)

    async def _beat(self, job: Job, lease_s: float, *, held_for: str | None = None) -> None:
        """Tell the owner the attempt is still ours, its lease running `lease_s` from now,
        and whether its call still waits here (`held_for`: why)."""
        d, now = job.dispatch, self._clock.now_ms()
        await self._report(job.partition, "kron.executions.ExecutionHeartbeat", {
            **self._base(d, "execution.held" if held_for else "execution.heartbeat", now),
            "attempt": d.attempt, "fencing_token": d.fencing_token,
            "lease_until_ms": now + int(lease_s * 1000), "held_for": held_for,
        })

    def _base(self, d: Dispatch, event_type: str, now_ms: int) -> dict[str, Any]:
        return {
            "envelope": make_envelope(
                event_id=f"{d.exec_id}:{d.attempt}:{event_type}:{now_ms}",
                event_type=event_type, occurred_at_ms=now_ms, tenant=d.tenant,
                causation_id=d.exec_id, correlation_id=d.job_id, producer=self._worker),
            "exec_id": d.exec_id, "job_id": d.job_id, "scheduled_for_ms": d.scheduled_for_ms,
            "owner_epoch": 0,
        }

    def _result(self, d: Dispatch, out: Outcome, started: int) -> tuple[str, dict[str, Any]]:
        now = self._clock.now_ms()
        common = {"attempt": d.attempt, "fencing_token": d.fencing_token,
                  "started_at_ms": started, "finished_at_ms": now,
                  "status_code": out.status_code, "output": out.output}
        if out.ok:
            return "kron.executions.ExecutionSucceeded", {
                **self._base(d, "execution.succeeded", now), **common}
        assert out.error_class is not None
        return "kron.executions.ExecutionFailed", {
            **self._base(d, "execution.failed", now), **common,
            "error_class": str(out.error_class), "error": out.error[:2000],
            "final": False, "retry_after_s": out.retry_after_s}


def _origin(url: str) -> str:
    """scheme://authority of an absolute URL, as written (cheaper than parsing it)."""
    end = url.find("/", url.find("//") + 2)
    return url if end < 0 else url[:end]


@functools.lru_cache(maxsize=1024)
def _iso(ms: int) -> str:
    """X-Kron-Scheduled-For and KRON_SCHEDULED_FOR: the instant as kron.timefmt renders it,
    with the `+00:00` offset targets have always received (a target's parser may not take
    `Z`). A spike's attempts share their slot; remembering it took an attempt's cost to the
    executor from 20.3 to 18.2 us (no runner, 100k attempts)."""
    return f"{iso(ms)[:-1]}+00:00"
