"""Fair decisions (issue 39): when more slots are due in a partition than one round of a
tick decides, the owner decides them tier by tier and, within a tier, in weighted turns
across tenants (streams.engine.lanes), so one tenant's flood costs another at most its
share of each round. The core over a MemoryStore, with explicit times; pick() alone."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Generator, Iterator
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.domain.tenants import TenantTable
from streams.domain.timer import (
    LEGACY_LANE,
    SYSTEM_LANE,
    Lane,
    Tier,
    TimerKind,
    decode_timer_key,
    encode_timer_key,
    tenant_lane,
)
from streams.engine.core import Context, Dispatch, Effect, PartitionCore
from streams.engine.lanes import FairState, TenantWeights, pick
from streams.engine.store import MemoryStore
from tests.support.stack import spec

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
SEC = 1000
TARGET = {"url": "http://target.invalid/hook"}
ROUND = 2000


class Owner:
    """One partition's owner over a MemoryStore: jobs of several tenants, ticks by round."""

    def __init__(self, *, weights: TenantWeights | None = None) -> None:
        self.store = MemoryStore()
        self.core = (PartitionCore(self.store) if weights is None
                     else PartitionCore(self.store, weights=weights))
        self.n = 0
        self.now = T0 - 60 * SEC

    def ctx(self, now_ms: int | None = None) -> Context:
        self.n += 1
        return Context(now_ms=self.now if now_ms is None else now_ms,
                       causation_id=f"ev-{self.n}", worker="w1", epoch=1, incarnation="p1")

    def one_offs(self, tenant: str, count: int, run_at_ms: int, *, prefix: str | None = None,
                 **fields: Any) -> list[str]:
        """`count` one-off jobs of `tenant`, created now, due at run_at_ms."""
        ids = [f"{prefix or tenant}-{i:05d}" for i in range(count)]
        s = spec(target=TARGET, run_at_ms=run_at_ms, **fields)
        for job_id in ids:
            self.core.create_new(job_id=job_id, tenant=tenant, command_id=f"c-{job_id}", spec=s,
                                 idempotency_key=None, ctx=self.ctx())
        return ids

    def round(self, now_ms: int, *, limit: int = ROUND,
              ctx: Context | None = None) -> tuple[list[Dispatch], bool]:
        """One on_tick: the attempts it started, in decision order, and `more`."""
        self.now = now_ms
        effects, more = self.core.on_tick(ctx or self.ctx(), limit=limit)
        return dispatches(effects), more


def dispatches(effects: list[Effect]) -> list[Dispatch]:
    return [e for e in effects if isinstance(e, Dispatch)]


def tenants(ds: list[Dispatch]) -> list[str]:
    return [d.tenant for d in ds]


def test_a_flood_does_not_hold_back_another_tenants_slots_due_with_it() -> None:
    o = Owner()
    o.one_offs("A", 10_000, T0)
    o.one_offs("B", 10, T0)
    first, more = o.round(T0)
    assert more and len(first) == ROUND
    # Equal turns: B's ten are decided among the first twenty, A's take the rest.
    assert Counter(tenants(first[:20])) == {"A": 10, "B": 10}
    assert Counter(tenants(first)) == {"A": ROUND - 10, "B": 10}


def test_a_slot_due_after_a_flood_is_decided_in_the_first_round_at_its_time() -> None:
    o = Owner()
    o.one_offs("A", 10_000, T0)
    [late] = o.one_offs("B", 1, T0 + SEC)
    first, more = o.round(T0)
    assert more and set(tenants(first)) == {"A"}
    second, more = o.round(T0 + SEC)  # 8,000 of A's still due
    assert more and late in [d.job_id for d in second[:2]]
    assert Counter(tenants(second)) == {"A": ROUND - 1, "B": 1}


