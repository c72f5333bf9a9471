"""Engine behaviour through the real path, one shared worker process for the module."""

from __future__ import annotations

import itertools
import time
import uuid
from datetime import datetime

import pytest
from confluent_kafka import Producer

from replay.reader import read_topic
from schemas import codec
from streams.engine.batch import partition_for
from tests.support.stack import executions, latest_executions, spec, wait_until

pytestmark = pytest.mark.integration


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def new_job() -> str:
    return f"job-{uuid.uuid4().hex[:10]}"


def sched_ms(hit) -> int:
    return int(datetime.fromisoformat(hit.headers["X-Kron-Scheduled-For"]).timestamp() * 1000)


def states_of(stack, job_id: str) -> dict[str, dict]:
    return latest_executions(stack.settings, job_id)


def test_cron_with_seconds_fires_consecutive_slots_once_each(stack) -> None:
    job_id = new_job()
    stack.commands.send("CreateJob", job_id, spec=spec(
        target={"url": f"{stack.receiver.url}/ok"}, cron="*/2 * * * * *"))
    stack.receiver.wait_for(job_id, 5, 30)
    stack.commands.send("DeleteJob", job_id)
    time.sleep(3)
    slots = sorted(sched_ms(h) for h in stack.receiver.hits_for(job_id))
    assert len(slots) >= 5
    assert len(set(slots)) == len(slots), "a slot was delivered twice"
    assert all(b - a == 2000 for a, b in itertools.pairwise(slots)), slots
    recorded = sorted(e["scheduled_for_ms"] for e in states_of(stack, job_id).values())
    assert recorded == slots


def test_503_503_200_takes_three_attempts_with_capped_growing_backoff(stack) -> None:
    job_id = new_job()
    stack.commands.send("CreateJob", job_id, spec=spec(
        target={"url": f"{stack.receiver.url}/status/503,503,200"}, run_at_ms=now_ms(),
        retry={"max_attempts": 5, "base_s": 0.5, "max_s": 10.0}))
    hits = stack.receiver.wait_for(job_id, 3, 30)
    time.sleep(1)
    hits = stack.receiver.hits_for(job_id)
    assert [h.headers["X-Kron-Attempt"] for h in hits] == ["1", "2", "3"]
    assert len({h.headers["Idempotency-Key"] for h in hits}) == 1
    final = wait_until(lambda: [e for e in states_of(stack, job_id).values()
                                if e["state"] == "succeeded"], 10)
    assert final and final[0]["attempt"] == 3
    history = [e for e in executions(stack.settings) if e["job_id"] == job_id
               and e["state"] == "retry_pending"]
    delays = [e["retry_at_ms"] - e["updated_at_ms"] for e in history]
    caps = [500 * 2 ** (n - 1) for n in (1, 2)]
    assert len(delays) == 2
    assert all(0 <= d <= cap for d, cap in zip(delays, caps, strict=True)), (delays, caps)
    gaps = [b.received_ms - a.received_ms for a, b in itertools.pairwise(hits)]
    assert all(g >= d for g, d in zip(gaps, delays, strict=True)), (gaps, delays)


def test_400_is_not_retried_and_raises_an_alert(stack) -> None:
    job_id = new_job()
    stack.commands.send("CreateJob", job_id, spec=spec(
        target={"url": f"{stack.receiver.url}/status/400"}, run_at_ms=now_ms()))
    stack.receiver.wait_for(job_id, 1, 20)
    final = wait_until(lambda: [e for e in states_of(stack, job_id).values()
                                if e["state"] == "failed"], 15)
    time.sleep(1)
    assert len(stack.receiver.hits_for(job_id)) == 1
    assert final and final[0]["attempt"] == 1 and final[0]["status_code"] == 400
    alerts = [e for e in read_topic(stack.settings.bootstrap_servers,
                                    stack.settings.topic("dead-letters"))
              if e.record and e.record["error_class"] == "execution_failed"
              and e.key == job_id.encode()]
    assert len(alerts) == 1


def test_hanging_target_times_out_and_is_retried(stack) -> None:
    job_id = new_job()
    stack.commands.send("CreateJob", job_id, spec=spec(
        target={"url": f"{stack.receiver.url}/hang", "timeout_s": 1.0}, run_at_ms=now_ms(),
        retry={"max_attempts": 2, "base_s": 0.1, "max_s": 0.5}))
    final = wait_until(lambda: [e for e in states_of(stack, job_id).values()
                                if e["state"] == "failed"], 30)
    assert final, states_of(stack, job_id)
    assert final[0]["attempt"] == 2
    assert [a["outcome"] for a in final[0]["attempts"]] == ["timeout", "timeout"]
    assert len(stack.receiver.hits_for(job_id)) == 2


