"""Manual controls through the real path (issue 40, part 5): `kron api`, the broker, a
worker and the loopback HTTP target.

A failed run retried with :retry makes attempt 2 of the same execution (the same
Idempotency-Key, X-Kron-Attempt 2, a new fencing token); a running one cancelled with
:cancel ends `cancelled`, and the target's late answer does not change that; GET /v1/runs
lists the tenant's failed runs across its jobs, deleted ones included; the CLI does the
same against the real API.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from streams.domain.ids import exec_id
from tests.support.stack import wait_until

pytestmark = pytest.mark.integration

ENDED = ("succeeded", "failed", "cancelled")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def one_off(c: httpx.Client, url: str, **fields: Any) -> tuple[str, str]:
    """A one-off job due now calling `url`: its id and its run's id."""
    slot = now_ms()
    r = c.post("/v1/jobs", json={
        "name": f"ctl-{uuid.uuid4().hex[:6]}", "run_at": iso(slot),
        "target": {"type": "http", "method": "POST", "url": url, "timeout_s": 30}, **fields})
    assert r.status_code == 201, r.text
    job_id = r.json()["job_id"]
    return job_id, exec_id(job_id, slot)


def run_of(c: httpx.Client, run_id: str) -> dict[str, Any]:
    r = c.get(f"/v1/runs/{run_id}")
    return r.json() if r.status_code == 200 else {}


def state_is(c: httpx.Client, run_id: str, *states: str, timeout_s: float = 60) -> dict[str, Any]:
    run = wait_until(lambda: (r := run_of(c, run_id)).get("state") in states and r, timeout_s)
    assert run, run_of(c, run_id)
    return dict(run)


def test_retry_of_a_permanently_failed_run_is_attempt_2_under_the_same_key(api_stack) -> None:
    stack, url = api_stack, api_stack.receiver.url
    with stack.client() as c:
        # 400 fails for good at once (no retry); the same key's next call gets 200.
        job_id, run_id = one_off(c, f"{url}/status/400,200")
        run = state_is(c, run_id, *ENDED)
        assert (run["state"], run["attempt"]) == ("failed", 1), run
        assert c.post(f"/v1/runs/{run_id}:cancel").status_code == 409  # not running
        r = c.post(f"/v1/runs/{run_id}:retry")
        assert r.status_code == 202, r.text
        run = state_is(c, run_id, "succeeded")
        assert [a["attempt"] for a in run["attempts"]] == [1, 2]
        assert [a["status_code"] for a in run["attempts"]] == [400, 200]
        hits = stack.receiver.hits_for(job_id)
        assert [h.headers["Idempotency-Key"] for h in hits] == [run_id, run_id]
        assert [h.headers["X-Kron-Attempt"] for h in hits] == ["1", "2"]
        tokens = [h.headers["X-Kron-Fencing-Token"] for h in hits]
        assert tokens[0] != tokens[1], tokens
        r = c.post(f"/v1/runs/{run_id}:retry")  # succeeded: nothing to retry
        assert r.status_code == 409 and r.json()["type"].endswith("run-not-retryable"), r.text


def test_cancel_of_a_slow_call_ends_cancelled_and_its_late_answer_is_ignored(
        api_stack) -> None:
    stack, url = api_stack, api_stack.receiver.url
    with stack.client() as c:
        job_id, run_id = one_off(c, f"{url}/slow/4")
        assert stack.receiver.wait_for(job_id, 1, 60), stack.worker.log()[-3000:]
        assert state_is(c, run_id, "running", timeout_s=10)["state"] == "running"
        assert c.post(f"/v1/runs/{run_id}:retry").status_code == 409  # running
        r = c.post(f"/v1/runs/{run_id}:cancel", json={"reason": "too slow"})
        assert r.status_code == 202, r.text
        run = state_is(c, run_id, *ENDED, timeout_s=10)
        assert (run["state"], run["reason"]) == ("cancelled", "too slow"), run
        time.sleep(5.5)  # past the target's answer
        run = run_of(c, run_id)
        assert (run["state"], run["attempt"]) == ("cancelled", 1), run
        assert len(stack.receiver.hits_for(job_id)) == 1
        assert c.post(f"/v1/runs/{run_id}:cancel").status_code == 409
        assert c.post(f"/v1/runs/{run_id}:retry").status_code == 409  # a cancel stands


