"""PartitionCore's manual controls on plain executions (issue 40, part 5): RetryRun runs a
failed, missed or skipped execution again as its next attempt (same exec id, so the same
Idempotency-Key; attempt and fencing token one higher), CancelRun stops a running one and
fences it. DAG runs take the same commands (test_core_dag.py)."""

from __future__ import annotations

import pytest

from streams.domain.errors import PermanentError
from streams.domain.ids import exec_id
from streams.engine.core import Cancel, Dispatch
from tests.unit.test_core_scenarios import MIN, SEC, Partition, dispatches, utc

T0 = utc(2026, 3, 1, 0, 0)
ONE_ATTEMPT = {"max_attempts": 1, "backoff": "fixed", "base_s": 1.0, "max_s": 1.0}


def failed_run(p: Partition, *, retry: dict[str, object] | None = None) -> Dispatch:
    """A one-off job `j` due at T0 whose only attempt failed for good: its Dispatch."""
    p.create("j", run_at_ms=T0, retry=retry or ONE_ATTEMPT)
    [first] = dispatches(p.tick(T0))
    p.now += SEC
    p.report(first, "permanent", status_code=400)
    assert p.ex("j", T0)["state"] == "failed"
    return first


def test_retry_of_a_failed_run_starts_its_next_attempt_with_the_same_key() -> None:
    p = Partition(T0 - MIN)
    first = failed_run(p)
    p.now += MIN
    [again] = dispatches(p.command("RetryRun", "j", run_id=first.exec_id))
    assert again.exec_id == first.exec_id == exec_id("j", T0)  # the Idempotency-Key
    assert (again.attempt, again.fencing_token) == (2, 2)
    assert again.fencing_token != first.fencing_token
    ex = p.ex("j", T0)
    assert (ex["state"], ex["attempt"], ex["reason"]) == ("running", 2, None)
    assert [a["attempt"] for a in ex["attempts"]] == [1, 2]
    assert ex["envelope"]["event_type"] == "execution.rerun_started"
    assert p.job("j")["running"] == [first.exec_id]
    p.report(again, "success")
    assert p.ex("j", T0)["state"] == "succeeded"
    assert p.job("j")["status"] == "completed"


def test_a_retried_run_that_fails_again_is_judged_by_its_retry_policy() -> None:
    """Attempt 4 of a job allowing 3 fails at once: a retry spends no more of the policy."""
    p = Partition(T0 - MIN)
    p.create("j", run_at_ms=T0)  # max_attempts 3
    d = dispatches(p.tick(T0))[0]
    for _ in range(3):
        p.now += 10 * SEC
        p.report(d, "transient")
        p.now += 10 * SEC
        nxt = dispatches(p.tick(p.now))
        d = nxt[0] if nxt else d
    assert p.ex("j", T0)["state"] == "failed"
    [fourth] = dispatches(p.command("RetryRun", "j", run_id=d.exec_id))
    assert fourth.attempt == 4
    p.report(fourth, "transient")
    assert p.ex("j", T0)["state"] == "failed"


def test_retry_of_a_missed_and_of_a_skipped_run_makes_attempt_one() -> None:
    p = Partition(T0 + 30 * SEC)
    p.create("m", cron="0 * * * *", misfire={"kind": "skip_if_late_by", "late_by_s": 60.0})
    p.create("s", cron="0 * * * *")
    p.command("PauseJob", "s")
    p.ticks(T0 + 59 * MIN, MIN)
    p.tick(T0 + 70 * MIN)  # m's 01:00 slot is 10 min late: missed; s's is skipped (paused)
    assert p.ex("m", T0 + 60 * MIN)["state"] == "missed"
    assert p.ex("s", T0 + 60 * MIN)["state"] == "skipped"
    for job_id in ("m", "s"):
        run_id = exec_id(job_id, T0 + 60 * MIN)
        [d] = dispatches(p.command("RetryRun", job_id, run_id=run_id))
        assert (d.exec_id, d.attempt, d.fencing_token) == (run_id, 1, 1)
        ex = p.ex(job_id, T0 + 60 * MIN)
        assert (ex["state"], ex["reason"]) == ("running", None)