def test_pause_records_skipped_slots_and_resume_continues(stack) -> None:
    job_id = new_job()
    stack.commands.send("CreateJob", job_id, spec=spec(
        target={"url": f"{stack.receiver.url}/ok"}, cron="* * * * * *"))
    stack.receiver.wait_for(job_id, 2, 20)
    stack.commands.send("PauseJob", job_id)
    time.sleep(3)
    paused_hits = len(stack.receiver.hits_for(job_id))
    time.sleep(2)
    assert len(stack.receiver.hits_for(job_id)) <= paused_hits + 1  # one may be in flight
    stack.commands.send("ResumeJob", job_id)
    stack.receiver.wait_for(job_id, paused_hits + 2, 20)
    stack.commands.send("DeleteJob", job_id)
    time.sleep(2)
    after_delete = len(stack.receiver.hits_for(job_id))
    time.sleep(2)
    assert len(stack.receiver.hits_for(job_id)) == after_delete, "delete did not stop the job"
    states = sorted(states_of(stack, job_id).values(), key=lambda e: e["scheduled_for_ms"])
    skipped = [e for e in states if e["state"] == "skipped"]
    assert len(skipped) >= 3 and all(e["reason"] == "paused" for e in skipped)
    # No lost slot: every second between the first and the last recorded slot has an outcome.
    slots = [e["scheduled_for_ms"] for e in states]
    assert slots == list(range(slots[0], slots[-1] + 1, 1000))


def test_trigger_now_runs_one_extra_execution_with_its_own_id(stack) -> None:
    job_id = new_job()
    stack.commands.send("CreateJob", job_id, spec=spec(
        target={"url": f"{stack.receiver.url}/ok"}, cron="0 0 1 1 *"))
    cmd = stack.commands.send("TriggerJob", job_id)
    stack.commands.send("TriggerJob", job_id, command_id=cmd)  # a redelivery: no new run
    stack.receiver.wait_for(job_id, 1, 20)
    time.sleep(1.5)
    hits = stack.receiver.hits_for(job_id)
    assert len(hits) == 1
    (state,) = states_of(stack, job_id).values()
    assert state["trigger"] == "manual" and state["exec_id"] == hits[0].headers["Idempotency-Key"]


def test_skip_if_running_records_skipped_slots(stack) -> None:
    job_id = new_job()
    stack.commands.send("CreateJob", job_id, spec=spec(
        target={"url": f"{stack.receiver.url}/slow/3.5"}, cron="* * * * * *",
        overlap="skip_if_running"))
    time.sleep(6)
    stack.commands.send("DeleteJob", job_id)
    states = wait_until(lambda: [e for e in states_of(stack, job_id).values()
                                 if e["state"] == "skipped"], 10)
    assert len(states) >= 2
    assert all(e["reason"] == "overlap: running" for e in states)
    running = [e for e in states_of(stack, job_id).values() if e["state"] != "skipped"]
    hits = stack.receiver.hits_for(job_id)
    assert len(hits) == len(running) <= 3


def test_same_create_command_twice_makes_one_job(stack) -> None:
    job_id = new_job()
    s = spec(target={"url": f"{stack.receiver.url}/ok"}, run_at_ms=now_ms() + 500)
    cmd = stack.commands.send("CreateJob", job_id, spec=s)
    stack.commands.send("CreateJob", job_id, spec=s, command_id=cmd)
    stack.receiver.wait_for(job_id, 1, 20)
    time.sleep(1.5)
    assert len(stack.receiver.hits_for(job_id)) == 1


def test_poison_records_go_to_dead_letters_and_the_partition_moves_on(stack) -> None:
    job_id = new_job()
    producer = Producer({"bootstrap.servers": stack.settings.bootstrap_servers, "acks": "all"})
    topic = stack.settings.topic("commands")
    header = bytes.fromhex("c301") + b"\x00" * 8
    poison = [b"garbage", header + b"\x01\x02", bytes.fromhex("c301") + b"\xaa" * 3]
    for value in poison:
        producer.produce(topic, key=job_id.encode(), value=value)
    producer.flush(10)
    # Well-formed but invalid: an unknown job, and a year-10000 run_at.
    stack.commands.send("PauseJob", f"nope-{job_id}")
    stack.commands.send("CreateJob", job_id + "-far", spec=spec(
        target={"url": f"{stack.receiver.url}/ok"}, run_at_ms=253_402_300_800_000 + 1))
    stack.commands.send("CreateJob", job_id, spec=spec(
        target={"url": f"{stack.receiver.url}/ok"}, run_at_ms=now_ms()))
    assert stack.receiver.wait_for(job_id, 1, 20), "a valid command behind poison did not run"

    def letters() -> list:
        return [e.record for e in read_topic(stack.settings.bootstrap_servers,
                                             stack.settings.topic("dead-letters"))
                if (e.record and e.record["source_topic"] == topic
                and (e.key or b"").decode().endswith(job_id)) or
                (e.record and e.record["source_topic"] == topic
                 and (e.key or b"").decode() in (f"nope-{job_id}", job_id + "-far"))]

    found = wait_until(lambda: len(letters()) >= 5 and letters(), 15)
    assert len(found) == 5, found
    classes = sorted(r["error_class"] for r in found)
    assert classes == ["decode", "decode", "decode", "validation", "validation"]
    assert all(r["source_offset"] >= 0 and r["source_partition"] >= 0 for r in found)


