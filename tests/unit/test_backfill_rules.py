"""Backfill in the partition core (in-memory store): every slot of a range is armed, page by
page, never cut short; `rerun` runs a failed, missed or skipped slot again as a new attempt of
the same execution, and without it a recorded slot stays as it was. Also the schema (v1 reads
as v2 with rerun false), the API's counts, the stores' terminal memo and the audit."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest

from api.backfill import counts
from api.problems import Problem
from api.projection import Batch, Views, apply_execution
from replay.audit import audit
from schemas import names
from schemas.codec import Codec
from schemas.registry import default_registry
from streams.domain.ids import exec_id
from streams.domain.timer import TimerKind, decode_timer_key
from streams.engine import backfill
from streams.engine import core as core_module
from streams.engine.core import BACKFILL_PAGE_REF, Dispatch, Effect, Emit, PartitionCore
from streams.engine.faust_store import TerminalMemo
from streams.engine.store import MemoryStore, Record, copy_record
from tests.golden.make_golden import SAMPLES
from tests.unit.test_core_scenarios import MIN, SEC, Partition, dispatches, utc

T0 = utc(2026, 6, 1)
DAY = 86_400 * SEC


def backfill_timers(p: Partition, job_id: str) -> list[tuple[int, str]]:
    return [(due, ref) for due, kind, ref in p.timers(job_id)
            if kind == TimerKind.FIRE and ref]


def drain(p: Partition, job_id: str, *, step_ms: int = SEC, succeed: bool = True,
          limit: int = 100_000) -> tuple[list[Dispatch], int]:
    """Tick until the job has no backfill timer left, answering each call at once.
    Returns the calls and the most timers the partition held after a tick."""
    calls: list[Dispatch] = []
    most = len(p.store.timers)
    for _ in range(limit):
        started = dispatches(p.tick(p.now + step_ms))
        for d in started:
            calls.append(d)
            if succeed:
                p.report(d, "success")
        most = max(most, len(p.store.timers))
        if not started and not backfill_timers(p, job_id):
            return calls, most
    raise AssertionError("the backfill never drained")


class QuickStore(MemoryStore):
    """MemoryStore without its per-write Avro and snapshot checks (the other tests make
    those), for a backfill of 11,520 slots."""

    def _read(self, kind: str, table: dict[str, Record], key: str) -> Record | None:
        record = table.get(key)
        return None if record is None else copy_record(record)

    def _write(self, kind: str, table: dict[str, Record], key: str, record: Record,
               schema: str) -> None:
        table[key] = copy_record(record)


def backfill_cmd(p: Partition, job_id: str, from_ms: int, to_ms: int, **fields: Any
                 ) -> list[Effect]:
    fields.setdefault("max_per_s", 1000.0)
    return p.command("BackfillJob", job_id, from_ms=from_ms, to_ms=to_ms, **fields)


# --- over the page: every slot, page by page -------------------------------------------------


def test_eight_days_of_a_per_minute_cron_runs_every_slot_page_by_page() -> None:
    """The issue's case: 11,520 slots, more than a page (10,000). Every one runs once, and
    the job never holds more than a page of backfill timers (plus the page timer)."""
    assert backfill.BACKFILL_PAGE == core_module.MAX_LATE_SLOTS
    now = T0 + 8 * DAY
    p = Partition(now)
    p.store = QuickStore()
    p.core = PartitionCore(p.store)
    p.create("j", cron="* * * * *", lease_s=5.0)
    backfill_cmd(p, "j", T0, now - MIN)
    armed = backfill_timers(p, "j")
    assert len(armed) == backfill.BACKFILL_PAGE + 1
    page = [ref for _, ref in armed if ref.startswith(BACKFILL_PAGE_REF)]
    assert len(page) == 1
    # Ticks 20 ms apart, as a busy ticker's: 20 calls a tick at 1,000/s.
    calls, most = drain(p, "j", step_ms=20)
    # A page, its page timer, the job's own timer and the lease timers of the last 5 s.
    assert most <= backfill.BACKFILL_PAGE + 2 + 5_000 // 20 + 1
    slots = [d.scheduled_for_ms for d in calls if d.scheduled_for_ms < now]
    assert len(slots) == 8 * 24 * 60 == len(set(slots))
    assert sorted(slots) == [T0 + i * MIN for i in range(8 * 24 * 60)]
    recorded = [e for e in p.execs("j") if e["trigger"] == "backfill"]
    assert len(recorded) == 8 * 24 * 60
    assert {e["state"] for e in recorded} == {"succeeded"}


@pytest.fixture
def small_page(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(backfill, "BACKFILL_PAGE", 4)
    return 4


def test_the_next_page_is_armed_when_the_current_one_has_drained(small_page: int) -> None:
    now = T0 + DAY
    p = Partition(now)
    p.create("j", cron="* * * * *")
    backfill_cmd(p, "j", T0, T0 + 9 * MIN, max_per_s=2.0)  # 10 slots: pages of 4, 4, 2
    assert backfill_timers(p, "j") == [
        *[(now + i * 500, f"backfill:{T0 + i * MIN}") for i in range(4)],
        (now + 4 * 500, f"{BACKFILL_PAGE_REF}:cmd-3")]
    p.tick(now + 3 * 500)  # the first page's four have fired; the page timer is not due
    assert backfill_timers(p, "j") == [(now + 4 * 500, f"{BACKFILL_PAGE_REF}:cmd-3")]
    p.tick(now + 4 * 500 + 100)  # it arms the next four from then, and the rest after them
    t = now + 4 * 500 + 100
    assert backfill_timers(p, "j") == [
        *[(t + i * 500, f"backfill:{T0 + (4 + i) * MIN}") for i in range(4)],
        (t + 4 * 500, f"{BACKFILL_PAGE_REF}:cmd-3")]
    drain(p, "j", step_ms=500)
    assert sorted(e["scheduled_for_ms"] for e in p.execs("j") if e["trigger"] == "backfill") \
        == [T0 + i * MIN for i in range(10)]


def test_a_page_boundary_exactly_at_the_end_leaves_no_page_timer(small_page: int) -> None:
    now = T0 + DAY
    p = Partition(now)
    p.create("j", cron="* * * * *")
    backfill_cmd(p, "j", T0, T0 + 3 * MIN)  # exactly one page
    assert [ref for _, ref in backfill_timers(p, "j")] == [
        f"backfill:{T0 + i * MIN}" for i in range(4)]


def test_a_backfill_over_pages_of_a_deleted_job_records_every_slot(small_page: int) -> None:
    """The job is deleted while the backfill pages: each remaining slot is still recorded
    (skipped, "job deleted"), none dropped."""
    now = T0 + DAY
    p = Partition(now)
    p.create("j", cron="* * * * *")
    backfill_cmd(p, "j", T0, T0 + 10 * MIN, max_per_s=1.0)
    drain_once = dispatches(p.tick(now + 1 * SEC))
    for d in drain_once:
        p.report(d, "success")
    p.command("DeleteJob", "j")
    drain(p, "j")
    by_slot = {e["scheduled_for_ms"]: e for e in p.execs("j") if e["scheduled_for_ms"] < now}
    assert sorted(by_slot) == [T0 + i * MIN for i in range(11)]
    assert [by_slot[T0 + i * MIN]["state"] for i in range(2)] == ["succeeded"] * 2
    assert {by_slot[T0 + i * MIN]["reason"] for i in range(2, 11)} == {"job deleted"}


def test_a_redelivered_backfill_command_arms_nothing_twice(small_page: int) -> None:
    now = T0 + DAY
    p = Partition(now)
    p.create("j", cron="* * * * *")
    backfill_cmd(p, "j", T0, T0 + 9 * MIN, command_id="bf-1")
    before = dict(p.store.timers)
    backfill_cmd(p, "j", T0, T0 + 9 * MIN, command_id="bf-1")
    assert p.store.timers == before
    calls, _ = drain(p, "j")
    assert sorted(d.scheduled_for_ms for d in calls if d.scheduled_for_ms < now) == [
        T0 + i * MIN for i in range(10)]


# --- rerun -------------------------------------------------------------------------------


def with_failed_slot(max_attempts: int = 1) -> tuple[Partition, int]:
    """A per-minute job whose slot at T0 + 1 min failed (all its attempts, 503); the slots
    before and after it succeeded."""
    p = Partition(T0 - 30 * SEC)
    p.create("j", cron="* * * * *", lease_s=600.0,
             retry={"max_attempts": max_attempts, "backoff": "fixed", "base_s": 1.0,
                    "max_s": 1.0})
    for minute in range(3):
        for d in dispatches(p.tick(T0 + minute * MIN)):
            p.report(d, "transient" if d.scheduled_for_ms == T0 + MIN else "success",
                     status_code=503)
        for _ in range(max_attempts - 1):
            for d in dispatches(p.tick(p.now + 2 * SEC)):
                p.report(d, "transient", status_code=503)
    failed = T0 + MIN
    assert p.ex("j", failed)["state"] == "failed"
    assert p.ex("j", failed)["attempt"] == max_attempts
    p.command("PauseJob", "j")  # its own later slots would only add noise
    return p, failed


def test_rerun_runs_a_failed_slot_again_as_a_new_attempt_of_the_same_execution() -> None:
    p, failed = with_failed_slot()
    before = p.ex("j", failed)
    backfill_cmd(p, "j", T0, T0 + 2 * MIN, rerun=True)
    calls, _ = drain(p, "j", succeed=False)
    assert [(d.exec_id, d.attempt, d.fencing_token) for d in calls] == [
        (before["exec_id"], 2, 2)]  # the succeeded slots around it are not run again
    during = p.ex("j", failed)
    assert during["state"] == "running" and during["envelope"]["event_type"] == \
        backfill.RERUN_STARTED
    assert during["trigger"] == before["trigger"] and during["reason"] is None
    assert during["exec_id"] in p.job("j")["running"]
    p.report(calls[0], "success")
    after = p.ex("j", failed)
    assert after["state"] == "succeeded" and after["attempt"] == 2
    assert [a["outcome"] for a in after["attempts"]] == ["transient", "succeeded"]
    # Listed once (`allow` keeps a finished run listed until it prunes the list).
    assert p.job("j")["running"].count(during["exec_id"]) == 1


def test_without_rerun_a_failed_slot_stays_as_it_was() -> None:
    p, failed = with_failed_slot()
    before = p.ex("j", failed)
    backfill_cmd(p, "j", T0, T0 + 2 * MIN)
    effects: list[Effect] = []
    for _ in range(5):
        effects += p.tick(p.now + SEC)
    assert dispatches(effects) == []
    assert p.ex("j", failed) == before
    suppressed = [e.record["exec_id"] for e in effects if isinstance(e, Emit)
                  and e.name == "kron.executions.TriggerSuppressed"]
    assert sorted(suppressed) == sorted(exec_id("j", T0 + m * MIN) for m in range(3))


def test_a_rerun_that_fails_is_retried_only_within_the_retry_policy() -> None:
    p, failed = with_failed_slot(max_attempts=2)  # failed at attempt 2 of 2
    backfill_cmd(p, "j", failed, failed, rerun=True)
    [call] = dispatches(p.tick(p.now + SEC))
    assert call.attempt == 3
    p.report(call, "transient", status_code=503)
    assert p.ex("j", failed)["state"] == "failed"  # one more attempt, no retries after it


def test_rerun_of_a_missed_slot_gets_the_full_retry_policy() -> None:
    p = Partition(T0 - 30 * SEC)
    p.create("j", cron="* * * * *", misfire={"kind": "skip_if_late_by", "late_by_s": 1.0},
             retry={"max_attempts": 2, "backoff": "fixed", "base_s": 1.0, "max_s": 1.0})
    p.tick(T0 + 10 * SEC)  # found 10 s late: missed
    missed = p.ex("j", T0)
    assert missed["state"] == "missed" and missed["attempt"] == 0
    p.command("PauseJob", "j")
    backfill_cmd(p, "j", T0, T0, rerun=True)
    [call] = dispatches(p.tick(p.now + SEC))
    assert (call.exec_id, call.attempt) == (missed["exec_id"], 1)
    p.report(call, "transient", status_code=503)
    assert p.ex("j", T0)["state"] == "retry_pending"
    [retry] = dispatches(p.tick(p.now + 2 * SEC))
    assert retry.attempt == 2


def test_a_slot_running_when_the_backfill_arrives_is_not_rerun() -> None:
    p = Partition(T0 - 30 * SEC)
    p.create("j", cron="* * * * *", lease_s=600.0, retry={"max_attempts": 1})
    [live] = dispatches(p.tick(T0))
    p.command("PauseJob", "j")
    backfill_cmd(p, "j", T0, T0, rerun=True, max_per_s=0.5)
    p.report(live, "permanent", status_code=400)  # it fails before the backfill's turn comes
    assert dispatches(p.tick(p.now + 5 * SEC)) == []
    assert p.ex("j", T0)["state"] == "failed" and p.ex("j", T0)["attempt"] == 1


def test_a_rerun_timer_fired_twice_runs_the_slot_once() -> None:
    """A tick redelivered after a crash fires the same paced timer again: the rerun names
    the attempt it reruns, so the execution (failed again meanwhile) is not run a third time."""
    p, failed = with_failed_slot()
    backfill_cmd(p, "j", failed, failed, rerun=True)
    timers = dict(p.store.timers)
    [call] = dispatches(p.tick(p.now + SEC))
    p.report(call, "permanent", status_code=400)
    assert p.ex("j", failed)["attempt"] == 2
    for key, value in timers.items():  # the fired timer's delete was lost
        if decode_timer_key(key).ref.startswith("backfill:"):
            p.store.put_timer(key, value)
    assert dispatches(p.tick(p.now + SEC)) == []
    assert p.ex("j", failed)["attempt"] == 2


def test_reruns_stop_at_the_attempt_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backfill, "MAX_ATTEMPTS_WITH_RERUNS", 2)
    p, failed = with_failed_slot()
    for expected in ([2], []):
        backfill_cmd(p, "j", failed, failed, rerun=True)
        calls = dispatches(p.tick(p.now + SEC))
        assert [d.attempt for d in calls] == expected
        for d in calls:
            p.report(d, "permanent", status_code=400)
    assert p.ex("j", failed)["attempt"] == 2


def test_cancelled_and_succeeded_slots_are_not_rerun() -> None:
    ex = {"state": "cancelled", "attempt": 1}
    assert not backfill.may_rerun(ex)
    assert not backfill.may_rerun({**ex, "state": "succeeded"})
    assert not backfill.may_rerun({**ex, "state": "running"})
    assert not backfill.may_rerun({**ex, "state": "retry_pending"})
    assert all(backfill.may_rerun({**ex, "state": s}) for s in ("failed", "missed", "skipped"))
    assert not backfill.may_rerun({"state": "failed",
                                   "attempt": backfill.MAX_ATTEMPTS_WITH_RERUNS})


# --- the terminal memo after a rerun ---------------------------------------------------------


def test_the_terminal_memo_answers_per_attempt() -> None:
    memo = TerminalMemo()
    memo.add("e", 1)
    assert "e" in memo and memo.ended_at("e") == 1
    memo.discard("e")
    assert "e" not in memo and memo.ended_at("e") is None
    memo.add("e")  # attempt unknown: terminal for good, as before reruns
    assert memo.ended_at("e") is not None and memo.ended_at("e") > 10**9


def test_a_rerun_attempt_is_watched_by_its_lease() -> None:
    """The rerun's attempt is not taken for the finished one: its lease expires it."""
    p, failed = with_failed_slot()
    assert p.store.known_terminal(exec_id("j", failed), 1)
    backfill_cmd(p, "j", failed, failed, rerun=True)
    [call] = dispatches(p.tick(p.now + SEC))
    assert not p.store.known_terminal(call.exec_id, 2)
    assert not p.store.known_terminal(call.exec_id)
    p.tick(p.now + 601 * SEC)  # the worker died: nothing reports
    ex = p.ex("j", failed)
    assert ex["state"] == "failed" and ex["attempts"][-1]["outcome"] == "lease_expired"