def test_tiers_order_decisions() -> None:
    o = Owner()
    # Created batch first: creation order is not decision order.
    o.one_offs("A", 300, T0, prefix="batch", priority="batch")
    o.one_offs("B", 300, T0, prefix="normal")  # normal by default
    o.one_offs("C", 300, T0, prefix="crit", priority="critical")
    o.one_offs("A", 300, T0, prefix="crit-a", priority="critical")
    decided, more = o.round(T0, limit=1000)
    assert more
    tiers = [d.job_id.split("-")[0] for d in decided]
    assert tiers == ["crit"] * 600 + ["normal"] * 300 + ["batch"] * 100
    # Within the critical tier, C and A share turns.
    assert Counter(tenants(decided[:20])) == {"A": 10, "C": 10}
    rest, more = o.round(T0, limit=1000)
    assert not more and [d.job_id.split("-")[0] for d in rest] == ["batch"] * 200


def test_weights_split_a_round_in_proportion() -> None:
    o = Owner(weights=TenantWeights({"A": 3}))
    o.one_offs("A", 2_000, T0)
    o.one_offs("B", 2_000, T0)
    decided, more = o.round(T0)
    assert more and Counter(tenants(decided)) == {"A": 1_500, "B": 500}
    # Interleaved by weight: three of A's to one of B's all along.
    assert Counter(tenants(decided[:400])) == {"A": 300, "B": 100}


def test_a_tenants_unused_share_goes_to_the_others() -> None:
    o = Owner(weights=TenantWeights({"B": 5}))
    o.one_offs("A", 3_000, T0)
    o.one_offs("B", 100, T0)
    decided, more = o.round(T0)
    assert more and Counter(tenants(decided)) == {"A": 1_900, "B": 100}


def test_the_chunks_of_a_tick_share_as_one_round_would() -> None:
    """The worker applies a tick as chunks over one Context: the turns carry over."""
    o = Owner(weights=TenantWeights({"A": 3}))
    o.one_offs("A", 2_000, T0)
    o.one_offs("B", 2_000, T0)
    o.one_offs("C", 2_000, T0, prefix="C")
    ctx, decided = o.ctx(T0), []
    while len(decided) < 2_000:
        ds, more = o.round(T0, limit=40, ctx=ctx)
        ctx.effects = []
        decided += ds
        assert more
    assert Counter(tenants(decided)) == {"A": 1_200, "B": 400, "C": 400}


def test_due_order_holds_within_a_tenant() -> None:
    o = Owner()
    # A's slots over ten seconds, created out of order; B's all at the first.
    for i, at in enumerate([7, 3, 9, 0, 5, 1, 8, 2, 6, 4]):
        o.one_offs("A", 150, T0 + at * SEC, prefix=f"A{i}")
    o.one_offs("B", 1_000, T0)
    decided: list[Dispatch] = []
    more = True
    while more:
        ds, more = o.round(T0 + 9 * SEC, limit=300)
        decided += ds
    assert len(decided) == 2_500
    for tenant in ("A", "B"):
        slots = [d.scheduled_for_ms for d in decided if d.tenant == tenant]
        assert slots == sorted(slots)
    # And each round still shares between them while both have slots due.
    assert Counter(tenants(decided[:300])) == {"A": 150, "B": 150}


def test_decisions_are_the_same_on_a_replay() -> None:
    runs = []
    for _ in range(2):
        o = Owner(weights=TenantWeights({"A": 2}))
        for t in ("A", "B", "C", "D"):
            o.one_offs(t, 200, T0)
        ctx, ids = o.ctx(T0), []
        for _ in range(10):
            ds, _ = o.round(T0, limit=32, ctx=ctx)
            ctx.effects = []
            ids += [d.job_id for d in ds]
        runs.append(ids)
    assert runs[0] == runs[1] and len(runs[0]) == 320


def test_leases_fire_during_a_flood() -> None:
    o = Owner()
    [job] = o.one_offs("C", 1, T0)
    [d], _ = o.round(T0)
    lease_end = d.lease_until_ms
    o.one_offs("A", 10_000, lease_end)
    logged = len(o.store.log)
    _, more = o.round(lease_end)
    assert more
    # The expired lease was looked at first: the attempt failed and its retry is set.
    kind, first = o.store.log[logged]
    assert kind == "execution" and first["exec_id"] == d.exec_id
    ex = o.store.execution(d.exec_id)
    assert ex is not None and ex["state"] == "retry_pending"
    assert ex["attempts"][0]["outcome"] == "lease_expired"
    retry = [decode_timer_key(k) for k in o.store.timers if decode_timer_key(k).ref == d.exec_id]
    assert [(t.kind, t.lane) for t in retry] == [(TimerKind.RETRY, tenant_lane("C", Tier.NORMAL))]
    # The retry, due in a flood, is decided in the first round at its time, early on.
    again, more = o.round(max(lease_end, retry[0].due_ms))
    assert more and job in [x.job_id for x in again[:2]]


