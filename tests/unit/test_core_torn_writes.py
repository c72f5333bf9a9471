"""A worker that dies in the middle of an event leaves its writes torn.

One event writes to three partitions (jobs, executions, timers) with no transaction: each
partition keeps some prefix of what the event wrote to it, independently of the others
(the fault suite saw a fire's timer writes reach Kafka and its job write not). For a fire
of a cron job and of a one-off, every combination of surviving prefixes is tried; the next
owner (a new core over what survived) must then keep every slot: each one ends with exactly
one execution, started once, and the cron job keeps firing."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from typing import Any

import pytest

from streams.domain.ids import exec_id
from streams.domain.timer import TimerKind, decode_timer_key
from streams.engine.core import Context, Dispatch, PartitionCore
from streams.engine.store import MemoryStore, Record
from tests.support.stack import spec
from tests.unit.test_core_scenarios import SEC, TARGET, Partition, dispatches, utc

T0 = utc(2026, 5, 4, 12, 0, 0)


class Recording(MemoryStore):
    """A MemoryStore that also lists each partition's writes in order."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[str, Any, Any]] = []

    def put_job(self, job: Record, *, cache: bool = True) -> None:
        self.writes.append(("jobs", job["job_id"], copy.deepcopy(job)))
        super().put_job(job, cache=cache)

    def put_execution(self, execution: Record) -> None:
        self.writes.append(("executions", execution["exec_id"], copy.deepcopy(execution)))
        super().put_execution(execution)

    def put_timer(self, key: bytes, value: bytes) -> None:
        self.writes.append(("timers", key, value))
        super().put_timer(key, value)

    def delete_timer(self, key: bytes, *, read: bool = False) -> None:
        if key in self.timers:
            self.writes.append(("timers", key, None))
        super().delete_timer(key, read=read)


def _survivor(before: MemoryStore, writes: list[tuple[str, Any, Any]],
              keep: dict[str, int]) -> MemoryStore:
    """`before` plus the first keep[partition] writes the event made to each partition."""
    after = copy.deepcopy(before)
    after.__class__ = MemoryStore
    seen = dict.fromkeys(keep, 0)
    for table, key, value in writes:
        seen[table] += 1
        if seen[table] > keep[table]:
            continue
        if table == "jobs":
            after.put_job(value)
        elif table == "executions":
            after.put_execution(value)
        elif value is None:
            after.delete_timer(key)
        else:
            after.put_timer(key, value)
    return after


def _tears(writes: list[tuple[str, Any, Any]]) -> list[dict[str, int]]:
    counts = {t: sum(1 for w in writes if w[0] == t) for t in ("jobs", "executions", "timers")}
    ranges = [range(counts[t] + 1) for t in counts]
    return [dict(zip(counts, combo, strict=True)) for combo in itertools.product(*ranges)]


def _recording(now_ms: int) -> tuple[Partition, Recording]:
    """A partition owner whose store lists every write it makes."""
    p = Partition(now_ms)
    store = p.store = Recording()
    p.core = PartitionCore(store)
    return p, store


def _before(store: Recording) -> MemoryStore:
    """The state so far, as a plain store; the writes after it are listed from here."""
    before = copy.deepcopy(store)
    before.__class__ = MemoryStore
    store.writes.clear()
    return before


def _crash_at_fire(job_id: str, fire_at_ms: int, **spec_fields: Any) -> tuple[
        MemoryStore, list[tuple[str, Any, Any]]]:
    """Run a partition up to the tick that fires at `fire_at_ms`; return the state before
    that tick and the writes the tick made."""
    p, store = _recording(T0)
    p.create(job_id, **spec_fields)
    while p.now + SEC < fire_at_ms:
        for d in dispatches(p.tick(p.now + SEC)):
            p.report(d, "success")
    before = _before(store)
    fired = dispatches(p.tick(fire_at_ms))
    assert fired, "the crash must come in the middle of a fire"
    return before, list(store.writes)


def _crash_in_catch_up(job_id: str, down_until_ms: int, events: int, **spec_fields: Any
                       ) -> tuple[MemoryStore, list[tuple[str, Any, Any]], int]:
    """An owner back from downtime fires the overdue slots one event (tick) each, as the
    ticker does (a slot armed by an event is due at once and waits for the next tick);
    the crash tears the last `events` of those events together. Returns the state before
    them, their writes, and the time of the crash."""
    p, store = _recording(T0)
    p.create(job_id, **spec_fields)
    for d in dispatches(p.tick(T0 + 2 * SEC)):
        p.report(d, "success")
    p.now = down_until_ms
    before = _before(store)
    for _ in range(events):
        assert dispatches(p.tick(down_until_ms)), "each event fires a slot"
    return before, list(store.writes), down_until_ms


