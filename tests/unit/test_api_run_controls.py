"""The API's manual controls on plain runs (issue 40, part 5): :retry and :cancel send the
worker's CancelRun/RetryRun or answer 409 as the worker would refuse; GET /v1/runs lists the
tenant's runs across its jobs (deleted jobs' too) from the projection's x/ and xs/ indexes;
next_run_at and upcoming carry the job's own UTC offset."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.projection import RUNS_INDEXED, Views
from api.routes import render, responses
from kron.settings import Settings
from kron.timefmt import iso_in
from schemas import names
from streams.domain.ids import exec_id
from tests.unit import test_dag_query as dag_query
from tests.unit.test_api_routes import conforms, problem
from tests.unit.test_dag_query import (
    EXECUTIONS,
    JOBS,
    OK,
    RUN,
    Feed,
    Publisher,
    attempt,
    execution,
    job_state,
    task_exec,
)

# The DAG query tests' fixtures: its settings, its API client over `views` (defined below,
# with these runs), its publisher standing in for Kafka, its request form of DAG specs.
settings = dag_query.settings
client = dag_query.client
publisher = dag_query.publisher
dag_request_form = dag_query.dag_request_form

HOUR = 3_600_000
SLOT = 1_700_000_000_000
A, B, GONE = "j_alpha", "j_beta", "j_gone"
FAIL = attempt(1, 10, 20, outcome="permanent", status=400, error="HTTP 400")


def plain(job_id: str, hour: int, state: str, *attempts: dict[str, Any],
          at: int = 0, tenant: str = "acme") -> dict[str, Any]:
    rec = execution(exec_id(job_id, SLOT + hour * HOUR), f"execution.{state}", state,
                    job_id=job_id, slot=SLOT + hour * HOUR, attempts=attempts,
                    last_error="HTTP 400" if state == "failed" else None, at=at)
    rec["envelope"]["tenant"] = tenant
    return rec


def rid(job_id: str, hour: int) -> str:
    return exec_id(job_id, SLOT + hour * HOUR)


PLAIN_RECORDS = [
    plain(A, 1, "running", attempt(1, 10)),
    plain(A, 1, "failed", FAIL, at=30),          # the same run, now failed: moves index
    plain(A, 2, "missed"),
    plain(B, 3, "failed", FAIL),
    plain(B, 4, "running", attempt(1, 10)),
    plain(B, 5, "retry_pending", attempt(1, 10, 20, outcome="transient", error="HTTP 503")),
    plain(B, 6, "succeeded", attempt(1, 10, 20, **OK)),
    plain(B, 7, "skipped"),
    plain(GONE, 8, "failed", FAIL),              # its job is deleted below
    plain("j_other", 9, "failed", FAIL, tenant="globex"),
]


def feed_all(feed: Feed) -> None:
    """The DAG query's records (a DAG run failed, one running, their task instances, a
    plain succeeded run), then these."""
    feed.job(JOBS[0])
    feed.job(JOBS[1])
    for i, rec in enumerate(EXECUTIONS):
        if i == 14:
            feed.job(JOBS[2])
        feed.execution(rec)
    for job_id in (A, B, GONE):
        feed.job(job_state(job_id, "job.created", dag=False, applied=["c"], running=[]))
    for rec in PLAIN_RECORDS:
        feed.execution(rec)
    gone = job_state(GONE, "job.deleted", dag=False, applied=["c", "d"], running=[])
    feed.job({**gone, "status": "deleted", "next_run_at_ms": None})


@pytest.fixture
def views(tmp_path: Path, settings: Settings) -> Iterator[Views]:
    v = Views(tmp_path / "views")
    feed_all(Feed(settings, v))
    yield v
    v.close()


# --- :retry and :cancel of a plain run ----------------------------------------------------


@pytest.mark.parametrize("run_id", [rid(A, 1), rid(A, 2), rid(B, 7)])
def test_retry_of_a_failed_missed_or_skipped_run_sends_retry_run(
        client: TestClient, publisher: Publisher, run_id: str) -> None:
    body = conforms(responses.RunCommandAccepted, client.post(f"/v1/runs/{run_id}:retry"), 202)
    name, record, key = publisher.sent[-1]
    assert (name, record["run_id"], key) == (names.RETRY_RUN, run_id, record["job_id"])
    assert body["action"] == "retry" and body["applied"] is False  # no worker here


@pytest.mark.parametrize("run_id", [rid(B, 4), rid(B, 5)])
def test_cancel_of_a_running_or_retrying_run_sends_cancel_run(
        client: TestClient, publisher: Publisher, run_id: str) -> None:
    body = conforms(responses.RunCommandAccepted,
                    client.post(f"/v1/runs/{run_id}:cancel", json={"reason": "stuck"}), 202)
    name, record, _ = publisher.sent[-1]
    assert (name, record["run_id"], record["reason"]) == (names.CANCEL_RUN, run_id, "stuck")
    assert body["state"] in ("running", "retry_pending")


def test_the_actions_a_plain_run_cannot_take_are_409(client: TestClient,
                                                     publisher: Publisher) -> None:
    for run_id, state in ((rid(B, 4), "running"), (rid(B, 5), "retry_pending"),
                          (rid(B, 6), "succeeded")):
        p = problem(client.post(f"/v1/runs/{run_id}:retry"), 409, "run-not-retryable",
                    "run_id")
        assert p["state"] == state and "failed, missed or skipped" in p["detail"]
    for run_id in (rid(A, 1), rid(A, 2), rid(B, 6), rid(B, 7)):
        p = problem(client.post(f"/v1/runs/{run_id}:cancel"), 409, "run-not-running", "run_id")
        assert "queued, running or retrying" in p["detail"]
    assert publisher.sent == []


def test_a_deleted_jobs_run_is_readable_but_takes_no_commands(client: TestClient,
                                                              publisher: Publisher) -> None:
    assert client.get(f"/v1/runs/{rid(GONE, 8)}").json()["state"] == "failed"
    assert client.post(f"/v1/runs/{rid(GONE, 8)}:retry").status_code == 404
    assert publisher.sent == []


# --- GET /v1/runs ----------------------------------------------------------------------------


def listed(client: TestClient, **params: Any) -> dict[str, Any]:
    return conforms(responses.RunList, client.get("/v1/runs", params=params), 200)


def test_failed_runs_of_every_job_newest_slot_first_deleted_jobs_included(
        client: TestClient) -> None:
    runs = listed(client, state="failed")["runs"]
    assert [r["run_id"] for r in runs] == [rid(GONE, 8), rid(B, 3), rid(A, 1), RUN]
    assert runs[-1]["tasks"]["failed"] == 1  # a DAG run, its tasks counted
    assert {r["state"] for r in runs} == {"failed"}
    everything = [r["run_id"] for r in listed(client, limit=500)["runs"]]
    assert task_exec("a") not in everything  # task instances are not runs
    assert rid("j_other", 9) not in everything  # another tenant's
    assert len(everything) == 8 + 3  # plain acme runs + two DAG runs + the DAG file's plain


def test_since_bounds_the_slot_and_pages_follow_a_stable_cursor(client: TestClient) -> None:
    since = iso_in(SLOT + 3 * HOUR, "Asia/Kolkata")  # any offset: the same instant
    runs = listed(client, since=since)["runs"]
    assert [r["run_id"] for r in runs] == [rid(GONE, 8), rid(B, 7), rid(B, 6), rid(B, 5),
                                           rid(B, 4), rid(B, 3)]
    seen: list[str] = []
    cursor = None
    while True:
        page = listed(client, limit=2, **({"cursor": cursor} if cursor else {}))
        seen += [r["run_id"] for r in page["runs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
        assert len(page["runs"]) == 2
    assert seen == [r["run_id"] for r in listed(client, limit=500)["runs"]]
    first = listed(client, state="failed", limit=1)
    rest = listed(client, state="failed", cursor=first["next_cursor"])["runs"]
    assert [r["run_id"] for r in rest] == [rid(B, 3), rid(A, 1), RUN]


def test_bad_list_parameters_are_422(client: TestClient) -> None:
    problem(client.get("/v1/runs", params={"state": "broken"}), 422, "invalid-input", "state")
    problem(client.get("/v1/runs", params={"limit": 0}), 422, "invalid-input", "limit")
    problem(client.get("/v1/runs", params={"since": "2026-01-01T00:00:00"}), 422,
            "invalid-input", "since")
    problem(client.get("/v1/runs", params={"cursor": "x"}), 422, "invalid-input", "cursor")


def test_another_tenant_sees_only_its_own(client: TestClient) -> None:
    r = client.get("/v1/runs", headers={"X-API-Key": "key-globex"})
    assert [x["run_id"] for x in r.json()["runs"]] == [rid("j_other", 9)]


def test_a_run_moves_between_state_indexes_and_a_kept_store_is_indexed_once(
        tmp_path: Path, settings: Settings) -> None:
    path = tmp_path / "kept"
    views = Views(path)
    feed_all(Feed(settings, views))
    keys = [k for k in views.dump() if k.startswith(b"xs/acme/running/")]
    assert keys and all(rid(A, 1).encode() not in k for k in keys)  # it failed since
    whole = views.dump()
    # A store kept from before the indexes: no x/, xs/ or marker. Opening fills them.
    assert views.db.get(RUNS_INDEXED) is not None
    for key in [*whole, RUNS_INDEXED]:
        if key.startswith((b"x/", b"xs/", b"m/")):
            views.db.delete(key)
    assert not [k for k in views.dump() if k.startswith(b"x")]
    views.close()
    reopened = Views(path)
    try:
        assert reopened.dump() == whole
    finally:
        reopened.close()


# --- times in the job's zone -----------------------------------------------------------------


def test_next_run_times_carry_the_jobs_offset() -> None:
    at = 1_791_664_200_000  # 2026-10-10T20:30:00Z
    assert iso_in(at, "Asia/Kolkata") == "2026-10-11T02:00:00.000+05:30"
    assert iso_in(at, "America/New_York") == "2026-10-10T16:30:00.000-04:00"
    assert iso_in(at, "UTC") == iso_in(at, None) == "2026-10-10T20:30:00.000Z"
    assert iso_in(at, "Europe/London") == "2026-10-10T21:30:00.000+01:00"
    spec = {"name": "n", "schedule": {"cron": "0 2 * * *", "timezone": "Asia/Kolkata"}}
    assert render.upcoming_out(spec, [at]) == ["2026-10-11T02:00:00.000+05:30"]
    assert render.job_zone({"run_at": "2026-10-10T20:30:00.000Z"}) is None
