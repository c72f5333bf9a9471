"""Fire-ahead through the real path: a worker with KRON_FIRE_AHEAD_S=3 decides eligible slots
up to 3 s early (their `running` record is in Kafka before the due time), yet no call
reaches the loopback receiver before its slot, each slot is called once, and a pause inside
the window cancels a decided slot so that it is never called."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

import pytest

from kron.processes import WorkerProcess
from tests.conftest import fresh_settings
from tests.support.stack import Commands, latest_executions, spec, wait_until

pytestmark = pytest.mark.integration


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def scheduled_ms(hit) -> int:  # type: ignore[no-untyped-def]
    when = datetime.fromisoformat(hit.headers["X-Kron-Scheduled-For"])
    return int(when.astimezone(UTC).timestamp() * 1000)


def test_slots_decided_ahead_are_called_on_time_once_and_a_pause_cancels_them(
    kafka_cluster, tmp_path, receiver
) -> None:
    settings = fresh_settings(kafka_cluster, tmp_path / "d", fire_ahead_s=3.0)
    commands = Commands(settings)
    worker = WorkerProcess(settings, "w1", tmp_path).start()
    url = f"{receiver.url}/ok"
    try:
        warm = f"warm-{uuid.uuid4().hex[:8]}"
        commands.send("CreateJob", warm, spec=spec(target={"url": url}, run_at_ms=now_ms()))
        assert receiver.wait_for(warm, 1, 90), worker.log()[-3000:]

        due = now_ms() + 6000
        once = [f"once-{i}-{uuid.uuid4().hex[:6]}" for i in range(24)]
        for job_id in once:
            commands.send("CreateJob", job_id, spec=spec(target={"url": url}, run_at_ms=due))
        victim = f"victim-{uuid.uuid4().hex[:6]}"
        commands.send("CreateJob", victim, spec=spec(target={"url": url}, run_at_ms=due + 500))
        cron = f"cron-{uuid.uuid4().hex[:6]}"
        commands.send("CreateJob", cron, spec=spec(target={"url": url}, cron="*/1 * * * * *"))
        skip = f"skip-{uuid.uuid4().hex[:6]}"
        commands.send("CreateJob", skip, spec=spec(target={"url": url}, cron="*/1 * * * * *",
                                                     overlap="skip_if_running"))

        # Decided early: the victim's attempt is recorded as running before its due time.
        early = wait_until(lambda: [e for e in latest_executions(settings, victim).values()
                                    if e["state"] == "running"], 8, interval_s=0.1)
        assert now_ms() < due + 500 - 1000, "decided too late for the pause to race it"
        assert early[0]["attempts"][0]["started_at_ms"] == due + 500
        commands.send("PauseJob", victim)

        for job_id in once:
            assert receiver.wait_for(job_id, 1, 30), job_id
        assert receiver.wait_for(cron, 8, 30)
        time.sleep(2.0)  # late duplicates, or the victim's call, would arrive here
        commands.send("DeleteJob", cron)
        commands.send("DeleteJob", skip)

        hits = [h for h in receiver.hits if not h.path.startswith("/warm")]
        mine = [h for h in hits if h.headers["X-Kron-Job-Id"] in {*once, cron, skip, victim}]
        keys = [h.headers["Idempotency-Key"] for h in mine]
        assert len(keys) == len(set(keys)), "a slot was called twice"
        for h in mine:
            assert h.received_ms >= scheduled_ms(h), (h.headers, h.received_ms)
        assert not receiver.hits_for(victim), "a slot cancelled by a pause was called"
        state = wait_until(lambda: [e for e in latest_executions(settings, victim).values()
                                    if e["state"] == "cancelled"], 10)
        assert state[0]["reason"] == "job paused before the slot was due"
        # Every one-off ran once and is recorded as succeeded.
        for job_id in once:
            [ex] = wait_until(lambda j=job_id: [e for e in latest_executions(settings, j).values()
                                                if e["state"] == "succeeded"], 10)
            assert ex["scheduled_for_ms"] == due
        # The cron's slots are contiguous: deciding early loses none.
        slots = sorted(scheduled_ms(h) for h in mine if h.headers["X-Kron-Job-Id"] == cron)
        assert slots == list(range(slots[0], slots[-1] + 1, 1000)), slots
    finally:
        worker.stop()
        commands.close()


def test_slots_held_by_a_killed_worker_are_retried_by_the_next_owner_at_their_due_time(
    kafka_cluster, tmp_path, receiver
) -> None:
    """Two workers decide one-offs 10 s ahead; one is killed (-9) before they are due. The
    survivor takes its partitions over and retries the victim's held slots as attempt 2
    right away, long before their 60 s lease would have run out. Its own held slots,
    which crossed the rebalance's new epoch in the process that holds them, are called
    once, as attempt 1."""
    settings = fresh_settings(kafka_cluster, tmp_path / "d", fire_ahead_s=10.0,
                              session_timeout_s=6.0)
    commands = Commands(settings)
    workers = [WorkerProcess(settings, f"w{i}", tmp_path).start() for i in (1, 2)]
    url = f"{receiver.url}/ok"
    try:
        warm = f"warm-{uuid.uuid4().hex[:8]}"
        commands.send("CreateJob", warm, spec=spec(target={"url": url}, run_at_ms=now_ms()))
        assert receiver.wait_for(warm, 1, 90), [w.log()[-2000:] for w in workers]
        time.sleep(3)  # let the second worker's join settle the assignment

        due = now_ms() + 9500
        jobs = [f"held-{i}-{uuid.uuid4().hex[:6]}" for i in range(24)]
        for job_id in jobs:
            commands.send("CreateJob", job_id, spec=spec(target={"url": url}, run_at_ms=due,
                                                         lease_s=60.0))

        def decided() -> dict[str, str]:
            owners = {}
            for job_id in jobs:
                for e in latest_executions(settings, job_id).values():
                    if e["state"] == "running":
                        owners[job_id] = e["worker"]
            return owners if len(owners) == len(jobs) else {}

        owners = wait_until(decided, 8, interval_s=0.2)
        assert now_ms() < due - 1000, "decided too late to kill the owner before the due time"
        victim = next(w for w in workers if w.name == owners[jobs[0]])
        survivor = next(w for w in workers if w is not victim)
        victim.kill()
        orphans = {j for j in jobs if owners[j] == victim.name}

        # Well inside the lease: only the handover retries them this soon.
        for job_id in jobs:
            assert receiver.wait_for(job_id, 1, 40), (job_id, survivor.log()[-3000:])
        time.sleep(2.0)  # a second call of any of them would arrive here
        for job_id in jobs:
            hits = receiver.hits_for(job_id)
            assert len(hits) == 1, (job_id, len(hits))
            assert hits[0].headers["X-Kron-Attempt"] == ("2" if job_id in orphans else "1")
            assert hits[0].received_ms >= due
        for job_id in orphans:
            [ex] = wait_until(lambda j=job_id: [e for e in latest_executions(settings, j).values()
                                                if e["state"] == "succeeded"], 20)
            assert [(a["worker"], a["outcome"]) for a in ex["attempts"]] == [
                (victim.name, "lease_expired"), (survivor.name, "succeeded")]
    finally:
        for w in workers:
            w.stop()
        commands.close()