def _run_next_owner(store: MemoryStore, start_ms: int, until_ms: int) -> None:
    """A new owner (epoch 2) ticks every second and reports every call it makes as done."""
    core = PartitionCore(store)
    now, n = start_ms, 0
    while now <= until_ms:
        n += 1
        ctx = Context(now_ms=now, causation_id=f"after-{n}", worker="w2", epoch=2,
                      misfire_grace_ms=GRACE_MS)
        effects, more = core.on_tick(ctx)
        assert not more
        for d in (e for e in effects if isinstance(e, Dispatch)):
            n += 1
            core.on_report("kron.executions.ExecutionSucceeded", _success(d, now),
                           Context(now_ms=now, causation_id=f"rep-{n}", worker="w2", epoch=2))
        now += SEC


def _success(d: Dispatch, now: int) -> Record:
    return {
        "envelope": {"event_id": f"rep-{d.exec_id}-{d.attempt}", "event_type": "execution.report",
                     "schema_version": 1, "occurred_at_ms": now, "tenant": "acme",
                     "causation_id": d.exec_id, "correlation_id": d.job_id,
                     "producer": "executor"},
        "exec_id": d.exec_id, "job_id": d.job_id, "scheduled_for_ms": d.scheduled_for_ms,
        "owner_epoch": 0, "attempt": d.attempt, "fencing_token": d.fencing_token,
        "started_at_ms": now, "finished_at_ms": now, "status_code": 200,
        "output": None,
    }


def _starts(store: MemoryStore, ex_id: str) -> int:
    """How many times the surviving history started the execution's first attempt."""
    return sum(1 for kind, rec in store.log if kind == "execution" and rec["exec_id"] == ex_id
               and rec["attempt"] == 1 and rec["envelope"]["event_type"] == "execution.started")


# The deployment default: a slot decided again at its lease's end is not yet a misfire.
GRACE_MS = 60 * SEC
LEASE_S = 10.0
def _assert_cron_kept(store: MemoryStore, slots: list[int], keep: dict[str, int]) -> None:
    """Every slot succeeded with one start, and only the slot after them is armed."""
    for slot in slots:
        ex = store.execution(exec_id("cron", slot))
        assert ex is not None and ex["state"] == "succeeded", (keep, slot, ex)
        assert _starts(store, exec_id("cron", slot)) == 1, (keep, slot)
    fire = [decode_timer_key(k) for k in store.timers
            if decode_timer_key(k).kind == TimerKind.FIRE]
    assert [t.due_ms for t in fire] == [slots[-1] + 2 * SEC], (keep, fire)


CRON_SLOTS = [T0 + k * 2 * SEC for k in range(1, 13)]  # */2 s from T0 + 2 s


@pytest.mark.parametrize("crash_slot", [CRON_SLOTS[2]])
def test_a_torn_cron_fire_loses_no_slot_and_starts_none_twice(crash_slot: int) -> None:
    before, writes = _crash_at_fire("cron", crash_slot, cron="*/2 * * * * *",
                                     lease_s=LEASE_S)
    assert len(_tears(writes)) > 8  # the event wrote to all three partitions
    for keep in _tears(writes):
        store = _survivor(before, writes, keep)
        _run_next_owner(store, crash_slot + 1, CRON_SLOTS[-1] + 500)
        _assert_cron_kept(store, CRON_SLOTS, keep)
        job = store.job("cron")
        assert job is not None and job["next_run_at_ms"] == CRON_SLOTS[-1] + 2 * SEC, keep


def test_a_torn_one_off_fire_runs_it_once() -> None:
    run_at = T0 + 3 * SEC
    before, writes = _crash_at_fire("once", run_at, run_at_ms=run_at, lease_s=LEASE_S)
    for keep in _tears(writes):
        store = _survivor(before, writes, keep)
        _run_next_owner(store, run_at + 1, run_at + 2 * int(LEASE_S * SEC))
        ex = store.execution(exec_id("once", run_at))
        assert ex is not None and ex["state"] == "succeeded", (keep, ex)
        assert _starts(store, exec_id("once", run_at)) == 1, keep
        job = store.job("once")
        assert job is not None and job["status"] == "completed", (keep, job)
        assert not [k for k in store.timers if decode_timer_key(k).kind == TimerKind.FIRE], keep


def test_catch_up_fires_torn_together_keep_every_slot() -> None:
    """The fault suite's case: a new owner catching up fired three slots in three events
    and died; their job and execution writes landed, their timer writes did not, and the
    started executions had no lease timer left to recover them. Every tear of the three
    events' writes together is tried."""
    crash_at = T0 + 8 * SEC + 200
    before, writes, _ = _crash_in_catch_up("cron", crash_at, 3, cron="*/2 * * * * *",
                                           lease_s=LEASE_S)
    slots = [T0 + k * 2 * SEC for k in range(1, 12)]
    tears = _tears(writes)
    assert len(tears) > 100
    for keep in tears:
        store = _survivor(before, writes, keep)
        _run_next_owner(store, crash_at + 1, slots[-1] + 500)
        _assert_cron_kept(store, slots, keep)


Resend = Callable[[MemoryStore], None]


def _resender(kind: str, job_id: str, command_id: str, at_ms: int, **fields: Any) -> Resend:
    """Sends the command again to a new owner (epoch 2) over the given state: a redelivery
    after the first owner died without committing it."""
    def resend(store: MemoryStore) -> None:
        q = Partition(at_ms)
        q.store, q.core, q.epoch, q.worker = store, PartitionCore(store), 2, "w2"
        q.command(kind, job_id, command_id=command_id, **fields)

    return resend


