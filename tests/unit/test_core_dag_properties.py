"""Properties of DAG runs through the partition core (issue 38), on random DAGs.

test_dag_properties.py checks the pure rules (streams.domain.dag). This file checks that
the partition core (streams/engine/core.py, streams/engine/runs.py) applies them through
its state, over the in-memory store: task instances, attempts, leases, retries, fencing,
the run record and the job's `running` list.

Each example draws a DAG (2-15 tasks, edges from lower to higher index only, so acyclic;
any of the seven trigger rules; some tasks with a retry policy of their own), a one-off or
a cron DAG job (a non-`allow` overlap), and then an interleaving: report one attempt in
flight (success, transient or permanent), heartbeat one, advance time and tick (retries
and lease expiries fire there), redeliver a report or send one with an old fencing token
(each must change nothing but `stale_rejected`), or switch owner (the calls in flight are
lost; their leases expire and new attempts come). A test model knows every attempt it
dispatched and how each ended (reported, or lost and expired).

Invariants, over the effects and the whole history the MemoryStore logged (`store.log`):

1. attempts of a task instance are dispatched as 1, 2, 3, ..., each once, one at a time,
   never over the task's max_attempts (its retry, else the job's);
2. a task starts only when its rule holds: at each start, `verdict` over the parents'
   states in the run record written just before it is RUN;
3. with nothing in flight and no retry pending, the run has ended, every task is final,
   and the run succeeded iff no task failed, was upstream_failed or cancelled;
4. every run write equals a reference written here (a fixpoint over parents' states using
   Airflow's table). The rules are eager, so a task with a skipped and a failed parent
   settled by different events depends on their order: the reference is therefore
   REPLAYED in the order the core took the task ends in (the order of the instance end
   writes in the log, one before each run write that takes it in), rather than the rules
   restricted. Each end itself is checked against the model: success -> succeeded;
   permanent, or transient / lease expiry with the attempts used up -> failed;
5. after RetryRun on a failed run: succeeded tasks are never dispatched again, reset ones
   start at their previous attempt + 1 (1 if they never ran);
6. the run id is in the job's `running` list exactly while the run runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from streams.domain.dag import TriggerRule, Verdict, verdict
from streams.domain.ids import exec_id, task_exec_id
from streams.domain.timer import TimerKind, decode_timer_key
from streams.engine.core import Cancel, Dispatch, Effect
from streams.engine.store import Record
from tests.unit.test_core_dag import Dag, started, task
from tests.unit.test_core_scenarios import MIN, SEC, utc

T0 = utc(2026, 3, 1)
JOB = "j"
RUN = exec_id(JOB, T0)
LEASE_S = 5.0
# A task instance's end states, and the task states that make a run fail.
ENDS = frozenset({"succeeded", "failed", "cancelled"})
BAD = frozenset({"failed", "upstream_failed", "cancelled"})
FINAL = BAD | {"succeeded", "skipped"}
# What an attempt's record says of each way the model ends it.
RECORDED = {"success": "succeeded", "transient": "transient", "permanent": "permanent",
            "lost": "lease_expired"}
# Steps before the model stops interleaving and only drains (reports and long ticks), so
# every example ends however the interleaving was drawn.
FREE_STEPS = 120
DRAIN_STEPS = 400


def retry_policy(max_attempts: int) -> Record:
    return {"max_attempts": max_attempts, "backoff": "fixed", "base_s": 1.0, "max_s": 1.0}


# --- the reference ---------------------------------------------------------------------------


def _done(ps: Sequence[str]) -> bool:
    return all(s in FINAL for s in ps)


def _bad(ps: Sequence[str]) -> bool:
    return any(s in BAD for s in ps)


# Airflow's table over the parents' states: "run", "skipped", "upstream_failed" or "wait"
# (docs/semantics.md, Workflows). A task without parents runs whatever its rule.
TABLE: dict[str, Callable[[Sequence[str]], str]] = {
    "all_success": lambda ps: ("upstream_failed" if _bad(ps) else "skipped" if "skipped" in ps
                               else "run" if all(s == "succeeded" for s in ps) else "wait"),
    "all_failed": lambda ps: ("skipped" if {"succeeded", "skipped"} & set(ps)
                              else "run" if _done(ps) else "wait"),
    "all_done": lambda ps: "run" if _done(ps) else "wait",
    "one_success": lambda ps: ("run" if "succeeded" in ps else "wait" if not _done(ps)
                               else "skipped" if all(s == "skipped" for s in ps)
                               else "upstream_failed"),
    "one_failed": lambda ps: "run" if _bad(ps) else "wait" if not _done(ps) else "skipped",
    "none_failed": lambda ps: "upstream_failed" if _bad(ps) else "run" if _done(ps) else "wait",
    "always": lambda ps: "run",
}


class Reference:
    """A run as plain task states, decided again from scratch after every event."""

    def __init__(self, parents: list[list[int]], rules: list[str]) -> None:
        self.parents, self.rules = parents, rules
        self.states = ["pending"] * len(parents)

    def settle(self) -> None:
        # Index order is topological (edges go up), so one pass sees every parent this
        # event settles before judging the child, as the core's topological release does.
        for i, state in enumerate(self.states):
            if state == "pending":
                ps = [self.states[p] for p in self.parents[i]]
                got = TABLE[self.rules[i]](ps) if ps else "run"
                if got != "wait":
                    self.states[i] = "running" if got == "run" else got

    def end(self, i: int, state: str) -> None:
        assert self.states[i] == "running", (i, self.states)
        self.states[i] = state
        self.settle()

    def retry(self) -> None:
        """Every bad task and every descendant of one goes back to pending, unless it
        succeeded."""
        below: set[int] = set()
        for i, state in enumerate(self.states):
            if state in BAD or below & set(self.parents[i]):
                below.add(i)
        for i in below:
            if self.states[i] != "succeeded":
                self.states[i] = "pending"
        self.settle()


# --- the cases -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    parents: list[list[int]]
    rules: list[str]
    retries: list[int | None]  # a task's own max_attempts; None: the job's
    job_attempts: int
    cron: bool
    overlap: str

    def tasks(self) -> list[Record]:
        return [task(f"t{i}", *(f"t{p}" for p in ps), rule=self.rules[i],
                     retry=None if own is None else retry_policy(own))
                for i, (ps, own) in enumerate(zip(self.parents, self.retries, strict=True))]

    def max_attempts(self, i: int) -> int:
        own = self.retries[i]
        return self.job_attempts if own is None else own

    def fields(self) -> dict[str, Any]:
        when: dict[str, Any] = {"cron": "0 0 * * *"} if self.cron else {"run_at_ms": T0}
        return {**when, "retry": retry_policy(self.job_attempts), "lease_s": LEASE_S,
                "overlap": self.overlap}


@st.composite
def cases(draw: st.DrawFn) -> Case:
    n = draw(st.integers(2, 15))
    parents = [draw(st.lists(st.integers(0, i - 1), unique=True, max_size=min(i, 4)))
               if i else [] for i in range(n)]
    rules = draw(st.lists(st.sampled_from([str(r) for r in TriggerRule]), min_size=n,
                          max_size=n))
    retries = draw(st.lists(st.none() | st.integers(1, 3), min_size=n, max_size=n))
    return Case(parents, rules, retries, job_attempts=draw(st.integers(1, 3)),
                cron=draw(st.booleans()),
                overlap=draw(st.sampled_from(["skip_if_running", "queue", "replace"])))


# --- the simulation --------------------------------------------------------------------------


@dataclass
class Flight:
    """An attempt the core dispatched and the model has not ended yet."""

    d: Dispatch
    lease_until_ms: int
    lost: bool = False  # its owner went away: it is never reported, its lease expires


class Sim:
    def __init__(self, case: Case, data: st.DataObject) -> None:
        self.case, self.data = case, data
        self.index = {f"t{i}": i for i in range(len(case.parents))}
        self.p = Dag(T0 - MIN)
        self.flights: dict[str, Flight] = {}  # exec id -> its attempt in flight
        self.outcomes: dict[str, list[str]] = {}  # exec id -> how each attempt ended
        self.dispatched: list[Dispatch] = []
        self.sent: list[tuple[Dispatch, str]] = []  # reports applied, to redeliver
        # This round (0, then one per RetryRun): the attempt each task started at, the
        # tasks that had succeeded before it.
        self.first: dict[str, int] = {}
        self.kept: set[str] = set()
        assert self.apply(lambda: self.p.create_dag(JOB, case.tasks(), **case.fields())) == []
        self.apply(lambda: self.p.tick(T0))
        self.check_state()

    # --- driving the core ---------------------------------------------------------------------

    def draw(self, strategy: st.SearchStrategy[Any]) -> Any:
        return self.data.draw(strategy)

    def apply(self, call: Callable[[], list[Effect]],
              ends: dict[str, str] | None = None) -> list[Dispatch]:
        """One event; `ends`: the task instances the model expects it to end, and how."""
        mark = len(self.p.store.log)
        effects = call()
        written = [(rec["task_id"], rec["state"]) for kind, rec in self.p.store.log[mark:]
                   if kind == "execution" and rec["run_id"] == RUN and rec["state"] in ENDS]
        assert sorted(written) == sorted((ends or {}).items())
        assert not [e for e in effects if isinstance(e, Cancel)]
        out = [e for e in effects if isinstance(e, Dispatch)]
        for d in out:
            self.on_dispatch(d)
        return out

    def on_dispatch(self, d: Dispatch) -> None:
        assert d.run_id == RUN and d.task_id in self.index
        assert d.exec_id == task_exec_id(RUN, d.task_id)
        i = self.index[d.task_id]
        # (1) attempts 1, 2, 3, ... one at a time: never one twice, never two at once.
        past = self.outcomes.setdefault(d.exec_id, [])
        assert d.exec_id not in self.flights
        assert d.attempt == d.fencing_token == len(past) + 1, (d, past)
        # (5) what succeeded before a RetryRun never runs again; a reset task starts at its
        # previous attempt + 1 (checked just above: 1 if it never ran).
        assert d.task_id not in self.kept
        first = self.first.setdefault(d.task_id, d.attempt)
        # (1) and retries within the task's max_attempts (a rerun may start past it).
        assert d.attempt <= max(self.case.max_attempts(i), first)
        self.flights[d.exec_id] = Flight(d, d.lease_until_ms)
        self.dispatched.append(d)

    def end_of(self, d: Dispatch, how: str) -> dict[str, str]:
        """The model's record of an attempt's end; the task instance's end it implies."""
        del self.flights[d.exec_id]
        self.outcomes[d.exec_id].append(RECORDED[how])
        assert d.task_id is not None
        if how == "success":
            return {d.task_id: "succeeded"}
        if how == "permanent" or d.attempt >= self.case.max_attempts(self.index[d.task_id]):
            return {d.task_id: "failed"}
        return {}  # retried (the core's timer starts the next attempt)

    def stale(self, call: Callable[[], list[Effect]]) -> None:
        """A redelivered or fenced report: nothing changes but the count of rejections."""
        mark, rejected = len(self.p.store.log), self.p.core.stale_rejected
        assert call() == []
        assert len(self.p.store.log) == mark
        assert self.p.core.stale_rejected == rejected + 1

    # --- the steps ----------------------------------------------------------------------------

    def live(self) -> list[Flight]:
        return [f for f in self.flights.values() if not f.lost]

    def report(self) -> None:
        d = self.draw(st.sampled_from(self.live())).d
        how = self.draw(st.sampled_from(["success", "success", "transient", "permanent"]))
        ends = self.end_of(d, how)
        self.apply(lambda: self.p.report(d, how), ends)
        self.sent.append((d, how))
        if self.draw(st.booleans()):
            event("redelivered at once")
            self.stale(lambda: self.p.report(d, how))

    def heartbeat(self) -> None:
        f = self.draw(st.sampled_from(self.live()))
        until = self.p.now + int(LEASE_S * SEC)
        self.apply(lambda: self.p.report(f.d, "heartbeat", lease_until_ms=until))
        f.lease_until_ms = max(f.lease_until_ms, until)

    def tick(self, step_ms: int | None = None) -> None:
        if step_ms is None:
            step_ms = self.draw(st.sampled_from([300, 1000, 2500, 6000]))
        now = self.p.now + step_ms
        ends: dict[str, str] = {}
        for f in [f for f in self.flights.values() if f.lease_until_ms <= now]:
            event("a lease expired")
            ends.update(self.end_of(f.d, "lost"))
        self.apply(lambda: self.p.tick(now), ends)

    def old_report(self) -> None:
        """A late duplicate of an applied report, or a report under an old token."""
        if self.sent and self.draw(st.booleans()):
            d, how = self.draw(st.sampled_from(self.sent))
            event("redelivered late")
            self.stale(lambda: self.p.report(d, how))
            return
        f = self.draw(st.sampled_from(list(self.flights.values())))
        how = self.draw(st.sampled_from(["success", "transient", "permanent"]))
        event("an old fencing token")
        self.stale(lambda: self.p.report(f.d, how, token=f.d.fencing_token - 1))

    def switch_owner(self) -> None:
        event("owner switched")
        self.p.new_owner(self.p.epoch + 1, f"w{self.p.epoch + 1}")
        for f in self.flights.values():
            f.lost = True

    def step(self, n: int) -> None:
        if n >= FREE_STEPS:  # drain: report what can be reported, else let leases expire
            if self.live():
                self.report()
            else:
                self.tick(int(LEASE_S * SEC) + SEC)
            return
        steps: list[Callable[[], None]] = [self.tick, self.switch_owner]
        if self.flights:
            steps.append(self.old_report)
        if self.live():
            steps = [self.report] * 5 + steps + [self.heartbeat]
        self.draw(st.sampled_from(steps))()

    def run_to_its_end(self) -> str:
        for n in range(FREE_STEPS + DRAIN_STEPS):
            if self.run()["state"] != "running":
                break
            self.step(n)
            self.check_state()
        run = self.run()
        assert run["state"] in ("succeeded", "failed"), "the run did not end"
        # Nothing is left to happen: a tick past every lease and retry dispatches nothing
        # and writes none of the run's records.
        mark = len(self.p.store.log)
        assert self.apply(lambda: self.p.tick(self.p.now + 10 * SEC)) == []
        assert not [r for k, r in self.p.store.log[mark:] if k == "execution"]
        return str(run["state"])

    def retry_run(self) -> None:
        """RetryRun on the failed run: a new round."""
        before = self.states()
        self.kept = {t for t, s in before.items() if s == "succeeded"}
        self.first = {}
        assert not self.flights
        self.apply(lambda: self.p.command("RetryRun", JOB, run_id=RUN))
        self.check_state()

    # --- reading state ------------------------------------------------------------------------

    def run(self) -> Mapping[str, Any]:
        run = self.p.store.execution(RUN)
        assert run is not None and run["dag"] is not None
        return run

    def states(self) -> dict[str, str]:
        return {t["task_id"]: str(t["state"]) for t in self.run()["dag"]["tasks"]}

    def instances(self) -> list[Mapping[str, Any]]:
        return [e for e in self.p.store.executions.values() if e["run_id"] == RUN]

    def check_state(self) -> None:
        run, job = self.run(), self.p.job(JOB)
        # (6) the job lists the run exactly while it runs.
        assert (RUN in job["running"]) == (run["state"] == "running"), (job["running"], run)
        # The core's attempts in flight are the model's (lost ones included, until their
        # lease expires), and each instance waiting to retry has its timer.
        running = {e["exec_id"]: e["attempt"] for e in self.instances()
                   if e["state"] == "running"}
        assert running == {x: f.d.attempt for x, f in self.flights.items()}
        pending = {e["exec_id"] for e in self.instances() if e["state"] == "retry_pending"}
        timers = {k.ref for k in map(decode_timer_key, self.p.store.timers)
                  if k.kind == TimerKind.RETRY}
        assert pending == timers
        states = self.states()
        # (3) nothing in flight and no retry pending: the run is over, and its state says
        # whether a task went bad.
        if not running and not pending:
            assert run["state"] in ("succeeded", "failed"), states
        if run["state"] != "running":
            assert not running and not pending
            assert set(states.values()) <= FINAL, states
            assert (run["state"] == "succeeded") == (not BAD & set(states.values())), states

    def check_history(self) -> None:
        """(2) and (4) over the whole log; each attempt's record against the model."""
        rules = self.case.rules
        ref = Reference(self.case.parents, rules)
        last: Mapping[str, Any] | None = None
        seen: dict[str, str] = {}  # exec id -> the state of its last write
        ends: list[tuple[int, str]] = []
        for kind, rec in self.p.store.log:
            if kind != "execution":
                continue
            if rec["exec_id"] == RUN:
                if last is None:
                    ref.settle()
                elif last["state"] == "failed" and rec["state"] == "running":
                    assert ends == []
                    ref.retry()
                else:
                    assert len(ends) == 1, ends  # one end taken in per run write
                    ref.end(*ends[0])
                ends = []
                assert [t["state"] for t in rec["dag"]["tasks"]] == ref.states
                last = rec
            elif rec["run_id"] == RUN:
                i = self.index[rec["task_id"]]
                before = seen.get(rec["exec_id"])
                if rec["state"] == "running" and (before is None or before in ENDS):
                    assert last is not None
                    self.assert_released(last, i)
                if rec["state"] in ENDS and before not in ENDS:
                    ends.append((i, rec["state"]))
                seen[rec["exec_id"]] = rec["state"]
        assert ends == []
        for ex in self.instances():
            got = [a["outcome"] for a in ex["attempts"]]
            assert got == self.outcomes[ex["exec_id"]], (ex["task_id"], got)

    def assert_released(self, run: Mapping[str, Any], i: int) -> None:
        """The task's rule held on its parents' states in the run record just written."""
        progress = run["dag"]["tasks"]
        assert progress[i]["state"] == "running"
        ps = [progress[p]["state"] for p in self.case.parents[i]]
        got = verdict(TriggerRule(self.case.rules[i]), total=len(ps),
                      pending=sum(s not in FINAL for s in ps),
                      succeeded=ps.count("succeeded"), failed=sum(s in BAD for s in ps),
                      skipped=ps.count("skipped"))
        assert got is Verdict.RUN, (self.case.rules[i], ps)


