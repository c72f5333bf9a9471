"""A rebalance storm: for ~45 s a worker joins or leaves every few seconds (SIGTERM and
SIGKILL mixed, seeded) under a seeded load. Invariants: no slot lost, none triggered twice,
attempts within the policy; p99 lateness is reported."""

from __future__ import annotations

import random
import signal
import time
import uuid

import pytest

from tests.conftest import fresh_settings
from tests.faults.support import (
    Fleet,
    judge,
    now_ms,
    seeded_load,
    wait_for_group,
    wait_settled,
    warm_up,
)
from tests.support.stack import Commands

pytestmark = pytest.mark.integration

STORM_S = 45


def test_workers_joining_and_leaving_every_few_seconds(kafka_cluster, tmp_path,
                                                       fault_receiver, reliability) -> None:
    settings = fresh_settings(kafka_cluster, tmp_path / "d", session_timeout_s=6.0)
    commands = Commands(settings)
    rcv = fault_receiver
    rng = random.Random(5)
    tag = uuid.uuid4().hex[:6]
    events: list[str] = []
    with Fleet(settings, tmp_path, rcv) as fleet:
        fleet.start("w1")
        fleet.start("w2")
        warm_up(commands, rcv, fleet)
        assert wait_for_group(settings, 2), fleet.logs()
        start = now_ms() + 1000
        load = seeded_load(commands, f"{rcv.url}/ok", seed=55, start_ms=start,
                           end_ms=start + (STORM_S + 5) * 1000, cron_jobs=6, one_offs=20,
                           periods_s=(1, 2, 3), prefix=f"rs-{tag}")
        names = ["w1", "w2", "w3"]
        deadline = time.monotonic() + STORM_S
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(3, 6))
            alive = [n for n in names if n in fleet.workers
                     and fleet.workers[n].proc.poll() is None]
            down = [n for n in names if n not in alive]
            if len(alive) >= 2 and (not down or rng.random() < 0.5):
                victim = rng.choice(alive)
                if rng.random() < 0.5:
                    fleet.workers[victim].kill()
                    events.append(f"kill -9 {victim}")
                else:
                    fleet.workers[victim].signal(signal.SIGTERM)
                    events.append(f"SIGTERM {victim}")
            elif down:
                joiner = rng.choice(down)
                fleet.start(joiner)
                events.append(f"start {joiner}")
        for n in names:  # end with every worker up, so the group settles
            if n not in fleet.workers or fleet.workers[n].proc.poll() is not None:
                fleet.start(n)
        settled = wait_settled(settings, load, 120)
        verdict = judge(settings, rcv, load)
        logs = fleet.logs()
    commands.close()
    reliability.record(
        scenario="rebalance storm", injected=f"{len(events)} membership changes in {STORM_S} s "
        f"({sum('kill' in e for e in events)} kill -9, {sum('TERM' in e for e in events)} "
        f"SIGTERM, {sum('start' in e for e in events)} joins)",
        lost=len(verdict.lost), duplicates=len(verdict.duplicates),
        max_lateness_ms=verdict.max_lateness_ms, attempts_ok=verdict.attempts_ok,
        notes=f"{verdict.slots} slots, p99 lateness {verdict.p99_lateness_ms} ms, "
              f"{verdict.repeated_calls} same-key repeats, {verdict.same_attempt_repeats} "
              "same-attempt repeats")
    assert len(events) >= 6, events
    assert settled, logs
    assert not verdict.lost, verdict.summary()
    assert not verdict.duplicates, verdict.summary()
    assert verdict.attempts_ok, verdict.summary()
