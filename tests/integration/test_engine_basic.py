"""The engine through the real path: Kafka broker, `kron worker` processes, HTTP on loopback."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

import pytest

from bench.receiver import Receiver
from kron.settings import Settings
from tests.support.stack import Commands, latest_executions, spec, wait_until

pytestmark = pytest.mark.integration


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_one_off_job_calls_the_target_once_on_time(
    kafka_settings: Settings, receiver: Receiver, commands: Commands, start_worker
) -> None:
    worker = start_worker()
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    # Warm-up: the worker's first assignment takes a few seconds; measure timing after it.
    warm = f"warm-{uuid.uuid4().hex[:8]}"
    commands.send("CreateJob", warm, spec=spec(target={"url": f"{receiver.url}/ok"},
                                                run_at_ms=now_ms()))
    assert receiver.wait_for(warm, 1, 60), worker.log()[-3000:]

    run_at = now_ms() + 2000
    commands.send("CreateJob", job_id, spec=spec(target={"url": f"{receiver.url}/ok"},
                                                  run_at_ms=run_at))
    hits = receiver.wait_for(job_id, 1, 15)
    time.sleep(1.5)  # a second call would arrive in this window
    hits = receiver.hits_for(job_id)
    assert len(hits) == 1, hits
    hit = hits[0]
    assert run_at <= hit.received_ms <= run_at + 1000, hit.received_ms - run_at
    states = wait_until(lambda: [e for e in latest_executions(kafka_settings, job_id).values()
                                 if e["state"] == "succeeded"], 10)
    assert len(states) == 1
    exec_id = states[0]["exec_id"]
    assert hit.headers["Idempotency-Key"] == exec_id
    assert hit.headers["X-Kron-Job-Id"] == job_id
    assert hit.headers["X-Kron-Attempt"] == "1"
    assert hit.headers["X-Kron-Fencing-Token"] == "1"
    sched = datetime.fromisoformat(hit.headers["X-Kron-Scheduled-For"])
    assert int(sched.astimezone(UTC).timestamp() * 1000) == run_at


@pytest.mark.parametrize("local", [True, False], ids=["applied-here", "as-events"])
def test_ticks_and_results_of_owned_partitions_skip_the_signals_topic(
    kafka_cluster, tmp_path, receiver: Receiver, local: bool
) -> None:
    """A worker applies its own ticks and its own attempts' results for the partitions it
    owns without a round trip through kron.signals; with KRON_LOCAL_TICKS=false and
    KRON_LOCAL_RESULTS=false each tick and each batch is an event. Either way every
    execution ends `succeeded`, once."""
    from kron.processes import WorkerProcess
    from replay.reader import read_topic
    from schemas.names import ATTEMPTS_FINISHED, TICK
    from tests.conftest import fresh_settings

    settings = fresh_settings(kafka_cluster, tmp_path / "d")
    commands = Commands(settings)
    worker = WorkerProcess(settings, "w1", tmp_path)
    worker.env["KRON_LOCAL_RESULTS"] = str(local).lower()
    worker.env["KRON_LOCAL_TICKS"] = str(local).lower()
    worker.start()
    try:
        jobs = [f"job-{uuid.uuid4().hex[:8]}" for _ in range(8)]  # spread over partitions
        for job_id in jobs:
            commands.send("CreateJob", job_id, spec=spec(target={"url": f"{receiver.url}/ok"},
                                                          run_at_ms=now_ms()))
        for job_id in jobs:
            assert receiver.wait_for(job_id, 1, 90), worker.log()[-3000:]
        for job_id in jobs:
            done = wait_until(lambda j=job_id: [e for e in latest_executions(settings, j)
                                                .values() if e["state"] == "succeeded"], 30)
            assert len(done) == 1 and done[0]["attempt"] == 1, worker.log()[-3000:]
        signals = read_topic(settings, settings.topic("signals"))
        batches = [e for e in signals if e.name == ATTEMPTS_FINISHED]
        ticked = {e.record["partition"] for e in signals if e.name == TICK}
        fired_in = {e.partition for e in signals if e.name == ATTEMPTS_FINISHED}
        if local:
            assert batches == [] and ticked == set()
        else:
            reported = {r["exec_id"] for e in batches for r in e.record["results"]}
            assert len(reported) == len(jobs)
            assert fired_in <= ticked, (fired_in, ticked)
    finally:
        worker.stop()
        commands.close()
