"""The executor's dispatch queue (streams.fair_dispatch): tiers, weighted fairness per tenant
at any depth, FIFO per tenant, per-tenant dispatch rates split over the owned partitions, and
the bound. Real asyncio where the queue waits; a hand-moved clock where time matters."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

from kron.clock import ManualClock, SystemClock
from streams.domain.policies import Priority
from streams.domain.tenants import TenantTable
from streams.engine.core import Context, Dispatch, PartitionCore
from streams.engine.running_gate import RunningGate
from streams.engine.store import MemoryStore
from streams.executor import Executor
from streams.fair_dispatch import LOWER_TIER_SHARE, FairQueue, TokenBucket
from streams.targets import AttemptInfo, Outcome
from tests.support.stack import spec


@dataclass(frozen=True)
class Quotas:
    weight: float = 1.0
    dispatch_rate_per_s: float = 0.0


@dataclass
class Tenants:
    """Anything with quotas(tenant) -> .weight, .dispatch_rate_per_s."""

    table: dict[str, Quotas] = field(default_factory=dict)

    def quotas(self, tenant: str) -> Quotas:
        return self.table.get(tenant, Quotas())


def drain(q: FairQueue[Any], n: int | None = None) -> list[Any]:
    out: list[Any] = []
    while n is None or len(out) < n:
        item = q.pop()
        if item is None:
            break
        out.append(item)
    return out


# --- tiers -------------------------------------------------------------------------------------


def test_higher_tiers_go_first() -> None:
    q: FairQueue[str] = FairQueue()
    for i in range(3):
        q.put("t", f"b{i}", "batch")
    for i in range(3):
        q.put("t", f"n{i}", "normal")
    q.put("u", "c0", "critical")
    q.put("t", "c1", "critical")
    assert drain(q) == ["c0", "c1", "n0", "n1", "n2", "b0", "b1", "b2"]


def test_an_unknown_priority_is_normal_and_the_default_is_normal() -> None:
    q: FairQueue[str] = FairQueue()
    q.put("t", "b", "batch")
    q.put("t", "x", "urgent")
    q.put("t", "n")
    assert drain(q) == ["x", "n", "b"]


def test_lower_tiers_get_one_pick_in_sixteen_under_a_flood() -> None:
    q: FairQueue[str] = FairQueue()
    for i in range(1000):
        q.put("a", f"c{i}", "critical")
    for i in range(100):
        q.put("b", f"n{i}", "normal")
    for i in range(100):
        q.put("c", f"b{i}", "batch")
    first = drain(q, 16 * 40)
    tiers = Counter(x[0] for x in first)
    # Each lower tier waiting is owed one pick in LOWER_TIER_SHARE, never none.
    assert tiers["n"] == pytest.approx(40, abs=2)
    assert tiers["b"] == pytest.approx(40, abs=2)
    assert tiers["c"] == len(first) - tiers["n"] - tiers["b"]
    # No lower-tier pick before the first LOWER_TIER_SHARE - 1 critical ones.
    assert all(x[0] == "c" for x in first[:LOWER_TIER_SHARE - 1])
    rest = drain(q)
    assert [x for x in first + rest if x[0] == "n"] == [f"n{i}" for i in range(100)]


# --- weights -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("weights", "share"), [((3, 1), 0.75), ((1, 1), 0.5), ((0.5, 1), 1 / 3),
                                                 ((10, 1), 10 / 11)])
def test_weights_split_the_picks_in_proportion(weights: tuple[float, float],
                                               share: float) -> None:
    tenants = Tenants({"a": Quotas(weight=weights[0]), "b": Quotas(weight=weights[1])})
    q: FairQueue[str] = FairQueue(tenants=tenants)
    for _ in range(5000):
        q.put("a", "a")
        q.put("b", "b")
    picks = Counter(drain(q, 4000))
    assert picks["a"] / 4000 == pytest.approx(share, abs=0.05)


def test_weights_hold_at_any_depth_and_within_each_tier() -> None:
    """Deep queues, tenants arriving in a burst each: 3:1 from the first picks on."""
    tenants = Tenants({"a": Quotas(weight=3), "b": Quotas(weight=1)})
    q: FairQueue[str] = FairQueue(tenants=tenants)
    for _ in range(20_000):
        q.put("a", "a", "batch")
    for _ in range(20_000):
        q.put("b", "b", "batch")
    for n in (40, 400, 4000):
        picks = Counter(drain(q, n))
        assert picks["a"] / n == pytest.approx(0.75, abs=0.05)


def test_a_flood_lets_another_tenants_single_attempt_out_at_once() -> None:
    async def main() -> int:
        q: FairQueue[str] = FairQueue()
        for i in range(10_000):
            q.put("a", f"a{i}")
        q.put("b", "b")
        got = [await q.get() for _ in range(3)]
        return got.index("b")

    assert asyncio.run(main()) <= 1


def test_a_heavy_tenants_flood_delays_another_by_its_weight_at_most() -> None:
    tenants = Tenants({"a": Quotas(weight=4)})
    q: FairQueue[str] = FairQueue(tenants=tenants)
    for i in range(10_000):
        q.put("a", f"a{i}")
    drain(q, 1)  # "a" has its turn, with credit for 3 more
    q.put("b", "b")
    assert drain(q, 5).index("b") <= 4


def test_fifo_within_a_tenant_and_tier() -> None:
    rng = random.Random(7)
    tenants = Tenants({"t0": Quotas(weight=2), "t1": Quotas(weight=0.5)})
    q: FairQueue[tuple[str, str, int]] = FairQueue(tenants=tenants)
    sent: dict[tuple[str, str], list[int]] = {}
    got: list[tuple[str, str, int]] = []
    for i in range(5000):
        tenant, tier = f"t{rng.randrange(4)}", rng.choice(["critical", "normal", "batch"])
        q.put(tenant, (tenant, tier, i), tier)
        sent.setdefault((tenant, tier), []).append(i)
        if rng.random() < 0.4:
            got.extend(drain(q, rng.randrange(1, 4)))
    got.extend(drain(q))
    assert len(got) == 5000 and q.size == 0
    for key, seq in sent.items():
        assert [i for t, tier, i in got if (t, tier) == key] == seq


# --- dispatch rate -----------------------------------------------------------------------------


def simulate(q: FairQueue[str], clock: ManualClock, seconds: float,
             step: float = 0.01) -> list[tuple[float, str]]:
    """Take everything that may go, every `step` of simulated time."""
    out: list[tuple[float, str]] = []
    start = clock.monotonic()
    while clock.monotonic() - start < seconds - 1e-9:
        out.extend((clock.monotonic() - start, x) for x in drain(q))
        clock.advance(step)
    return out


def test_a_tenant_is_held_to_its_rate_and_others_pass_it() -> None:
    clock = ManualClock()
    tenants = Tenants({"a": Quotas(dispatch_rate_per_s=10)})
    q: FairQueue[str] = FairQueue(tenants=tenants, clock=clock)
    for _ in range(10_000):
        q.put("a", "a")
    out = simulate(q, clock, 1.0)
    for _ in range(50):
        q.put("b", "b")
    out += [(t + 1.0, x) for t, x in simulate(q, clock, 19.0)]
    by_a = [t for t, x in out if x == "a"]
    # 20 s at 10/s, plus the one second's burst the bucket starts with: within 10%.
    assert len(by_a) == pytest.approx(200, rel=0.10)
    assert len(by_a) <= 10 + 200 + 1
    # Each second after the first holds 10 (the first also the burst of 10).
    per_second = Counter(int(t) for t in by_a)
    assert all(per_second[s] == pytest.approx(10, abs=1) for s in range(2, 20))
    # "b" (no rate) went at once, past a's thousands waiting.
    assert [t for t, x in out if x == "b"] == [1.0] * 50
    assert q.throttled == q.size == 10_000 - len(by_a)
    assert q.ready == 0


def test_a_rate_is_split_over_the_partitions_the_worker_owns() -> None:
    clock = ManualClock()
    tenants = Tenants({"a": Quotas(dispatch_rate_per_s=40)})
    q: FairQueue[str] = FairQueue(tenants=tenants, clock=clock, partitions=8,
                                  owned_partitions=2)
    for _ in range(10_000):
        q.put("a", "a")
    drain(q)  # the starting burst: one second's worth, 40 x 2/8
    assert len(simulate(q, clock, 10.0)) == pytest.approx(100, abs=2)  # 10/s
    q.set_partitions(4)  # a rebalance: twice the partitions, twice the rate here
    assert len(simulate(q, clock, 10.0)) == pytest.approx(200, abs=2)
    q.set_partitions(8)
    assert len(simulate(q, clock, 10.0)) == pytest.approx(400, abs=2)
    q.set_partitions(0)  # none owned: nothing is due here anyway; the arithmetic holds
    assert q.owned_partitions == 0


def test_a_throttled_tenants_tiers_still_go_in_order() -> None:
    clock = ManualClock()
    q: FairQueue[str] = FairQueue(tenants=Tenants({"a": Quotas(dispatch_rate_per_s=1)}),
                                  clock=clock)
    q.put("a", "n1")
    assert drain(q) == ["n1"]
    q.put("a", "n2")
    q.put("a", "b1", "batch")
    q.put("a", "c1", "critical")
    assert drain(q) == []
    assert [x for _, x in simulate(q, clock, 3.5)] == ["c1", "n2", "b1"]


def test_token_bucket() -> None:
    b = TokenBucket(2.0, now=0.0)
    assert [b.take(0.0) for _ in range(3)] == [True, True, False]
    assert b.ready_at(0.0) == pytest.approx(0.5)
    assert b.take(0.5) and not b.take(0.5)
    b.set_rate(0.5, now=0.5)  # a slower rate: one token at most
    assert b.burst == 1.0 and b.ready_at(0.5) == pytest.approx(2.5)
    assert b.take(100.0) and not b.take(100.0)


def test_a_throttled_attempt_waits_for_its_token_and_wakes_a_getter() -> None:
    """Real time: a getter waiting on a throttled tenant is woken when its token is due."""

    async def main() -> list[float]:
        q: FairQueue[str] = FairQueue(tenants=Tenants({"a": Quotas(dispatch_rate_per_s=4)}),
                                      clock=SystemClock())
        start = time.monotonic()
        for i in range(6):
            q.put("a", f"a{i}")
        times = []
        for _ in range(6):
            await q.get()
            times.append(time.monotonic() - start)
        return times

    times = asyncio.run(main())
    assert times[3] < 0.1  # the burst: one second's worth, 4
    assert times[4] == pytest.approx(0.25, abs=0.1)
    assert times[5] == pytest.approx(0.5, abs=0.1)


# --- the bound ---------------------------------------------------------------------------------


def test_the_bound_is_backpressure_not_loss() -> None:
    async def main() -> None:
        clock = ManualClock()
        q: FairQueue[str] = FairQueue(bound=3, clock=clock,
                                      tenants=Tenants({"slow": Quotas(dispatch_rate_per_s=1)}))
        for i in range(5):
            q.put("a", f"a{i}")  # never refused: each is an attempt already started
        assert q.full and q.size == 5
        room = asyncio.ensure_future(q.room())
        await asyncio.sleep(0)
        assert not room.done()
        assert await q.get() == "a0"
        assert await q.get() == "a1"
        await asyncio.sleep(0)
        assert not room.done()  # 3 still wait for a runner
        assert await q.get() == "a2"
        await asyncio.sleep(0)
        assert room.done()
        assert [await q.get(), await q.get()] == ["a3", "a4"]
        # Attempts held back for their tenant's rate don't count: they wait for time.
        q.put("slow", "s0")
        assert await q.get() == "s0"
        for i in range(10):
            q.put("slow", f"s{i + 1}")
        assert q.pop() is None
        assert q.throttled == 10 and q.ready == 0 and not q.full
        await asyncio.wait_for(q.room(), 1)
        for i in range(3):
            q.put("a", f"a{i + 5}")
        assert q.full and q.size == 13

    asyncio.run(main())


# --- through the executor ----------------------------------------------------------------------


class Recorder:
    """A runner that records the order of its calls and answers when told."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.gate = asyncio.Event()

    async def run(self, target: dict[str, Any], info: AttemptInfo) -> Outcome:
        self.calls.append(info.exec_id)
        await self.gate.wait()
        return Outcome(ok=True)


