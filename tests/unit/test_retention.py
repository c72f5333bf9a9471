"""History retention in the partition core (streams.engine.retention), over the MemoryStore:
an ended execution arms an EXPIRE timer its window later, which tombstones it; nothing
live goes; a redelivered timer changes nothing; and a slot whose record is gone is never
run again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from api.projection import Projector, Views, tenant_runs_prefix
from kron.settings import Settings
from replay.audit import TOMBSTONE, audit, tombstone
from schemas import codec, names
from streams.domain.ids import exec_id, task_exec_id
from streams.domain.timer import HOUSEKEEPING_LANE, TimerKind, decode_timer_key
from streams.engine import retention
from streams.engine.core import PartitionCore
from streams.engine.store import Record
from tests.unit.test_core_dag import DIAMOND, Dag, started
from tests.unit.test_core_scenarios import MIN, SEC, dispatches, utc

T0 = utc(2026, 11, 1, 9, 0)
HOUR = 60 * MIN
WINDOW = HOUR
SETTLE = min(retention.SETTLE_MS, WINDOW)


class Kept(Dag):
    """A partition owner whose core keeps history for WINDOW."""

    def __init__(self, now_ms: int, *, window_ms: int = WINDOW) -> None:
        super().__init__(now_ms)
        self.window_ms = window_ms
        self.core = PartitionCore(self.store, history_ms=window_ms)

    def new_owner(self, epoch: int, worker: str) -> None:
        super().new_owner(epoch, worker)
        self.core = PartitionCore(self.store, history_ms=self.window_ms)

    def expire_timers(self) -> list[tuple[int, list[str]]]:
        out = []
        for key, value in self.store.timers.items():
            tk = decode_timer_key(key)
            if tk.kind == TimerKind.EXPIRE:
                assert tk.lane == HOUSEKEEPING_LANE
                out.append((tk.due_ms, orjson.loads(value)["x"]))
        return sorted(out)

    def tombstones(self) -> list[str]:
        return [rec["exec_id"] for kind, rec in self.store.log if kind == "execution-tombstone"]


def run_once(p: Kept, job_id: str, **fields: Any) -> str:
    """A cron job's slot at p.now that succeeds a second later, then the job deleted (so
    later ticks fire nothing of it): the execution's id."""
    p.create(job_id, cron="*/10 * * * *", **fields)
    (d,) = dispatches(p.tick())
    p.now += SEC
    p.report(d, "success")
    p.command("DeleteJob", job_id)
    return d.exec_id


def test_an_ended_execution_arms_an_expire_timer_its_window_after_the_end() -> None:
    p = Kept(T0)
    ex_id = run_once(p, "j")
    assert p.expire_timers() == [(T0 + SEC + WINDOW, [ex_id])]


def test_a_running_execution_arms_nothing_and_retention_off_arms_nothing() -> None:
    p = Kept(T0)
    p.create("j", run_at_ms=T0)
    dispatches(p.tick())
    assert p.expire_timers() == []
    off = Dag(T0)
    off.create("j", run_at_ms=T0)
    (d,) = dispatches(off.tick())
    off.report(d, "success")
    assert not any(decode_timer_key(k).kind == TimerKind.EXPIRE for k in off.store.timers)


def test_the_tombstone_is_written_when_the_window_has_passed_and_not_before() -> None:
    p = Kept(T0)
    ex_id = run_once(p, "j")
    p.tick(T0 + WINDOW)  # a second early
    assert p.store.execution(ex_id) is not None and p.tombstones() == []
    p.tick(T0 + SEC + WINDOW)
    assert p.store.execution(ex_id) is None
    assert p.tombstones() == [ex_id]
    assert p.expire_timers() == []  # fired and deleted


def test_a_redelivered_expire_timer_is_a_no_op() -> None:
    p = Kept(T0)
    ex_id = run_once(p, "j")
    p.tick(T0 + SEC + WINDOW)
    log = len(p.store.log)
    retention.arm(p.store, p.now, [ex_id])  # the same timer again (a torn delete)
    p.tick(p.now + SEC)
    assert p.store.log[log:] == [] and p.expire_timers() == []


