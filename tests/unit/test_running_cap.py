"""A tenant's max_running (issue 39): a slot over the cap is recorded `queued` with the
reason, and starts, in due order, as the tenant's running executions end. The core over a
MemoryStore with the real RunningGate, explicit times; and the gate's split alone."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.domain.tenants import TenantTable
from streams.domain.timer import TimerKind, decode_timer_key, is_waiting
from streams.engine.core import Context, Dispatch, Effect, PartitionCore
from streams.engine.running_gate import CONCURRENCY_REASON, PartitionGate, RunningGate
from streams.engine.store import MemoryStore
from tests.support.stack import spec

T0 = 1_767_225_600_000
SEC = 1000
TARGET = {"url": "http://target.invalid/hook"}
TABLE = TenantTable.from_toml("[tenants.A]\nmax_running = 3\n")


class Owner:
    def __init__(self, table: TenantTable = TABLE, *, fire_ahead_ms: int = 0) -> None:
        self.store = MemoryStore()
        self.gate = RunningGate(table, partitions=1)
        self.core = PartitionCore(self.store, gate=PartitionGate(self.gate, 0))
        self.n = 0
        self.now = T0 - 60 * SEC
        self.fire_ahead_ms = fire_ahead_ms
        self.started: Counter[str] = Counter()

    def ctx(self) -> Context:
        self.n += 1
        return Context(now_ms=self.now, causation_id=f"ev-{self.n}", worker="w1", epoch=1,
                       incarnation="p1", fire_ahead_ms=self.fire_ahead_ms)

    def one_offs(self, tenant: str, count: int, first_ms: int, step_ms: int = 0,
                 **fields: Any) -> list[str]:
        ids = [f"{tenant}-{i:04d}" for i in range(count)]
        for i, job_id in enumerate(ids):
            s = spec(target=TARGET, run_at_ms=first_ms + i * step_ms, **fields)
            self.core.create_new(job_id=job_id, tenant=tenant, command_id=f"c-{job_id}",
                                 spec=s, idempotency_key=None, ctx=self.ctx())
        return ids

    def tick(self, now_ms: int) -> list[Dispatch]:
        self.now = now_ms
        out: list[Dispatch] = []
        more = True
        while more:
            effects, more = self.core.on_tick(self.ctx())
            out += self._count(effects)
        return out

    def _count(self, effects: list[Effect]) -> list[Dispatch]:
        ds = [e for e in effects if isinstance(e, Dispatch)]
        self.started.update(d.exec_id for d in ds)
        return ds

    def succeed(self, d: Dispatch) -> list[Dispatch]:
        rec = {
            "envelope": {"event_id": f"rep-{d.exec_id}", "event_type": "execution.report",
                         "schema_version": 1, "occurred_at_ms": self.now, "tenant": d.tenant,
                         "causation_id": d.exec_id, "correlation_id": d.job_id,
                         "producer": "executor"},
            "exec_id": d.exec_id, "job_id": d.job_id, "scheduled_for_ms": d.scheduled_for_ms,
            "owner_epoch": 0, "attempt": d.attempt, "fencing_token": d.fencing_token,
            "started_at_ms": self.now, "finished_at_ms": self.now, "status_code": 200,
            "response_excerpt": None}
        return self._count(self.core.on_report("kron.executions.ExecutionSucceeded", rec,
                                               self.ctx()))

    def states(self, tenant: str) -> Counter[str]:
        return Counter(str(e["state"]) for e in self.store.executions.values()
                       if e["envelope"]["tenant"] == tenant)

    def waiting_timers(self) -> int:
        return sum(1 for k in self.store.timers
                   if decode_timer_key(k).kind == TimerKind.WAIT)


def test_slots_over_the_cap_are_queued_with_the_reason_others_tenants_are_not_held() -> None:
    o = Owner()
    o.one_offs("A", 10, T0)
    o.one_offs("B", 5, T0)
    started = o.tick(T0)
    assert Counter(d.tenant for d in started) == {"A": 3, "B": 5}
    assert o.states("A") == {"running": 3, "queued": 7}
    queued = [e for e in o.store.executions.values() if e["state"] == "queued"]
    assert {e["reason"] for e in queued} == {CONCURRENCY_REASON}
    assert o.waiting_timers() == 7
    # At the cap, later ticks start nothing more of A, and read none of its queue.
    assert o.tick(T0 + SEC) == []


def test_queued_executions_start_in_due_order_as_running_ones_end() -> None:
    o = Owner()
    ids = o.one_offs("A", 8, T0, step_ms=10)
    first = o.tick(T0 + SEC)
    assert [d.job_id for d in first] == ids[:3]
    o.succeed(first[0])
    nxt = o.tick(T0 + 2 * SEC)
    assert [d.job_id for d in nxt] == [ids[3]]
    # Lateness counts from the slot's time: the attempt starts now, the slot is T0 + 30.
    assert nxt[0].scheduled_for_ms == T0 + 30
    ex = o.store.execution(nxt[0].exec_id)
    assert ex is not None and ex["reason"] is None and ex["attempts"][0]["started_at_ms"] == (
        T0 + 2 * SEC)
    for d in first[1:] + nxt:
        o.succeed(d)
    assert [d.job_id for d in o.tick(T0 + 3 * SEC)] == ids[4:7]


def test_a_queued_execution_of_a_deleted_job_is_cancelled_and_never_starts() -> None:
    o = Owner()
    ids = o.one_offs("A", 4, T0, step_ms=1)
    first = o.tick(T0 + 10)
    assert len(first) == 3
    o.now = T0 + 20
    o.core.on_command("kron.commands.DeleteJob", {
        "envelope": {"event_id": "del", "event_type": "job.delete_requested",
                     "schema_version": 1, "occurred_at_ms": o.now, "tenant": "A",
                     "causation_id": None, "correlation_id": ids[3], "producer": "t"},
        "command_id": "del", "job_id": ids[3]}, o.ctx())
    assert o.waiting_timers() == 0
    o.succeed(first[0])
    assert o.tick(T0 + SEC) == []
    assert o.states("A")["cancelled"] == 1


def test_a_capped_tenants_slots_are_not_decided_ahead() -> None:
    o = Owner(fire_ahead_ms=5 * SEC)
    o.one_offs("A", 2, T0 + 2 * SEC)
    o.one_offs("B", 2, T0 + 2 * SEC)
    early = o.tick(T0)
    assert Counter(d.tenant for d in early) == {"B": 2}
    assert Counter(d.tenant for d in o.tick(T0 + 2 * SEC)) == {"A": 2}


@settings(max_examples=60, deadline=None)
@given(cap=st.integers(1, 4), jobs=st.integers(1, 25),
       finishes=st.lists(st.integers(0, 10), min_size=1, max_size=40))
def test_never_more_than_the_cap_running_every_slot_starts_once(
        cap: int, jobs: int, finishes: list[int]) -> None:
    o = Owner(TenantTable.from_toml(f"[tenants.A]\nmax_running = {cap}\n"))
    o.one_offs("A", jobs, T0, step_ms=7)
    running = o.tick(T0)
    now = T0
    for pick in [*finishes, *([0] * (jobs + 1))]:  # then drain whatever is left
        assert len(running) <= cap
        assert o.states("A")["running"] == len(running) <= cap
        if not running:
            break
        done = running.pop(pick % len(running))
        running += o.succeed(done)
        now += 100
        running += o.tick(now)
    assert o.states("A") == {"succeeded": jobs}
    assert set(o.started.values()) == {1} and len(o.started) == jobs
    assert not any(is_waiting(decode_timer_key(k).lane) for k in o.store.timers)


def test_the_gate_splits_the_cap_by_the_partitions_owned() -> None:
    gate = RunningGate(TenantTable.from_toml("[tenants.A]\nmax_running = 10\n"), partitions=8)
    assert gate.share("A") == 10
    gate.set_owned({0, 1, 2})
    assert gate.share("A") == 4  # ceil(10 * 3 / 8)
    assert gate.share("B") == 0  # not listed, defaults: unlimited
    assert all(gate.admit(p, "A", f"x{i}") for i, p in enumerate((0, 1, 2, 2)))
    assert not gate.admit(1, "A", "x9") and gate.admit(0, "A", "x0")  # counted already
    gate.set_owned({0, 1})  # partition 2's count goes with it
    assert gate.running("A") == 2 and gate.share("A") == 3
    assert gate.admit(1, "A", "x9") and not gate.admit(1, "A", "x10")
    gate.release(0, "A", "x0")
    assert gate.admit(1, "A", "x10")


def test_a_round_starts_queued_executions_up_to_its_limit_and_says_more_are_due() -> None:
    o = Owner(TenantTable.from_toml("[tenants.A]\nmax_running = 50\n"))
    o.one_offs("A", 60, T0)
    first = o.tick(T0)
    assert len(first) == 50 and o.states("A")["queued"] == 10
    for d in first[:20]:
        o.succeed(d)
    o.now = T0 + SEC
    effects, more = o.core.on_tick(o.ctx(), limit=4)
    assert len([e for e in effects if isinstance(e, Dispatch)]) == 4 and more
    effects, more = o.core.on_tick(o.ctx(), limit=100)
    assert len([e for e in effects if isinstance(e, Dispatch)]) == 6 and not more
    assert o.waiting_timers() == 0


def test_a_tenant_with_room_again_wakes_the_owner() -> None:
    o = Owner()
    woken: list[str] = []
    o.gate.on_room = woken.append
    o.one_offs("A", 5, T0)
    first = o.tick(T0)
    o.one_offs("B", 1, T0 + 10)
    o.tick(T0 + 10)
    assert woken == []  # nothing of a capped tenant ended yet
    o.succeed(first[0])
    assert woken == ["A"]


def test_a_dag_run_counts_once_and_a_queued_one_can_be_cancelled() -> None:
    from tests.unit.test_core_dag import dag_spec, task

    o = Owner(TenantTable.from_toml("[tenants.A]\nmax_running = 1\n"))
    for i in range(2):
        o.core.create_new(job_id=f"dag-{i}", tenant="A", command_id=f"c{i}",
                          spec=dag_spec([task("a"), task("b")], run_at_ms=T0 + i),
                          idempotency_key=None, ctx=o.ctx())
    started = o.tick(T0 + 10)
    # The first run's two root tasks start (one run, however many tasks); the second waits.
    assert sorted(d.task_id or "" for d in started) == ["a", "b"]
    assert {d.job_id for d in started} == {"dag-0"}
    assert o.states("A") == {"running": 3, "queued": 1}  # the run, its two tasks; the other
    queued = next(e for e in o.store.executions.values() if e["state"] == "queued")
    o.core.on_command("kron.commands.CancelRun", {
        "envelope": {"event_id": "cx", "event_type": "run.cancel_requested",
                     "schema_version": 1, "occurred_at_ms": o.now, "tenant": "A",
                     "causation_id": None, "correlation_id": "dag-1", "producer": "t"},
        "command_id": "cx", "job_id": "dag-1", "run_id": queued["exec_id"],
        "reason": "not needed"}, o.ctx())
    assert o.store.execution(queued["exec_id"])["state"] == "cancelled"  # type: ignore[index]
    assert o.waiting_timers() == 0
    for d in started:
        o.succeed(d)
    assert o.tick(T0 + SEC) == []
    assert o.states("A") == {"succeeded": 3, "cancelled": 1}