def test_legacy_keys_are_still_found_and_fired() -> None:
    """A store written before lanes: its timers' keys in the old layout. They fire; what
    they arm goes to the lanes."""
    o = Owner()
    [once] = o.one_offs("A", 1, T0)
    o.core.create_new(job_id="cron", tenant="B", command_id="c-cron",
                      spec=spec(target=TARGET, cron="* * * * * *"), idempotency_key=None,
                      ctx=o.ctx(T0 - 500))
    for key, value in list(o.store.timers.items()):
        tk = decode_timer_key(key)
        o.store.delete_timer(key)
        o.store.put_timer(encode_timer_key(due_ms=tk.due_ms, kind=tk.kind, job_id=tk.job_id,
                                           ref=tk.ref, lane=LEGACY_LANE), value)
    assert {decode_timer_key(k).lane for k in o.store.timers} == {LEGACY_LANE}
    decided, more = o.round(T0)
    assert not more and sorted(d.job_id for d in decided) == sorted(["cron", once])
    lanes = {decode_timer_key(k).lane for k in o.store.timers}
    assert lanes == {SYSTEM_LANE, tenant_lane("B", Tier.NORMAL)}  # leases, cron's next slot
    decided, _ = o.round(T0 + SEC)
    assert [d.job_id for d in decided] == ["cron"]


def test_an_update_of_a_job_armed_before_lanes_leaves_no_timer_behind() -> None:
    o = Owner()
    o.core.create_new(job_id="cron", tenant="B", command_id="c-cron",
                      spec=spec(target=TARGET, cron="0 * * * * *"), idempotency_key=None,
                      ctx=o.ctx(T0 - 500))
    [(key, value)] = o.store.timers.items()
    tk = decode_timer_key(key)
    o.store.delete_timer(key)
    o.store.put_timer(encode_timer_key(due_ms=tk.due_ms, kind=tk.kind, job_id=tk.job_id,
                                       ref=tk.ref, lane=LEGACY_LANE), value)
    o.core.on_command("kron.commands.DeleteJob", {
        "envelope": {"event_id": "d", "event_type": "job.delete_requested", "schema_version": 1,
                     "occurred_at_ms": T0 - 400, "tenant": "B", "causation_id": None,
                     "correlation_id": None, "producer": "tests"},
        "command_id": "d", "job_id": "cron"}, o.ctx(T0 - 400))
    assert o.store.timers == {}


# --- pick() alone ------------------------------------------------------------------------------


def _lane(tenant: str, tier: Tier = Tier.NORMAL) -> Lane:
    return tenant_lane(tenant, tier)


def _timers(lane: Lane, n: int, start: int = 0) -> Generator[tuple[bytes, bytes]]:
    for i in range(start, start + n):
        yield encode_timer_key(due_ms=T0 + i, kind=TimerKind.FIRE, job_id=f"{lane.tenant}-{i}",
                               ref="", lane=lane), orjson.dumps({"i": i})


def _owner_of(item: tuple[bytes, bytes]) -> int:
    return decode_timer_key(item[0]).lane.tenant


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 400), min_size=1, max_size=8),
       weights=st.lists(st.integers(1, 5), min_size=8, max_size=8),
       limit=st.integers(1, 600), rotation=st.integers(0, 2**40))