def _torn_create(job_id: str, **spec_fields: Any) -> tuple[MemoryStore, list[Any], Resend]:
    """The state before a create, the writes it made, and the same create again."""
    p, store = _recording(T0)
    before = _before(store)
    fields = {"spec": spec(target=TARGET, **spec_fields), "idempotency_key": None}
    p.command("CreateJob", job_id, command_id="create-1", **fields)
    return before, list(store.writes), _resender("CreateJob", job_id, "create-1",
                                                 T0 + 500, **fields)


def test_a_torn_one_off_create_redelivered_runs_it_once() -> None:
    """The job record kept and its FIRE timer lost (or any other tear): the redelivered
    create arms it, and it runs once."""
    run_at = T0 + 3 * SEC
    before, writes, redeliver = _torn_create("once", run_at_ms=run_at, lease_s=LEASE_S)
    assert {w[0] for w in writes} == {"jobs", "timers"}
    for keep in _tears(writes):
        store = _survivor(before, writes, keep)
        redeliver(store)
        _run_next_owner(store, T0 + SEC, run_at + 2 * int(LEASE_S * SEC))
        ex = store.execution(exec_id("once", run_at))
        assert ex is not None and ex["state"] == "succeeded", (keep, ex)
        assert _starts(store, exec_id("once", run_at)) == 1, keep


def test_a_torn_cron_create_redelivered_keeps_every_slot() -> None:
    before, writes, redeliver = _torn_create("cron", cron="*/2 * * * * *", lease_s=LEASE_S)
    for keep in _tears(writes):
        store = _survivor(before, writes, keep)
        redeliver(store)
        _run_next_owner(store, T0 + SEC, CRON_SLOTS[-1] + 500)
        _assert_cron_kept(store, CRON_SLOTS, keep)


def test_a_repeated_command_on_whole_state_changes_nothing() -> None:
    """The re-arm puts what is there already: the timer table is the same after it."""
    before, writes, redeliver = _torn_create("cron", cron="*/2 * * * * *", lease_s=LEASE_S)
    store = _survivor(before, writes, _tears(writes)[-1])  # the last tear keeps every write
    timers, job = dict(store.timers), copy.deepcopy(store.job("cron"))
    redeliver(store)
    assert store.timers == timers and store.job("cron") == job


def _torn_update(created_at_ms: int) -> tuple[MemoryStore, list[Any], Resend]:
    """A cron job created at `created_at_ms`, then updated at T0 + 500 ms (new target,
    same schedule): the state before the update, its writes, and the same update again."""
    p, store = _recording(created_at_ms)
    p.create("cron", cron="*/2 * * * * *", lease_s=LEASE_S)
    p.now = T0 + 500
    before = _before(store)
    body = spec(target={"url": "http://target.invalid/v2"}, cron="*/2 * * * * *",
                lease_s=LEASE_S)
    p.command("UpdateJob", "cron", command_id="update-1", spec=body)
    return before, list(store.writes), _resender("UpdateJob", "cron", "update-1", T0 + 600,
                                                 spec=body)


def test_a_torn_update_redelivered_keeps_every_slot() -> None:
    """An update that re-arms the same next slot (new target, same schedule): its delete of
    the old FIRE timer and its put of the new one are the same key, so a tear can leave the
    job at version 2 with no timer at all. The redelivered update arms it again. (Created
    after T0's slot, so the update has no overdue slot to settle first.)"""
    before, writes, redeliver = _torn_update(T0 + 100)
    assert {w[0] for w in writes} == {"jobs", "timers"}
    for keep in _tears(writes):
        store = _survivor(before, writes, keep)
        redeliver(store)
        _run_next_owner(store, T0 + SEC, CRON_SLOTS[-1] + 500)
        _assert_cron_kept(store, CRON_SLOTS, keep)
        job = store.job("cron")
        assert job is not None and job["version"] == 2, keep


def test_a_torn_update_that_settled_an_overdue_slot_keeps_it() -> None:
    """Created at T0, so T0's slot is overdue when the update comes: the update settles it
    first (an execution, started), then re-arms. Two tears used to lose that slot:

    - the job write kept and the execution lost: the job's cursor is past T0 and lists its
      execution as running, and the spec that owed it is replaced. The redelivered command
      starts it again from the job record (_restart_lost_start), before anything prunes it;
    - the execution kept and its lease lost, while the delete of T0's FIRE timer landed: a
      started execution nothing watches. The settled timer is now deleted after the
      event's leases, as a tick deletes what it fired, so that tear cannot happen."""
    before, writes, redeliver = _torn_update(T0)
    for keep in _tears(writes):
        store = _survivor(before, writes, keep)
        redeliver(store)
        _run_next_owner(store, T0 + SEC, CRON_SLOTS[-1] + 500)
        _assert_cron_kept(store, [T0, *CRON_SLOTS], keep)
