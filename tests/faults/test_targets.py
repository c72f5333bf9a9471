"""Misbehaving targets next to a steady job: slow, hanging past the per-attempt deadline,
connection refused, connection reset, every 4xx/5xx class, a redirect, and a 429 with
Retry-After. Each follows the retry policy; the per-attempt deadline holds; the worker stays
in its group (no rebalance in its log) and the steady job keeps firing on time.

Already covered in tests/integration/test_engine_scenarios.py (not repeated): 503,503,200
backoff growth, 400 not retried with an alert, a hang timed out and retried once."""

from __future__ import annotations

import uuid

import pytest

from tests.conftest import fresh_settings
from tests.faults.support import (
    Fleet,
    dead_port,
    history,
    judge,
    latest,
    now_ms,
    rebalance_lines,
    seeded_load,
    wait_for_group,
    wait_settled,
    wait_until,
    warm_up,
)
from tests.support.stack import Commands, spec

pytestmark = pytest.mark.integration

# name -> (path, timeout_s, max_attempts, final state, attempts made, receiver hits)
CASES: dict[str, tuple[str, float, int, str, int, int]] = {
    "slow within deadline": ("/slow/1.5", 5.0, 2, "succeeded", 1, 1),
    "hang past deadline": ("HANG", 1.5, 2, "failed", 2, 2),
    "connection refused": ("REFUSED", 2.0, 3, "failed", 3, 0),
    "connection reset": ("/reset", 2.0, 2, "failed", 2, 2),
    "301 redirect": ("/status/301", 2.0, 3, "failed", 1, 1),
    "401": ("/status/401", 2.0, 3, "failed", 1, 1),
    "403": ("/status/403", 2.0, 3, "failed", 1, 1),
    "404": ("/status/404", 2.0, 3, "failed", 1, 1),
    "409": ("/status/409", 2.0, 3, "failed", 1, 1),
    "410": ("/status/410", 2.0, 3, "failed", 1, 1),
    "422": ("/status/422", 2.0, 3, "failed", 1, 1),
    "408 then 200": ("/status/408,200", 2.0, 3, "succeeded", 2, 2),
    "500 then 200": ("/status/500,200", 2.0, 3, "succeeded", 2, 2),
    "502 then 200": ("/status/502,200", 2.0, 3, "succeeded", 2, 2),
    "504 then 200": ("/status/504,200", 2.0, 3, "succeeded", 2, 2),
    "500 x3": ("/status/500", 2.0, 3, "failed", 3, 3),
    "429 Retry-After 3": ("/status-ra/429,200/3", 2.0, 3, "succeeded", 2, 2),
}
RETRY_AFTER_MS = 3000


def test_bad_targets_follow_the_policy_and_do_not_stall_the_stream(
        kafka_cluster, tmp_path, fault_receiver, reliability) -> None:
    settings = fresh_settings(kafka_cluster, tmp_path / "d", session_timeout_s=6.0)
    commands = Commands(settings)
    rcv = fault_receiver
    tag = uuid.uuid4().hex[:6]
    with Fleet(settings, tmp_path, rcv) as fleet, dead_port() as refused:
        fleet.start("w1")
        fleet.start("w2")
        warm_up(commands, rcv, fleet)
        assert wait_for_group(settings, 2), fleet.logs()
        marks = {n: len(w.log().splitlines()) for n, w in fleet.workers.items()}
        start = now_ms() + 1500
        # The steady job: every second, on time, while the bad targets misbehave.
        steady = seeded_load(commands, f"{rcv.url}/ok", seed=6, start_ms=start,
                             end_ms=start + 20_000, cron_jobs=4, one_offs=0, periods_s=(1, 2),
                             prefix=f"tg-steady-{tag}")
        # "localhost" keeps the failing hosts' circuit breaker apart from 127.0.0.1's.
        ids: dict[str, str] = {}
        for i, (name, (path, timeout, attempts, *_)) in enumerate(CASES.items()):
            url = (f"http://localhost:{rcv.port}/hang" if path == "HANG" else
                   f"http://localhost:{refused}/" if path == "REFUSED" else rcv.url + path)
            job_id = f"tg-{i}-{tag}"
            ids[name] = job_id
            commands.send("CreateJob", job_id, spec=spec(
                target={"url": url, "timeout_s": timeout}, run_at_ms=start + 2000 + 300 * i,
                retry={"max_attempts": attempts, "backoff": "exponential", "base_s": 0.2,
                       "max_s": 0.5}, lease_s=10.0))

        def finals() -> dict[str, dict]:
            _, execs = history(settings)
            by_job = {e["job_id"]: e for e in latest(execs).values()}
            return {n: by_job[j] for n, j in ids.items()
                    if j in by_job and by_job[j]["state"] in ("succeeded", "failed")}

        done = wait_until(lambda: len(f := finals()) == len(CASES) and f, 60, 1.0) or finals()
        settled = wait_settled(settings, steady, 60)
        verdict = judge(settings, rcv, steady)
        evicted = {n: rebalance_lines(w.log(), marks[n]) for n, w in fleet.workers.items()}
        alive = [n for n, w in fleet.workers.items() if w.proc and w.proc.poll() is None]
    commands.close()

    problems: list[str] = []
    for name, (path, timeout, _attempts, state, made, nhits) in CASES.items():
        f = done.get(name)
        if f is None:
            problems.append(f"{name}: not finished")
            continue
        hits = rcv.hits_for(ids[name])
        if f["state"] != state or f["attempt"] != made:
            problems.append(f"{name}: {f['state']} after {f['attempt']} attempts, "
                            f"want {state} after {made}: {f['last_error']}")
        if len(hits) != nhits:
            problems.append(f"{name}: {len(hits)} calls, want {nhits}")
        if len({h.headers["Idempotency-Key"] for h in hits}) > 1:
            problems.append(f"{name}: more than one Idempotency-Key")
        for a in f["attempts"]:
            took = (a["finished_at_ms"] or 0) - a["started_at_ms"]
            if took > (timeout + 2.0) * 1000:
                problems.append(f"{name}: attempt {a['attempt']} took {took} ms, deadline "
                                f"{timeout} s")
        if path.startswith("/status-ra") and len(hits) == 2:
            gap = hits[1].received_ms - hits[0].received_ms
            if gap < RETRY_AFTER_MS:
                problems.append(f"{name}: retried after {gap} ms despite Retry-After 3")
    rebalances = sum(len(v) for v in evicted.values())
    reliability.record(
        scenario="misbehaving targets", injected=f"{len(CASES)} bad targets (slow, hang, "
        "refused, reset, 3xx, 4xx, 5xx, 429+Retry-After) beside 4 steady jobs",
        lost=len(verdict.lost), duplicates=len(verdict.duplicates),
        max_lateness_ms=verdict.max_lateness_ms,
        attempts_ok=verdict.attempts_ok and not problems,
        notes=f"steady jobs: {verdict.slots} slots, p99 lateness {verdict.p99_lateness_ms} ms; "
              f"{rebalances} rebalance log lines after start; {len(problems)} policy problems")
    assert settled, fleet.logs()
    assert not problems, problems
    assert alive == list(fleet.workers), f"a worker died: {alive}"
    assert not rebalances, evicted
    assert not verdict.lost and not verdict.duplicates, verdict.summary()
    # Bounded, not fast: a stalled stream would make every steady slot late by the hang.
    assert verdict.p99_lateness_ms < 5000, verdict.summary()