def attempt(exec_id: str, tenant: str = "t", priority: str = "normal",
            lease_s: float = 30.0) -> Dispatch:
    """An attempt as the core dispatches it (its priority a Priority)."""
    return Dispatch(exec_id=exec_id, job_id="j", tenant=tenant, scheduled_for_ms=0, attempt=1,
                    fencing_token=1, target={"topic": "x"}, lease_s=lease_s,
                    priority=Priority(priority))


def test_the_executor_calls_critical_first_and_counts_throttled_apart() -> None:
    reports: list[tuple[str, dict[str, Any]]] = []

    async def report(partition: int, name: str, record: dict[str, Any], /, **_: Any) -> None:
        reports.append((name, record))

    async def main() -> Recorder:
        runner = Recorder()
        ex = Executor(runners={"kafka": runner}, report=report, clock=SystemClock(),
                      worker_id="w", concurrency=1,
                      tenants=Tenants({"slow": Quotas(dispatch_rate_per_s=0.01)}),
                      partitions=4, owned_partitions=4)
        ex.start()
        ex.submit(attempt("first"), 0)
        await asyncio.sleep(0.01)  # the one runner is busy with it
        ex.submit(attempt("batch", priority="batch"), 0)
        ex.submit(attempt("normal"), 0)
        ex.submit(attempt("critical", tenant="u", priority="critical"), 0)
        ex.submit(attempt("slow0", tenant="slow"), 0)
        ex.submit(attempt("slow1", tenant="slow"), 0)
        assert ex.backlog == 5
        runner.gate.set()
        for _ in range(100):
            await asyncio.sleep(0.01)
            if ex.completed == 5:
                break
        assert ex.backlog == 0 and ex.throttled == 1  # slow1: its next token is 100 s away
        await ex.stop()
        return runner

    runner = asyncio.run(main())
    assert runner.calls == ["first", "critical", "normal", "slow0", "batch"]


