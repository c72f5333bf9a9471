"""The dashboard's pure helpers (api/ui/query.py): label searches, a job's kinds, the jobs
search, percentiles and the last hour's runs per minute."""

from __future__ import annotations

from typing import Any

from api.ui.query import JobSearch, RunSample, activity, job_kinds, parse_label, percentile

MIN = 60_000


def http_job(**overrides: Any) -> dict[str, Any]:
    return {"name": "nightly", "schedule": {"cron": "0 2 * * *", "timezone": "UTC"},
            "target": {"type": "http", "url": "http://x.test/"},
            "metadata": {"team": "ops", "tier": "gold"}} | overrides


def test_a_label_is_a_key_or_a_key_and_its_value() -> None:
    assert parse_label(None) is None
    assert parse_label("  ") is None
    assert parse_label("team") == ("team", None)
    assert parse_label(" team = ops ") == ("team", "ops")
    assert parse_label("team=") == ("team", "")
    assert parse_label("url=http://a=b") == ("url", "http://a=b")


def test_a_jobs_kinds_are_its_schedule_and_what_it_runs() -> None:
    assert job_kinds(http_job()) == {"cron", "http"}
    one_off = {"name": "x", "run_at": "2026-01-01T00:00:00.000Z",
               "target": {"type": "kafka", "topic": "t"}}
    assert job_kinds(one_off) == {"once", "kafka"}
    dag = {"name": "x", "run_at": "2026-01-01T00:00:00.000Z", "dag": {"tasks": []}}
    assert job_kinds(dag) == {"once", "dag"}
    assert job_kinds(http_job(target={"type": "command", "command": "c"})) == {"cron", "command"}


def test_the_index_part_of_a_search_is_name_and_status_and_never_deleted() -> None:
    entry = {"name": "Nightly Report", "status": "active"}
    assert JobSearch().matches_index(entry)
    assert JobSearch(name="report").matches_index(entry)  # case-insensitive, a substring
    assert not JobSearch(name="weekly").matches_index(entry)
    assert JobSearch(status="active").matches_index(entry)
    assert not JobSearch(status="paused").matches_index(entry)
    assert not JobSearch().matches_index({"name": "x", "status": "deleted"})
    assert not JobSearch(status="deleted").matches_index({"name": "x", "status": "deleted"})


def test_labels_and_kinds_are_matched_on_the_definition() -> None:
    job = http_job()
    assert not JobSearch(name="x").needs_definition
    assert JobSearch(label=("team", None)).needs_definition
    assert JobSearch(kind="cron").needs_definition
    assert JobSearch(label=("team", None)).matches(job)
    assert JobSearch(label=("team", "ops")).matches(job)
    assert not JobSearch(label=("team", "dev")).matches(job)
    assert not JobSearch(label=("owner", None)).matches(job)
    assert JobSearch(kind="http", label=("tier", "gold")).matches(job)
    assert not JobSearch(kind="once").matches(job)
    assert not JobSearch(kind="dag").matches(job)
    assert JobSearch(label=("team", None)).matches(http_job(metadata={"team": ""}))
    assert not JobSearch(label=("team", None)).matches(http_job(metadata={}))


def test_percentiles_are_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([7], 95) == 7
    values = list(range(100, 0, -1))  # 1..100, unsorted
    assert percentile(values, 50) == 50
    assert percentile(values, 95) == 95
    assert percentile(values, 100) == 100
    assert percentile([1, 2, 3, 4], 50) == 2
    assert percentile([1, 2, 3, 4], 51) == 3


def test_activity_folds_the_hour_into_minutes() -> None:
    now = 1_000 * MIN + 30_000  # half way into minute 1000
    samples = [
        RunSample(scheduled_for_ms=1_000 * MIN, started_at_ms=1_000 * MIN + 40, state="succeeded",
                  lateness_ms=40),
        RunSample(scheduled_for_ms=1_000 * MIN, started_at_ms=1_000 * MIN + 200, state="failed",
                  lateness_ms=200),
        # scheduled the minute before, started in this one: counted when it started
        RunSample(scheduled_for_ms=999 * MIN + 59_000, started_at_ms=1_000 * MIN + 10,
                  state="succeeded", lateness_ms=1_010),
        RunSample(scheduled_for_ms=990 * MIN, started_at_ms=990 * MIN + 5, state="succeeded",
                  lateness_ms=5),
        RunSample(scheduled_for_ms=995 * MIN, started_at_ms=None, state="missed",
                  lateness_ms=None),
        RunSample(scheduled_for_ms=995 * MIN + 1, started_at_ms=None, state="missed",
                  lateness_ms=None),
        RunSample(scheduled_for_ms=900 * MIN, started_at_ms=900 * MIN, state="succeeded",
                  lateness_ms=0),  # before the hour: left out
    ]
    minutes = activity(samples, now_ms=now, minutes=60)
    assert len(minutes) == 60
    assert minutes[0]["minute"] == "1970-01-01T15:41:00.000Z"  # minute 941
    last = minutes[-1]
    assert last["minute"] == "1970-01-01T16:40:00.000Z"  # minute 1000, the current one
    assert last["executions"] == 3
    assert last["lateness_ms"] == {"p50": 200, "p95": 1_010, "max": 1_010}
    by_minute = {m["minute"]: m for m in minutes}
    assert by_minute["1970-01-01T16:30:00.000Z"]["executions"] == 1
    assert by_minute["1970-01-01T16:35:00.000Z"]["not_started"] == {"missed": 2}
    assert by_minute["1970-01-01T16:35:00.000Z"]["lateness_ms"]["p50"] is None
    assert sum(m["executions"] for m in minutes) == 4