def test_cancel_fences_the_running_attempt_and_a_late_result_is_rejected() -> None:
    p = Partition(T0 - MIN)
    p.create("j", run_at_ms=T0, lease_s=600.0)
    [d] = dispatches(p.tick(T0))
    p.now += SEC
    effects = p.command("CancelRun", "j", run_id=d.exec_id, reason="operator said so")
    assert [e for e in effects if isinstance(e, Cancel)] == [
        Cancel(exec_id=d.exec_id, fencing_token=d.fencing_token)]  # the executor stops it
    ex = p.ex("j", T0)
    assert (ex["state"], ex["reason"], ex["fencing_token"]) == (
        "cancelled", "operator said so", d.fencing_token + 1)
    assert p.job("j")["running"] == []
    # The target answers late, with the old token: fenced, the run stays cancelled.
    p.now += SEC
    assert p.report(d, "success") == []
    assert p.core.stale_rejected == 1
    assert p.ex("j", T0)["state"] == "cancelled"
    # Its lease runs out later: nothing happens either (no retry of a cancelled run).
    assert dispatches(p.tick(T0 + 11 * MIN)) == []
    assert p.ex("j", T0)["state"] == "cancelled"


def test_cancel_of_a_run_waiting_for_its_retry_drops_the_retry() -> None:
    p = Partition(T0 - MIN)
    p.create("j", run_at_ms=T0)
    [d] = dispatches(p.tick(T0))
    p.report(d, "transient")
    assert p.ex("j", T0)["state"] == "retry_pending"
    p.command("CancelRun", "j", run_id=d.exec_id, reason=None)
    assert (p.ex("j", T0)["state"], p.ex("j", T0)["reason"]) == ("cancelled", "run cancelled")
    assert dispatches(p.tick(T0 + 10 * MIN)) == []


@pytest.mark.parametrize("outcome", ["success", "running"])
def test_retry_is_refused_for_a_running_or_succeeded_run(outcome: str) -> None:
    p = Partition(T0 - MIN)
    p.create("j", run_at_ms=T0)
    [d] = dispatches(p.tick(T0))
    if outcome == "success":
        p.report(d, "success")
    with pytest.raises(PermanentError, match="only a failed, missed or skipped") as err:
        p.command("RetryRun", "j", run_id=d.exec_id)
    assert err.value.field == "run_id"
    assert p.ex("j", T0)["attempt"] == 1


def test_a_cancelled_run_is_not_retried_and_an_ended_one_not_cancelled() -> None:
    p = Partition(T0 - MIN)
    first = failed_run(p)
    with pytest.raises(PermanentError, match="only a queued, running or retrying"):
        p.command("CancelRun", "j", run_id=first.exec_id, reason=None)
    [again] = dispatches(p.command("RetryRun", "j", run_id=first.exec_id))
    p.command("CancelRun", "j", run_id=again.exec_id, reason=None)
    with pytest.raises(PermanentError, match="cancelled after 2 attempt"):
        p.command("RetryRun", "j", run_id=first.exec_id)


def test_a_run_of_another_job_or_an_unknown_one_is_refused() -> None:
    p = Partition(T0 - MIN)
    first = failed_run(p)
    p.create("k", cron="0 * * * *")
    with pytest.raises(PermanentError, match="no run"):
        p.command("RetryRun", "k", run_id=first.exec_id)
    with pytest.raises(PermanentError, match="no run"):
        p.command("CancelRun", "j", run_id="nope", reason=None)


def test_a_retry_command_that_comes_again_starts_no_second_attempt() -> None:
    p = Partition(T0 - MIN)
    first = failed_run(p)
    [again] = dispatches(p.command("RetryRun", "j", command_id="c-1", run_id=first.exec_id))
    assert dispatches(p.command("RetryRun", "j", command_id="c-1", run_id=first.exec_id)) == []
    assert p.ex("j", T0)["attempt"] == again.attempt == 2
