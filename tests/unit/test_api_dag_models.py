"""api.models for DAG jobs (issue 38): a ``dag`` instead of a ``target``, built into the Avro
JobSpec's kron.DagTarget with every task's target checked as a job's own, refused with a 422
naming the field as the caller wrote it, shown back by request_of and changed by PATCH."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.models import (
    InvalidField,
    JobRequest,
    build_spec,
    iso,
    merge_patch,
    parse_patch,
    parse_request,
    request_of,
    spec_fingerprint,
    upcoming,
)
from api.projection import Projector, Views
from api.routes import responses, service
from api.server import Components, create_app
from kron.settings import Settings
from schemas import codec, names
from schemas.jsonable import jsonable
from streams.domain.commands import CommandRegistry
from streams.domain.dag import MAX_EDGES, MAX_TASKS
from streams.domain.topics import TopicGrants
from streams.engine.spec import plan_of


def utc_ms(y: int, mo: int, d: int, h: int = 0, mi: int = 0) -> int:
    return int(datetime(y, mo, d, h, mi, tzinfo=UTC).timestamp()) * 1000


NOW = utc_ms(2026, 5, 28, 20, 26)
HOUR = 3_600_000
URL = "https://hooks.example.com"
COMMANDS = CommandRegistry.parse("""
[commands."reports.nightly"]
argv = ["/usr/local/bin/nightly", "--day", "{day}"]
tenants = ["acme"]
[commands."reports.nightly".params.day]
pattern = '[0-9]{4}-[0-9]{2}-[0-9]{2}'
[commands."cleanup"]
argv = ["/usr/local/bin/cleanup"]
tenants = ["*"]
""")
GRANTS = TopicGrants.parse("acme=shared.*", own_prefix="kron")


def task(task_id: str, *deps: str, target: Any = None, **fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"id": task_id, "target": target or {"url": f"{URL}/{task_id}"}}
    if deps:
        out["depends_on"] = list(deps)
    return out | fields


SETTLEMENT: dict[str, Any] = {
    "name": "settlement",
    "schedule": {"cron": "0 2 * * *", "timezone": "Asia/Kolkata"},
    "concurrency": "skip_if_running",
    "dag": {"tasks": [
        task("ingest", target={"type": "http", "url": f"{URL}/ingest", "method": "put",
                               "headers": {"X-Token": "t"}, "body": '{"day": 1}'}),
        task("fx", target={"topic": "acme.fx", "key": "k", "value": "v"}),
        task("reconcile", "ingest", "fx", retry={"max_attempts": 5, "backoff": "exponential",
                                                "base_s": 10, "max_s": 300}, timeout_s=60),
        task("report", "reconcile", target={"command": "reports.nightly",
                                            "args": {"day": "2026-12-01"}}),
        task("cleanup", "report", trigger_rule="all_done", retry={"max": 2, "backoff": "exp"}),
    ]},
}


def build(raw: dict[str, Any], **kw: Any) -> dict[str, Any]:
    kw = {"now_ms": NOW, "allow_private": False, "tenant": "acme", "commands": COMMANDS,
          "topic_grants": GRANTS} | kw
    return build_spec(parse_request(raw), **kw)


def invalid(raw: dict[str, Any], **kw: Any) -> InvalidField:
    with pytest.raises(InvalidField) as info:
        build(raw, **kw)
    err = info.value
    assert err.errors[0] == (err.field, err.message)
    return err


def dag_job(*tasks: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"schedule": "0 2 * * *", "dag": {"tasks": list(tasks)}} | fields


def create_job(spec: dict[str, Any]) -> dict[str, Any]:
    return {"envelope": {"event_id": "c-1", "event_type": "job.create_requested",
                         "schema_version": 1, "occurred_at_ms": NOW, "tenant": "acme",
                         "causation_id": None, "correlation_id": None, "producer": "api"},
            "command_id": "c-1", "job_id": "job-1", "idempotency_key": None, "spec": spec}


# --- a good DAG ---------------------------------------------------------------------------------


def test_a_dag_builds_into_the_avro_dag_target() -> None:
    spec = build(SETTLEMENT)
    kind, dag = spec["target"]
    assert kind == "kron.DagTarget"
    assert [t["id"] for t in dag["tasks"]] == ["ingest", "fx", "reconcile", "report", "cleanup"]
    ingest, fx, reconcile, report, cleanup = dag["tasks"]
    assert ingest == {"id": "ingest", "target": ("kron.HttpTarget", {
        "method": "PUT", "url": f"{URL}/ingest", "headers": {"X-Token": "t"},
        "body": b'{"day": 1}', "timeout_s": 30.0}), "depends_on": [],
        "trigger_rule": "all_success", "retry": None, "timeout_s": None}
    assert fx["target"] == ("kron.KafkaTarget", {"topic": "acme.fx", "key": b"k",
                                                 "value": b"v", "headers": {}})
    assert reconcile["depends_on"] == ["ingest", "fx"]
    assert reconcile["retry"] == {"max_attempts": 5, "backoff": "exponential",
                                  "base_s": 10.0, "max_s": 300.0}
    assert reconcile["timeout_s"] == 60.0
    assert report["target"] == ("kron.RegisteredCommandTarget", {
        "command": "reports.nightly", "args": {"day": "2026-12-01"}, "env": {},
        "timeout_s": None})
    assert cleanup["trigger_rule"] == "all_done"
    assert cleanup["retry"] == {"max_attempts": 2, "backoff": "exponential", "base_s": 1.0,
                                "max_s": 300.0}
    # everything else as for any job
    assert spec["schedule"] == ("kron.CronSchedule", {"expr": "0 2 * * *",
                                                      "timezone": "Asia/Kolkata"})
    assert spec["overlap"] == "skip_if_running" and spec["name"] == "settlement"
    plan = plan_of(spec)
    assert plan.dag is not None and [t.task_id for t in plan.dag.tasks][2] == "reconcile"


def test_a_dag_job_encodes_as_a_create_job() -> None:
    spec = build(SETTLEMENT)
    back = codec.decode(codec.encode(names.CREATE_JOB, create_job(spec))).record
    assert back["spec"] == spec
    assert spec_fingerprint(back["spec"]) == spec_fingerprint(spec)
    many = {**create_job(spec), "jobs": [{"job_id": "job-1", "idempotency_key": None,
                                          "spec": spec}]}
    del many["job_id"], many["idempotency_key"], many["spec"]
    assert codec.decode(codec.encode(names.CREATE_JOBS, many)).record["jobs"][0]["spec"] == spec


def test_a_dag_job_without_a_name_is_named_after_its_first_task() -> None:
    assert build(dag_job(task("ingest"), task("load", "ingest")))["name"] == "dag:ingest"


def test_a_one_off_dag_job_and_its_other_fields() -> None:
    spec = build(dag_job(task("a"), task("b", "a"), schedule=None, run_at=iso(NOW + HOUR),
                         jitter_s=5, lease_s=30, metadata={"team": "fin"},
                         misfire="fire_all", start_at=iso(NOW)))
    assert spec["schedule"] == ("kron.OneOffSchedule", {"run_at_ms": NOW + HOUR})
    assert (spec["jitter_s"], spec["lease_s"], spec["metadata"]) == (5.0, 30.0, {"team": "fin"})
    assert upcoming(spec, now_ms=NOW) == [NOW + HOUR]


def test_upcoming_and_the_fingerprint_of_a_dag_spec() -> None:
    spec = build(SETTLEMENT)
    # 02:00 in Kolkata is 20:30 UTC the day before
    first = utc_ms(2026, 5, 28, 20, 30)
    assert upcoming(spec, now_ms=NOW, count=2) == [first, first + 86_400_000]
    other = build({**SETTLEMENT, "dag": {"tasks": [
        *SETTLEMENT["dag"]["tasks"][:-1], task("cleanup", "report", trigger_rule="all_success",
                                                retry={"max": 2, "backoff": "exp"})]}})
    assert spec_fingerprint(other) != spec_fingerprint(spec)
    assert spec_fingerprint(build(SETTLEMENT)) == spec_fingerprint(spec)


def test_any_change_to_a_task_changes_the_fingerprint() -> None:
    spec = build(SETTLEMENT)
    seen = {spec_fingerprint(spec)}
    changes = {"id": "zz", "depends_on": ["zz"], "trigger_rule": "always", "timeout_s": 1.5,
               "retry": {"max_attempts": 1, "backoff": "fixed", "base_s": 1.0, "max_s": 1.0},
               "target": ("kron.HttpTarget", {"method": "GET", "url": URL, "headers": {},
                                              "body": None, "timeout_s": 30.0})}
    for i in range(len(spec["target"][1]["tasks"])):
        for key, value in changes.items():
            tasks = [dict(t) for t in spec["target"][1]["tasks"]]
            tasks[i][key] = value
            seen.add(spec_fingerprint({**spec, "target": ("kron.DagTarget", {"tasks": tasks})}))
    assert len(seen) == 1 + 5 * len(changes)


# --- request_of -----------------------------------------------------------------------------------


def test_request_of_shows_the_dag_and_round_trips() -> None:
    spec = build(SETTLEMENT)
    form = request_of(spec)
    assert "target" not in form
    assert form["dag"]["tasks"][0] == {
        "id": "ingest", "target": {"type": "http", "method": "PUT", "url": f"{URL}/ingest",
                                   "headers": {"X-Token": "t"}, "body": '{"day": 1}',
                                   "timeout_s": 30.0},
        "depends_on": [], "trigger_rule": "all_success", "retry": None, "timeout_s": None}
    assert build(form) == spec
    # as the GET shows it: the job's Avro state decoded, made JSON, read as a JobRequest
    decoded = codec.decode(codec.encode(names.CREATE_JOB, create_job(spec))).record["spec"]
    shown = jsonable(request_of(decoded))
    JobRequest.model_validate(shown)
    assert build(shown) == spec


def test_non_utf8_task_bytes_survive_request_of() -> None:
    spec = build(dag_job(task("a", target={"url": f"{URL}/a", "body": "ok\udcff"})))
    assert spec["target"][1]["tasks"][0]["target"][1]["body"] == b"ok\xff"
    assert build(request_of(spec)) == spec


# --- target or dag --------------------------------------------------------------------------------


def test_target_and_dag_together_are_refused_naming_dag() -> None:
    err = invalid({**dag_job(task("a")), "target": {"url": URL}})
    assert (err.field, err.message) == ("dag", "give either target or dag, not both")


def test_neither_target_nor_dag_is_a_missing_target() -> None:
    for raw in ({"schedule": "0 2 * * *"}, {"schedule": "0 2 * * *", "target": None}):
        err = invalid(raw)
        assert (err.field, err.message) == ("target", "target is required")


def test_a_dag_with_a_null_target_is_a_dag_job() -> None:
    assert build({**dag_job(task("a")), "target": None})["target"][0] == "kron.DagTarget"


@pytest.mark.parametrize(("dag", "field", "message"), [
    ({}, "dag.tasks", "dag.tasks is required"),
    ({"tasks": []}, "dag.tasks", "a DAG needs at least one task"),
    ({"tasks": None}, "dag.tasks", "dag.tasks: Input should be a valid list"),
    ([], "dag", "dag: Input should be a valid dictionary or instance of DagIn"),
])
def test_a_dag_needs_tasks(dag: Any, field: str, message: str) -> None:
    err = invalid({"schedule": "0 2 * * *", "dag": dag})
    assert (err.field, err.message) == (field, message)


# --- the graph, as parse_dag judges it ------------------------------------------------------------


@pytest.mark.parametrize(("tasks", "field", "message"), [
    ([task("a", "c"), task("b", "a"), task("c", "b")], "dag.tasks[0].depends_on",
     "dependency cycle: a -> c -> b -> a"),
    ([task("x"), task("a", "b"), task("b", "a")], "dag.tasks[1].depends_on",
     "dependency cycle: a -> b -> a"),
    ([task("a"), task("b", "zz")], "dag.tasks[1].depends_on",
     "dag.tasks[1].depends_on: unknown task 'zz'"),
    ([task("a"), task("a")], "dag.tasks[1].id",
     "dag.tasks[1].id: duplicate task id 'a' (also dag.tasks[0])"),
    ([task("a"), task("Bad Id")], "dag.tasks[1].id",
     "dag.tasks[1].id must be a string matching [a-z0-9][a-z0-9_.-]{0,63}; got 'Bad Id'"),
    ([task("a" * 65)], "dag.tasks[0].id", None),
    ([task("a", "a")], "dag.tasks[0].depends_on",
     "dag.tasks[0].depends_on: task 'a' depends on itself"),
    ([task("a"), task("b", "a", "a")], "dag.tasks[1].depends_on",
     "dag.tasks[1].depends_on: 'a' is listed twice"),
    ([task("a"), task("b", "a", trigger_rule="sometimes")], "dag.tasks[1].trigger_rule",
     "dag.tasks[1].trigger_rule must be one of: all_success, all_failed, all_done, "
     "one_success, one_failed, none_failed, always; got 'sometimes'"),
    ([task("a"), task("b", retry={"max_attempts": 0})], "dag.tasks[1].retry.max_attempts",
     None),
    ([task("a", retry={"base_s": 10, "max_s": 5})], "dag.tasks[0].retry.max_s", None),
    ([task("a", timeout_s=0)], "dag.tasks[0].timeout_s", None),
    ([task("a", timeout_s=86_401)], "dag.tasks[0].timeout_s", None),
    ([task(f"t{i}") for i in range(MAX_TASKS + 1)], "dag.tasks",
     f"a DAG has at most {MAX_TASKS} tasks; got {MAX_TASKS + 1}"),
    ([task(f"r{i}") for i in range(100)]
     + [task(f"c{j}", *[f"r{i}" for i in range(100)]) for j in range(MAX_EDGES // 100 + 1)],
     "dag.tasks", f"a DAG has at most {MAX_EDGES} dependencies; got {MAX_EDGES + 100}"),
])
def test_bad_graphs_are_refused_naming_the_field(tasks: list[dict[str, Any]], field: str,
                                                 message: str | None) -> None:
    err = invalid(dag_job(*tasks))
    assert err.field == field
    assert err.message.startswith(field) or message is not None, err.message
    if message is not None:
        assert err.message == message


def test_the_largest_dag_builds() -> None:
    tasks = [task("root")] + [task(f"t{i}", "root") for i in range(MAX_TASKS - 1)]
    assert len(build(dag_job(*tasks))["target"][1]["tasks"]) == MAX_TASKS


# --- a task's fields ----------------------------------------------------------------------------


@pytest.mark.parametrize(("bad", "field", "hint"), [
    ({"dependson": ["a"]}, "dag.tasks[1].dependson", "dag.tasks[1].depends_on"),
    ({"trigger": "all_done"}, "dag.tasks[1].trigger", "dag.tasks[1].trigger_rule"),
    ({"retry": {"max_atempts": 2}}, "dag.tasks[1].retry.max_atempts",
     "dag.tasks[1].retry.max_attempts"),
    ({"target": {"url": URL, "header": {}}}, "dag.tasks[1].target.header",
     "dag.tasks[1].target.headers"),
    ({"target": {"type": "kafka", "topic": "acme.x", "url": URL}}, "dag.tasks[1].target.url",
     None),
])
def test_a_task_field_not_in_the_model_is_named(bad: dict[str, Any], field: str,
                                                hint: str | None) -> None:
    with pytest.raises(InvalidField) as info:
        parse_request(dag_job(task("a"), task("b") | bad))
    assert info.value.field == field
    assert info.value.message.startswith(f"unknown field {field!r}")
    if hint is not None:
        assert info.value.message.endswith(f"did you mean {hint!r}?")


@pytest.mark.parametrize(("bad", "field", "message"), [
    ({"id": None}, "dag.tasks[1].id", "dag.tasks[1].id: Input should be a valid string"),
    ({"target": None}, "dag.tasks[1].target", None),
    ({"target": {"timeout_s": 3}}, "dag.tasks[1].target",
     "dag.tasks[1].target.type is required (http, kafka or command) unless the target has a "
     "url, topic or command"),
    ({"target": {"type": "ftp", "url": URL}}, "dag.tasks[1].target", None),
    ({"depends_on": ["a", 1]}, "dag.tasks[1].depends_on[1]",
     "dag.tasks[1].depends_on[1]: Input should be a valid string"),
    ({"depends_on": "a"}, "dag.tasks[1].depends_on", None),
    ({"timeout_s": "60"}, "dag.tasks[1].timeout_s", None),
    ({"retry": {"backoff": "linear"}}, "dag.tasks[1].retry.backoff", None),
    ({"trigger_rule": 3}, "dag.tasks[1].trigger_rule", None),
])
def test_a_task_field_of_the_wrong_type_is_named(bad: dict[str, Any], field: str,
                                                 message: str | None) -> None:
    with pytest.raises(InvalidField) as info:
        parse_request(dag_job(task("a"), task("b") | bad))
    assert info.value.field == field
    if message is not None:
        assert info.value.message == message


def test_a_task_without_id_or_target_is_named() -> None:
    with pytest.raises(InvalidField) as info:
        parse_request(dag_job(task("a"), {"depends_on": ["a"]}))
    assert [f for f, _ in info.value.errors] == ["dag.tasks[1].id", "dag.tasks[1].target"]
    assert info.value.message == "dag.tasks[1].id is required"


# --- a task's target is checked as a job's -----------------------------------------------------

PRIVATE = ["http://127.0.0.1/", "http://localhost:8080/", "http://169.254.169.254/latest/",
           "http://[::1]/", "http://10.0.0.1/", "http://metadata/", "http://svc.internal/",
           "http://0x7f000001/", "http://①②⑦。0。0。1/"]


def as_task(text: str, i: int = 1) -> str:
    """A job-level field or message about ``target`` as the same about task ``i``'s."""
    return re.sub(r"\btarget(?=[. ]|$)", f"dag.tasks[{i}].target", text)