def test_failed_runs_are_listed_across_jobs_deleted_ones_too_and_per_tenant(
        api_stack) -> None:
    stack, url = api_stack, api_stack.receiver.url
    since = iso(now_ms() - 1000)
    with stack.client() as c:
        runs = [one_off(c, f"{url}/status/404") for _ in range(3)]
        for _, run_id in runs:
            assert state_is(c, run_id, *ENDED)["state"] == "failed"
        gone_job, gone_run = runs[0]
        assert c.delete(f"/v1/jobs/{gone_job}").status_code == 200
        r = c.get("/v1/runs", params={"state": "failed", "since": since})
        assert r.status_code == 200, r.text
        listed = [x["run_id"] for x in r.json()["runs"]]
        assert set(listed) == {run_id for _, run_id in runs}, listed
        assert run_of(c, gone_run)["state"] == "failed"  # its job is deleted
        pages: list[str] = []
        params: dict[str, Any] = {"state": "failed", "since": since, "limit": 1}
        while True:
            page = c.get("/v1/runs", params=params).json()
            pages += [x["run_id"] for x in page["runs"]]
            if page["next_cursor"] is None:
                break
            params["cursor"] = page["next_cursor"]
        assert pages == listed
    with stack.client("key-globex") as other:
        theirs = other.get("/v1/runs", params={"since": since}).json()["runs"]
        assert not {x["run_id"] for x in theirs} & set(listed)


# --- the CLI --------------------------------------------------------------------------------


def kron(stack: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kron", *args, "--api", stack.api.url, "--key", "key-acme"],
        capture_output=True, text=True, timeout=120)


def test_the_cli_creates_from_flags_lists_retries_and_cancels_runs(api_stack) -> None:
    stack, url = api_stack, api_stack.receiver.url
    since = iso(now_ms() - 1000)
    slot = now_ms()
    created = kron(stack, "jobs", "create", "--at", iso(slot), "--url",
                   f"{url}/status/500,200", "--retries", "0", "--json")
    assert created.returncode == 0, created.stderr
    job_id = json.loads(created.stdout)["job_id"]
    run_id = exec_id(job_id, slot)
    with stack.client() as c:
        assert state_is(c, run_id, *ENDED)["state"] == "failed"
    listed = kron(stack, "runs", "list", "--state", "failed", "--since", since, "--json")
    assert listed.returncode == 0, listed.stderr
    assert run_id in [r["run_id"] for r in json.loads(listed.stdout)["runs"]]
    assert kron(stack, "runs", "cancel", run_id).returncode == 1  # not running: 409
    retried = kron(stack, "runs", "retry", run_id, "--json")
    assert retried.returncode == 0, retried.stderr
    with stack.client() as c:
        assert state_is(c, run_id, "succeeded")["attempt"] == 2
    # A slow one, cancelled from the CLI.
    slow_slot = now_ms()
    slow = kron(stack, "jobs", "create", "--at", iso(slow_slot), "--url", f"{url}/slow/4",
                "--json")
    assert slow.returncode == 0, slow.stderr
    slow_job = json.loads(slow.stdout)["job_id"]
    assert stack.receiver.wait_for(slow_job, 1, 60)
    slow_run = exec_id(slow_job, slow_slot)
    with stack.client() as c:
        state_is(c, slow_run, "running", timeout_s=10)
        cancelled = kron(stack, "runs", "cancel", slow_run, "--reason", "cli", "--json")
        assert cancelled.returncode == 0, cancelled.stderr
        assert state_is(c, slow_run, *ENDED, timeout_s=10)["state"] == "cancelled"
    # A cron job in Kolkata from flags: its next run in its own zone, then updated.
    cron = kron(stack, "jobs", "create", "--cron", "0 2 * * *", "--tz", "Asia/Kolkata",
                "--url", f"{url}/ok", "--retries", "5", "--json")
    assert cron.returncode == 0, cron.stderr
    job = json.loads(cron.stdout)
    assert job["next_run_at"].endswith("T02:00:00.000+05:30"), job
    assert job["definition"]["retry"]["max_attempts"] == 6
    updated = kron(stack, "jobs", "update", job["job_id"], "--tz", "Europe/Berlin", "--json")
    assert updated.returncode == 0, updated.stderr
    assert json.loads(updated.stdout)["next_run_at"].endswith(
        ("T02:00:00.000+01:00", "T02:00:00.000+02:00"))
    bad = kron(stack, "jobs", "create", "--cron", "0 2 * * *", "--at", iso(slot), "--url", url)
    assert bad.returncode == 2 and "--cron and --at" in bad.stderr
