"""A simulated partition owner driving PartitionCore, checked against the design invariants.

One partition holds a handful of jobs (per-3-seconds, per-20-seconds, per-minute and daily
crons in UTC and in America/New_York across the 2026-03-08 spring-forward gap, and
one-offs) with random overlap, misfire, DST, jitter and retry policies, under a misfire grace
of 5 s or 60 s (a deployment setting). The simulation interleaves ticks with a monotonic
clock (including long jumps standing in for downtime, and ticks that may fire only a couple
of timers), attempt reports (success, 503, 400, timeout, heartbeat, or silence until the
lease runs out), executor heartbeats, stale reports from fenced attempts, duplicate
deliveries (of a recent event, or of an old report landing late), crash + restart of the
owner (a new core over the same store, next epoch, then redelivery of the uncommitted tail)
and create / update / pause / resume / trigger / delete commands. MAX_LATE_SLOTS is shrunk so
that downtime produces more late slots than one tick may enumerate.

The store round-trips every record through the Avro codec, exactly like the Faust store
(``TableStore``): the core gets fresh copies, so a mutation it forgets to write back is lost
here too, and ``store.log`` holds snapshots.

Invariants (checked after every step unless noted):

1. no duplicate trigger: one execution per (job, slot); a terminal execution never changes
   again; an (exec_id, attempt) is dispatched at most once ever, across restarts and
   redeliveries (a crash can lose a dispatch, which only lease expiry recovers, as attempt
   n + 1); a redelivered command or report changes nothing and starts nothing.
2. no lost slot: every slot of a job from its creation up to its armed slot has exactly one
   recorded outcome, or is pending in the queue (overlap=queue) or a paced misfire timer. An
   update first settles every slot the old spec owed by its time; a delete every slot due by
   its time. After the final drain nothing is due any more.
3. bounded attempts: attempt <= retry.max_attempts; a permanent (400) failure is final.
4. monotonic: a job's cursor never decreases; nor do an execution's attempt, fencing token,
   or the lease of its running attempt (a duplicated heartbeat must not shorten it).
5. a report with a stale fencing token changes no state at all.
6. timers: exactly one FIRE timer (ref "") per active/paused job with a next run, matching
   next_run_at_ms, the version and the jitter; none otherwise. A LEASE timer due no later
   than its lease lists every running attempt (finished ones are swept lazily when their
   timer fires), one RETRY timer per retry_pending one, none for finished ones; ``running``
   lists exactly the job's unfinished executions.
7. determinism (teardown): the recorded events (redeliveries included, with the worker and
   epoch of the owner that processed them) replayed by one core on a second fresh store
   produce the same log, effects and timers as the original run with its restarts.
8. a paused job starts no scheduled run (a manual trigger may).

At teardown the written history also passes ``replay.audit``, the offline auditor.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from unittest import mock

import orjson
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from replay.audit import audit
from schemas import codec
from streams.domain.errors import PermanentError
from streams.domain.ids import exec_id
from streams.domain.policies import Overlap
from streams.domain.schedule import OneOffSchedule, apply_jitter, bounded_next_slot
from streams.domain.timer import TimerKind, decode_timer_key
from streams.engine import core as core_module
from streams.engine.core import (
    MISFIRE_GRACE_MS,
    RUNNING_PRUNE_AT,
    Cancel,
    Context,
    Dispatch,
    Effect,
    PartitionCore,
)
from streams.engine.faust_store import RecordCache, job_encoder
from streams.engine.spec import JobPlan, plan_of
from streams.engine.store import TERMINAL, MemoryStore, Record
from streams.reports import result_item
from tests.support.stack import spec

# 01:40 EST on the day New York springs forward (02:00 EST -> 03:00 EDT at 07:00Z).
BASE_MS = int(datetime(2026, 3, 8, 6, 40, tzinfo=UTC).timestamp() * 1000)
TENANT = "acme"
NY = "America/New_York"
# (cron, timezone). A per-3-seconds cron stays in UTC: next_slot in the hour after a
# spring-forward walks back an hour of local times per call, too slow for many examples.
CRONS = (("*/3 * * * * *", "UTC"), ("*/20 * * * * *", "UTC"), ("*/20 * * * * *", NY),
         ("*/2 * * * *", "UTC"), ("*/2 * * * *", NY), ("*/15 * * * *", NY),
         ("0 * * * *", NY), ("30 2 * * *", NY), ("30 2 * * *", "UTC"))
OUTCOME_STATES = frozenset({"succeeded", "failed", "running", "retry_pending", "queued",
                            "skipped", "missed", "cancelled"})
LIVE = frozenset({"running", "retry_pending"})
# Small enough that a long jump of a per-second cron crosses it, so a tick meets more late
# slots than one event may enumerate.
SIM_MAX_LATE_SLOTS = 40
MAX_JOBS = 5
MAX_SIM_MS = 90 * 60_000


class CodecStore(MemoryStore):
    """MemoryStore with the value semantics of the Faust TableStore: a record is stored as
    its Avro bytes, so a record that does not fit its schema fails here as it would in
    production, and reads go through the TableStore's own RecordCache. At every read the
    cache's answer must equal a fresh decode of the stored bytes: a record the core changed
    in place after saving it, or one not in its canonical form, fails the example."""

    JOB = "kron.state.JobState"
    EXEC = "kron.executions.ExecutionState"

    def __init__(self) -> None:
        super().__init__()
        self._raw: dict[tuple[str, str], bytes] = {}
        self.caches = {"job": RecordCache(schema=self.JOB),
                       "execution": RecordCache(schema=self.EXEC)}

    # Stored records are never mutated (reads hand out copies), so the table and the log
    # may share them.
    def job(self, job_id: str) -> Record | None:
        return self._read("job", job_id)

    def put_job(self, job: Record, *, cache: bool = True) -> None:
        self._put("job", self.JOB, job["job_id"], job, self.jobs, cache=cache)

    def execution(self, exec_id: str) -> Record | None:
        return self._read("execution", exec_id)

    def put_execution(self, execution: Record) -> None:
        self._put("execution", self.EXEC, execution["exec_id"], execution, self.executions)

    def _read(self, kind: str, key: str) -> Record | None:
        raw = self._raw.get((kind, key))
        if raw is None:
            return None
        fresh = codec.decode(raw).record
        cached = self.caches[kind].get(key.encode(), raw)
        if cached is None:
            return fresh
        assert cached == fresh, f"the record cache's {kind} {key!r} differs from its bytes"
        return cached

    def _put(self, kind: str, schema: str, key: str, rec: Record,
             table: dict[str, Record], *, cache: bool = True) -> None:
        raw = codec.encode(schema, rec)
        if kind == "job":
            # What the TableStore writes: the spec's bytes reused while it is the same object.
            assert job_encoder().encode(rec) == raw, f"spliced bytes of job {key!r} differ"
        self._raw[(kind, key)] = raw
        table[key] = stored = codec.decode(raw).record
        self.log.append((kind, stored))
        if cache:
            self.caches[kind].put(key.encode(), raw, rec)


@dataclass(frozen=True, kw_only=True)
class Event:
    """One record of the partition's input stream, with the facts of the owner that
    processed it (its worker id and epoch go into the written state)."""

    kind: str  # "command" | "tick" | "report"
    name: str
    record: Record
    now_ms: int
    event_id: str
    worker: str
    epoch: int
    limit: int = 2000
    grace_ms: int = MISFIRE_GRACE_MS


def apply(core: PartitionCore, ev: Event) -> list[Effect] | PermanentError:
    # One process per worker name: a crash_and_restart starts another.
    ctx = Context(now_ms=ev.now_ms, causation_id=ev.event_id, worker=ev.worker,
                  epoch=ev.epoch, incarnation=ev.worker, misfire_grace_ms=ev.grace_ms,
                  fire_ahead_ms=ev.record.get("fire_ahead_ms", 0) if ev.kind == "tick" else 0)
    rec = copy.deepcopy(ev.record)
    try:
        if ev.kind == "command":
            return core.on_command(ev.name, rec, ctx)
        if ev.kind == "tick":
            effects, _more = core.on_tick(ctx, limit=ev.limit)
            return effects
        return core.on_report(ev.name, rec, ctx)
    except PermanentError as exc:  # the engine dead-letters it; state is untouched
        return exc


def snapshot(store: MemoryStore) -> tuple[Any, ...]:
    # Shallow is enough: CodecStore replaces records on write and never mutates them.
    return dict(store.jobs), dict(store.executions), dict(store.timers), len(store.log)


@dataclass(kw_only=True)
class JobInfo:
    plan: JobPlan
    max_attempts: int
    checked_ms: int  # every slot <= this one has a recorded execution
    deleted_at_ms: int | None = None


@dataclass(kw_only=True)
class ExecSeen:
    state: str
    attempt: int
    token: int
    lease: int | None
    created_at_ms: int
    key: tuple[str, int, bool]


@dataclass(kw_only=True)
class Outstanding:
    dispatch: Dispatch
    started_ms: int
    lease_s: float


def job_specs() -> st.SearchStrategy[dict[str, Any]]:
    schedule = st.one_of(
        st.sampled_from(CRONS).map(lambda c: ("cron", *c)),
        st.tuples(st.just("once"), st.integers(-20 * 60_000, 30 * 60_000), st.just("")),
    )
    misfire = st.one_of(
        st.just({"kind": "fire_once", "late_by_s": None, "fire_all_cap": 100}),
        st.sampled_from([0.0, 5.0, 30.0, 600.0]).map(
            lambda s: {"kind": "skip_if_late_by", "late_by_s": s, "fire_all_cap": 100}),
        st.sampled_from([1, 3, 100]).map(
            lambda c: {"kind": "fire_all", "late_by_s": None, "fire_all_cap": c}),
    )
    retry = st.builds(
        lambda n, base, backoff: {"max_attempts": n, "backoff": backoff, "base_s": base,
                                  "max_s": base * 8},
        st.integers(1, 4), st.sampled_from([0.2, 1.0, 5.0]),
        st.sampled_from(["exponential", "fixed"]))
    return st.fixed_dictionaries({
        "schedule": schedule,
        "overlap": st.sampled_from(["allow", "skip_if_running", "queue", "replace"]),
        "misfire": misfire,
        "retry": retry,
        "dst": st.sampled_from(["skip", "shift_forward"]),
        "lease_s": st.sampled_from([2.0, 10.0, 60.0]),
        "jitter_s": st.sampled_from([0.0, 0.0, 2.0]),
    })


advances = st.one_of(
    st.integers(0, 1_500),
    st.integers(0, 1_500),
    st.integers(0, 15_000),
    st.integers(0, 15_000),
    # downtime: the owner was gone, nothing ticked
    st.sampled_from([60_000, 7 * 60_000, 7 * 60_000, 25 * 60_000, 3_600_000]),
)
OUTCOMES = ("success", "503", "400", "timeout", "heartbeat", "silence")


class PartitionSim(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = CodecStore()
        self.core = PartitionCore(self.store)
        self.epoch = 1
        self.worker = "worker-1"
        self.now = BASE_MS
        self.seq = 0
        self.history: list[tuple[Event, list[Effect] | PermanentError]] = []
        self.jobs: dict[str, JobInfo] = {}
        self.outstanding: dict[tuple[str, int], Outstanding] = {}
        self.dispatched: set[tuple[str, int]] = set()
        self.all_dispatches: list[Outstanding] = []
        self.permanent: set[tuple[str, int]] = set()
        self.log_seen = 0
        self.cursors: dict[str, int | None] = {}
        self.execs: dict[str, ExecSeen] = {}
        self.slot_owner: dict[tuple[str, int], str] = {}
        self.live: set[str] = set()
        self.peak_live: dict[str, int] = {}
        self.grace_ms = MISFIRE_GRACE_MS
        self.fire_ahead_ms = 0

    @initialize(grace_s=st.sampled_from([5, 60]), ahead_s=st.sampled_from([0, 3, 10]))
    def deployment(self, grace_s: int, ahead_s: int) -> None:
        """The misfire grace is a deployment setting, the same for every owner; so is the
        fire-ahead window, which a ticker that is behind sends as 0."""
        self.grace_ms = grace_s * 1000
        self.fire_ahead_ms = ahead_s * 1000

    # --- driving -----------------------------------------------------------------------------

    def _id(self, prefix: str) -> str:
        self.seq += 1
        return f"{prefix}-{self.seq}"

    def _feed(self, kind: str, name: str, record: Record, *, limit: int = 2000
              ) -> list[Effect] | PermanentError:
        ev = Event(kind=kind, name=name, record=record, now_ms=self.now,
                   event_id=self._id("ev"), worker=self.worker, epoch=self.epoch, limit=limit,
                   grace_ms=self.grace_ms)
        return self._process(ev)

    def _process(self, ev: Event) -> list[Effect] | PermanentError:
        out = apply(self.core, ev)
        self.history.append((ev, out))
        if not isinstance(out, PermanentError):
            self._take_effects(out, ev)
        self._scan_log()
        return out

    def _redeliver(self, ev: Event, *, worker: str, epoch: int) -> None:
        again = Event(kind=ev.kind, name=ev.name, record=ev.record, now_ms=ev.now_ms,
                      event_id=ev.event_id, worker=worker, epoch=epoch, limit=ev.limit,
                      grace_ms=ev.grace_ms)
        before = snapshot(self.store)
        execs_before = set(self.store.executions)
        out = self._process(again)
        if ev.kind == "tick":
            return  # may legitimately fire timers armed since; checked by dispatch uniqueness
        effects = [] if isinstance(out, PermanentError) else out
        assert not [e for e in effects if isinstance(e, Dispatch)], "redelivery dispatched"
        assert set(self.store.executions) == execs_before, "redelivery created an execution"
        if ev.name != "kron.executions.ExecutionHeartbeat":
            assert snapshot(self.store) == before, f"redelivered {ev.name} changed state"

    def _take_effects(self, effects: list[Effect], ev: Event) -> None:
        for eff in effects:
            if isinstance(eff, Dispatch):
                key = (eff.exec_id, eff.attempt)
                assert key not in self.dispatched, f"attempt dispatched twice: {key}"
                assert (eff.exec_id, eff.attempt - 1) not in self.permanent, \
                    "a permanent failure was retried"
                assert eff.fencing_token == eff.attempt
                assert 1 <= eff.attempt <= self.jobs[eff.job_id].max_attempts
                if eff.attempt == 1 and self.store.executions[eff.exec_id]["trigger"] != "manual":
                    assert self.store.jobs[eff.job_id]["status"] != "paused", \
                        "a paused job started a scheduled run"
                if eff.not_before_ms:
                    self._check_early(eff, ev)
                self.dispatched.add(key)
                o = Outstanding(dispatch=eff, started_ms=max(self.now, eff.not_before_ms),
                                lease_s=eff.lease_s)
                self.outstanding[key] = o
                self.all_dispatches.append(o)
            elif isinstance(eff, Cancel):
                for key in [k for k in self.outstanding if k[0] == eff.exec_id]:
                    del self.outstanding[key]

    def _check_early(self, d: Dispatch, ev: Event) -> None:
        """A slot decided ahead: only a first scheduled attempt of a one-off or an `allow`
        job, within the window, held until its jittered due time, leased from then."""
        ex = self.store.executions[d.exec_id]
        job = self.store.jobs[d.job_id]
        plan = plan_of(job["spec"])
        assert ev.kind == "tick", ev
        assert ev.now_ms < d.not_before_ms <= ev.now_ms + ev.record["fire_ahead_ms"], (d, ev)
        assert d.attempt == 1 and ex["trigger"] == "schedule", d
        assert d.not_before_ms == ex["due_at_ms"] >= ex["scheduled_for_ms"], (d, ex)
        assert plan.overlap == Overlap.ALLOW or isinstance(plan.schedule, OneOffSchedule), plan
        assert ex["lease_until_ms"] == d.not_before_ms + int(d.lease_s * 1000)
        assert ex["attempts"][0]["started_at_ms"] == d.not_before_ms

    def _called(self) -> list[tuple[str, int]]:
        """Outstanding attempts the executor has called: none before its due time."""
        return sorted(k for k, o in self.outstanding.items()
                      if o.dispatch.not_before_ms <= self.now)

    # --- rules -------------------------------------------------------------------------------

    def _spec(self, p: dict[str, Any]) -> dict[str, Any]:
        kind, a, b = p["schedule"]
        sched = ({"cron": a, "tz": b} if kind == "cron" else {"run_at_ms": self.now + a})
        return spec(target={"url": "http://target.invalid/hook"}, **sched,
                    overlap=p["overlap"], misfire=p["misfire"], retry=p["retry"],
                    dst={"nonexistent": p["dst"]}, lease_s=p["lease_s"],
                    jitter_s=p["jitter_s"])

    @precondition(lambda self: len(self.jobs) < MAX_JOBS)
    @rule(p=job_specs())
    def create_job(self, p: dict[str, Any]) -> None:
        s = self._spec(p)
        job_id = f"job-{len(self.jobs)}"
        out = self._command("CreateJob", job_id, spec=s, idempotency_key=None)
        assert not isinstance(out, PermanentError), out
        assert not out
        job = self.store.jobs[job_id]
        self.jobs[job_id] = JobInfo(
            plan=plan_of(s), max_attempts=p["retry"]["max_attempts"],
            checked_ms=-1 if p["schedule"][0] == "once" else job["created_at_ms"] - 1)

    @precondition(lambda self: bool(self.jobs))
    @rule(data=st.data(), p=job_specs(), version=st.sampled_from(["none", "current", "stale"]))
    def update_job(self, data: st.DataObject, p: dict[str, Any], version: str) -> None:
        """A new schedule and policies (the retry policy stays: attempts are judged by it)."""
        job_id = data.draw(st.sampled_from(sorted(self.jobs)))
        info = self.jobs[job_id]
        before = self.store.jobs[job_id]
        p = {**p, "retry": before["spec"]["retry"]}
        expected = {"none": None, "current": before["version"],
                    "stale": before["version"] - 1}[version]
        snap = snapshot(self.store)
        out = self._command("UpdateJob", job_id, spec=self._spec(p), expected_version=expected)
        if isinstance(out, PermanentError):
            assert before["status"] == "deleted" or version == "stale"
            assert snapshot(self.store)[:3] == snap[:3]
            return
        # Every slot of the old spec due by now was settled before the switch ...
        self._check_slots(job_id, self._paced(), through_ms=self.now)
        # ... and the new spec's slots count from the update on (or, for a one-off, from
        # the cursor: its run_at may be in the past).
        job = self.store.jobs[job_id]
        after = job["cursor_ms"] if job["cursor_ms"] is not None else -1
        if p["schedule"][0] == "cron":
            after = max(after, self.now - 1)
        info.plan = plan_of(job["spec"])
        info.checked_ms = after

    def _command(self, kind: str, job_id: str, **fields: Any) -> list[Effect] | PermanentError:
        cid = self._id("cmd")
        record = {
            "envelope": {"event_id": cid, "event_type": f"job.{kind.lower()}_requested",
                         "schema_version": 1, "occurred_at_ms": self.now, "tenant": TENANT,
                         "causation_id": None, "correlation_id": None, "producer": "tests"},
            "command_id": cid, "job_id": job_id, **fields,
        }
        return self._feed("command", f"kron.commands.{kind}", record)

    @precondition(lambda self: bool(self.jobs))
    @rule(data=st.data(), kind=st.sampled_from(["PauseJob", "ResumeJob", "TriggerJob",
                                                "DeleteJob", "PauseJob", "ResumeJob",
                                                "TriggerJob"]))
    def job_command(self, data: st.DataObject, kind: str) -> None:
        self._job_command(data.draw(st.sampled_from(sorted(self.jobs))), kind)

    def _decided_early(self) -> list[str]:
        return sorted({o.dispatch.job_id for o in self.outstanding.values()
                       if o.dispatch.not_before_ms > self.now})

    @precondition(lambda self: bool(self._decided_early()))
    @rule(data=st.data(), kind=st.sampled_from(["PauseJob", "PauseJob", "DeleteJob"]),
          wait=st.integers(0, 3_000))
    def stop_inside_the_window(self, data: st.DataObject, kind: str, wait: int) -> None:
        """A pause or delete lands while a slot decided ahead waits for its due time."""
        job_id = data.draw(st.sampled_from(self._decided_early()))
        due = min(o.dispatch.not_before_ms for o in self.outstanding.values()
                  if o.dispatch.job_id == job_id and o.dispatch.not_before_ms > self.now)
        self.now = min(self.now + wait, due - 1)
        self._job_command(job_id, kind)

    def _job_command(self, job_id: str, kind: str) -> None:
        before = snapshot(self.store)
        out = self._command(kind, job_id)
        if isinstance(out, PermanentError):
            assert self.store.jobs[job_id]["status"] == "deleted"
            assert snapshot(self.store)[:3] == before[:3]
        elif kind == "DeleteJob":
            self.jobs[job_id].deleted_at_ms = self.now
        if kind in ("PauseJob", "DeleteJob") and not isinstance(out, PermanentError):
            # No slot decided ahead for it is still to be called: cancelled with the command.
            waiting = [k for k, o in self.outstanding.items()
                       if o.dispatch.job_id == job_id and o.dispatch.not_before_ms > self.now]
            assert not waiting, (kind, waiting)

    @rule(advance=advances, limit=st.sampled_from([2000, 2000, 2000, 2]),
          behind=st.sampled_from([False, False, False, True]))
    def tick(self, advance: int, limit: int, behind: bool) -> None:
        if self.now + advance > BASE_MS + MAX_SIM_MS:
            advance %= 60_000  # keep an example's slot count (and run time) bounded
        self.now += advance
        window = 0 if behind else self.fire_ahead_ms
        self._feed("tick", "kron.engine.Tick", {"now_ms": self.now, "fire_ahead_ms": window},
                   limit=limit)

    @precondition(lambda self: bool(self._called()))
    @rule(data=st.data(), outcome=st.sampled_from(OUTCOMES), retry_after=st.sampled_from(
        [None, None, 3.0]), batched=st.booleans())
    def report(self, data: st.DataObject, outcome: str, retry_after: float | None,
               batched: bool) -> None:
        key = data.draw(st.sampled_from(self._called()))
        o = self.outstanding[key]
        if outcome == "silence":  # the attempt died with its worker: only the lease tells
            del self.outstanding[key]
            return
        if outcome != "heartbeat":
            del self.outstanding[key]
        self._report(o, outcome, o.dispatch.fencing_token, retry_after, batched=batched)

    def _report(self, o: Outstanding, outcome: str, token: int,
                retry_after: float | None = None, *,
                batched: bool = False) -> list[Effect] | PermanentError:
        d = o.dispatch
        base = {"envelope": {"event_id": self._id("rep"), "event_type": "execution.report",
                             "schema_version": 1, "occurred_at_ms": self.now,
                             "tenant": TENANT, "causation_id": d.exec_id,
                             "correlation_id": d.job_id, "producer": "executor"},
                "exec_id": d.exec_id, "job_id": d.job_id,
                "scheduled_for_ms": d.scheduled_for_ms, "owner_epoch": 0,
                "attempt": d.attempt, "fencing_token": token}
        if outcome == "heartbeat":
            rec = {**base, "lease_until_ms": self.now + int(o.lease_s * 1000)}
            return self._feed("report", "kron.executions.ExecutionHeartbeat", rec)
        times = {"started_at_ms": o.started_ms, "finished_at_ms": self.now}
        if outcome == "success":
            rec = {**base, **times, "status_code": 200, "output": "ok"}
            return self._result("kron.executions.ExecutionSucceeded", rec, batched)
        error_class, status = {"503": ("transient", 503), "400": ("permanent", 400),
                               "timeout": ("timeout", None)}[outcome]
        rec = {**base, **times, "status_code": status, "error_class": error_class,
               "error": f"attempt failed: {outcome}", "final": False,
               "retry_after_s": retry_after if outcome == "503" else None}
        out = self._result("kron.executions.ExecutionFailed", rec, batched)
        ex = self.store.executions.get(d.exec_id)
        if outcome == "400" and ex is not None and ex["attempts"][-1]["outcome"] == "permanent":
            self.permanent.add((d.exec_id, d.attempt))
        return out

    def _result(self, name: str, rec: Record, batched: bool) -> list[Effect] | PermanentError:
        """A result alone, or as the executor sends it: inside an AttemptsFinished batch."""
        if not batched:
            return self._feed("report", name, rec)
        batch = {"envelope": {**rec["envelope"], "event_id": self._id("batch")},
                 "results": [result_item(name, rec)]}
        # Through the codec, as on the wire: the batch must fit its schema.
        batch = codec.decode(codec.encode("kron.executions.AttemptsFinished", batch)).record
        return self._feed("report", "kron.executions.AttemptsFinished", batch)

    @precondition(lambda self: bool(self._called()))
    @rule()
    def heartbeats(self) -> None:
        """The executor extends the lease of every attempt it is running."""
        for key in self._called():
            self._report(self.outstanding[key], "heartbeat", key[1])

    @precondition(lambda self: bool(self.all_dispatches))
    @rule(data=st.data(), outcome=st.sampled_from(OUTCOMES[:5]))
    def stale_report(self, data: st.DataObject, outcome: str) -> None:
        o = data.draw(st.sampled_from(self.all_dispatches))
        ex = self.store.executions[o.dispatch.exec_id]
        token = o.dispatch.fencing_token
        if ex["state"] == "running" and ex["fencing_token"] == token:
            token -= 1  # an older, fenced attempt (or a token that never existed)
        before = snapshot(self.store)
        out = self._report(o, outcome, token)
        assert out == [], out
        assert snapshot(self.store) == before, "a stale report changed state"

    @precondition(lambda self: bool(self.history))
    @rule(data=st.data(), recent=st.booleans())
    def duplicate_delivery(self, data: st.DataObject, recent: bool) -> None:
        """An event arrives once more: a recent one (redelivery past the committed offset),
        or an older attempt report (a producer retry that landed late)."""
        reports = [ev for ev, _ in self.history if ev.kind == "report"]
        beats = [ev for ev in reports if ev.name.endswith("Heartbeat")]
        if beats and data.draw(st.booleans()):
            reports = beats
        if recent or not reports:
            k = data.draw(st.integers(1, min(8, len(self.history))))
            ev = self.history[-k][0]
        else:
            ev = data.draw(st.sampled_from(reports))
        self._redeliver(ev, worker=ev.worker, epoch=ev.epoch)

    @rule(data=st.data(), lose_attempts=st.booleans())
    def crash_and_restart(self, data: st.DataObject, lose_attempts: bool) -> None:
        """The owner dies; a new one (next epoch) takes the partition over the same state and
        is redelivered the tail after the last committed offset."""
        if lose_attempts:
            self.outstanding.clear()
        self.epoch += 1
        self.worker = f"worker-{self.epoch}"
        self.core = PartitionCore(self.store)
        # Another process: its record cache starts empty.
        self.store.caches = {"job": RecordCache(schema=CodecStore.JOB),
                             "execution": RecordCache(schema=CodecStore.EXEC)}
        k = data.draw(st.integers(0, min(6, len(self.history))))
        tail = [ev for ev, _ in self.history[len(self.history) - k:]]
        for ev in tail:
            self._redeliver(ev, worker=self.worker, epoch=self.epoch)

    # --- invariants --------------------------------------------------------------------------

    def _scan_log(self) -> None:
        log = self.store.log
        for kind, rec in log[self.log_seen:]:
            if kind == "job":
                prev = self.cursors.get(rec["job_id"])
                cur = rec["cursor_ms"]
                assert prev is None or (cur is not None and cur >= prev), \
                    f"cursor of {rec['job_id']} went back: {prev} -> {cur}"
                self.cursors[rec["job_id"]] = cur
                continue
            self._check_exec_transition(rec)
        self.log_seen = len(log)

    def _check_exec_transition(self, rec: Record) -> None:
        ex_id, state = rec["exec_id"], rec["state"]
        assert state in OUTCOME_STATES
        assert rec["attempt"] <= self.jobs[rec["job_id"]].max_attempts
        assert rec["attempt"] == len(rec["attempts"])
        manual = rec["trigger"] == "manual"
        key = (rec["job_id"], rec["scheduled_for_ms"], manual)
        if not manual:
            owner = self.slot_owner.setdefault(key[:2], ex_id)
            assert owner == ex_id, f"two executions for slot {key}"
        seen = self.execs.get(ex_id)
        if seen is not None:
            assert seen.key == key and seen.created_at_ms == rec["created_at_ms"]
            if seen.state in TERMINAL:
                assert state == seen.state, f"{ex_id} left terminal {seen.state} for {state}"
            assert rec["attempt"] >= seen.attempt and rec["fencing_token"] >= seen.token
            if (state == seen.state == "running" and rec["attempt"] == seen.attempt
                    and seen.lease is not None):
                assert rec["lease_until_ms"] >= seen.lease, f"lease of {ex_id} shortened"
        for a in rec["attempts"][:-1]:
            assert a["outcome"] != "permanent", "an attempt followed a permanent failure"
        self.execs[ex_id] = ExecSeen(state=state, attempt=rec["attempt"],
                                     token=rec["fencing_token"], lease=rec["lease_until_ms"],
                                     created_at_ms=rec["created_at_ms"], key=key)
        if state in LIVE:
            self.live.add(ex_id)
            # Per write, not per step: one event can start many runs and finish others.
            job_id = rec["job_id"]
            live = sum(1 for e in self.live if self.store.executions[e]["job_id"] == job_id)
            self.peak_live[job_id] = max(self.peak_live.get(job_id, 0), live)
        else:
            self.live.discard(ex_id)

    @invariant()
    def timers_match_state(self) -> None:
        fire: dict[str, list[tuple[int, Record]]] = {}
        lease: dict[str, list[tuple[int, int]]] = {}
        retry: dict[str, list[tuple[int, int]]] = {}
        for key, value in self.store.timers.items():
            tk = decode_timer_key(key)
            data = orjson.loads(value)
            if tk.kind == TimerKind.LEASE:
                for entry in data["l"]:
                    ex_id, attempt = entry[0], entry[1]
                    assert ex_id in self.store.executions
                    if len(entry) == 4:  # a slot's first attempt names its slot too
                        assert attempt == 1 and exec_id(entry[2], entry[3]) == ex_id, entry
                    lease.setdefault(ex_id, []).append((tk.due_ms, attempt))
                continue
            if tk.kind == TimerKind.HELD:
                for ex_id, attempt in data["h"]:
                    # An attempt decided ahead. A torn event's slot may have been decided
                    # again since, as an attempt 1 that started later (not the held one).
                    ex = self.store.executions[ex_id]
                    started = ex["attempts"][attempt - 1]["started_at_ms"]
                    assert started >= tk.due_ms, (started, tk.due_ms)
                continue
            assert tk.job_id in self.store.jobs
            if tk.kind == TimerKind.FIRE and not tk.ref:
                fire.setdefault(tk.job_id, []).append((tk.due_ms, data))
            elif tk.kind == TimerKind.FIRE:
                trigger, slot = tk.ref.split(":")
                assert trigger == "misfire" and data["s"] == int(slot)
            else:
                assert tk.ref in self.store.executions
                retry.setdefault(tk.ref, []).append((tk.due_ms, data["a"]))
        for job_id, job in self.store.jobs.items():
            armed = fire.get(job_id, [])
            if job["status"] in ("active", "paused") and job["next_run_at_ms"] is not None:
                assert len(armed) == 1, f"{job_id} has {len(armed)} fire timers"
                due, data = armed[0]
                nxt = job["next_run_at_ms"]
                assert data["s"] == nxt and data["v"] == job["version"]
                assert due == apply_jitter(nxt, jitter_s=job["spec"]["jitter_s"], job_id=job_id)
            else:
                assert not armed, f"{job_id} ({job['status']}) still has a fire timer"
                assert job["status"] != "active", f"{job_id} is active with nothing armed"
            running = job["running"]
            assert len(running) == len(set(running))
            mine = {e for e in self.live if self.store.executions[e]["job_id"] == job_id}
            assert mine <= set(running), f"{job_id}.running={running} misses live {mine}"
            stale = set(running) - mine
            if stale:
                # Only `allow` skips the job write at a finish.
                assert plan_of(job["spec"]).overlap == Overlap.ALLOW, (job_id, stale)
                assert all(self.store.executions[e]["state"] in TERMINAL for e in stale)
            # Bounded: it sheds finished runs whenever a start finds it at the threshold.
            peak = max(self.peak_live.get(job_id, 0), len(mine))
            assert len(running) <= max(RUNNING_PRUNE_AT, peak + 1), (job_id, len(running), peak)
        for ex_id in set(lease) | set(retry) | self.live:
            ex = self.store.executions[ex_id]
            if ex["state"] == "running":
                # Leases are swept lazily: finished attempts may still be listed, but the
                # running one is watched by a timer due no later than its lease.
                mine = [due for due, a in lease.get(ex_id, []) if a == ex["attempt"]]
                assert mine and min(mine) <= ex["lease_until_ms"], (ex_id, lease.get(ex_id))
            want_retry = ([(ex["retry_at_ms"], ex["attempt"])]
                          if ex["state"] == "retry_pending" else [])
            assert retry.get(ex_id, []) == want_retry, (ex_id, ex["state"], retry.get(ex_id))

    def _paced(self) -> dict[str, set[int]]:
        """Slots a misfire decided to fire, waiting in their paced timers."""
        paced: dict[str, set[int]] = {}
        for key in self.store.timers:
            tk = decode_timer_key(key)
            if tk.kind == TimerKind.FIRE and tk.ref:
                paced.setdefault(tk.job_id, set()).add(int(tk.ref.split(":")[1]))
        return paced

    @invariant()
    def no_lost_slot(self) -> None:
        paced = self._paced()
        for job_id in self.jobs:
            self._check_slots(job_id, paced)

    def _check_slots(self, job_id: str, paced: dict[str, set[int]],
                     through_ms: int | None = None) -> None:
        """Every slot of the job's plan before its armed one is accounted for; with
        `through_ms`, every slot due by then, the armed one included. A delete settles
        every slot due by its time; none after it is owed."""
        info = self.jobs[job_id]
        job = self.store.jobs[job_id]
        if job["status"] == "deleted":
            through_ms = info.deleted_at_ms
        plan = info.plan
        bound = None if through_ms is not None else job["next_run_at_ms"]
        if bound is not None:
            armed = bounded_next_slot(plan.schedule, after_ms=bound - 1, dst=plan.dst,
                                      start_at_ms=None, end_at_ms=None)
            assert armed is not None and armed.scheduled_for_ms == bound, \
                f"{job_id} armed {bound}, which is not a slot"
        queued = job["queued_slot_ms"]
        pending_seen = False
        after = info.checked_ms
        while True:
            slot = bounded_next_slot(plan.schedule, after_ms=after, dst=plan.dst,
                                     start_at_ms=None, end_at_ms=None)
            if slot is None or (bound is not None and slot.scheduled_for_ms >= bound):
                break
            if through_ms is not None and apply_jitter(
                    slot.scheduled_for_ms, jitter_s=plan.jitter_s, job_id=job_id) > through_ms:
                break
            s = slot.scheduled_for_ms
            ex = self.store.executions.get(exec_id(job_id, s))
            pending = s == queued or s in paced.get(job_id, ())
            if ex is not None:
                assert not pending, f"slot {s} of {job_id} both recorded and pending"
                assert ex["state"] in OUTCOME_STATES
                if not pending_seen:
                    info.checked_ms = s
            else:
                assert pending, f"lost slot: {job_id} @ {s} ({_iso(s)}), armed {bound}"
                pending_seen = True
            after = s

    def teardown(self) -> None:
        if not self.history:
            return
        # Let the owner run until nothing is due at the final time (the clock moving on only
        # as far as paced misfire runs need), then nothing may lag.
        for _ in range(5000):
            if not self.store.due_lanes(self.now):
                paced = [tk.due_ms for tk in map(decode_timer_key, self.store.timers)
                         if tk.kind == TimerKind.FIRE and tk.ref]
                if not paced:
                    break
                self.now = max(self.now, min(paced))
            self._feed("tick", "kron.engine.Tick", {"now_ms": self.now})
        assert not self.store.due_lanes(self.now), "not drained"
        assert not self._paced(), "paced runs left"
        self.timers_match_state()
        self.no_lost_slot()
        # Determinism: the recorded stream (redeliveries included), replayed by one core on
        # a second fresh store, writes the same log and asks for the same effects; the
        # restarts in the original run left nothing behind but the store.
        store = CodecStore()
        core = PartitionCore(store)
        for ev, want in self.history:
            got = apply(core, ev)
            if isinstance(want, PermanentError):
                assert isinstance(got, PermanentError) and got.message == want.message
            else:
                assert got == want, ev
        assert store.log == self.store.log
        assert store.timers == self.store.timers
        # The replay audit, an independent reading of the same invariants over the written
        # history (what the changelog topics would hold), finds nothing either.
        report = audit([r for kind, r in self.store.log if kind == "job"],
                       [r for kind, r in self.store.log if kind == "execution"],
                       now_ms=self.now, grace_ms=self.grace_ms)
        assert report.ok, report.violations


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


SIM_SETTINGS = settings(max_examples=200, stateful_step_count=50, deadline=None,
                        suppress_health_check=[HealthCheck.too_slow,
                                               HealthCheck.filter_too_much])


def test_partition_owner_simulation() -> None:
    with mock.patch.object(core_module, "MAX_LATE_SLOTS", SIM_MAX_LATE_SLOTS):
        run_state_machine_as_test(PartitionSim, settings=SIM_SETTINGS)