def test_the_executor_extends_the_lease_of_an_attempt_held_for_its_rate() -> None:
    """Held back for its tenant's rate, an attempt does not fail: its lease is extended by
    a heartbeat before it runs out, as a long call's is."""
    reports: list[tuple[str, dict[str, Any]]] = []

    async def report(partition: int, name: str, record: dict[str, Any], /, **_: Any) -> None:
        reports.append((name, record))

    async def main() -> None:
        clock = ManualClock(now_ms=1_000_000, monotonic=100.0)
        ex = Executor(runners={"kafka": Recorder()}, report=report, clock=clock,
                      worker_id="w", concurrency=1,
                      tenants=Tenants({"slow": Quotas(dispatch_rate_per_s=0.001)}))
        ex.submit(attempt("first", tenant="slow", lease_s=30), 0)
        first = ex._queue.pop()  # spends the bucket's one token
        assert first is not None and first.dispatch.exec_id == "first"
        ex.submit(attempt("held", tenant="slow", lease_s=30), 0)
        assert ex._queue.pop() is None and ex.throttled == 1
        await ex._beat_throttled()
        assert reports == []  # 30 s of lease left: nothing to do yet
        clock.advance(25)
        await ex._beat_throttled()
        assert [name for name, _ in reports] == ["kron.executions.ExecutionHeartbeat"]
        assert reports[0][1]["lease_until_ms"] == clock.now_ms() + 30_000
        assert reports[0][1]["exec_id"] == "held"
        clock.advance(15)
        await ex._beat_throttled()  # extended at 125 s to 155 s: 15 s left, not due yet
        assert len(reports) == 1
        clock.advance(6)
        await ex._beat_throttled()  # 9 s left, under a third of 30
        assert len(reports) == 2
        clock.advance(40)
        await ex._beat_throttled()  # ran out (no beat came in time): the owner retries it
        assert len(reports) == 2

    asyncio.run(main())