def test_each_lane_gets_its_share_and_the_unused_goes_to_the_others(
        sizes: list[int], weights: list[int], limit: int, rotation: int) -> None:
    lanes = [_lane(f"t{i}") for i in range(len(sizes))]
    weight = {lane.tenant: float(w) for lane, w in zip(lanes, weights, strict=False)}
    out, more = pick([(lane, _timers(lane, n)) for lane, n in zip(lanes, sizes, strict=True)],
                     limit, weight=lambda lane: weight[lane.tenant], rotation=rotation)
    assert len(out) == min(limit, sum(sizes)) and more == (sum(sizes) > limit)
    got = Counter(map(_owner_of, out))
    # Water-filling: a lane that got less than its whole backlog got at least its weighted
    # share of the round (less one for rounding) after the smaller lanes took theirs.
    for lane, n in zip(lanes, sizes, strict=True):
        mine = got[lane.tenant]
        if mine < n:
            bigger = [(m, weight[x.tenant]) for x, m in zip(lanes, sizes, strict=True)
                      if got[x.tenant] < m]
            room = limit - sum(got[x.tenant] for x, m in zip(lanes, sizes, strict=True)
                               if got[x.tenant] == m)
            share = room * weight[lane.tenant] / sum(w for _, w in bigger)
            assert mine >= int(share) - 1, (mine, share)
    # Due order within each lane.
    for lane in lanes:
        dues = [decode_timer_key(k).due_ms for k, _ in out if _owner_of((k, b"")) == lane.tenant]
        assert dues == sorted(dues) and dues == [T0 + i for i in range(len(dues))]


def test_the_system_lane_comes_first_then_legacy_then_the_tiers() -> None:
    lanes = [(_lane("a", Tier.BATCH), _timers(_lane("a", Tier.BATCH), 5)),
             (_lane("b", Tier.CRITICAL), _timers(_lane("b", Tier.CRITICAL), 5)),
             (LEGACY_LANE, _timers(LEGACY_LANE, 5)),
             (SYSTEM_LANE, _timers(SYSTEM_LANE, 5))]
    out, more = pick(lanes, 18)
    order = [decode_timer_key(k).lane for k, _ in out]
    assert order == ([SYSTEM_LANE] * 5 + [LEGACY_LANE] * 5 + [_lane("b", Tier.CRITICAL)] * 5
                     + [_lane("a", Tier.BATCH)] * 3)
    assert more


def test_ties_rotate_with_the_tick_and_a_late_lane_gets_no_credit() -> None:
    firsts = set()
    for now in range(50):
        lanes = [(_lane(f"t{i}"), _timers(_lane(f"t{i}"), 10)) for i in range(8)]
        out, _ = pick(lanes, 1, rotation=T0 + now)
        firsts.add(_owner_of(out[0]))
    assert len(firsts) > 4  # not always the same lane first
    # A lane that joins in a later round starts level with the others, not behind by the
    # turns it never needed.
    state = FairState()
    a, b = _lane("a"), _lane("b")
    out, _ = pick([(a, _timers(a, 100))], 10, state=state)
    out, _ = pick([(a, _timers(a, 100, 10)), (b, _timers(b, 100))], 10, state=state)
    assert Counter(map(_owner_of, out)) == {a.tenant: 5, b.tenant: 5}


def test_tenant_weights_are_looked_up_by_lane() -> None:
    weights = TenantWeights({"gold": 4.0}, default=2.0)
    assert weights(_lane("gold")) == 4.0 and weights(_lane("gold", Tier.BATCH)) == 4.0
    assert weights(_lane("other")) == 2.0
    with pytest.raises(ValueError):
        TenantWeights({"x": 0})
    table = TenantTable.from_toml("[defaults]\nweight = 2\n[tenants.gold]\nweight = 5\n")
    weights = TenantWeights.from_table(table)
    assert weights(_lane("gold")) == 5.0 and weights(_lane("other")) == 2.0


def test_a_jobs_timers_are_in_its_tenants_lane_at_its_tier() -> None:
    o = Owner()
    [job] = o.one_offs("A", 1, T0, priority="batch",
                       retry={"max_attempts": 3, "backoff": "fixed", "base_s": 1.0})
    [(key, _)] = o.store.timers.items()
    assert decode_timer_key(key).lane == tenant_lane("A", Tier.BATCH)
    [d], _ = o.round(T0)
    assert {decode_timer_key(k).lane for k in o.store.timers} == {SYSTEM_LANE}  # its lease
    o.core.on_report("kron.executions.ExecutionFailed", {
        "envelope": {"event_id": "r", "event_type": "execution.report", "schema_version": 1,
                     "occurred_at_ms": T0 + 10, "tenant": "A", "causation_id": None,
                     "correlation_id": None, "producer": "tests"},
        "exec_id": d.exec_id, "job_id": job, "scheduled_for_ms": T0, "owner_epoch": 0,
        "attempt": 1, "fencing_token": d.fencing_token, "started_at_ms": T0,
        "finished_at_ms": T0 + 10, "error_class": "transient", "error": "boom", "final": False,
        "status_code": 503, "retry_after_s": None}, o.ctx(T0 + 10))
    retry = [decode_timer_key(k) for k in o.store.timers
             if decode_timer_key(k).kind == TimerKind.RETRY]
    assert [t.lane for t in retry] == [tenant_lane("A", Tier.BATCH)]