@pytest.mark.parametrize("url", PRIVATE)
def test_a_private_url_in_a_task_is_refused_naming_the_task(url: str) -> None:
    err = invalid(dag_job(task("a"), task("b", "a", target={"url": url})))
    assert err.field == "dag.tasks[1].target.url"
    job = invalid({"schedule": "0 2 * * *", "target": {"url": url}})
    assert (err.field, err.message) == (as_task(job.field), as_task(job.message))
    assert build(dag_job(task("a"), task("b", target={"url": url})), allow_private=True)


BAD_TARGETS: list[dict[str, Any]] = [
    {"url": "ftp://example.com/x"},
    {"url": "http://user:pw@example.com/"},
    {"url": "https://exa mple.com/"},
    {"url": "http://a..b.com/"},
    {"url": URL, "timeout_s": 0},
    {"url": URL, "timeout_s": 4000},
    {"url": URL, "headers": {"X-A": "1\r\nX-B: 2"}},
    {"url": URL, "headers": {"Host": "internal"}},
    {"url": URL, "headers": {"x-kron-attempt": "9"}},
    {"url": URL, "headers": {f"X-{i}": "1" for i in range(51)}},
    {"url": URL, "headers": {"X-A": "\ud83d"}},
    {"url": URL, "body": "x" * (256 * 1024 + 1)},
    {"url": URL, "body": "\ud800"},
    {"topic": "kron.commands"},
    {"topic": "__consumer_offsets"},
    {"topic": "bad topic"},
    {"topic": "globex.reports"},
    {"topic": "acme.k", "key": "k" * (16 * 1024 + 1)},
    {"topic": "acme.v", "value": "v" * (256 * 1024 + 1)},
    {"topic": "acme.h", "headers": {"Idempotency-Key": "x"}},
    {"command": "nope"},
    {"command": "reports.nightly"},
    {"command": "reports.nightly", "args": {"day": "yesterday"}},
    {"command": "reports.nightly", "args": {"day": "2026-12-01", "x": "1"}},
    {"command": "reports.nightly", "args": {"day": "2026-12-01"}, "env": {"PATH": "/"}},
    {"command": "cleanup", "timeout_s": 0},
    {"type": "command", "argv": ["/bin/true"]},
    {"type": "command", "command": "cleanup", "image": "alpine"},
    {"type": "command"},
]