def test_create_jobs_batch_creates_its_jobs_and_dead_letters_only_the_bad_ones(stack) -> None:
    n, prefix = stack.settings.partitions, new_job()
    candidates = (f"{prefix}-{i}" for i in itertools.count())
    first = next(candidates)
    home = partition_for(first, n)
    mine = [first, *itertools.islice((c for c in candidates if partition_for(c, n) == home), 3)]
    stranger = next(c for c in candidates if partition_for(c, n) != home)
    target = {"url": f"{stack.receiver.url}/ok"}

    def job(job_id: str, run_at_ms: int) -> dict:
        return {"job_id": job_id, "idempotency_key": None,
                "spec": spec(target=target, run_at_ms=run_at_ms)}

    run_at = now_ms() + 500
    jobs = [job(j, run_at) for j in mine[:3]]
    jobs += [job(stranger, run_at), job(mine[0], run_at), job(mine[3], 253_402_300_800_001)]
    command_id = uuid.uuid4().hex
    batch = {"envelope": {"event_id": command_id, "event_type": "job.create_many_requested",
                          "schema_version": 1, "occurred_at_ms": now_ms(), "tenant": "acme",
                          "causation_id": None, "correlation_id": None, "producer": "tests"},
             "command_id": command_id, "jobs": jobs}
    publish = stack.commands.publisher.publish_sync
    partition, offset = publish("kron.commands.CreateJobs", batch, key=first)
    assert partition == home  # librdkafka's murmur2_random agrees with partition_for
    _, again = publish("kron.commands.CreateJobs", batch, key=first)  # no job twice
    for job_id in mine[:3]:
        assert stack.receiver.wait_for(job_id, 1, 20), f"{job_id} of the batch did not run"

    def letters() -> list:
        return [e.record for e in read_topic(stack.settings.bootstrap_servers,
                                             stack.settings.topic("dead-letters"))
                if e.record and e.record["source_topic"] == stack.settings.topic("commands")
                and e.record["source_partition"] == home
                and e.record["source_offset"] in (offset, again)]

    found = wait_until(lambda: len(letters()) >= 6 and letters(), 15)
    assert found, "the refused jobs were not dead-lettered"
    assert len(found) == 6 and {r["error_class"] for r in found} == {"validation"}
    first_copy = sorted((r for r in found if r["source_offset"] == offset),
                        key=lambda r: r["error"])
    assert [r["error"].split(":")[0] for r in first_copy] == ["jobs[3]", "jobs[4]", "jobs[5]"]
    assert len({r["envelope"]["event_id"] for r in first_copy}) == 3
    # Each letter holds its job alone, as the CreateJob it stood for.
    for r, (index, job_id) in zip(first_copy, [(3, stranger), (4, mine[0]), (5, mine[3])],
                                  strict=True):
        command = codec.decode(r["value"]).record
        assert r["key"] == job_id.encode() and command["job_id"] == job_id
        assert command["command_id"] == command["envelope"]["event_id"] == (
            f"{command_id}#{index}")
    # The jobs' records in Kafka (what a restore reads, not the worker's cache) hold the
    # specs as sent: they were written with the batch's bytes.
    sent = {job["job_id"]: job["spec"] for job in codec.decode(
        codec.encode("kron.commands.CreateJobs", batch)).record["jobs"]}
    written = {e.key.decode(): e.record for e in read_topic(
        stack.settings.bootstrap_servers, stack.settings.topic("jobs"))
        if e.key and e.key.decode() in mine[:3] and e.record}
    assert set(written) == set(mine[:3])
    assert all(written[j]["spec"] == sent[j] for j in mine[:3])
    time.sleep(1.5)
    assert [len(stack.receiver.hits_for(j)) for j in mine] == [1, 1, 1, 0]
    assert stack.receiver.hits_for(stranger) == []


