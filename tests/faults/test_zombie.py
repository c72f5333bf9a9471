"""Zombie owner: `kill -STOP` a worker for longer than its session timeout, let the other
worker take its partitions, then `kill -CONT` it.

Expected: nothing the paused worker does after it lost its partitions changes state or
reaches a target. Its ownership lease (the send time of its last acknowledged heartbeat plus
the session timeout) has lapsed when it wakes, so it holds its stream, dispatches nothing,
and restarts as a fresh member; any changelog write it had buffered carries its old epoch and
every replay leaves it out. Judged by the receiver's log of (Idempotency-Key, attempt) and
the replay audit.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections import Counter

import pytest

from tests.conftest import fresh_settings
from tests.faults.support import (
    TERMINAL,
    Fleet,
    history,
    judge,
    latest,
    now_ms,
    seeded_load,
    wait_for_group,
    wait_settled,
    warm_up,
)
from tests.support.stack import Commands

pytestmark = pytest.mark.integration

SESSION_S = 6.0
PAUSE_S = 14.0  # well past the session: the group gives the partitions away


def test_a_paused_owner_changes_nothing_after_it_wakes(kafka_cluster, tmp_path, fault_receiver,
                                                       reliability) -> None:
    settings = fresh_settings(kafka_cluster, tmp_path / "d", session_timeout_s=SESSION_S)
    commands = Commands(settings)
    rcv = fault_receiver
    tag = uuid.uuid4().hex[:6]
    with Fleet(settings, tmp_path, rcv) as fleet:
        zombie = fleet.start("w1")
        fleet.start("w2")
        warm_up(commands, rcv, fleet)
        assert wait_for_group(settings, 2), fleet.logs()
        start = now_ms() + 1500
        end = start + 40_000
        # Every-second jobs on every partition: while w1 sleeps, the new owner keeps firing
        # them, and the ticks it sends land on w1's old partitions, ready to be fetched.
        load = seeded_load(commands, f"{rcv.url}/ok", seed=3, start_ms=start, end_ms=end,
                           cron_jobs=12, one_offs=10, periods_s=(1, 2), prefix=f"zb-{tag}")
        # Until w1 has run some of it (a fixed 6 s once fell short on a slow host, with the
        # group still settling): the load runs 40 s, so the pause still falls inside it.
        deadline = time.monotonic() + 20
        while True:
            time.sleep(1)
            w1_before = {e["exec_id"] for e in latest(history(settings)[1]).values()
                         if e.get("worker") == "w1"}
            if w1_before or time.monotonic() > deadline:
                break
        assert w1_before, "w1 owned nothing before the pause: the scenario proves nothing"
        zombie.signal(signal.SIGSTOP)
        time.sleep(PAUSE_S)
        woke_ms = now_ms()
        zombie.signal(signal.SIGCONT)
        if not wait_settled(settings, load, 120):
            done = {(e["job_id"], e["scheduled_for_ms"]): e["state"]
                    for e in latest(history(settings)[1]).values()}
            missing = [(j, s, done.get((j, s))) for j, slots in load.expected.items()
                       for s in slots if done.get((j, s)) not in TERMINAL]
            raise AssertionError(f"unsettled {missing[:10]} of {len(missing)}\n"
                                 f"{fleet.logs()}")
        verdict = judge(settings, rcv, load)
        execs = latest(history(settings)[1])
        # Who ran what after the wake-up: w1 may run again only as a fresh member.
        attempts = Counter((h.headers["Idempotency-Key"], h.headers["X-Kron-Attempt"])
                           for h in rcv.hits if h.headers.get("X-Kron-Job-Id") in load.expected)
        log = zombie.log()
        # Either the zombie met a record before the group told it to rejoin (then its
        # lapsed lease held the stream), or the rejoin came first and revoked its buffers.
        lapsed = "ownership lease lapsed" in log
        rejoined = any(e.get("worker") == "w1" and e["scheduled_for_ms"] > woke_ms + 3000
                       for e in execs.values())
        reliability.record(
            scenario="zombie owner (SIGSTOP > session)",
            injected=f"kill -STOP of one of 2 workers for {PAUSE_S:.0f} s "
                     f"(session {SESSION_S:.0f} s), then kill -CONT",
            lost=len(verdict.lost), duplicates=len(verdict.duplicates),
            max_lateness_ms=verdict.max_lateness_ms, attempts_ok=verdict.attempts_ok,
            notes=f"same-attempt repeats {verdict.same_attempt_repeats}; lease "
                  f"{'lapsed, stream held' if lapsed else 'never consulted: rejoin came first'}"
                  f"; zombie {'rejoined' if rejoined else 'did not rejoin'}")
        if lapsed:
            assert "restarting the worker" in log or "ownership lease renewed" in log, log[-3000:]
        assert not verdict.lost, verdict.summary()
        assert not verdict.duplicates, verdict.summary()
        assert verdict.attempts_ok, verdict.summary()
        # The same attempt of one execution was never dispatched twice: the new owner's
        # run and a zombie's would share key and attempt number.
        assert [k for k, n in attempts.items() if n > 1] == [], verdict.summary()
        assert zombie.proc is not None and zombie.proc.poll() is None, log[-3000:]
        assert rejoined, log[-3000:]
        assert wait_for_group(settings, 2), fleet.logs()