@pytest.mark.parametrize("target", BAD_TARGETS)
def test_a_task_target_is_refused_as_a_job_target_is(target: dict[str, Any]) -> None:
    """The same refusal (field, message, problem type and title), named under the task."""
    job = invalid({"schedule": "0 2 * * *", "target": target})
    assert job.field.startswith("target"), job.field
    err = invalid(dag_job(task("a"), task("b", "a", target=target)))
    assert (err.field, err.message) == (as_task(job.field), as_task(job.message))
    assert (err.kind, err.title) == (job.kind, job.title)


def test_task_targets_obey_the_tenants_topics_and_commands() -> None:
    ok = dag_job(task("a", target={"topic": "shared.x"}),
                 task("b", "a", target={"command": "reports.nightly",
                                        "args": {"day": "2026-12-01"}}))
    assert build(ok)["target"][0] == "kron.DagTarget"
    err = invalid(ok, tenant="globex")
    assert err.field == "dag.tasks[0].target.topic" and "'globex.<anything>'" in err.message
    err = invalid(dag_job(task("b", target={"command": "reports.nightly",
                                            "args": {"day": "2026-12-01"}})), tenant="globex")
    assert (err.field, err.message) == (
        "dag.tasks[0].target.command",
        "dag.tasks[0].target.command 'reports.nightly' is not granted to tenant 'globex'")
    err = invalid(dag_job(task("c", target={"command": "cleanup"})), commands=None)
    assert err.field == "dag.tasks[0].target.command"
    assert err.message.startswith("command targets are disabled on this kron")


