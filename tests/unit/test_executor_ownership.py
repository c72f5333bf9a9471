"""An attempt whose partition this worker may not act for at its call. With the owner's
lease lapsed and the partition still assigned (a broker restart) it waits for the lease and
goes out as the same attempt. After any rebalance since it came (another member may have
held the partition), even with the partition ours again, it is not called and is reported
so (a failed attempt without a call), for the owner to retry it now rather than at its
lease's end; so is one whose start Kafka acknowledged only after a revoke that did not
wait for it. The runner here records calls."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from kron.clock import ManualClock
from streams.engine.core import Dispatch
from streams.executor import Executor
from streams.targets import AttemptInfo, Outcome

Reports = list[tuple[str, dict[str, Any]]]


class Recorder:
    """Calls in order; a call waits while `gate` is clear."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def run(self, target: dict[str, Any], info: AttemptInfo) -> Outcome:
        self.calls.append((info.exec_id, info.attempt))
        await self.gate.wait()
        return Outcome(ok=True, status_code=200)


def attempt(exec_id: str, not_before_ms: int = 0) -> Dispatch:
    return Dispatch(exec_id=exec_id, job_id="j", tenant="t", scheduled_for_ms=0, attempt=2,
                    fencing_token=2, lease_s=60.0, target={"topic": "out"},
                    not_before_ms=not_before_ms)


def executor(owner: dict[str, Any], reports: Reports, *, concurrency: int = 4,
             barrier: Callable[[], Awaitable[None]] | None = None
             ) -> tuple[Executor, Recorder]:
    async def report(partition: int, name: str, record: dict[str, Any], /,
                     **_: Any) -> None:
        reports.append((name, record))

    runner = Recorder()
    ex = Executor(runners={"kafka": runner}, report=report,
                  clock=ManualClock(now_ms=1_000, monotonic=1.0), worker_id="w",
                  concurrency=concurrency, partitions=2, before_dispatch=barrier,
                  may_dispatch=lambda p: owner["lease"] and p in owner.get("parts", {0, 1}),
                  generation=lambda: owner.get("generation", 1))
    ex.set_owned_partitions({0, 1})
    return ex, runner


def rebalance(ex: Executor, owner: dict[str, Any], parts: set[int] | None = None) -> None:
    """A rebalance this member took part in: a revoke, then the next generation's
    assignment."""
    ex.rebalance_started()
    owner["generation"] = owner.get("generation", 1) + 1
    ex.set_owned_partitions({0, 1} if parts is None else parts)