def test_an_execution_running_again_is_never_tombstoned() -> None:
    p = Kept(T0)
    p.create("j", cron="*/10 * * * *")
    (d,) = dispatches(p.tick())
    retention.arm(p.store, T0 + SEC, [d.exec_id])  # as if it had ended once before
    p.tick(T0 + 2 * SEC)
    assert p.store.execution(d.exec_id)["state"] == "running"
    assert p.tombstones() == [] and p.expire_timers() == []  # its end arms anew


def test_an_execution_rewritten_later_waits_for_its_last_write() -> None:
    p = Kept(T0)
    ex_id = run_once(p, "j")
    ex = p.store.execution(ex_id)
    ex["updated_at_ms"] = T0 + 30 * MIN  # a later write (a rerun's end, say)
    p.store.put_execution(ex)  # type: ignore[arg-type]
    p.tick(T0 + SEC + WINDOW)
    assert p.store.execution(ex_id) is not None
    assert p.expire_timers() == [(T0 + 30 * MIN + WINDOW, [ex_id])]
    p.tick(T0 + 30 * MIN + WINDOW)
    assert p.tombstones() == [ex_id]


def test_no_tombstone_before_the_leases_of_its_attempts_have_fired() -> None:
    # A window shorter than the lease: the first attempt's lease timer must find the
    # execution (or it would decide the slot again), so the tombstone waits for it.
    p = Kept(T0, window_ms=SEC)
    p.create("j", run_at_ms=T0, lease_s=60.0)
    (d,) = dispatches(p.tick())
    p.report(d, "success")
    ended = T0
    p.tick(ended + SEC)
    assert p.store.execution(d.exec_id) is not None
    keep_until = ended + 60 * SEC + retention.LEASE_SLACK_MS
    assert p.expire_timers() == [(keep_until, [d.exec_id])]
    # A one-off's run is its cursor slot, listed running: released first, then a settle.
    effects = p.tick(keep_until)
    assert p.tombstones() == []
    effects += p.tick(keep_until + SEC)
    assert p.tombstones() == [d.exec_id] and dispatches(effects) == []


def test_a_slot_whose_record_is_gone_is_not_run_again() -> None:
    # A cron job: its slots fire from next_run_at; after its old executions expired, a new
    # owner (nothing in memory), its leases, a pause and resume and an update run none again.
    p = Kept(T0)
    p.create("j", cron="*/10 * * * *")
    ran = []
    for n in range(3):
        (d,) = dispatches(p.tick(T0 + n * 10 * MIN))
        p.report(d, "success")
        ran.append(d.exec_id)
    p.new_owner(2, "w2")
    out: list[Any] = []
    t = T0 + 20 * MIN
    while t < T0 + 20 * MIN + WINDOW + 5 * MIN:
        t += MIN
        effects = p.tick(t)
        out += [d for d in dispatches(effects) if d.scheduled_for_ms < T0 + 30 * MIN]
        for d in dispatches(effects):
            p.report(d, "success")
    assert set(ran) <= set(p.tombstones())
    p.command("PauseJob", "j")
    p.command("ResumeJob", "j")
    out += dispatches(p.command("UpdateJob", "j", spec=p.job("j")["spec"],
                                expected_version=None))
    assert out == []
    assert all(p.store.execution(e) is None for e in ran)
    assert p.job("j")["cursor_ms"] >= T0 + 20 * MIN