def test_a_bad_text_in_a_task_is_named() -> None:
    err = invalid(dag_job(task("a", target={"url": URL, "headers": {"X-A": "\ud800"}})))
    assert err.field == "dag.tasks[0].target.headers.X-A"
    err = invalid(dag_job(task("a", target={"url": URL}), task("b", "a\ud800")))
    assert err.field == "dag.tasks[1].depends_on[0]"


# --- merge_patch --------------------------------------------------------------------------------


def patch(spec: dict[str, Any], raw: dict[str, Any], **kw: Any) -> dict[str, Any]:
    kw = {"now_ms": NOW, "allow_private": False, "tenant": "acme", "commands": COMMANDS,
          "topic_grants": GRANTS} | kw
    return merge_patch(spec, parse_patch(raw), **kw)


def patch_error(spec: dict[str, Any], raw: dict[str, Any]) -> InvalidField:
    with pytest.raises(InvalidField) as info:
        patch(spec, raw)
    return info.value


def test_a_patch_keeps_the_dag_and_replaces_it_whole() -> None:
    spec = build(SETTLEMENT)
    renamed = patch(spec, {"name": "settle", "retry": {"max_attempts": 9}})
    assert renamed["target"] == spec["target"] and renamed["name"] == "settle"
    assert patch(spec, {}) == spec
    new = patch(spec, {"dag": {"tasks": [task("only")]}})
    assert [t["id"] for t in new["target"][1]["tasks"]] == ["only"]
    assert new["name"] == "settlement"
    err = patch_error(spec, {"dag": {"tasks": [task("a", "b"), task("b", "a")]}})
    assert (err.field, err.message) == ("dag.tasks[0].depends_on",
                                        "dependency cycle: a -> b -> a")
    err = patch_error(spec, {"dag": {"tasks": [task("a", target={"url": "http://10.0.0.1/"})]}})
    assert err.field == "dag.tasks[0].target.url"
    assert patch_error(spec, {"dag": {"tasks": []}}).field == "dag.tasks"