# --- the worker's wiring (streams.app) ---------------------------------------------------------


class _Lease:
    def watch(self, coordinator: Any) -> None:
        pass

    def valid(self) -> bool:
        return True


class _Runtime:
    def __init__(self, owned: frozenset[int]) -> None:
        self.owned = owned

    def coordinator(self) -> None:
        return None

    def owned_partitions(self) -> frozenset[int]:
        return self.owned


class _Signal:
    def __init__(self) -> None:
        self.receivers: list[Any] = []

    def connect(self, fn: Any) -> None:
        self.receivers.append(fn)


class _Lifecycle:
    """What _TickerHost and the assignment hook read of the WorkerLifecycle."""

    def __init__(self, owned: frozenset[int]) -> None:
        self.lease, self.runtime, self.clock = _Lease(), _Runtime(owned), None
        self.timers: dict[bytes, bytes] = {}
        self.app = type("App", (), {"on_partitions_assigned": _Signal(),
                                       "on_partitions_revoked": _Signal()})()

    def owned_partitions(self) -> frozenset[int]:
        return self.runtime.owned


def test_no_tick_decides_more_while_the_executor_is_full() -> None:
    from streams.app import _TickerHost

    async def main() -> None:
        ex = Executor(runners={}, report=None, clock=SystemClock(),  # type: ignore[arg-type]
                      worker_id="w", max_queued=2)
        lifecycle = _Lifecycle(frozenset({1, 3}))
        driver = type("Driver", (), {"tick_here": None})()
        host = _TickerHost(lifecycle, driver, ex)  # type: ignore[arg-type]
        assert host.tickable() == {1, 3}
        ex.submit(attempt("a"), 1)
        ex.submit(attempt("b"), 3)
        assert ex.full and host.tickable() == frozenset()
        assert ex._queue.pop() is not None  # a runner took one
        assert host.tickable() == {1, 3}

    asyncio.run(main())


