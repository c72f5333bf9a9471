"""kill -9 of a partition's owner just before a slot is due (the trigger is not recorded yet)
and just after it recorded the trigger (its `execution.started` record is in
kron.executions), repeated for several slots of a every-second job, under a seeded load.
Expected: the new owner fires the unfired slot late (within the misfire grace, so it runs)
and recovers the fired one by lease expiry with the same key; no slot lost, none twice."""

from __future__ import annotations

import time
import uuid

import pytest

from tests.conftest import fresh_settings
from tests.faults.support import (
    TERMINAL,
    Fleet,
    Tail,
    explain_slots,
    history,
    judge,
    latest,
    now_ms,
    seeded_load,
    unsettled,
    wait_for_group,
    wait_settled,
    wait_until,
    warm_up,
)
from tests.support.stack import Commands

pytestmark = pytest.mark.integration

MODES = ("before", "after", "before", "after")


def test_owner_kill_9_around_a_slots_due_time(kafka_cluster, tmp_path, fault_receiver,
                                                reliability) -> None:
    settings = fresh_settings(kafka_cluster, tmp_path / "d", session_timeout_s=6.0)
    commands = Commands(settings)
    rcv = fault_receiver
    tag = uuid.uuid4().hex[:6]
    injected: list[str] = []
    with Fleet(settings, tmp_path, rcv) as fleet:
        fleet.start("w1")
        fleet.start("w2")
        warm_up(commands, rcv, fleet)
        assert wait_for_group(settings, 2), fleet.logs()
        start = now_ms() + 1000
        end = start + 65_000
        main = seeded_load(commands, f"{rcv.url}/ok", seed=2, start_ms=start, end_ms=end,
                           cron_jobs=1, one_offs=0, periods_s=(1,), prefix=f"oc-main-{tag}")
        (job_id,) = main.expected
        load = seeded_load(commands, f"{rcv.url}/ok", seed=22, start_ms=start, end_ms=end,
                           cron_jobs=3, one_offs=8, periods_s=(2, 3), prefix=f"oc-{tag}")
        load.merge(main)

        def started(r: dict, after: int = 0) -> bool:
            return (r.get("job_id") == job_id and r["scheduled_for_ms"] > after
                    and (r.get("envelope") or {}).get("event_type") == "execution.started")

        for mode in MODES:
            if now_ms() > end - 8000:
                break
            tail = Tail(settings, "executions")
            try:
                rec = tail.wait(started, 45)
                if rec is None:
                    last = max((e["scheduled_for_ms"] for e in history(settings)[1]
                                if e["job_id"] == job_id), default=start)
                    explain_slots(settings, [(job_id, last)])
                assert rec is not None, (
                    [(e["scheduled_for_ms"], e["state"], e["last_error"], e["worker"])
                     for e in history(settings)[1] if e["job_id"] == job_id][-5:],
                    fleet.logs(3000))
                owner = rec["worker"]
                if mode == "before":
                    slot = (now_ms() // 1000 + 2) * 1000
                    time.sleep(max(0.0, (slot - 100 - now_ms()) / 1000))
                    fleet.workers[owner].kill()
                else:
                    nxt = tail.wait(lambda r, s=rec["scheduled_for_ms"]: started(r, s), 5)
                    assert nxt is not None, fleet.logs()
                    fleet.workers[owner].kill()
                    slot = nxt["scheduled_for_ms"]
            finally:
                tail.close()
            injected.append(f"{mode}@{slot % 100_000}")

            def slot_done(s: int = slot) -> bool:
                _, execs = history(settings)
                return any(e["job_id"] == job_id and e["scheduled_for_ms"] == s
                           and e["state"] in TERMINAL for e in latest(execs).values())

            assert wait_until(slot_done, 60, 0.5), (
                f"{mode}: slot {slot} never ran\n"
                f"{explain_slots(settings, [(job_id, slot)])}\n{fleet.logs()}")
            fleet.start(owner)
            assert wait_for_group(settings, 2, 60), fleet.logs()
        settled = wait_settled(settings, load, 90)
        verdict = judge(settings, rcv, load)
        explain = explain_slots(settings, verdict.duplicates + verdict.lost
                                + unsettled(settings, load))
        logs = fleet.logs()
    commands.close()
    reliability.record(
        scenario="owner kill -9 around a slot's due time",
        injected=f"{len(injected)} x SIGKILL of the owner ({', '.join(injected)})",
        lost=len(verdict.lost), duplicates=len(verdict.duplicates),
        max_lateness_ms=verdict.max_lateness_ms, attempts_ok=verdict.attempts_ok,
        notes=f"{verdict.slots} slots, p99 lateness {verdict.p99_lateness_ms} ms, "
              f"{verdict.repeated_calls} same-key repeats")
    assert len(injected) >= 3, injected
    assert settled, (explain, logs)
    assert not verdict.lost, verdict.summary()
    assert not verdict.duplicates, (verdict.summary(), explain)
    assert verdict.attempts_ok and verdict.same_attempt_repeats == 0, verdict.summary()