async def until(cond: Any, timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met in time")


def test_a_lapsed_lease_delays_the_call_and_keeps_the_attempt() -> None:
    owner: dict[str, Any] = {"lease": False}
    reports: Reports = []

    async def run() -> Recorder:
        ex, runner = executor(owner, reports)
        ex.start()
        ex.submit(attempt("e1"), 0)
        await asyncio.sleep(0.3)  # six looks at the lease
        assert runner.calls == [] and reports == []
        owner["lease"] = True  # a heartbeat went through: the partition is still ours
        await until(lambda: reports)
        await ex.stop()
        return runner

    runner = asyncio.run(run())
    assert runner.calls == [("e1", 2)]
    assert [(n, r["attempt"]) for n, r in reports] == [("kron.executions.ExecutionSucceeded", 2)]


def test_an_attempt_whose_partition_moved_is_reported_not_called() -> None:
    """Moved while it waited for the lease; the partition comes back to this worker before
    the lease does: still not called (another owner may have retried it meanwhile)."""
    owner: dict[str, Any] = {"lease": False}
    reports: Reports = []

    async def run() -> Recorder:
        ex, runner = executor(owner, reports)
        ex.start()
        ex.submit(attempt("e1"), 0)
        await asyncio.sleep(0.1)
        rebalance(ex, owner, {1})
        rebalance(ex, owner)
        owner["lease"] = True
        await until(lambda: reports)
        ex.submit(attempt("e2"), 0)  # came after the partition did: called
        await until(lambda: len(reports) == 2)
        await ex.stop()
        return runner

    runner = asyncio.run(run())
    assert runner.calls == [("e2", 2)]
    (name, failed), (_, ok) = reports
    assert name == "kron.executions.ExecutionFailed" and ok["exec_id"] == "e2"
    assert (failed["exec_id"], failed["attempt"], failed["fencing_token"]) == ("e1", 2, 2)
    assert failed["error_class"] == "lease_expired"
    assert failed["error"] == "not called: partition 0 is no longer ours"
    assert failed["started_at_ms"] == 0  # no call started: the record keeps its start


def test_a_revoke_counts_as_moved_before_any_new_assignment() -> None:
    """Dropped by the coordinator while cut off, this member learns of the generations it
    missed only at its rejoin, which revokes first; by the time its lease is renewed (the
    new generation's sync) its next assignment may give the partition back: the revoke
    alone tells that another member may have held it."""
    owner: dict[str, Any] = {"lease": False}
    reports: Reports = []

    async def run() -> Recorder:
        ex, runner = executor(owner, reports)
        ex.start()
        ex.submit(attempt("e1"), 0)
        await asyncio.sleep(0.1)
        ex.rebalance_started()
        owner["lease"] = True  # rejoined: no new assignment told yet
        await until(lambda: reports)
        await ex.stop()
        return runner

    runner = asyncio.run(run())
    assert runner.calls == []
    assert [(r["exec_id"], r["error_class"]) for _, r in reports] == [("e1", "lease_expired")]


def test_a_rebalance_reports_the_queued_attempts_of_partitions_it_took() -> None:
    owner: dict[str, Any] = {"lease": True}
    reports: Reports = []

    async def run() -> Recorder:
        ex, runner = executor(owner, reports, concurrency=1)
        runner.gate.clear()
        ex.start()
        for i, partition in enumerate((0, 0, 1, 0)):
            ex.submit(attempt(f"e{i}"), partition)
        await until(lambda: runner.calls)  # e0 in flight, e1-e3 queued
        owner["parts"] = {1}
        rebalance(ex, owner, {1})
        await until(lambda: len(reports) == 2)
        runner.gate.set()
        await until(lambda: len(reports) == 4)
        await ex.stop()
        return runner

    runner = asyncio.run(run())
    # e0's call was under way: it ends and is reported as it ended (its token fences it).
    assert runner.calls == [("e0", 2), ("e2", 2)]
    assert sorted((r["exec_id"], n.rsplit(".", 1)[1], r.get("error")) for n, r in reports) == [
        ("e0", "ExecutionSucceeded", None),
        ("e1", "ExecutionFailed", "not called: partition 0 went to another owner"),
        ("e2", "ExecutionSucceeded", None),
        ("e3", "ExecutionFailed", "not called: partition 0 went to another owner")]


@pytest.mark.parametrize("held", [False, True], ids=["due", "decided-ahead"])
@pytest.mark.parametrize("revoke", ["waited", "did-not-wait"])
def test_a_start_acknowledged_only_after_a_revoke_that_did_not_wait_is_not_called(
        held: bool, revoke: str) -> None:
    """A revoke hands partitions over once our writes are acknowledged, or after a bounded
    wait: then a start acknowledged later may be missing from what the next owner restored,
    and it may have decided the same attempt again. Such an attempt is not called, even
    with the partition kept here; after a revoke that waited, it is."""
    owner: dict[str, Any] = {"lease": True}
    reports: Reports = []
    acked = asyncio.Event()

    async def barrier() -> None:
        await acked.wait()

    async def run() -> Recorder:
        ex, runner = executor(owner, reports, barrier=barrier)
        clock = ex._clock
        assert isinstance(clock, ManualClock)
        ex.start()
        ex.submit(attempt("e1", 1_200 if held else 0), 0)
        await asyncio.sleep(0.1)
        if revoke == "did-not-wait":
            ex.handed_over_unacknowledged()
        rebalance(ex, owner)  # the partition stayed here
        acked.set()
        clock.advance(0.3)  # the held one is due
        await until(lambda: reports)
        ex.submit(attempt("e2"), 0)  # came after the revoke: called
        await until(lambda: len(reports) == 2)
        await ex.stop()
        return runner

    runner = asyncio.run(run())
    if revoke == "waited":
        assert runner.calls == [("e1", 2), ("e2", 2)]
        assert [(r["exec_id"], r.get("error")) for _, r in reports] == [
            ("e1", None), ("e2", None)]
        return
    assert runner.calls == [("e2", 2)]
    assert [(r["exec_id"], r.get("error")) for _, r in reports] == [
        ("e1", "not called: its start was acknowledged only after its partition was "
               "handed over"), ("e2", None)]


def test_a_call_waiting_for_kafka_or_the_lease_is_stuck_until_it_goes() -> None:
    """What the owner's tick asks at a held call's due time (Context.stuck): true while it
    waits for its start's acknowledgement or for the lease, false once it is called."""
    owner: dict[str, Any] = {"lease": False}
    reports: Reports = []
    acked = asyncio.Event()

    async def barrier() -> None:
        await acked.wait()

    async def run() -> list[bool]:
        ex, _ = executor(owner, reports, barrier=barrier)
        ex.start()
        ex.submit(attempt("e1"), 0)
        seen = []
        await asyncio.sleep(0.1)
        seen.append(ex.stuck("e1", 2))  # at the barrier
        acked.set()
        await asyncio.sleep(0.1)
        seen += [ex.stuck("e1", 2), ex.stuck("e1", 1)]  # waiting for the lease
        owner["lease"] = True
        await until(lambda: reports)
        seen.append(ex.stuck("e1", 2))
        await ex.stop()
        return seen

    assert asyncio.run(run()) == [True, True, False, False]


@pytest.mark.parametrize("acked", [True, False])
def test_a_revoke_that_gives_up_waiting_for_our_writes_tells_the_executor(acked: bool) -> None:
    """WorkerLifecycle._on_revoked waits half a session for the changelog's acks; when it
    hands over without them, the executor must hear of it."""
    from types import SimpleNamespace

    from streams.worker_lifecycle import WorkerLifecycle

    told: list[str] = []

    async def flush() -> None:
        if not acked:
            await asyncio.sleep(3600)  # the broker is away

    lifecycle = SimpleNamespace(
        changelog=SimpleNamespace(flush=flush),
        settings=SimpleNamespace(session_timeout_s=0.2, worker_id="w"),
        executor=SimpleNamespace(handed_over_unacknowledged=lambda: told.append("unsafe")))
    asyncio.run(WorkerLifecycle._on_revoked(lifecycle, None, signal=None))  # type: ignore[arg-type]
    assert told == ([] if acked else ["unsafe"])


def test_a_generation_taken_without_us_makes_unacknowledged_starts_unsafe() -> None:
    """Dropped by the coordinator while the broker was away, a member rejoins generations
    later (2 -> 5 in a broker-restart run); meanwhile another member restored our
    partitions without our pending writes and decided the same attempts again. Ours,
    acknowledged after, must not go out, even with the partition given back to us."""
    owner: dict[str, Any] = {"lease": True}
    reports: Reports = []
    acked = asyncio.Event()

    async def barrier() -> None:
        await acked.wait()

    async def run() -> Recorder:
        ex, runner = executor(owner, reports, barrier=barrier)
        ex.start()
        ex.submit(attempt("e1"), 0)
        await asyncio.sleep(0.1)
        ex.rebalance_started()
        owner["generation"] = 4  # rejoined: generations 2 and 3 went on without us
        ex.set_owned_partitions({0, 1})
        acked.set()
        await until(lambda: reports)
        await ex.stop()
        return runner

    runner = asyncio.run(run())
    assert runner.calls == []
    assert [r["error"] for _, r in reports] == [
        "not called: its start was acknowledged only after its partition was handed over"]


@pytest.mark.parametrize("rebalanced", [False, True])
def test_a_start_acknowledged_while_the_lease_had_lapsed(rebalanced: bool) -> None:
    """Acknowledged while this worker could not tell whether the coordinator had dropped
    it: called once the lease is back if the group did not rebalance meanwhile, else not."""
    owner: dict[str, Any] = {"lease": True}
    reports: Reports = []
    acked = asyncio.Event()

    async def barrier() -> None:
        await acked.wait()

    async def run() -> Recorder:
        ex, runner = executor(owner, reports, barrier=barrier)
        clock = ex._clock
        assert isinstance(clock, ManualClock)
        ex.start()
        ex.submit(attempt("e1", 1_500), 0)  # decided ahead: its start confirmed while held
        await asyncio.sleep(0.05)
        owner["lease"] = False
        acked.set()
        await asyncio.sleep(0.05)
        if rebalanced:
            rebalance(ex, owner)
        owner["lease"] = True
        clock.advance(0.6)
        await until(lambda: reports)
        await ex.stop()
        return runner

    runner = asyncio.run(run())
    if not rebalanced:
        assert runner.calls == [("e1", 2)]
        return
    assert runner.calls == []
    assert [r["error"] for _, r in reports] == [
        "not called: its start was acknowledged while this worker's lease had lapsed, and "
        "the group rebalanced since"]


@pytest.mark.parametrize(("lapsed_s", "stopping", "waiting", "restarts"),
                         [(5.0, False, True, False), (7.0, False, True, True),
                          (7.0, True, True, False), (7.0, False, False, False)])
def test_a_lease_lapsed_a_session_past_its_end_restarts_an_idle_worker(
        lapsed_s: float, stopping: bool, waiting: bool, restarts: bool) -> None:
    """A stream waiting for the broker reads no event, so hold_lease never runs: the
    watch restarts the worker (dropping its unsent writes) once the lease is a session
    (6 s here) past its end, not before, not while it stops, and not without writes
    waiting for Kafka (nothing could land late)."""
    from types import SimpleNamespace

    from streams.worker_lifecycle import WorkerLifecycle

    why: list[str] = []
    lifecycle = SimpleNamespace(
        _stopping=stopping, settings=SimpleNamespace(session_timeout_s=6.0),
        changelog=SimpleNamespace(unacknowledged=waiting),
        lease=SimpleNamespace(remaining_s=lambda: -lapsed_s), restart=why.append)
    asyncio.run(WorkerLifecycle._watch_lease(lifecycle))  # type: ignore[arg-type]
    assert bool(why) == restarts


def test_the_changelog_tells_whether_a_write_waits_for_kafka() -> None:
    from streams.changelog import Changelog

    class Books(Changelog):
        def _write(self, *args: Any) -> None:
            pass

        def poll(self) -> None:
            pass

    log = Books(on_offsets=lambda offsets: None, on_fatal=lambda why: None)
    assert not log.unacknowledged
    log.produce("t", 0, b"k", b"v", None)
    log.produce("t", 1, b"k", b"v", None)
    assert log.unacknowledged
    log._ack(("t", 0), 1, 0)
    assert log.unacknowledged
    log._ack(("t", 1), 1, 0)
    assert not log.unacknowledged