def _consume(it: Iterator[Any]) -> int:
    return sum(1 for _ in it)


def test_pick_reads_no_further_than_it_takes() -> None:
    read = Counter[int]()

    def counted(lane: Lane, n: int) -> Generator[tuple[bytes, bytes]]:
        for item in _timers(lane, n):
            read[lane.tenant] += 1
            yield item
    a, b = _lane("a"), _lane("b")
    out, more = pick([(a, counted(a, 10_000)), (b, counted(b, 10_000))], 100)
    assert more and len(out) == 100
    # Each lane's 50, and one more of one lane: `more` looked.
    assert sorted(read.values()) == [50, 51]
    # Many lanes, a small round: the lanes it does not get to are not read, and the ones
    # that may have due timers but do not drop out.
    read.clear()
    many = [_lane(f"t{i}") for i in range(100)]
    lanes = [(lane, counted(lane, 0 if i % 2 else 5)) for i, lane in enumerate(many)]
    state = FairState()
    out, more = pick(lanes, 10, state=state)
    assert more and len(out) == 10 and len(set(map(_owner_of, out))) == 10
    assert len(read) <= 11
    # The next round (a chunk of the same tick) goes on with the lanes not reached.
    lanes = [(lane, counted(lane, 0 if i % 2 else 5)) for i, lane in enumerate(many)]
    again, _ = pick(lanes, 10, state=state)
    assert not set(map(_owner_of, out)) & set(map(_owner_of, again))


def test_more_is_false_when_no_lane_read_or_not_holds_a_due_timer() -> None:
    lanes = [(_lane(f"t{i}"), _timers(_lane(f"t{i}"), 1 if i == 0 else 0)) for i in range(5)]
    out, more = pick(lanes, 1)
    assert len(out) == 1 and not more
    lanes = [(_lane(f"t{i}"), _timers(_lane(f"t{i}"), 1 if i == 3 else 0)) for i in range(5)]
    out, more = pick(lanes, 0)
    assert out == [] and more


def test_single_lane_round_is_due_order_and_more_is_exact() -> None:
    o = Owner()
    o.one_offs("A", 50, T0)
    decided, more = o.round(T0, limit=50)
    assert not more and len(decided) == 50
    o.one_offs("A", 51, T0 + SEC, prefix="A2")
    decided, more = o.round(T0 + SEC, limit=50)
    assert more and len(decided) == 50
    assert list(itertools.islice((d.job_id for d in decided), 3)) == [
        "A2-00000", "A2-00001", "A2-00002"]


def test_slots_decided_ahead_are_taken_by_tier_and_tenant_too() -> None:
    """Fire-ahead decides a window of slots before their time. It takes them as a round of
    due timers: B's critical slots first, then the normal tier shared by tenant, so A's
    spike decided ahead does not push B's slots behind it (they were in due and key
    order, B's wherever their job ids fell among A's)."""
    o = Owner()
    due = T0 + 2 * SEC
    o.one_offs("A", 3_000, due)
    o.one_offs("B", 10, due, prefix="Bc", priority="critical")
    o.one_offs("B", 10, due, prefix="Bn")
    ctx = o.ctx(T0)
    ctx.fire_ahead_ms = 3 * SEC
    first = dispatches(o.core.on_tick(ctx, limit=32)[0])
    assert len(first) == 32
    assert [d.job_id[:2] for d in first[:10]] == ["Bc"] * 10
    # Then the normal tier in equal turns: B's ten among the next twenty, A's the rest.
    assert Counter(d.tenant for d in first[10:30]) == {"A": 10, "B": 10}
    assert all(d.not_before_ms == due for d in first)  # held until their time