# --- the schema ------------------------------------------------------------------------------


def test_a_v1_backfill_reads_as_one_that_leaves_recorded_slots() -> None:
    codec = Codec(default_registry())
    v1 = SAMPLES[(names.BACKFILL_JOB, 1)][0]
    decoded = codec.decode(codec.encode(names.BACKFILL_JOB, v1, version=1))
    assert (decoded.version, decoded.reader_version) == (1, 2)
    assert decoded.record["rerun"] is False
    assert decoded.record["to_ms"] == v1["to_ms"]
    # A producer that leaves `rerun` out writes the default.
    assert codec.decode(codec.encode(names.BACKFILL_JOB, v1)).record["rerun"] is False


# --- the API's counts ------------------------------------------------------------------------


def project(views: Views, store: MemoryStore) -> None:
    for kind, rec in store.log:
        if kind == "execution":
            batch = Batch(views)
            apply_execution(batch, rec, b"")
            batch.commit()


def test_the_api_counts_slots_armed_and_already_recorded(tmp_path: Path) -> None:
    p, _failed = with_failed_slot()
    views = Views(tmp_path / "views")
    try:
        project(views, p.store)
        job_spec = p.job("j")["spec"]
        rng = {"from_ms": T0 - 2 * MIN, "to_ms": T0 + 2 * MIN}
        assert counts(views, job_spec, "j", rerun=False, **rng) == {
            "slots": 5, "armed": 2, "rerun": 0, "already_recorded": 3}
        assert counts(views, job_spec, "j", rerun=True, **rng) == {
            "slots": 5, "armed": 3, "rerun": 1, "already_recorded": 2}
        with pytest.raises(Problem) as err:
            counts(views, job_spec, "j", rerun=False, limit=4, **rng)
        assert err.value.status == 422 and err.value.extra == {"slots_at_least": 5,
                                                               "limit": 4}
        assert "more than 4 slots" in err.value.detail
    finally:
        views.close()