def test_the_jobs_cursor_execution_listed_running_is_released_first() -> None:
    # An `allow` job does not write itself when an execution ends, so its last execution
    # stays in its durable `running` list; it is the cursor slot. Tombstoned while listed,
    # the next command would start it again (_restart_lost_start). The EXPIRE timer takes it
    # off the list (a job write) first, and tombstones it a settle later.
    p = Kept(T0)
    p.create("j", cron="0 9 1 1 *")  # yearly: the cursor stays on the slot that ran
    (d,) = dispatches(p.tick(utc(2027, 1, 1, 9, 0)))
    p.report(d, "success")
    ended = p.now
    assert d.exec_id in p.job("j")["running"]
    p.tick(ended + WINDOW)
    assert d.exec_id not in p.job("j")["running"] and p.tombstones() == []
    settle = min(retention.SETTLE_MS, WINDOW)
    assert p.expire_timers() == [(ended + WINDOW + settle, [d.exec_id])]
    p.tick(ended + WINDOW + settle)
    assert p.tombstones() == [d.exec_id]
    p.new_owner(2, "w2")
    effects = p.command("UpdateJob", "j", spec=p.job("j")["spec"], expected_version=None)
    assert dispatches(effects) == []
    assert p.store.execution(d.exec_id) is None


def test_a_dag_run_goes_first_and_its_task_instances_with_it() -> None:
    p = Kept(T0 - MIN)
    p.create_dag("j", DIAMOND, run_at_ms=T0)
    run_id = exec_id("j", T0)
    todo = started(p.tick(T0))
    while todo:
        nxt: dict[str, Any] = {}
        for d in todo.values():
            nxt |= started(p.report(d, "permanent" if d.task_id == "b" else "success",
                                    status_code=400))
        todo = nxt
    run = p.run("j", T0)
    assert run["state"] == "failed"
    tasks = [task_exec_id(run_id, t) for t in ("a", "b", "c", "cleanup")]
    # Only the run is listed: its task instances go with it.
    assert [ids for _, ids in p.expire_timers()] == [[run_id]]
    # A one-off's run is its cursor slot, still listed running: released, then a settle.
    p.tick(run["updated_at_ms"] + WINDOW)
    assert p.tombstones() == [] and run_id not in p.job("j")["running"]
    p.tick(run["updated_at_ms"] + WINDOW + SETTLE)
    assert p.tombstones()[0] == run_id
    assert sorted(p.tombstones()[1:]) == sorted(tasks)
    assert all(p.store.execution(t) is None for t in [run_id, *tasks])


def test_a_run_with_a_live_task_instance_waits() -> None:
    p = Kept(T0 - MIN)
    p.create_dag("j", DIAMOND, run_at_ms=T0)
    run_id = exec_id("j", T0)
    a = started(p.tick(T0))["a"]
    # Forced: the run recorded failed while task a runs (not a state the core makes).
    run: Record = p.run("j", T0)
    run["state"] = "failed"
    p.store.put_execution(run)  # type: ignore[arg-type]
    retention.arm(p.store, T0 + SEC, [run_id])
    p.tick(T0 + 2 * SEC)
    assert p.tombstones() == []
    assert p.store.execution(a.exec_id)["state"] == "running"


# --- the API's views ----------------------------------------------------------------------


def project(p: Kept, tmp_path: Path) -> Views:
    """The partition's whole changelog history folded into fresh views, as the projector
    folds kron.jobs and kron.executions (tombstones included)."""
    settings = Settings(topic_prefix="t", api_keys="")
    views = Views(tmp_path / "views")
    projector = Projector(settings, views)
    for offset, (kind, rec) in enumerate(p.store.log):
        if kind == "execution-tombstone":
            projector.apply("t.executions", 0, offset, None,
                            tombstone_of=rec["exec_id"].encode())
        elif kind == "execution":
            projector.apply("t.executions", 0, offset,
                            codec.encode_trusted(names.EXECUTION_STATE, rec))
        else:
            projector.apply("t.jobs", 0, offset, codec.encode_trusted(names.JOB_STATE, rec))
    return views