def test_a_patch_switches_a_job_between_target_and_dag() -> None:
    plain = build({"schedule": "0 2 * * *", "target": {"url": URL}})
    made_dag = patch(plain, {"target": None, "dag": {"tasks": [task("a")]}})
    assert made_dag["target"] == build(dag_job(task("a"), name=plain["name"]))["target"]
    err = patch_error(plain, {"dag": {"tasks": [task("a")]}})
    assert (err.field, err.message) == (
        "dag", 'this job has a target; to make it a DAG job, give "target": null with the dag')
    back = patch(made_dag, {"dag": None, "target": {"url": f"{URL}/again"}})
    assert back["target"][0] == "kron.HttpTarget"
    assert back["target"][1]["url"] == f"{URL}/again"
    err = patch_error(made_dag, {"target": {"url": URL}})
    assert (err.field, err.message) == (
        "target", 'this job is a DAG job; to give it a target instead, give "dag": null with '
                  'the target')
    assert patch_error(made_dag, {"dag": None}).field == "target"
    assert patch_error(plain, {"target": None}).field == "target"
    # a DAG job's target null is no change
    assert patch(made_dag, {"target": None}) == made_dag


def test_a_patch_names_a_bad_task_field() -> None:
    with pytest.raises(InvalidField) as info:
        parse_patch({"dag": {"tasks": [task("a") | {"dependson": []}]}})
    assert info.value.field == "dag.tasks[0].dependson"


