"""kill -9 of the worker running an attempt, at four points, under a seeded load.

The points are hit from outside (the engine has no fault-injection hook yet):
  before_http   the target is reached through a Gate that SIGKILLs the worker the moment it
                connects; the request never reaches the target
  during_call   the receiver SIGKILLs the caller as soon as the request arrives and holds it
  after_2xx     the receiver writes the 200, then SIGKILLs the caller at once (the worker has
                the answer but, almost always, has not produced its result report yet)
  after_result  a tail on kron.executions sees the execution's `succeeded` record and the owner
                is SIGKILLed at once: the report's offset on kron.signals is not yet committed
                (commit interval 1 s), so the new owner reads the report again
Expected: the attempt is recovered (lease expiry or redelivery), a second call carries the
same Idempotency-Key with a higher X-Kron-Attempt, exactly one terminal record per
execution; the background load loses nothing and fires nothing twice.
"""

from __future__ import annotations

import uuid

import pytest

from tests.conftest import fresh_settings
from tests.faults.support import (
    TERMINAL,
    Fleet,
    Gate,
    Tail,
    history,
    judge,
    now_ms,
    seeded_load,
    wait_for_group,
    wait_settled,
    wait_until,
    warm_up,
)
from tests.support.stack import Commands, spec

pytestmark = pytest.mark.integration

POINTS = ("before_http", "during_call", "after_2xx", "after_result")


def test_kill_9_of_the_attempts_worker_at_four_points(
        kafka_cluster, tmp_path, fault_receiver, reliability) -> None:
    settings = fresh_settings(kafka_cluster, tmp_path / "d", session_timeout_s=6.0)
    commands = Commands(settings)
    rcv = fault_receiver
    tag = uuid.uuid4().hex[:6]
    with Fleet(settings, tmp_path, rcv) as fleet, Gate(rcv.port, rcv.killable) as gate:
        fleet.start("w1")
        fleet.start("w2")
        warm_up(commands, rcv, fleet)
        assert wait_for_group(settings, 2), fleet.logs()
        start = now_ms() + 1000
        load = seeded_load(commands, f"{rcv.url}/ok", seed=1, start_ms=start,
                           end_ms=start + 50_000, cron_jobs=3, one_offs=10,
                           periods_s=(2, 3, 5), prefix=f"wc-{tag}")
        outcome: dict[str, dict] = {}
        for point in POINTS:
            job_id = f"wc-{point}-{tag}"
            url = {"before_http": f"{gate.url}/ok",
                   "during_call": f"{rcv.url}/kill-on-arrival/30",
                   "after_2xx": f"{rcv.url}/kill-after-2xx/x",
                   "after_result": f"{rcv.url}/ok"}[point]
            tail = Tail(settings, "executions") if point == "after_result" else None
            if point == "before_http":
                gate.armed.set()
            at = now_ms()
            commands.send("CreateJob", job_id, spec=spec(
                target={"url": url, "timeout_s": 40.0}, run_at_ms=at, lease_s=4.0,
                retry={"max_attempts": 3, "base_s": 0.2, "max_s": 1.0}))
            killed: str | None = None
            kills = gate.kills if point == "before_http" else rcv.kills
            before = len(kills)
            if tail is not None:
                rec = tail.wait(lambda r, j=job_id: r.get("job_id") == j
                                and r.get("state") == "succeeded", 30)
                tail.close()
                assert rec is not None, fleet.logs()
                killed = rec["worker"]
                fleet.workers[killed].kill()
            else:
                ev = wait_until(lambda k=kills, n=before: len(k) > n and k[-1], 30)
                assert ev, f"{point}: nobody was killed\n{fleet.logs()}"
                killed = next(n for n, w in fleet.workers.items()
                              if w.proc and w.proc.pid == ev.pid)
            assert killed is not None
            done = wait_until(lambda j=job_id: _final(settings, j), 60)
            assert done, f"{point}: no terminal state\n{fleet.logs()}"
            hits = rcv.hits_for(job_id)
            outcome[point] = {"killed": killed, "final": done, "hits": hits,
                              "lateness_ms": done["updated_at_ms"] - at}
            fleet.start(killed)  # the replacement rejoins with the same state dir
            assert wait_for_group(settings, 2, 60), fleet.logs()
        settled = wait_settled(settings, load, 90)
        verdict = judge(settings, rcv, load)
        _, execs = history(settings)
    commands.close()

    # Per point: exactly one terminal record, attempts within policy, one key.
    problems: list[str] = []
    notes: list[str] = []
    for point, o in outcome.items():
        final, hits = o["final"], o["hits"]
        terminal = [e for e in execs if e["exec_id"] == final["exec_id"]
                    and e["state"] in TERMINAL]
        keys = {h.headers["Idempotency-Key"] for h in hits}
        attempts = [int(h.headers["X-Kron-Attempt"]) for h in hits]
        outcomes = [a["outcome"] for a in final["attempts"]]
        notes.append(f"{point}: {len(hits)} call(s) attempts {attempts} -> {outcomes}")
        if final["state"] != "succeeded":
            problems.append(f"{point}: ended {final['state']}")
        if len(terminal) != 1:
            problems.append(f"{point}: {len(terminal)} terminal records")
        if keys != {final["exec_id"]}:
            problems.append(f"{point}: keys {keys} != exec id {final['exec_id']}")
        if attempts != sorted(set(attempts)) or max(attempts, default=0) > 3:
            problems.append(f"{point}: attempts {attempts} repeat or exceed the policy")
        if point == "before_http" and (attempts != [2] or outcomes[0] != "lease_expired"):
            problems.append(f"{point}: expected one call as attempt 2 after lease expiry")
        if point == "during_call" and attempts != [1, 2]:
            problems.append(f"{point}: expected attempts [1, 2], got {attempts}")
        if point == "after_2xx" and attempts[:1] != [1]:
            problems.append(f"{point}: expected attempt 1 first, got {attempts}")
        if point == "after_result" and attempts != [1]:
            problems.append(f"{point}: the redelivered report re-ran the call: {attempts}")
    max_late = max([verdict.max_lateness_ms] + [o["lateness_ms"] for o in outcome.values()])
    reliability.record(
        scenario="worker kill -9 at four points", injected="4 x SIGKILL of the attempt's "
        "worker (before HTTP, during, after 2xx, after result before commit)",
        lost=len(verdict.lost), duplicates=len(verdict.duplicates),
        max_lateness_ms=max_late,
        attempts_ok=verdict.attempts_ok and not any("attempts" in p for p in problems),
        notes="; ".join(notes) + f"; load {verdict.slots} slots, {verdict.repeated_calls} "
              f"same-key repeats, {verdict.same_attempt_repeats} same-attempt repeats")
    assert settled, fleet.logs()
    assert not problems, problems
    assert not verdict.lost and not verdict.duplicates, verdict.summary()
    assert verdict.attempts_ok, verdict.summary()
    assert verdict.same_attempt_repeats == 0, verdict.summary()


def _final(settings, job_id: str) -> dict | None:
    _, execs = history(settings)
    mine = {}
    for e in execs:
        if e["job_id"] == job_id:
            mine[e["exec_id"]] = e
    if len(mine) == 1:
        (e,) = mine.values()
        return e if e["state"] in TERMINAL else None
    assert len(mine) <= 1, f"{job_id}: {len(mine)} executions for one slot"
    return None