def test_the_views_drop_a_tombstoned_execution(tmp_path: Path) -> None:
    p = Kept(T0)
    p.create("j", cron="*/10 * * * *")
    ran = []
    for n in range(2):
        (d,) = dispatches(p.tick(T0 + n * 10 * MIN))
        p.report(d, "success")
        ran.append(d.exec_id)
    p.command("DeleteJob", "j")
    p.tick(T0 + SEC + WINDOW)  # the first has expired, the second not yet
    assert p.tombstones() == [ran[0]]
    views = project(p, tmp_path)
    try:
        assert views.execution(ran[0]) is None and views.execution(ran[1]) is not None
        runs = [key.decode().rsplit("/", 1)[-1] for key, _ in views.prefix(b"r/j/")]
        assert runs == [ran[1]]
        # GET /v1/runs' tenant indexes (all states, and by state) drop it too.
        for prefix in (tenant_runs_prefix("acme"), tenant_runs_prefix("acme", "succeeded")):
            listed = [key.decode().rsplit("/", 1)[-1] for key, _ in views.prefix(prefix)]
            assert listed == [ran[1]], prefix
        assert views.get(b"c/acme/succeeded") == 1
        assert views.job("j")["last_run"]["exec_id"] == ran[1]
    finally:
        views.close()


def test_a_tombstone_the_views_never_saw_changes_nothing(tmp_path: Path) -> None:
    views = Views(tmp_path / "views")
    try:
        projector = Projector(Settings(topic_prefix="t", api_keys=""), views)
        projector.apply("t.executions", 0, 0, None, tombstone_of=b"nope")
        assert set(views.dump()) == set()
    finally:
        views.close()


# --- kron replay audit ---------------------------------------------------------------------


def history(p: Kept, *, compacted: bool) -> tuple[list[Record], list[Record]]:
    """The jobs and executions the changelogs hold, in order; `compacted`: as compaction
    leaves them, with every record of a tombstoned execution (and its tombstone) gone."""
    gone = set(p.tombstones()) if compacted else set()
    jobs = [rec for kind, rec in p.store.log if kind == "job"]
    execs = [retention_marker(rec) if kind == "execution-tombstone" else rec
             for kind, rec in p.store.log if kind.startswith("execution")
             and rec["exec_id"] not in gone]
    return jobs, execs


def retention_marker(rec: Record) -> Record:
    return tombstone(rec["exec_id"])


def expired_history() -> Kept:
    """A cron job every 10 minutes for an hour, and a DAG run, all expired since."""
    p = Kept(T0 - MIN)
    p.create("j", cron="*/10 * * * *")
    p.create_dag("d", DIAMOND, run_at_ms=T0)
    t = T0
    while t <= T0 + 3 * HOUR:
        pending = dispatches(p.tick(t))
        while pending:  # every call succeeds; a DAG's next tasks are released by reports
            pending = [n for d in pending for n in dispatches(p.report(d, "success"))]
        t += 10 * MIN
    return p


def test_audit_passes_after_retention_with_the_window_and_fails_without() -> None:
    p = expired_history()
    assert len(p.tombstones()) > 10
    # Before compaction: the records are there, and the tombstones are read as such.
    jobs, execs = history(p, compacted=False)
    report = audit(jobs, execs, now_ms=p.now, history_ms=WINDOW)
    assert report.ok, report.violations
    # After compaction only the window's records are left: expired, not lost...
    jobs, execs = history(p, compacted=True)
    report = audit(jobs, execs, now_ms=p.now, history_ms=WINDOW)
    assert report.ok, report.violations
    records = {r["exec_id"]: r for kind, r in p.store.log if kind == "execution"}
    slots = [e for e in p.tombstones() if records[e]["run_id"] is None]  # tasks are not
    assert report.expired == len(slots)
    # ... which an audit that does not know the window reports as lost.
    blind = audit(jobs, execs, now_ms=p.now)
    assert blind.lost_slots


def test_a_record_after_its_tombstone_is_a_new_life_not_a_duplicate() -> None:
    p = Kept(T0)
    ex_id = run_once(p, "j")
    p.tick(T0 + SEC + WINDOW)
    jobs, execs = history(p, compacted=False)
    again = [r for r in execs if r.get("exec_id") == ex_id and TOMBSTONE not in r]
    report = audit(jobs, [*execs, *again], now_ms=p.now, history_ms=WINDOW)
    assert not report.duplicate_triggers, report.violations