# --- the audit -------------------------------------------------------------------------------


def _records(store: MemoryStore) -> tuple[list[Record], list[Record]]:
    jobs = [copy.deepcopy(r) for k, r in store.log if k == "job"]
    execs = [copy.deepcopy(r) for k, r in store.log if k == "execution"]
    return jobs, execs


def test_the_audit_accepts_a_rerun_and_still_flags_a_terminal_run_started_again() -> None:
    p, failed = with_failed_slot()
    backfill_cmd(p, "j", failed, failed, rerun=True)
    [call] = dispatches(p.tick(p.now + SEC))
    p.report(call, "success")
    jobs, execs = _records(p.store)
    report = audit(jobs, execs, now_ms=p.now)
    assert report.ok, report.violations
    # The same start written as an ordinary start is a duplicate trigger.
    forged = [copy.deepcopy(r) for r in execs]
    for rec in forged:
        if rec["envelope"]["event_type"] == backfill.RERUN_STARTED:
            rec["envelope"]["event_type"] = "execution.started"
    kinds = [v.kind for v in audit(jobs, forged, now_ms=p.now).violations]
    assert "duplicate_trigger" in kinds


def test_the_paced_timers_carry_the_attempt_they_rerun() -> None:
    p, failed = with_failed_slot()
    backfill_cmd(p, "j", T0, T0 + 2 * MIN, rerun=True)
    values = {decode_timer_key(k).ref: orjson.loads(v) for k, v in p.store.timers.items()
              if decode_timer_key(k).ref.startswith("backfill:")}
    assert {ref: v.get("rr") for ref, v in values.items()} == {
        f"backfill:{T0}": None, f"backfill:{failed}": 1, f"backfill:{T0 + 2 * MIN}": None}
