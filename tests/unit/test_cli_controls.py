"""`kron jobs create|update|backfill` from flags and `kron runs list|retry|cancel` (issue 40,
part 5), against the in-process API over the runs of test_api_run_controls.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from kron import jobs_cli
from kron.cli import app
from kron.jobs_cli import FlagError, spec_of_flags
from schemas import names
from tests.unit import test_api_run_controls as controls
from tests.unit.test_api_run_controls import GONE, A, B, rid
from tests.unit.test_dag_query import RUN, Publisher

# The fixtures of the API tests this drives: an in-process API over `views`.
settings = controls.settings
views = controls.views
client = controls.client
publisher = controls.publisher
dag_request_form = controls.dag_request_form
Invoke = Callable[..., Any]


@pytest.fixture
def kron(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> Invoke:
    """`kron ...` against the in-process API: (exit code, output)."""
    def request(method: str, url: str, **kw: Any) -> Any:
        kw.pop("timeout", None)
        return client.request(method, url.removeprefix(jobs_cli.DEFAULT_URL), **kw)

    monkeypatch.setattr(httpx, "request", request)

    def invoke(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(app, [*args, "--key", "key-acme"],
                                    env={"COLUMNS": "250"})
        return result.exit_code, result.output

    return invoke


def test_flags_make_the_request_fields() -> None:
    assert spec_of_flags(cron="0 2 * * *", tz="Asia/Kolkata", url="https://x.test/",
                         retries=5) == {
        "schedule": {"cron": "0 2 * * *", "timezone": "Asia/Kolkata"},
        "target": {"type": "http", "url": "https://x.test/"},
        "retry": {"max_attempts": 6}}
    assert spec_of_flags(at="2026-12-24T18:00:00Z", topic="team.events", name="n",
                         priority="batch") == {
        "name": "n", "run_at": "2026-12-24T18:00:00Z",
        "target": {"type": "kafka", "topic": "team.events"}, "priority": "batch"}
    assert spec_of_flags(tz="Europe/Berlin") == {"schedule": {"timezone": "Europe/Berlin"}}


@pytest.mark.parametrize(("flags", "says"), [
    ({"cron": "* * * * *", "at": "2026-12-24T18:00:00Z"}, "--cron and --at"),
    ({"url": "https://x.test/", "topic": "t"}, "--url and --topic"),
    ({"method": "GET", "topic": "t"}, "--method needs --url"),
    ({"retries": 100}, "--retries must be in 0..99"),
    ({"at": "2026-12-24T18:00:00Z", "tz": "Asia/Kolkata"}, "--tz is a cron schedule's zone"),
])
def test_flags_that_cannot_make_a_job_are_refused(flags: dict[str, Any], says: str) -> None:
    with pytest.raises(FlagError, match=says):
        spec_of_flags(**flags)


def test_create_from_flags_shows_the_next_run_in_the_jobs_zone(
        kron: Invoke, publisher: Publisher) -> None:
    code, out = kron("jobs", "create", "--cron", "0 2 * * *", "--tz", "Asia/Kolkata",
                     "--url", "https://example.com/hook", "--retries", "5", "--json")
    assert code == 0, out
    job = json.loads(out)
    assert job["next_run_at"].endswith("T02:00:00.000+05:30")
    assert all(t.endswith("T02:00:00.000+05:30") for t in job["upcoming"])
    assert job["definition"]["retry"]["max_attempts"] == 6
    assert publisher.sent[-1][0] in (names.CREATE_JOB, names.CREATE_JOBS)
    code, out = kron("jobs", "create", "--at", "2030-12-24T18:00:00Z", "--topic",
                     "acme.team.events", "--json")
    assert code == 0, out
    assert json.loads(out)["definition"]["target"]["topic"] == "acme.team.events"


def test_create_with_json_and_flags_takes_the_flags_over_the_body(kron: Invoke) -> None:
    body = json.dumps({"name": "from-json", "run_at": "2099-01-01T00:00:00Z",
                       "target": {"url": "https://example.com/a"}})
    code, out = kron("jobs", "create", body, "--cron", "0 3 * * *", "--json")
    assert code == 0, out
    job = json.loads(out)
    assert job["name"] == "from-json" and job["definition"]["schedule"]["cron"] == "0 3 * * *"
    assert "run_at" not in job["definition"] or job["definition"]["run_at"] is None


@pytest.mark.parametrize(("args", "says"), [
    (("--cron", "0 2 * * *"), "needs a schedule (--cron or --at) and a target"),
    (("--cron", "0 2 * * *", "--at", "2099-01-01T00:00:00Z", "--url", "https://e.com"),
     "--cron and --at both"),
    (("--url", "https://e.com", "--topic", "t", "--cron", "* * * * *"), "--url and --topic"),
    (("not json",), "not readable JSON"),
    (("--cron", "0 2 * * *", "--retries", "lots"), "Invalid value"),
])
def test_bad_create_flags_say_why_and_exit_non_zero(kron: Invoke, publisher: Publisher,
                                                    args: tuple[str, ...], says: str) -> None:
    code, out = kron("jobs", "create", *args)
    assert code == 2 and says in out
    assert publisher.sent == []


def test_the_apis_refusal_exits_1_with_its_problem(kron: Invoke) -> None:
    code, out = kron("jobs", "create", "--cron", "0 2 * * *", "--tz", "Mars/Olympus",
                     "--url", "https://example.com/")
    assert code == 1 and "error 422" in out and "schedule.timezone" in out


def test_update_from_flags_sends_a_merge_patch(kron: Invoke, publisher: Publisher) -> None:
    code, out = kron("jobs", "update", A, "--name", "renamed", "--retries", "0", "--json")
    assert code == 0, out
    name, record, key = publisher.sent[-1]
    assert (name, key) == (names.UPDATE_JOB, A)
    assert record["spec"]["name"] == "renamed"
    assert record["spec"]["retry"]["max_attempts"] == 1
    code, out = kron("jobs", "update", A)
    assert code == 2 and "nothing to change" in out


def test_backfill_sends_its_range(kron: Invoke, publisher: Publisher) -> None:
    code, out = kron("jobs", "backfill", A, "--from", "2023-11-14T00:00:00Z",
                     "--to", "2023-11-14T03:00:00Z", "--rerun", "--max-per-s", "5", "--json")
    assert code == 0, out
    name, record, _ = publisher.sent[-1]
    assert name == names.BACKFILL_JOB and record["rerun"] is True
    assert record["max_per_s"] == 5
    code, out = kron("jobs", "backfill", A, "--to", "2023-11-14T03:00:00Z")
    assert code == 2 and "--from" in out


def test_runs_list_retry_and_cancel(kron: Invoke, publisher: Publisher) -> None:
    code, out = kron("runs", "list", "--state", "failed", "--json")
    assert code == 0, out
    assert [r["run_id"] for r in json.loads(out)["runs"]] == [
        rid(GONE, 8), rid(B, 3), rid(A, 1), RUN]
    code, out = kron("runs", "list", "--limit", "1")
    assert code == 0 and "more: --cursor" in out and rid(GONE, 8) in out
    code, out = kron("runs", "retry", rid(A, 1), "--json")
    assert code == 0 and json.loads(out)["action"] == "retry"
    code, out = kron("runs", "cancel", rid(B, 4), "--reason", "stuck", "--json")
    assert code == 0 and json.loads(out)["action"] == "cancel"
    assert [(n, r["run_id"]) for n, r, _ in publisher.sent] == [
        (names.RETRY_RUN, rid(A, 1)), (names.CANCEL_RUN, rid(B, 4))]
    code, out = kron("runs", "retry", rid(B, 6))
    assert code == 1 and "409" in out
    code, out = kron("runs", "list", "--state", "bogus")
    assert code == 1 and "state" in out