# --- the properties --------------------------------------------------------------------------


@settings(max_examples=150)
@given(cases(), st.data())
def test_a_dag_run_through_the_core_follows_the_rules(case: Case, data: st.DataObject) -> None:
    sim = Sim(case, data)
    event(f"the run {sim.run_to_its_end()}")
    sim.check_history()


@settings(max_examples=100)
@given(cases(), st.data())
def test_a_retried_run_reruns_only_what_did_not_succeed(case: Case,
                                                       data: st.DataObject) -> None:
    sim = Sim(case, data)
    rounds = 0
    while sim.run_to_its_end() == "failed" and rounds < 2:
        sim.retry_run()
        rounds += 1
        event(f"retried {rounds}x")
    sim.check_history()


def test_a_rerun_task_that_waits_on_a_rerun_parent_runs_again() -> None:
    no_retry = retry_policy(1)
    p = Dag(T0 - MIN)
    p.create_dag(JOB, [task("a", retry=no_retry),
                       task("x", "a", rule="all_done", retry=no_retry)], run_at_ms=T0)
    a = started(p.tick(T0))["a"]
    x = started(p.report(a, "permanent"))["x"]
    p.report(x, "permanent")
    assert p.run(JOB, T0)["state"] == "failed"
    rerun = started(p.command("RetryRun", JOB, run_id=RUN))
    assert set(rerun) == {"a"} and rerun["a"].attempt == 2
    # a succeeds this time: x (all_done on a) must run again, as its attempt 2.
    released = started(p.report(rerun["a"], "success"))
    assert set(released) == {"x"} and released["x"].attempt == 2
