"""Backfill through the real path: `kron api`, the broker, a worker and a loopback HTTP target.

A slot that failed stays failed (and uncalled) unless the backfill asks for `rerun`, which
calls it again with the same Idempotency-Key and a higher X-Kron-Attempt; a range of more
slots than the worker arms at once (10,000) runs in full; one past the API's limit is
refused with the count and the limit.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from api.backfill import MAX_BACKFILL_SLOTS
from bench.receiver import Hit
from streams.engine.backfill import BACKFILL_PAGE
from tests.support.stack import wait_until

pytestmark = pytest.mark.integration


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def slot_of(hit: Hit) -> int:
    when = datetime.fromisoformat(hit.headers["X-Kron-Scheduled-For"].replace("Z", "+00:00"))
    return int(when.timestamp() * 1000)


def cron_job(c: Any, stack: Any, cron: str, path: str) -> str:
    r = c.post("/v1/jobs", json={
        "name": f"bf-{uuid.uuid4().hex[:6]}", "schedule": {"cron": cron},
        "target": {"type": "http", "url": f"{stack.receiver.url}{path}", "method": "POST"},
        "retry": {"max_attempts": 1}})
    assert r.status_code == 201, r.text
    return str(r.json()["job_id"])


def run_of(c: Any, run_id: str) -> dict[str, Any]:
    r = c.get(f"/v1/runs/{run_id}")
    return r.json() if r.status_code == 200 else {}


def test_a_failed_slot_is_left_alone_unless_the_backfill_asks_for_rerun(api_stack) -> None:
    stack = api_stack
    with stack.client() as c:
        # Every slot's first call is answered 503 (and there are no retries): it fails.
        job_id = cron_job(c, stack, "*/2 * * * * *", "/status/503,200")
        [first] = stack.receiver.wait_for(job_id, 1, 30)[:1]
        assert c.post(f"/v1/jobs/{job_id}:pause").status_code == 200
        failed_slot, key = slot_of(first), first.headers["Idempotency-Key"]
        assert wait_until(lambda: run_of(c, key).get("state") == "failed", 20)
        rng = {"from": iso(failed_slot - 4000), "to": iso(failed_slot), "max_per_s": 50}

        # Without rerun: the failed slot is already recorded, and not called again.
        r = c.post(f"/v1/jobs/{job_id}:backfill", json=rng)
        assert r.status_code == 202, r.text
        assert r.json()["backfill"] == {"slots": 3, "armed": 2, "rerun": 0,
                                        "already_recorded": 1}
        wanted = {failed_slot - 4000, failed_slot - 2000}
        assert wait_until(lambda: wanted <= {slot_of(h) for h in stack.receiver.hits_for(job_id)},
                          30)
        time.sleep(1.0)
        assert [h.headers["X-Kron-Attempt"] for h in stack.receiver.hits_for(job_id)
                if h.headers["Idempotency-Key"] == key] == ["1"]
        assert run_of(c, key)["state"] == "failed" and run_of(c, key)["attempt"] == 1
        runs = {x["scheduled_for"]: x for x in c.get(f"/v1/jobs/{job_id}/runs").json()["runs"]}
        new_ids = [h.headers["Idempotency-Key"] for h in stack.receiver.hits_for(job_id)
                   if slot_of(h) in wanted]
        assert len(new_ids) == 2 and {runs[iso_z(s)]["trigger"] for s in wanted} == {"backfill"}
        assert wait_until(lambda: all(run_of(c, i).get("state") == "failed" for i in new_ids), 20)

        # With rerun: each failed slot is called again, same key, next attempt (200 now).
        r = c.post(f"/v1/jobs/{job_id}:backfill", json={**rng, "rerun": True})
        assert r.status_code == 202, r.text
        assert r.json()["backfill"] == {"slots": 3, "armed": 3, "rerun": 3,
                                        "already_recorded": 0}
        again = wait_until(lambda: [h for h in stack.receiver.hits_for(job_id)
                                    if h.headers["Idempotency-Key"] == key
                                    and h.headers["X-Kron-Attempt"] == "2"], 30)
        assert again and again[0].status == 200 and slot_of(again[0]) == failed_slot
        assert wait_until(lambda: run_of(c, key).get("state") == "succeeded", 20)
        done = run_of(c, key)
        assert done["attempt"] == 2 and done["run_id"] == key
        assert [a["outcome"] for a in done["attempts"]] == ["transient", "succeeded"]
        assert wait_until(lambda: all(run_of(c, i).get("state") == "succeeded"
                                      for i in new_ids), 20)

        # Succeeded slots are never run again, rerun or not.
        hits = len(stack.receiver.hits_for(job_id))
        r = c.post(f"/v1/jobs/{job_id}:backfill", json={**rng, "rerun": True})
        assert r.json()["backfill"] == {"slots": 3, "armed": 0, "rerun": 0,
                                        "already_recorded": 3}
        time.sleep(1.5)
        assert len(stack.receiver.hits_for(job_id)) == hits
        c.delete(f"/v1/jobs/{job_id}")


def iso_z(ms: int) -> str:
    """The API's own rendering of a time (milliseconds, Z)."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + \
        f"{ms % 1000:03d}Z"


