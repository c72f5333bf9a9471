"""A run whose call waits in the worker for its tenant's dispatch rate shows `queued`,
reason "dispatch rate" (issue 39): the executor reports an attempt held back a second or
more once (a heartbeat with `held_for`), and again, plainly, when it calls it; the core
records the reason and clears it; the API shows such a running execution queued.
The real Executor (a manual clock, a recording reporter), the real core over a MemoryStore,
the API's render."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from api.routes.render import run_out
from kron.clock import ManualClock
from streams.domain.policies import Priority
from streams.domain.states import QueueReason
from streams.engine.core import Context, Dispatch, PartitionCore
from streams.engine.store import MemoryStore
from streams.executor import HELD_NOTICE_S, Executor
from streams.targets import AttemptInfo, Outcome
from tests.support.stack import spec

T0 = 1_767_225_600_000


@dataclass(frozen=True)
class _Quotas:
    weight: float = 1.0
    dispatch_rate_per_s: float = 0.0


class _Table:
    def quotas(self, tenant: str) -> _Quotas:
        return _Quotas(dispatch_rate_per_s=1.0 if tenant == "slow" else 0.0)


class _Runner:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def run(self, target: dict[str, Any], info: AttemptInfo) -> Outcome:
        self.calls.append(info.exec_id)
        return Outcome(ok=True)


def _attempt(exec_id: str) -> Dispatch:
    return Dispatch(exec_id=exec_id, job_id="j", tenant="slow", scheduled_for_ms=0, attempt=1,
                    fencing_token=1, target={"url": "http://x.invalid/"}, lease_s=30.0,
                    priority=Priority.NORMAL)


def test_the_executor_reports_an_attempt_held_for_the_rate_once_then_when_called() -> None:
    async def main() -> list[tuple[str, dict[str, Any]]]:
        beats: list[tuple[str, dict[str, Any]]] = []

        async def report(partition: int, name: str, record: dict[str, Any], /,
                         **_: Any) -> None:
            if name.endswith("Heartbeat"):
                beats.append((record["exec_id"], record))

        clock = ManualClock()
        runner = _Runner()
        ex = Executor(runners={"http": runner}, report=report,
                      clock=clock, worker_id="w", tenants=_Table(), partitions=1)
        ex.submit(_attempt("a"), 0)
        ex.submit(_attempt("b"), 0)  # the bucket holds a second's worth: b waits
        q = ex._queue
        assert q.pop() is not None and q.pop() is None and q.throttled == 1
        await ex._beat_throttled()
        assert beats == []  # not held a second yet
        clock.advance(HELD_NOTICE_S)
        await ex._beat_throttled()
        await ex._beat_throttled()  # told once, not at every look
        assert [(e, r["held_for"], r["envelope"]["event_type"]) for e, r in beats] == [
            ("b", "dispatch rate", "execution.held")]
        (job,) = list(q.throttled_items())
        await ex._run(job)
        assert runner.calls == ["b"]
        assert [(e, r["held_for"]) for e, r in beats[1:]] == [("b", None)]
        return beats

    asyncio.run(main())


def _ctx(n: int, now: int) -> Context:
    return Context(now_ms=now, causation_id=f"ev-{n}", worker="w", epoch=1, incarnation="p")


def _report(d: Dispatch, name: str, n: int, **fields: Any) -> dict[str, Any]:
    return {"envelope": {"event_id": f"r{n}", "event_type": "execution.report",
                         "schema_version": 2, "occurred_at_ms": T0, "tenant": d.tenant,
                         "causation_id": None, "correlation_id": d.job_id,
                         "producer": "w"},
            "exec_id": d.exec_id, "job_id": d.job_id, "scheduled_for_ms": d.scheduled_for_ms,
            "owner_epoch": 1, "attempt": d.attempt, "fencing_token": d.fencing_token,
            **fields}


def _started() -> tuple[MemoryStore, PartitionCore, Dispatch]:
    """A one-off of tenant `slow`, fired at T0: its store, its core and its dispatch."""
    store = MemoryStore()
    core = PartitionCore(store)
    core.create_new(job_id="j1", tenant="slow", command_id="c1",
                    spec=spec(target={"url": "http://x.invalid/"}, run_at_ms=T0),
                    idempotency_key=None, ctx=_ctx(0, T0 - 1000))
    effects, _ = core.on_tick(_ctx(1, T0))
    (d,) = [e for e in effects if isinstance(e, Dispatch)]
    return store, core, d


def test_the_core_records_the_held_reason_and_clears_it_when_called_or_done() -> None:
    store, core, d = _started()
    beat = "kron.executions.ExecutionHeartbeat"
    core.on_report(beat, _report(d, beat, 2, lease_until_ms=T0 + 60_000,
                                 held_for="dispatch rate"), _ctx(2, T0 + 1000))
    ex = store.execution(d.exec_id)
    assert ex is not None and ex["state"] == "running" and ex["reason"] == "dispatch rate"
    shown = run_out({**ex, "started_at_ms": None, "finished_at_ms": None, "lateness_ms": 0})
    assert (shown["state"], shown["reason"]) == ("queued", QueueReason.DISPATCH_RATE)
    core.on_report(beat, _report(d, beat, 3, lease_until_ms=T0 + 60_000, held_for=None),
                   _ctx(3, T0 + 2000))
    ex = store.execution(d.exec_id)
    assert ex is not None and ex["reason"] is None and ex["envelope"]["event_type"] == (
        "execution.heartbeat")
    # Held again, and its result comes before the word it was called: done, no reason left.
    core.on_report(beat, _report(d, beat, 4, lease_until_ms=T0 + 60_000,
                                 held_for="dispatch rate"), _ctx(4, T0 + 3000))
    done = "kron.executions.ExecutionSucceeded"
    core.on_report(done, _report(d, done, 5, started_at_ms=T0 + 3000, finished_at_ms=T0 + 3100,
                                 status_code=200, response_excerpt=None), _ctx(5, T0 + 3100))
    ex = store.execution(d.exec_id)
    assert ex is not None and ex["state"] == "succeeded" and ex["reason"] is None


def test_a_heartbeat_with_any_other_held_for_sets_no_reason() -> None:
    store, core, d = _started()
    beat = "kron.executions.ExecutionHeartbeat"
    core.on_report(beat, _report(d, beat, 2, lease_until_ms=T0 + 60_000,
                                 held_for="<img src=x onerror=alert(1)>"), _ctx(2, T0 + 1000))
    ex = store.execution(d.exec_id)
    assert ex is not None and ex["reason"] is None and ex["lease_until_ms"] == T0 + 60_000
