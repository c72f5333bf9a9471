"""PartitionCore, example by example: DST, misfire, overlap, fencing, leases and pause.

Each test drives one partition's core over a MemoryStore with explicit times; the property
simulation in test_core_properties.py covers the same ground with random interleavings.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from unittest import mock

import orjson
import pytest

from streams.domain.ids import exec_id
from streams.domain.timer import Tier, TimerKind, decode_timer_key, tenant_lane
from streams.engine import core as core_module
from streams.engine.core import (
    MISFIRE_GRACE_MS,
    Cancel,
    Context,
    Dispatch,
    Effect,
    Emit,
    PartitionCore,
)
from streams.engine.store import MemoryStore, Record
from tests.support.stack import spec

TARGET = {"url": "http://target.invalid/hook"}
SEC = 1000
MIN = 60 * SEC


def utc(*args: int) -> int:
    return int(datetime(*args, tzinfo=UTC).timestamp() * 1000)  # type: ignore[misc]


class Partition:
    """One partition owner: feeds the core commands, ticks and reports at explicit times."""

    def __init__(self, now_ms: int, *, fire_ahead_ms: int = 0) -> None:
        self.store = MemoryStore()
        self.core = PartitionCore(self.store)
        self.now = now_ms
        self.n = 0
        self.fire_ahead_ms = fire_ahead_ms
        self.epoch = 1
        self.worker = "w1"
        self.incarnation = "p1"

    def _ctx(self) -> Context:
        self.n += 1
        return Context(now_ms=self.now, causation_id=f"ev-{self.n}", worker=self.worker,
                       epoch=self.epoch, incarnation=self.incarnation,
                       fire_ahead_ms=self.fire_ahead_ms)

    def new_owner(self, epoch: int, worker: str) -> None:
        """The partition's next owner, another process: the same durable state, nothing
        in memory."""
        self.core = PartitionCore(self.store)
        self.epoch, self.worker, self.incarnation = epoch, worker, f"p-{worker}"

    def command(self, kind: str, job_id: str, *, command_id: str | None = None,
                **fields: Any) -> list[Effect]:
        self.n += 1
        cid = command_id or f"cmd-{self.n}"
        record = {
            "envelope": {"event_id": cid, "event_type": f"job.{kind.lower()}_requested",
                         "schema_version": 1, "occurred_at_ms": self.now, "tenant": "acme",
                         "causation_id": None, "correlation_id": None, "producer": "tests"},
            "command_id": cid, "job_id": job_id, **fields,
        }
        return self.core.on_command(f"kron.commands.{kind}", record, self._ctx())

    def create(self, job_id: str, **spec_fields: Any) -> list[Effect]:
        s = spec(target=TARGET, **spec_fields)
        return self.command("CreateJob", job_id, spec=s, idempotency_key=None)

    def tick(self, at_ms: int | None = None) -> list[Effect]:
        if at_ms is not None:
            assert at_ms >= self.now
            self.now = at_ms
        effects, more = self.core.on_tick(self._ctx())
        assert not more
        return effects

    def ticks(self, until_ms: int, every_ms: int) -> list[Effect]:
        """A healthy ticker: ticks every `every_ms` up to `until_ms`, inclusive."""
        out: list[Effect] = []
        while self.now + every_ms <= until_ms:
            out += self.tick(self.now + every_ms)
        return out

    def report(self, d: Dispatch, outcome: str, *, token: int | None = None,
               **extra: Any) -> list[Effect]:
        rec: Record = {
            "envelope": {"event_id": f"rep-{self.n}", "event_type": "execution.report",
                         "schema_version": 1, "occurred_at_ms": self.now, "tenant": "acme",
                         "causation_id": d.exec_id, "correlation_id": d.job_id,
                         "producer": "executor"},
            "exec_id": d.exec_id, "job_id": d.job_id, "scheduled_for_ms": d.scheduled_for_ms,
            "owner_epoch": 0, "attempt": d.attempt,
            "fencing_token": d.fencing_token if token is None else token,
        }
        if outcome == "heartbeat":
            rec["lease_until_ms"] = extra["lease_until_ms"]
            return self.core.on_report("kron.executions.ExecutionHeartbeat", rec, self._ctx())
        rec.update(started_at_ms=self.now, finished_at_ms=self.now)
        if outcome == "success":
            rec.update(status_code=200, output=None)
            return self.core.on_report("kron.executions.ExecutionSucceeded", rec, self._ctx())
        rec.update(error_class=outcome, error=f"failed: {outcome}", final=False,
                   status_code=extra.get("status_code"),
                   retry_after_s=extra.get("retry_after_s"))
        return self.core.on_report("kron.executions.ExecutionFailed", rec, self._ctx())

    def job(self, job_id: str) -> Record:
        job = self.store.job(job_id)
        assert job is not None
        return job

    def execs(self, job_id: str) -> list[Record]:
        return sorted((e for e in self.store.executions.values() if e["job_id"] == job_id),
                      key=lambda e: e["scheduled_for_ms"])

    def ex(self, job_id: str, slot_ms: int) -> Record:
        ex = self.store.execution(exec_id(job_id, slot_ms))
        assert ex is not None, f"no execution for {slot_ms}"
        return ex

    def lease_dues(self, exec_id: str) -> list[int]:
        """Due times of the lease timers that list this execution (any attempt)."""
        dues = []
        for key, value in self.store.timers.items():
            tk = decode_timer_key(key)
            if tk.kind == TimerKind.LEASE and any(
                    e[0] == exec_id for e in orjson.loads(value)["l"]):
                dues.append(tk.due_ms)
        return sorted(dues)

    def timers(self, job_id: str) -> list[tuple[int, TimerKind, str]]:
        keys = [decode_timer_key(k) for k in self.store.timers]
        return sorted((k.due_ms, k.kind, k.ref) for k in keys if k.job_id == job_id)


def dispatches(effects: list[Effect]) -> list[Dispatch]:
    return [e for e in effects if isinstance(e, Dispatch)]


def by_state(execs: list[Record]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for e in execs:
        out.setdefault(e["state"], []).append(e["scheduled_for_ms"])
    return out


# --- DST ---------------------------------------------------------------------------------------

DST_DAY = utc(2026, 3, 8)  # New York springs forward at 02:00 EST = 07:00Z


def test_dst_gap_shift_forward_fires_once_after_the_gap() -> None:
    p = Partition(utc(2026, 3, 7, 12))
    p.create("j", cron="30 2 * * *", tz="America/New_York",
             dst={"nonexistent": "shift_forward"})
    # 02:30 does not exist on 2026-03-08; moved by the gap's length it is 03:30 EDT.
    assert p.job("j")["next_run_at_ms"] == utc(2026, 3, 8, 7, 30)
    assert p.ticks(utc(2026, 3, 8, 7, 29, 59), 10 * MIN) == []
    fired = dispatches(p.tick(utc(2026, 3, 8, 7, 30)))
    assert [d.scheduled_for_ms for d in fired] == [utc(2026, 3, 8, 7, 30)]
    ex = p.ex("j", utc(2026, 3, 8, 7, 30))
    assert ex["dst_outcome"] == "shifted_forward" and ex["trigger"] == "schedule"
    # The next day is ordinary again: 02:30 EDT.
    assert p.job("j")["next_run_at_ms"] == utc(2026, 3, 9, 6, 30)
    assert len(p.execs("j")) == 1


def test_dst_gap_skip_records_nothing_for_that_day() -> None:
    p = Partition(utc(2026, 3, 7, 12))
    p.create("j", cron="30 2 * * *", tz="America/New_York", dst={"nonexistent": "skip"})
    assert p.job("j")["next_run_at_ms"] == utc(2026, 3, 9, 6, 30)
    assert p.ticks(utc(2026, 3, 9, 6, 29), 10 * MIN) == []
    assert p.execs("j") == []  # not fired, and not "missed" either: it is no slot at all
    fired = dispatches(p.tick(utc(2026, 3, 9, 6, 30)))
    assert [d.scheduled_for_ms for d in fired] == [utc(2026, 3, 9, 6, 30)]


@pytest.mark.parametrize(("policy", "expected"), [
    ("first", [(utc(2026, 11, 1, 5, 30), "ambiguous_first")]),
    ("last", [(utc(2026, 11, 1, 6, 30), "ambiguous_last")]),
    ("both", [(utc(2026, 11, 1, 5, 30), "ambiguous_both_1"),
              (utc(2026, 11, 1, 6, 30), "ambiguous_both_2")]),
])
def test_dst_fall_back_follows_the_ambiguous_policy(policy: str,
                                                     expected: list[tuple[int, str]]) -> None:
    p = Partition(utc(2026, 10, 31, 12))
    p.create("j", cron="30 1 * * *", tz="America/New_York", dst={"ambiguous": policy})
    fired = []
    for now in range(utc(2026, 11, 1, 5), utc(2026, 11, 1, 8), MIN):
        # Unanswered attempts come back as retries after their lease; count first attempts.
        fired += [d.scheduled_for_ms for d in dispatches(p.tick(now)) if d.attempt == 1]
    assert fired == [ms for ms, _ in expected]
    assert [(e["scheduled_for_ms"], e["dst_outcome"]) for e in
            sorted(p.execs("j"), key=lambda e: e["scheduled_for_ms"])] == expected


# --- misfire -----------------------------------------------------------------------------------

T0 = utc(2026, 1, 5)


def test_fire_once_after_an_hour_of_downtime_coalesces_into_one_run() -> None:
    p = Partition(T0 + 30 * SEC)
    p.create("j", cron="*/10 * * * *", lease_s=600.0)
    [first] = dispatches(p.ticks(T0 + 10 * MIN + SEC, 10 * SEC))
    p.report(first, "success")
    # The owner is gone from 00:10:01 until 01:10:30: six slots (00:20 .. 01:10) are late.
    effects = p.tick(T0 + 70 * MIN + 30 * SEC)
    [run] = dispatches(effects)
    assert run.scheduled_for_ms == T0 + 70 * MIN
    states = by_state(p.execs("j"))
    assert states["missed"] == [T0 + m * MIN for m in (20, 30, 40, 50, 60)]
    assert {e["reason"] for e in p.execs("j") if e["state"] == "missed"} == {"coalesced"}
    assert p.ex("j", run.scheduled_for_ms)["trigger"] == "misfire"
    job = p.job("j")
    assert job["cursor_ms"] == T0 + 70 * MIN and job["next_run_at_ms"] == T0 + 80 * MIN


def test_skip_if_late_by_misses_old_slots_and_fires_recent_ones() -> None:
    p = Partition(T0 + 30 * SEC)
    p.create("j", cron="*/10 * * * *", lease_s=600.0,
             misfire={"kind": "skip_if_late_by", "late_by_s": 900.0})
    # Down from the start until 00:52: 00:10, 00:20, 00:30 are > 15 min late; 00:40, 00:50 not.
    effects = p.tick(T0 + 52 * MIN)
    assert sorted(d.scheduled_for_ms for d in dispatches(effects)) == [T0 + 40 * MIN,
                                                                        T0 + 50 * MIN]
    states = by_state(p.execs("j"))
    assert states["missed"] == [T0 + 10 * MIN, T0 + 20 * MIN, T0 + 30 * MIN]
    assert {e["reason"] for e in p.execs("j") if e["state"] == "missed"} == {
        "late_by_exceeded"}


def test_skip_if_late_by_applies_to_a_single_late_slot_too() -> None:
    """An hourly job whose owner was down from 00:59 to 01:10 has one late slot, 10 min late:
    with late_by 60 s it must be missed, not run as if it were on time."""
    p = Partition(T0 + 30 * SEC)
    p.create("j", cron="0 * * * *", misfire={"kind": "skip_if_late_by", "late_by_s": 60.0})
    p.ticks(T0 + 59 * MIN, MIN)
    effects = p.tick(T0 + 70 * MIN)
    assert dispatches(effects) == []
    [ex] = p.execs("j")
    assert (ex["scheduled_for_ms"], ex["state"], ex["reason"]) == (
        T0 + 60 * MIN, "missed", "late_by_exceeded")
    assert p.job("j")["next_run_at_ms"] == T0 + 120 * MIN


def test_skip_if_late_by_fires_a_single_slot_within_the_limit() -> None:
    p = Partition(T0 + 30 * SEC)
    p.create("j", cron="0 * * * *", misfire={"kind": "skip_if_late_by", "late_by_s": 900.0})
    p.ticks(T0 + 59 * MIN, MIN)
    [run] = dispatches(p.tick(T0 + 70 * MIN))
    assert run.scheduled_for_ms == T0 + 60 * MIN


def test_a_single_late_slot_under_fire_once_runs_as_a_misfire() -> None:
    p = Partition(T0 + 30 * SEC)
    p.create("j", cron="0 * * * *")
    p.ticks(T0 + 59 * MIN, MIN)
    [run] = dispatches(p.tick(T0 + 70 * MIN))
    assert run.scheduled_for_ms == T0 + 60 * MIN
    assert p.ex("j", run.scheduled_for_ms)["trigger"] == "misfire"


def test_a_single_late_slot_under_fire_all_is_paced() -> None:
    p = Partition(T0 + 30 * SEC)
    p.create("j", cron="0 * * * *", misfire={"kind": "fire_all", "fire_all_cap": 5})
    p.ticks(T0 + 59 * MIN, MIN)
    assert dispatches(p.tick(T0 + 70 * MIN)) == []
    [run] = dispatches(p.tick(T0 + 70 * MIN))
    assert run.scheduled_for_ms == T0 + 60 * MIN
    assert p.ex("j", run.scheduled_for_ms)["trigger"] == "misfire"


def test_a_slot_found_within_the_grace_fires_normally() -> None:
    p = Partition(T0 + 30 * SEC)
    p.create("j", cron="0 * * * *", misfire={"kind": "skip_if_late_by", "late_by_s": 0.0})
    p.ticks(T0 + 59 * MIN, MIN)
    [run] = dispatches(p.tick(T0 + 60 * MIN + MISFIRE_GRACE_MS))
    assert p.ex("j", run.scheduled_for_ms)["trigger"] == "schedule"


def test_one_off_created_with_a_past_run_at_still_fires() -> None:
    """The API judged the skew: a one-off is due at run_at even if that already passed."""
    p = Partition(T0)
    p.create("j", run_at_ms=T0 - 10 * MIN,
             misfire={"kind": "skip_if_late_by", "late_by_s": 60.0})
    [run] = dispatches(p.tick(T0 + SEC))
    assert run.scheduled_for_ms == T0 - 10 * MIN


def test_fire_all_is_capped_and_paced_through_timers() -> None:
    p = Partition(T0 + 30 * SEC)
    p.create("j", cron="*/10 * * * *", lease_s=600.0,
             misfire={"kind": "fire_all", "fire_all_cap": 3})
    now = T0 + 62 * MIN  # six late slots: 00:10 .. 01:00
    assert dispatches(p.tick(now)) == []  # nothing starts in the tick that finds them
    assert by_state(p.execs("j"))["missed"] == [T0 + m * MIN for m in (10, 20, 30)]
    paced = [(due, ref) for due, kind, ref in p.timers("j") if kind == TimerKind.FIRE and ref]
    assert paced == [(now + i * core_module.PACE_MS, f"misfire:{T0 + m * MIN}")
                     for i, m in enumerate((40, 50, 60))]
    started = []
    for i in range(3):
        started += [d.scheduled_for_ms for d in dispatches(p.tick(now + i * core_module.PACE_MS))]
    assert started == [T0 + 40 * MIN, T0 + 50 * MIN, T0 + 60 * MIN]
    assert {p.ex("j", s)["trigger"] for s in started} == {"misfire"}
    assert p.job("j")["next_run_at_ms"] == T0 + 70 * MIN


def test_more_late_slots_than_one_tick_may_enumerate_are_all_accounted_for() -> None:
    """A per-second job whose owner was down 3 h has 10,800 late slots, more than
    MAX_LATE_SLOTS: the rest is judged by the following ticks, none silently dropped, and
    fire_once still runs only the newest."""
    p = Partition(T0)
    p.create("j", cron="* * * * * *")
    now = T0 + 3 * 3600 * SEC
    started = dispatches(p.tick(now))  # slots 0 .. 9,999: all older than the newest
    assert started == [] and len(p.execs("j")) == core_module.MAX_LATE_SLOTS
    started = dispatches(p.tick(now))  # the next tick (at once: its timer is due) goes on
    execs = p.execs("j")
    slots = [e["scheduled_for_ms"] for e in execs]
    newest = now - MISFIRE_GRACE_MS
    assert slots == list(range(T0, newest + 1, SEC))
    assert [d.scheduled_for_ms for d in started] == [newest]
    assert len(by_state(execs)["missed"]) == len(slots) - 1
    assert p.job("j")["next_run_at_ms"] == newest + SEC


def test_late_slots_beyond_the_enumeration_cap_are_judged_by_policy() -> None:
    with mock.patch.object(core_module, "MAX_LATE_SLOTS", 4):
        p = Partition(T0 + 30 * SEC)
        p.create("once", cron="*/10 * * * *", lease_s=600.0)
        p.create("late", cron="*/10 * * * *", lease_s=600.0,
                 misfire={"kind": "skip_if_late_by", "late_by_s": 1400.0})
        now = T0 + 95 * MIN  # nine late slots, 00:10 .. 01:30
        started = []
        for _ in range(3):
            started += dispatches(p.tick(now))
    assert [d.scheduled_for_ms for d in started if d.job_id == "once"] == [T0 + 90 * MIN]
    assert sorted(d.scheduled_for_ms for d in started if d.job_id == "late") == [
        T0 + m * MIN for m in (80, 90)]
    for job_id in ("once", "late"):
        assert [e["scheduled_for_ms"] for e in p.execs(job_id)] == [
            T0 + m * MIN for m in range(10, 91, 10)]
        assert p.job(job_id)["next_run_at_ms"] == T0 + 100 * MIN


# --- overlap -----------------------------------------------------------------------------------


def test_only_allow_jobs_let_their_results_wait_and_every_dispatch_carries_its_lease() -> None:
    # A result that waits behind a spike (streams/reports.py) must not move a decision:
    # skip, queue and replace look at what is running when the next slot falls due.
    p = Partition(T0 + 30 * SEC)
    for overlap in ("allow", "skip_if_running", "queue", "replace"):
        p.create(overlap, cron="* * * * *", overlap=overlap, lease_s=120.0)
    sent = {d.job_id: d for d in dispatches(p.tick(T0 + MIN))}
    assert {job: d.result_may_wait for job, d in sent.items()} == {
        "allow": True, "skip_if_running": False, "queue": False, "replace": False}
    for job, d in sent.items():
        assert d.lease_until_ms == p.ex(job, T0 + MIN)["lease_until_ms"] == T0 + MIN + 120_000



def test_overlap_queue_buffers_one_slot_and_skips_the_rest() -> None:
    p = Partition(T0 + 30 * SEC)
    p.create("j", cron="* * * * *", overlap="queue", lease_s=3600.0)
    [first] = dispatches(p.tick(T0 + MIN))
    assert dispatches(p.tick(T0 + 2 * MIN)) == []
    assert p.job("j")["queued_slot_ms"] == T0 + 2 * MIN
    assert dispatches(p.tick(T0 + 3 * MIN)) == []
    assert (p.ex("j", T0 + 3 * MIN)["state"], p.ex("j", T0 + 3 * MIN)["reason"]) == (
        "skipped", "overlap: queue full")
    [queued] = dispatches(p.report(first, "success"))
    assert queued.scheduled_for_ms == T0 + 2 * MIN
    assert p.job("j")["queued_slot_ms"] is None
    assert p.job("j")["running"] == [queued.exec_id]


def test_overlap_replace_cancels_and_fences_the_running_attempt() -> None:
    p = Partition(T0 + 30 * SEC)
    p.create("j", cron="* * * * *", overlap="replace", lease_s=3600.0)
    [old] = dispatches(p.tick(T0 + MIN))
    effects = p.tick(T0 + 2 * MIN)
    assert [type(e) for e in effects] == [Cancel, Dispatch]
    cancel, new = effects
    assert isinstance(cancel, Cancel) and isinstance(new, Dispatch)
    assert (cancel.exec_id, cancel.fencing_token) == (old.exec_id, 1)
    cancelled = p.ex("j", T0 + MIN)
    assert (cancelled["state"], cancelled["fencing_token"]) == ("cancelled", 2)
    # The cancelled attempt's late report carries token 1: rejected, nothing changes.
    before = (dict(p.store.executions), dict(p.store.jobs), dict(p.store.timers))
    assert p.report(old, "success") == []
    assert p.core.stale_rejected == 1
    assert (dict(p.store.executions), dict(p.store.jobs), dict(p.store.timers)) == before
    assert p.job("j")["running"] == [new.exec_id]


# --- attempts, fencing, leases -----------------------------------------------------------------


def test_a_permanent_failure_is_final_and_alerts() -> None:
    p = Partition(T0 + 30 * SEC)
    p.create("j", cron="* * * * *", retry={"max_attempts": 4})
    [d] = dispatches(p.tick(T0 + MIN))
    effects = p.report(d, "permanent", status_code=400)
    assert dispatches(effects) == []
    assert [e.topic for e in effects if isinstance(e, Emit)] == ["dead-letters"]
    ex = p.ex("j", T0 + MIN)
    assert (ex["state"], ex["attempt"]) == ("failed", 1)
    assert p.ticks(T0 + MIN + 10 * MIN, 30 * SEC) and p.ex("j", T0 + MIN)["attempt"] == 1


def test_transient_failures_retry_up_to_max_attempts_honouring_retry_after() -> None:
    p = Partition(T0 + 30 * SEC)
    p.create("j", cron="0 * * * *", retry={"max_attempts": 2, "base_s": 0.2, "max_s": 1.0})
    [d1] = dispatches(p.tick(T0 + 60 * MIN))
    p.report(d1, "transient", status_code=503, retry_after_s=30.0)
    ex = p.ex("j", d1.scheduled_for_ms)
    assert ex["state"] == "retry_pending" and ex["retry_at_ms"] >= p.now + 30 * SEC
    assert dispatches(p.tick(p.now + 29 * SEC)) == []
    [d2] = dispatches(p.tick(ex["retry_at_ms"]))
    assert (d2.exec_id, d2.attempt, d2.fencing_token) == (d1.exec_id, 2, 2)
    p.report(d2, "transient", status_code=503)
    assert p.ex("j", d1.scheduled_for_ms)["state"] == "failed"


def test_a_lost_dispatch_is_recovered_by_lease_expiry_as_the_next_attempt() -> None:
    """The owner crashed after writing attempt 1 but before handing it to the executor;
    redelivery changes nothing, only the lease timer brings the slot back, as attempt 2."""
    p = Partition(T0 + 30 * SEC)
    p.create("j", cron="0 * * * *", lease_s=10.0)
    [d1] = dispatches(p.tick(T0 + 60 * MIN))  # ... and the effect is lost with the process
    p.core = PartitionCore(p.store)  # restart over the same state
    assert p.tick() == []  # the redelivered tick finds its timer gone
    assert dispatches(p.tick(T0 + 60 * MIN + 9 * SEC)) == []
    assert dispatches(p.tick(T0 + 60 * MIN + 10 * SEC)) == []  # the lease ran out
    ex = p.ex("j", T0 + 60 * MIN)
    assert ex["state"] == "retry_pending" and ex["attempts"][0]["outcome"] == "lease_expired"
    [d2] = dispatches(p.tick(ex["retry_at_ms"]))
    assert (d2.exec_id, d2.attempt, d2.fencing_token) == (d1.exec_id, 2, 2)
    # A zombie report of attempt 1 is fenced.
    before = dict(p.store.executions)
    assert p.report(d1, "success") == [] and dict(p.store.executions) == before


def test_a_duplicated_heartbeat_never_pulls_the_lease_back_in() -> None:
    p = Partition(T0 + 30 * SEC)
    p.create("j", cron="0 * * * *", lease_s=30.0)
    [d] = dispatches(p.tick(T0 + 60 * MIN))
    p.now += 10 * SEC
    p.report(d, "heartbeat", lease_until_ms=p.now + 30 * SEC)
    p.now += 10 * SEC
    p.report(d, "heartbeat", lease_until_ms=p.now + 30 * SEC)
    lease = p.ex("j", d.scheduled_for_ms)["lease_until_ms"]
    # The first heartbeat arrives once more (a producer retry).
    p.report(d, "heartbeat", lease_until_ms=p.now - 10 * SEC + 30 * SEC)
    assert p.ex("j", d.scheduled_for_ms)["lease_until_ms"] == lease
    # The timer stays at the first lease; firing, it finds the extension and re-arms there.
    assert p.lease_dues(d.exec_id) == [T0 + 60 * MIN + 30 * SEC]
    assert dispatches(p.tick(lease - 1)) == []
    assert p.ex("j", d.scheduled_for_ms)["state"] == "running"
    assert p.lease_dues(d.exec_id) == [lease]


def test_redelivered_commands_are_no_ops() -> None:
    p = Partition(T0 + 30 * SEC)
    s = spec(target=TARGET, cron="0 * * * *")
    p.command("CreateJob", "j", command_id="c-create", spec=s, idempotency_key=None)
    [run] = dispatches(p.command("TriggerJob", "j", command_id="c-run"))
    assert run.scheduled_for_ms == p.now
    log = len(p.store.log)
    assert p.command("CreateJob", "j", command_id="c-create", spec=s,
                     idempotency_key=None) == []
    assert p.command("TriggerJob", "j", command_id="c-run") == []
    assert len(p.store.log) == log
    assert [e["trigger"] for e in p.execs("j")] == ["manual"]


def test_update_settles_the_old_specs_overdue_slots_before_switching() -> None:
    """The owner was down; an UpdateJob is processed before any tick. The slots the old
    schedule owed by the command's time get their outcomes under the old spec (fire_once:
    the newest runs, the rest are coalesced) instead of vanishing with the disarmed timer."""
    p = Partition(T0 + 30 * SEC)
    p.create("j", cron="*/10 * * * *")
    p.now = T0 + 35 * MIN
    effects = p.command("UpdateJob", "j", spec=spec(target=TARGET, cron="*/15 * * * *"),
                        expected_version=1)
    [run] = dispatches(effects)
    assert run.scheduled_for_ms == T0 + 30 * MIN
    assert by_state(p.execs("j")) == {"missed": [T0 + 10 * MIN, T0 + 20 * MIN],
                                      "running": [T0 + 30 * MIN]}
    job = p.job("j")
    assert (job["version"], job["cursor_ms"], job["next_run_at_ms"]) == (
        2, T0 + 30 * MIN, T0 + 45 * MIN)
    assert [(due, ref) for due, kind, ref in p.timers("j") if kind == TimerKind.FIRE] == [
        (T0 + 45 * MIN, "")]


def test_update_with_nothing_due_only_rearms() -> None:
    p = Partition(T0 + 30 * SEC)
    p.create("j", cron="*/10 * * * *")
    p.now = T0 + 5 * MIN
    assert p.command("UpdateJob", "j", spec=spec(target=TARGET, cron="*/15 * * * *"),
                     expected_version=None) == []
    assert p.execs("j") == [] and p.job("j")["next_run_at_ms"] == T0 + 15 * MIN


# --- pause -------------------------------------------------------------------------------------


def test_slots_due_while_paused_are_recorded_as_skipped() -> None:
    p = Partition(T0 + 30 * SEC)
    p.create("j", cron="*/10 * * * *")
    p.command("PauseJob", "j")
    assert dispatches(p.ticks(T0 + 35 * MIN, MIN)) == []
    assert by_state(p.execs("j")) == {"skipped": [T0 + m * MIN for m in (10, 20, 30)]}
    p.command("ResumeJob", "j")
    [run] = dispatches(p.ticks(T0 + 41 * MIN, MIN))
    assert run.scheduled_for_ms == T0 + 40 * MIN


def test_pause_stops_paced_misfire_runs_that_have_not_started() -> None:
    p = Partition(T0 + 30 * SEC)
    p.create("j", cron="*/10 * * * *", lease_s=600.0,
             misfire={"kind": "fire_all", "fire_all_cap": 100})
    now = T0 + 32 * MIN  # 00:10, 00:20, 00:30 late, paced at now, +100 ms, +200 ms
    p.tick(now)
    [first] = dispatches(p.tick(now))
    assert first.scheduled_for_ms == T0 + 10 * MIN
    p.command("PauseJob", "j")
    assert dispatches(p.tick(now + 1000)) == []
    states = by_state(p.execs("j"))
    assert states == {"running": [T0 + 10 * MIN], "skipped": [T0 + 20 * MIN, T0 + 30 * MIN]}
    assert {e["reason"] for e in p.execs("j") if e["state"] == "skipped"} == {"paused"}


def test_pause_stops_the_queued_slot_from_starting() -> None:
    p = Partition(T0 + 30 * SEC)
    p.create("j", cron="* * * * *", overlap="queue", lease_s=3600.0)
    [first] = dispatches(p.tick(T0 + MIN))
    p.tick(T0 + 2 * MIN)
    assert p.job("j")["queued_slot_ms"] == T0 + 2 * MIN
    p.command("PauseJob", "j")
    assert dispatches(p.report(first, "success")) == []
    queued = p.ex("j", T0 + 2 * MIN)
    assert (queued["state"], queued["reason"]) == ("skipped", "paused")
    assert p.job("j")["queued_slot_ms"] is None and p.job("j")["running"] == []


def test_trigger_while_paused_runs_and_delete_cancels() -> None:
    p = Partition(T0 + 30 * SEC)
    p.create("j", cron="0 * * * *", retry={"max_attempts": 3})
    p.command("PauseJob", "j")
    [manual] = dispatches(p.command("TriggerJob", "j"))
    effects = p.command("DeleteJob", "j")
    assert [(type(e), e.exec_id) for e in effects] == [(Cancel, manual.exec_id)]
    job = p.job("j")
    assert (job["status"], job["next_run_at_ms"], job["running"]) == ("deleted", None, [])
    assert p.timers("j") == []
    assert p.report(manual, "success") == []


def test_a_batch_of_results_applies_each_and_fences_the_stale_one() -> None:
    from streams.reports import result_item

    p = Partition(T0 + 30 * SEC)
    p.create("a", cron="0 * * * *")
    p.create("b", cron="0 * * * *")
    d1, d2 = sorted(dispatches(p.tick(T0 + 60 * MIN)), key=lambda d: d.job_id)
    common = {"started_at_ms": p.now, "finished_at_ms": p.now, "status_code": 200,
              "output": None}

    def item(d: Dispatch, token: int) -> Record:
        return result_item("kron.executions.ExecutionSucceeded", {
            "exec_id": d.exec_id, "job_id": d.job_id, "scheduled_for_ms": d.scheduled_for_ms,
            "attempt": d.attempt, "fencing_token": token, **common})

    batch = {"envelope": {"event_id": "batch-1", "event_type": "execution.attempts_finished",
                          "schema_version": 1, "occurred_at_ms": p.now, "tenant": "",
                          "causation_id": None, "correlation_id": None, "producer": "w"},
             "results": [item(d1, d1.fencing_token), item(d2, d2.fencing_token + 7)]}
    p.core.on_report("kron.executions.AttemptsFinished", batch, p._ctx())
    assert p.ex("a", d1.scheduled_for_ms)["state"] == "succeeded"
    assert p.ex("b", d2.scheduled_for_ms)["state"] == "running"  # a stale token: fenced
    assert p.core.stale_rejected == 1


# --- fire-ahead ------------------------------------------------------------------------------

T0 = utc(2026, 1, 5, 12, 0, 0)


def _dispatches(effects: list[Effect]) -> list[Dispatch]:
    return [e for e in effects if isinstance(e, Dispatch)]


def test_fire_ahead_decides_one_offs_and_allow_jobs_early_and_holds_the_call() -> None:
    p = Partition(T0 + 500, fire_ahead_ms=3 * SEC)
    p.create("once", run_at_ms=T0 + 2 * SEC)
    p.create("every", cron="*/1 * * * * *", tz="UTC", overlap="allow", lease_s=60.0)
    p.create("skip", cron="*/1 * * * * *", tz="UTC", overlap="skip_if_running")
    p.create("far", run_at_ms=T0 + 5 * SEC)
    ds = _dispatches(p.tick())
    by_slot = sorted((d.job_id, d.scheduled_for_ms - T0) for d in ds)
    # The cron's next slot (T0+1s) was armed by the create; deciding it arms T0+2s, which
    # the next tick decides: one slot per job per tick.
    assert by_slot == [("every", 1 * SEC), ("once", 2 * SEC)]
    for d in ds:
        assert d.not_before_ms == d.scheduled_for_ms > p.now
        ex = p.ex(d.job_id, d.scheduled_for_ms)
        assert ex["state"] == "running"
        assert ex["attempts"][0]["started_at_ms"] == d.not_before_ms
        # The lease counts from the due time.
        assert ex["lease_until_ms"] == d.not_before_ms + int(d.lease_s * SEC)
    assert {d.job_id: d.lease_s for d in ds} == {"every": 60.0, "once": 10.0}
    assert p.job("once")["status"] == "completed"
    # skip_if_running judges `running` at the due time: never decided early.
    assert not p.execs("skip")
    assert [d.scheduled_for_ms - T0 for d in _dispatches(p.tick())] == [2 * SEC]
    assert [d.scheduled_for_ms - T0 for d in _dispatches(p.tick())] == [3 * SEC]
    assert _dispatches(p.tick()) == []  # T0+4s is beyond the window (T0+3.5s)
    # At the due time, the other policy fires as always, with no hold.
    late = _dispatches(p.tick(T0 + 1 * SEC))
    assert [(d.job_id, d.not_before_ms) for d in late if d.job_id == "skip"] == [("skip", 0)]


def test_fire_ahead_off_decides_nothing_early() -> None:
    p = Partition(T0)
    p.create("once", run_at_ms=T0 + 2 * SEC)
    assert _dispatches(p.tick()) == []
    [d] = _dispatches(p.tick(T0 + 2 * SEC))
    assert d.not_before_ms == 0


def test_a_pause_inside_the_window_cancels_the_slots_decided_early() -> None:
    p = Partition(T0 + 500, fire_ahead_ms=3 * SEC)
    p.create("once", run_at_ms=T0 + 2 * SEC)
    p.create("every", cron="*/1 * * * * *", tz="UTC", overlap="allow")
    p.tick()
    p.tick()
    early = {(e["job_id"], e["scheduled_for_ms"] - T0) for e in p.store.executions.values()}
    assert early == {("once", 2 * SEC), ("every", 1 * SEC), ("every", 2 * SEC)}
    p.now = T0 + 1500  # every@1s is due and (as far as the core knows) called: it stays
    effects = p.command("PauseJob", "every") + p.command("PauseJob", "once")
    cancelled = sorted(c.exec_id for c in effects if isinstance(c, Cancel))
    assert cancelled == sorted([exec_id("every", T0 + 2 * SEC), exec_id("once", T0 + 2 * SEC)])
    for job_id, slot in (("every", 2 * SEC), ("once", 2 * SEC)):
        ex = p.ex(job_id, T0 + slot)
        assert ex["state"] == "cancelled" and ex["reason"] == "job paused before the slot was due"
    assert p.ex("every", T0 + 1 * SEC)["state"] == "running"
    assert p.job("every")["status"] == "paused"
    assert p.job("once")["status"] == "paused"
    # Paused: nothing more is decided early, and the armed slot is skipped at its time.
    assert _dispatches(p.tick()) == []
    p.tick(T0 + 3 * SEC)
    assert p.ex("every", T0 + 3 * SEC)["state"] == "skipped"
    # Resumed, the once-job has nothing left to run: its slot was settled by the pause.
    p.command("ResumeJob", "once")
    assert p.job("once")["status"] == "completed"


def test_a_delete_inside_the_window_cancels_the_slot_decided_early() -> None:
    p = Partition(T0, fire_ahead_ms=3 * SEC)
    p.create("once", run_at_ms=T0 + 2 * SEC)
    [d] = _dispatches(p.tick())
    effects = p.command("DeleteJob", "once")
    assert [c.exec_id for c in effects if isinstance(c, Cancel)] == [d.exec_id]
    assert p.ex("once", T0 + 2 * SEC)["state"] == "cancelled"
    # The cancelled attempt's late word (had it been called) is fenced.
    p.now = T0 + 2 * SEC
    assert p.report(d, "success") == []
    assert p.ex("once", T0 + 2 * SEC)["state"] == "cancelled"


def test_a_slot_decided_early_whose_owner_died_is_retried_at_its_due_time() -> None:
    p = Partition(T0, fire_ahead_ms=3 * SEC)
    p.create("once", run_at_ms=T0 + 2 * SEC, retry={"max_attempts": 3, "backoff": "fixed",
                                                    "base_s": 0.5, "max_s": 0.5})
    [d] = _dispatches(p.tick())
    # The owner died before the due time; the next owner only has the durable state.
    p.new_owner(epoch=2, worker="w2")
    assert _dispatches(p.tick(T0 + 2 * SEC - 1)) == []
    p.tick(T0 + 2 * SEC)
    # Not at its lease's end (60 s on): at the due time, as a lapsed lease.
    ex = p.ex("once", T0 + 2 * SEC)
    assert ex["state"] == "retry_pending" and ex["attempts"][0]["outcome"] == "lease_expired"
    assert T0 + 2 * SEC <= ex["retry_at_ms"] <= T0 + 2 * SEC + 500
    [again] = _dispatches(p.tick(ex["retry_at_ms"]))
    # A new attempt and token: the old owner may have called attempt 1 as it died.
    assert (again.exec_id, again.attempt, again.fencing_token) == (d.exec_id, 2, 2)
    assert again.not_before_ms == 0
    p.report(again, "success")
    assert p.ex("once", T0 + 2 * SEC)["state"] == "succeeded"
    # Its HELD timer is gone: nothing fails it twice.
    assert not [k for k in p.store.timers if decode_timer_key(k).kind == TimerKind.HELD]


def test_a_takeover_after_the_due_time_retries_the_held_slots_at_its_first_tick() -> None:
    p = Partition(T0 + 500, fire_ahead_ms=3 * SEC)
    p.create("every", cron="*/1 * * * * *", tz="UTC", overlap="allow", lease_s=60.0,
             retry={"max_attempts": 1})
    held = _dispatches(p.tick()) + _dispatches(p.tick())
    assert [d.scheduled_for_ms - T0 for d in held] == [1 * SEC, 2 * SEC]
    p.new_owner(epoch=5, worker="w2")
    p.tick(T0 + 12 * SEC)  # the session timeout passed before the group moved it
    for d in held:  # max_attempts 1: failed now, not 60 s from now
        ex = p.ex("every", d.scheduled_for_ms)
        assert ex["state"] == "failed" and ex["attempts"][0]["outcome"] == "lease_expired"


def test_the_process_that_decided_a_slot_ahead_adds_nothing_at_its_due_time() -> None:
    p = Partition(T0, fire_ahead_ms=3 * SEC)
    p.create("once", run_at_ms=T0 + 2 * SEC)
    [d] = _dispatches(p.tick())
    held = [k for k in p.store.timers if decode_timer_key(k).kind == TimerKind.HELD]
    assert len(held) == 1 and decode_timer_key(held[0]).due_ms == d.not_before_ms
    # A rebalance kept the partition in this process (a new epoch): it still holds the
    # call, so the tick at the due time only drops the HELD timer.
    p.epoch = 7
    assert _dispatches(p.tick(T0 + 2 * SEC)) == []
    assert not [k for k in p.store.timers if decode_timer_key(k).kind == TimerKind.HELD]
    assert p.ex("once", T0 + 2 * SEC)["state"] == "running"


def test_a_call_stuck_at_its_due_time_is_handed_over_if_its_process_dies_holding_it() -> None:
    """At the due time the process that decided the slot still holds its call, but the
    call waits (a broker away: the start's acknowledgement, the owner's lease): the HELD
    timer is written again HELD_RECHECK_MS on, so a next owner hands the slot over then
    (not at its lease's end, 60 s on); while the call goes out, nothing is written."""
    p = Partition(T0, fire_ahead_ms=3 * SEC)
    p.create("once", run_at_ms=T0 + 2 * SEC, lease_s=60.0,
             retry={"max_attempts": 3, "backoff": "fixed", "base_s": 0.5, "max_s": 0.5})
    p.create("sent", run_at_ms=T0 + 2 * SEC, lease_s=60.0)
    ds = {d.job_id: d for d in _dispatches(p.tick())}
    stuck = {(ds["once"].exec_id, 1)}
    p.core = PartitionCore(p.store)

    def tick(at_ms: int) -> list[Effect]:
        p.now = at_ms
        ctx = p._ctx()
        ctx.stuck = lambda ex_id, attempt: (ex_id, attempt) in stuck
        effects, _ = p.core.on_tick(ctx)
        return effects

    assert _dispatches(tick(T0 + 2 * SEC)) == []

    def held() -> list[tuple[int, list[Any]]]:
        return [(decode_timer_key(k).due_ms, orjson.loads(v)["h"])
                for k, v in p.store.timers.items()
                if decode_timer_key(k).kind == TimerKind.HELD]

    recheck = T0 + 2 * SEC + core_module.HELD_RECHECK_MS
    assert held() == [(recheck, [[ds["once"].exec_id, 1, T0 + 2 * SEC]])]
    tick(recheck)  # still stuck: again, still only the one that is
    assert held() == [(recheck + core_module.HELD_RECHECK_MS,
                       [[ds["once"].exec_id, 1, T0 + 2 * SEC]])]
    assert p.ex("once", T0 + 2 * SEC)["state"] == "running"
    # The process died holding it: the next owner fails it then, and retries it.
    p.new_owner(epoch=2, worker="w2")
    p.tick(recheck + core_module.HELD_RECHECK_MS)
    ex = p.ex("once", T0 + 2 * SEC)
    assert ex["state"] == "retry_pending" and ex["attempts"][0]["outcome"] == "lease_expired"
    assert p.ex("sent", T0 + 2 * SEC)["state"] == "running"  # its call went out: not ours
    assert held() == []


def test_a_cancelled_or_finished_held_slot_is_left_alone_by_the_next_owner() -> None:
    p = Partition(T0, fire_ahead_ms=3 * SEC)
    for job_id in ("once", "gone", "done"):
        p.create(job_id, run_at_ms=T0 + 2 * SEC)
    ds = {d.job_id: d for d in _dispatches(p.tick())}
    p.command("DeleteJob", "gone")
    p.now = T0 + 2 * SEC
    p.report(ds["done"], "success")
    p.new_owner(epoch=2, worker="w2")
    p.tick(T0 + 2 * SEC + 5)
    states = {j: p.ex(j, T0 + 2 * SEC)["state"] for j in ds}
    assert states == {"once": "retry_pending", "gone": "cancelled", "done": "succeeded"}


def test_a_pause_stamped_before_a_slot_that_already_fired_does_not_cancel_it() -> None:
    """A command's time is when the API accepted it; it may be processed after the tick
    that fired the slot at its due time. Only a slot decided ahead is cancelled."""
    p = Partition(T0 + 500)
    p.create("once", run_at_ms=T0 + 2 * SEC)
    [d] = _dispatches(p.tick(T0 + 2 * SEC))
    p.now = T0 + 2 * SEC - 50
    effects = p.command("PauseJob", "once")
    assert not [e for e in effects if isinstance(e, Cancel)]
    assert p.ex("once", T0 + 2 * SEC)["state"] == "running"
    p.now = T0 + 2 * SEC + 10
    p.report(d, "success")
    assert p.ex("once", T0 + 2 * SEC)["state"] == "succeeded"


def test_a_tick_deciding_ahead_in_chunks_resumes_where_the_last_chunk_stopped() -> None:
    """The worker applies a tick as chunks of on_tick over one Context. In RocksDB the
    slots an earlier chunk decided are tombstones; a chunk that scanned the window from
    `now` again would walk them all (quadratic in a spike)."""
    p = Partition(T0, fire_ahead_ms=3 * SEC)
    for i in range(50):
        p.create(f"once-{i}", run_at_ms=T0 + 2 * SEC + i)
    starts: list[dict[bytes, bytes]] = []
    lanes_in = p.store.lanes_in

    def spy(after_ms: int, until_ms: int, start: dict[bytes, bytes] | None = None) -> Any:
        starts.append(dict(start or {}))
        return lanes_in(after_ms, until_ms, start)

    ctx = p._ctx()
    decided: list[Dispatch] = []
    with mock.patch.object(p.store, "lanes_in", spy):
        while True:
            effects, more = p.core.on_tick(ctx, limit=8)
            ctx.effects = []
            decided += _dispatches(effects)
            if not more:
                break
    assert sorted(d.job_id for d in decided) == sorted(f"once-{i}" for i in range(50))
    # In each lane (the tenant's, and the system lane its HELD timers go to), each chunk
    # starts past the keys the one before looked at.
    assert len(starts) == 7 and starts[0] == {}, starts
    tenant = tenant_lane("acme", Tier.NORMAL).prefix
    for lane in {lane for s in starts for lane in s}:
        lowers = [s[lane] for s in starts if lane in s]
        assert lowers == sorted(set(lowers)), lowers
    assert len([s for s in starts if tenant in s]) == 6