def test_the_executor_learns_its_share_of_partitions_at_each_assignment() -> None:
    from streams.app import _track_owned_partitions

    clock = ManualClock()
    ex = Executor(runners={}, report=None, clock=clock, worker_id="w",  # type: ignore[arg-type]
                  tenants=Tenants({"a": Quotas(dispatch_rate_per_s=80)}), partitions=8)
    lifecycle = _Lifecycle(frozenset({0, 1}))
    gate = RunningGate(TenantTable.from_toml("[tenants.a]\nmax_running = 8\n"), partitions=8)
    _track_owned_partitions(lifecycle, ex, gate)  # type: ignore[arg-type]
    (assigned,) = lifecycle.app.on_partitions_assigned.receivers
    assigned(lifecycle.app, set(), signal=None)
    assert ex._queue.owned_partitions == 2
    assert gate.share("a") == 2  # and the running cap: 8 x 2/8
    for i in range(1000):
        ex.submit(attempt(f"a{i}", tenant="a"), 0)
    queue = ex._queue
    assert len(drain(queue)) == 20  # 80/s x 2/8: a second's worth
    clock.advance(1.0)
    assert len(drain(queue)) == 20
    lifecycle.runtime.owned = frozenset(range(8))
    assigned(lifecycle.app, set(), signal=None)
    clock.advance(1.0)
    assert len(drain(queue)) == 80
    # Each revoke is told too: what came before it is not called once held up.
    ex.submit(attempt("b0", tenant="b"), 0)
    job = queue.pop()
    assert job is not None and not ex._moved(job)
    (revoked,) = lifecycle.app.on_partitions_revoked.receivers
    revoked(lifecycle.app, set(), signal=None)
    assert ex._moved(job)