def test_a_range_of_more_slots_than_the_worker_arms_at_once_runs_in_full(api_stack) -> None:
    stack = api_stack
    n = BACKFILL_PAGE + 50
    with stack.client() as c:
        job_id = cron_job(c, stack, "* * * * * *", "/ok")
        assert c.post(f"/v1/jobs/{job_id}:pause").status_code == 200  # only the backfill calls
        end = (int(time.time()) - 5) * 1000
        start = end - (n - 1) * 1000
        r = c.post(f"/v1/jobs/{job_id}:backfill",
                   json={"from": iso(start), "to": iso(end), "max_per_s": 1000})
        assert r.status_code == 202, r.text
        assert r.json()["backfill"] == {"slots": n, "armed": n, "rerun": 0,
                                        "already_recorded": 0}
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and sum(
                slot_of(h) <= end for h in stack.receiver.hits_for(job_id)) < n:
            time.sleep(0.2)
        time.sleep(1.0)
        # The per-second job may fire its own slot between its create and its pause: a
        # slot after the range, not the backfill's. Every slot of the range runs once.
        hits = [h for h in stack.receiver.hits_for(job_id) if slot_of(h) <= end]
        own = [slot_of(h) for h in stack.receiver.hits_for(job_id) if slot_of(h) > end]
        assert len(own) <= 2, own
        slots = [slot_of(h) for h in hits]
        assert len(slots) == n == len(set(slots)), (len(slots), len(set(slots)))
        assert set(slots) == {start + i * 1000 for i in range(n)}
        assert len({h.headers["Idempotency-Key"] for h in hits}) == n
        c.delete(f"/v1/jobs/{job_id}")


def test_a_range_past_the_api_limit_is_refused_with_the_count_and_the_limit(api_stack) -> None:
    stack = api_stack
    with stack.client() as c:
        job_id = cron_job(c, stack, "* * * * * *", "/ok")
        end = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=5)
        start = end - timedelta(seconds=MAX_BACKFILL_SLOTS)  # one slot more than the limit
        r = c.post(f"/v1/jobs/{job_id}:backfill",
                   json={"from": start.isoformat(), "to": end.isoformat()})
        assert r.status_code == 422, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        body = r.json()
        assert body["type"].endswith("/backfill-too-large")
        assert body["limit"] == MAX_BACKFILL_SLOTS
        assert body["slots_at_least"] == MAX_BACKFILL_SLOTS + 1
        assert f"more than {MAX_BACKFILL_SLOTS:,} slots" in body["detail"]
        # Nothing was sent: the job's history shows no backfill.
        time.sleep(1.0)
        assert not [x for x in c.get(f"/v1/jobs/{job_id}/runs").json()["runs"]
                    if x["trigger"] == "backfill"]
        c.delete(f"/v1/jobs/{job_id}")