# --- over HTTP ------------------------------------------------------------------------------------


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    class Publisher:
        async def publish(self, name: str, record: dict[str, Any], *, key: str) -> None:
            pass

        def close(self) -> None:
            pass

    class Probe:
        def check(self, timeout_s: float = 2.0) -> dict[str, object]:
            return {"ok": True, "brokers": 1, "commands_topic": True}

    monkeypatch.setattr(service, "READ_YOUR_WRITES_S", 0.01)
    settings = Settings(bootstrap_servers="127.0.0.1:1", data_dir=tmp_path, api_create_batch=1,
                        api_keys="acme=key-acme")
    views = Views(tmp_path / "views")
    parts = Components(settings=settings, views=views, projector=Projector(settings, views),
                       publisher=Publisher(), probe=Probe())  # type: ignore[arg-type]
    yield TestClient(create_app(settings, components=parts), headers={"X-API-Key": "key-acme"})
    views.close()


def test_the_api_creates_a_dag_job_and_refuses_a_bad_one(client: TestClient) -> None:
    body = {"run_at": (datetime.now(UTC) + timedelta(hours=1)).isoformat(),
            "dag": {"tasks": [task("a"), task("b", "a")]}}
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    job = responses.CreatedJob.model_validate(r.json())
    assert job.name == "dag:a" and job.definition.target is None
    assert job.definition.dag is not None
    assert [t.id for t in job.definition.dag.tasks] == ["a", "b"]
    got = client.get(f"/v1/jobs/{job.job_id}")
    assert got.status_code == 200
    assert got.json()["definition"] == r.json()["definition"]
    for change, status, field in [
            ({"name": "renamed"}, 200, None),
            ({"dag": {"tasks": [task("x", "x")]}}, 422, "dag.tasks[0].depends_on"),
            ({"target": {"url": URL}}, 422, "target"),
            ({"dag": None, "target": {"url": URL}}, 200, None)]:
        r = client.patch(f"/v1/jobs/{job.job_id}", json=change)
        assert r.status_code == status, r.text
        assert r.json().get("field") == field
    cases = [
        (body | {"dag": {"tasks": [task("a", target={"url": "http://127.0.0.1/"})]}},
         "dag.tasks[0].target.url"),
        (body | {"dag": {"tasks": [task("a", "b"), task("b", "a")]}}, "dag.tasks[0].depends_on"),
        (body | {"dag": {"tasks": [task("a") | {"dependson": []}]}}, "dag.tasks[0].dependson"),
        (body | {"target": {"url": URL}}, "dag"),
        ({"run_at": body["run_at"]}, "target"),
    ]
    for bad, field in cases:
        r = client.post("/v1/jobs", json=bad)
        assert r.status_code == 422, r.text
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["field"] == field, r.json()


def test_the_operators_dag_limits_lower_the_workers() -> None:
    chain = [task("t0")] + [task(f"t{i}", f"t{i - 1}") for i in range(1, 5)]
    assert build(dag_job(*chain), dag_max_tasks=5)["target"][0] == "kron.DagTarget"
    err = invalid(dag_job(*chain), dag_max_tasks=4)
    assert (err.field, err.message) == ("dag.tasks", "a DAG has at most 4 tasks; got 5")
    err = invalid(dag_job(*chain), dag_max_edges=3)
    assert (err.field, err.message) == ("dag.tasks", "a DAG has at most 3 dependencies; got 4")


def test_the_dag_limit_settings_can_only_lower_the_workers() -> None:
    with pytest.raises(ValueError, match="dag_max_tasks"):
        Settings(dag_max_tasks=501)
    with pytest.raises(ValueError, match="dag_max_edges"):
        Settings(dag_max_edges=5001)