def test_a_rebalance_takes_out_the_attempts_of_partitions_no_longer_owned() -> None:
    """Before their token: a tenant's attempts for a lost partition would spend its tokens
    here only to be refused at the call (the new owner retries them by lease)."""
    clock = ManualClock()
    ex = Executor(runners={}, report=None, clock=clock, worker_id="w",  # type: ignore[arg-type]
                  tenants=Tenants({"slow": Quotas(dispatch_rate_per_s=2)}), partitions=2)
    queue = ex._queue
    for i in range(6):
        ex.submit(attempt(f"s{i}", tenant="slow"), i % 2)
        ex.submit(attempt(f"f{i}", tenant="fast"), i % 2)
    first = [job.dispatch.exec_id for job in drain(queue, 4)]
    assert first == ["s0", "f0", "s1", "f1"]  # "slow" spent its burst: 2 x 2/2 partitions
    assert queue.throttled == 0 and queue.ready == 8
    assert queue.pop().dispatch.exec_id == "f2"  # type: ignore[union-attr]  # "slow" set aside
    assert queue.throttled == 4 and queue.ready == 3
    ex.set_owned_partitions(frozenset({0}))
    assert ex.fenced == 4  # s3, s5, f3, f5
    assert queue.size == 3 and queue.throttled == 2 and queue.ready == 1
    assert [job.dispatch.exec_id for job in drain(queue)] == ["f4"]
    clock.advance(1.0)  # 2/s x 1/2 partitions: one token a second
    assert [job.dispatch.exec_id for job in drain(queue)] == ["s2"]
    clock.advance(1.0)
    assert [job.dispatch.exec_id for job in drain(queue)] == ["s4"]
    assert queue.size == queue.throttled == 0
    ex.submit(attempt("s6", tenant="slow"), 0)  # the emptied lane takes attempts again
    clock.advance(1.0)
    assert [job.dispatch.exec_id for job in drain(queue)] == ["s6"]


# --- with the real tenants table and the real core ---------------------------------------------


def test_the_tenants_files_weights_and_rates_drive_the_queue() -> None:
    table = TenantTable.from_toml("""
[defaults]
weight = 1

[tenants.acme]
weight = 3

[tenants.slow]
dispatch_rate_per_s = 8
""")
    clock = ManualClock()
    q: FairQueue[str] = FairQueue(tenants=table, clock=clock, partitions=8, owned_partitions=4)
    for _ in range(4000):
        for tenant in ("acme", "other", "slow"):
            q.put(tenant, tenant)
    picks = Counter(drain(q, 404))
    assert picks["slow"] == 4  # 8/s x 4/8 partitions: a second's worth banked
    assert (picks["acme"], picks["other"]) == (300, 100)
    drain(q)
    clock.advance(0.5)
    assert drain(q) == ["slow"] * 2
    clock.advance(10.0)
    assert drain(q) == ["slow"] * 4  # at most a second's worth


def test_the_core_dispatches_with_the_jobs_priority() -> None:
    core = PartitionCore(MemoryStore())
    now = 1_700_000_000_000

    def ctx(n: int) -> Context:
        return Context(now_ms=now, causation_id=f"ev-{n}", worker="w", epoch=1,
                       incarnation="p")

    for n, tier in enumerate(["critical", "batch", None]):
        fields = {} if tier is None else {"priority": tier}
        record = {
            "envelope": {"event_id": f"c{n}", "event_type": "job.create_requested",
                         "schema_version": 1, "occurred_at_ms": now, "tenant": "acme",
                         "causation_id": None, "correlation_id": None, "producer": "tests"},
            "command_id": f"c{n}", "job_id": f"j{n}", "idempotency_key": None,
            "spec": spec(target={"url": "http://target.invalid/"}, run_at_ms=now, **fields),
        }
        core.on_command("kron.commands.CreateJob", record, ctx(n))
    effects, _ = core.on_tick(ctx(9))
    got = {d.job_id: d.priority for d in effects if isinstance(d, Dispatch)}
    assert got == {"j0": Priority.CRITICAL, "j1": Priority.BATCH, "j2": Priority.NORMAL}