def test_long_attempt_heartbeats_past_its_lease(stack) -> None:
    job_id = new_job()
    stack.commands.send("CreateJob", job_id, spec=spec(
        target={"url": f"{stack.receiver.url}/slow/5", "timeout_s": 30.0},
        run_at_ms=now_ms(), lease_s=2.0))
    final = wait_until(lambda: [e for e in states_of(stack, job_id).values()
                                if e["state"] == "succeeded"], 30)
    assert final and final[0]["attempt"] == 1, states_of(stack, job_id)
    assert len(stack.receiver.hits_for(job_id)) == 1
    beats = [e for e in executions(stack.settings) if e["job_id"] == job_id
             and e["envelope"]["event_type"] == "execution.heartbeat"]
    assert len(beats) >= 3  # 5 s of work with a 2 s lease, a beat every 0.67 s


def test_command_target_runs_a_registered_command_with_the_execution_env(stack, tmp_path) -> None:
    job_id = new_job()
    out = tmp_path / "out.txt"
    stack.commands.send("CreateJob", job_id, spec=spec(
        target={"command": "test.append", "args": {"out": str(out)}, "timeout_s": 10.0},
        run_at_ms=now_ms()))
    final = wait_until(lambda: [e for e in states_of(stack, job_id).values()
                                if e["state"] == "succeeded"], 20)
    assert final, states_of(stack, job_id)
    assert out.read_text().split() == [final[0]["exec_id"], "1"]


def test_failing_command_is_retried_then_fails(stack) -> None:
    job_id = new_job()
    stack.commands.send("CreateJob", job_id, spec=spec(
        target={"command": "test.exit", "args": {"code": "3"}, "timeout_s": 10.0},
        run_at_ms=now_ms(), retry={"max_attempts": 2, "base_s": 0.1, "max_s": 0.2}))
    final = wait_until(lambda: [e for e in states_of(stack, job_id).values()
                                if e["state"] == "failed"], 20)
    assert final and final[0]["attempt"] == 2
    assert final[0]["last_error"] == "command 'test.exit' exited with 3"


def test_kafka_target_publishes_with_the_idempotency_key(stack) -> None:
    from confluent_kafka.admin import NewTopic

    from kron.topics import admin_client

    job_id = new_job()
    topic = f"acme.user-events-{stack.settings.topic_prefix}"  # the tenant's own namespace
    admin = admin_client(stack.settings)  # kept alive until the future resolves
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    stack.commands.send("CreateJob", job_id, spec=spec(
        target={"topic": topic, "key": b"k1", "value": b"hello", "headers": {"x": "y"}},
        run_at_ms=now_ms()))
    final = wait_until(lambda: [e for e in states_of(stack, job_id).values()
                                if e["state"] == "succeeded"], 20)
    assert final, states_of(stack, job_id)
    (msg,) = list(read_topic(stack.settings.bootstrap_servers, topic))
    assert msg.key == b"k1"


def test_backfill_creates_past_slots_once(stack) -> None:
    job_id = new_job()
    stack.commands.send("CreateJob", job_id, spec=spec(
        target={"url": f"{stack.receiver.url}/ok"}, cron="* * * * *"))
    start = (now_ms() // 60_000 - 5) * 60_000
    for _ in range(2):  # the second backfill must create nothing new
        stack.commands.send("BackfillJob", job_id, from_ms=start, to_ms=start + 4 * 60_000,
                            max_per_s=50.0)
    backfilled = wait_until(lambda: len([e for e in states_of(stack, job_id).values()
                                         if e["trigger"] == "backfill"
                                         and e["state"] == "succeeded"]) >= 5, 20)
    assert backfilled
    time.sleep(1)
    # The job's own live minute slot may also fire meanwhile; judge the backfilled range.
    end = start + 4 * 60_000
    slots = sorted(s for s in map(sched_ms, stack.receiver.hits_for(job_id)) if s <= end)
    assert slots == [start + i * 60_000 for i in range(5)]


def test_update_recomputes_the_next_occurrence(stack) -> None:
    job_id = new_job()
    stack.commands.send("CreateJob", job_id, spec=spec(
        target={"url": f"{stack.receiver.url}/ok"}, cron="0 0 1 1 *"))
    time.sleep(1)
    assert not stack.receiver.hits_for(job_id)
    stack.commands.send("UpdateJob", job_id, spec=spec(
        target={"url": f"{stack.receiver.url}/ok"}, cron="* * * * * *"))
    assert len(stack.receiver.wait_for(job_id, 2, 20)) >= 2
    stack.commands.send("DeleteJob", job_id)
