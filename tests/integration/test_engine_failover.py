"""Real processes dying: kill -9 mid-attempt, and every owner down for 10 s."""

from __future__ import annotations

import itertools
import signal
import time
import uuid

import pytest

from kron.processes import WorkerProcess
from tests.conftest import fresh_settings
from tests.support.stack import Commands, latest_executions, spec, wait_until

pytestmark = pytest.mark.integration


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def warm_up(commands: Commands, receiver, *workers: WorkerProcess) -> None:
    warm = f"warm-{uuid.uuid4().hex[:8]}"
    commands.send("CreateJob", warm, spec=spec(target={"url": f"{receiver.url}/ok"},
                                                run_at_ms=now_ms()))
    assert receiver.wait_for(warm, 1, 90), "\n".join(w.log()[-2000:] for w in workers)


# Without standbys (KRON_STANDBY_REPLICAS=0) the survivor rebuilds the partition from its
# changelog when it takes over, instead of from the copy it kept: the execution it finds
# running must be the same.
@pytest.mark.parametrize("standby_replicas", [1, 0])
def test_kill_9_mid_attempt_is_retried_elsewhere_with_the_same_key(
    kafka_cluster, tmp_path, receiver, standby_replicas
) -> None:
    settings = fresh_settings(kafka_cluster, tmp_path / "d", session_timeout_s=6.0,
                              standby_replicas=standby_replicas)
    commands = Commands(settings)
    workers = [WorkerProcess(settings, f"w{i}", tmp_path).start() for i in (1, 2)]
    try:
        warm_up(commands, receiver, *workers)
        time.sleep(3)  # let the second worker's join settle the assignment
        job_id = f"job-{uuid.uuid4().hex[:8]}"
        commands.send("CreateJob", job_id, spec=spec(
            target={"url": f"{receiver.url}/hold-first/60", "timeout_s": 90.0},
            run_at_ms=now_ms(), lease_s=4.0))
        assert receiver.wait_for(job_id, 1, 20)
        running = wait_until(lambda: [e for e in latest_executions(settings, job_id).values()
                                      if e["state"] == "running"], 10)
        owner = next(w for w in workers if w.name == running[0]["worker"])
        owner.kill()  # SIGKILL while the target holds the request
        hits = receiver.wait_for(job_id, 2, 60)
        assert len(hits) == 2, [w.log()[-2000:] for w in workers]
        final = wait_until(lambda: [e for e in latest_executions(settings, job_id).values()
                                    if e["state"] == "succeeded"], 20)
        assert final, latest_executions(settings, job_id)
        assert hits[0].headers["Idempotency-Key"] == hits[1].headers["Idempotency-Key"]
        assert [h.headers["X-Kron-Attempt"] for h in hits] == ["1", "2"]
        (state,) = latest_executions(settings, job_id).values()
        assert state["attempt"] == 2
        assert [a["outcome"] for a in state["attempts"]] == ["lease_expired", "succeeded"]
        assert state["attempts"][1]["worker"] != owner.name
    finally:
        for w in workers:
            w.stop()
        commands.close()


def test_all_owners_down_for_10s_follow_the_misfire_policy(
    kafka_cluster, tmp_path, receiver
) -> None:
    # A 3 s grace makes the 10 s outage a misfire (the default, 60 s, outlasts a failover).
    settings = fresh_settings(kafka_cluster, tmp_path / "d", misfire_grace_s=3.0)
    commands = Commands(settings)
    worker = WorkerProcess(settings, "w1", tmp_path).start()
    try:
        warm_up(commands, receiver, worker)
        job_id = f"job-{uuid.uuid4().hex[:8]}"
        commands.send("CreateJob", job_id, spec=spec(
            target={"url": f"{receiver.url}/ok"}, cron="*/2 * * * * *"))
        assert receiver.wait_for(job_id, 2, 20)
        worker.signal(signal.SIGTERM)
        worker.proc.wait(30)
        down_at = now_ms()
        time.sleep(10)
        worker = WorkerProcess(settings, "w1", tmp_path).start()
        up_hits = len(receiver.hits_for(job_id))
        assert receiver.wait_for(job_id, up_hits + 3, 60)
        commands.send("DeleteJob", job_id)
        time.sleep(2)
        states = sorted(latest_executions(settings, job_id).values(),
                        key=lambda e: e["scheduled_for_ms"])
        slots = [e["scheduled_for_ms"] for e in states]
        assert slots == list(range(slots[0], slots[-1] + 1, 2000)), "a slot was lost"
        missed = [e for e in states if e["state"] == "missed"]
        assert len(missed) >= 2 and all(e["reason"] == "coalesced" for e in missed)
        assert all(e["scheduled_for_ms"] > down_at - 2000 for e in missed)
        misfired = [e for e in states if e["trigger"] == "misfire"]
        assert len(misfired) == 1
        # The one coalesced run comes right after the run of missed slots.
        assert misfired[0]["scheduled_for_ms"] == missed[-1]["scheduled_for_ms"] + 2000
        keys = [h.headers["Idempotency-Key"] for h in receiver.hits_for(job_id)]
        assert len(keys) == len(set(keys)), "a slot fired twice"
        # Every call is of a started execution. The delete cancels the one attempt in flight,
        # which may have been decided ahead of its slot (fire-ahead) and never called.
        started = {e["exec_id"]: e for e in states if e["state"] not in ("missed", "skipped")}
        called = set(keys)
        assert called <= started.keys(), "a call of no started execution"
        uncalled = [e for x, e in started.items() if x not in called]
        assert len(uncalled) <= 1 and all(e["state"] == "cancelled" for e in uncalled), uncalled
        assert not any(b - a != 2000 for a, b in itertools.pairwise(slots))
    finally:
        worker.stop()
        commands.close()
