"""DAG runs on the query side: the projection, /v1/jobs/{id}/runs, /v1/runs/{id}, the run
commands (:cancel, :retry) and `kron jobs runs`.

Hand-built records, encoded and decoded with schemas.codec as the projector reads them:
a diamond (a -> b, c -> d, then an all_done cleanup) whose b fails after two attempts, so d
is upstream_failed and the run failed; a second run of the job still running; a plain job's
run. The spec lists the tasks out of dependency order (a, b, cleanup, c, d) on purpose."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from api import models
from api.projection import Projector, Views
from api.routes import responses, service
from api.routes.runs import dependency_order
from api.server import Components, create_app
from kron import jobs_cli
from kron.settings import Settings
from schemas import codec, names
from schemas.envelope import make_envelope
from streams.domain.ids import exec_id, task_exec_id
from tests.golden.make_golden import SAMPLES
from tests.unit.test_api_routes import Probe, conforms, problem

TENANT = "acme"
JOB, PLAIN = "j_dag", "j_plain"
SLOT = 1_700_000_000_000
SLOT2 = SLOT + 3_600_000
RUN, RUN2 = exec_id(JOB, SLOT), exec_id(JOB, SLOT2)
PLAIN_RUN = exec_id(PLAIN, SLOT)
TASKS = ("a", "b", "cleanup", "c", "d")  # the spec's order
IN_ORDER = ["a", "b", "c", "d", "cleanup"]  # dependency order
UPSTREAM = "trigger rule all_success: a parent failed"


def task_exec(task_id: str, run_id: str = RUN) -> str:
    return task_exec_id(run_id, task_id)


# --- records --------------------------------------------------------------------------------


def http(url: str) -> tuple[str, dict[str, Any]]:
    return ("kron.HttpTarget", {"method": "POST", "url": url, "headers": {}, "body": None,
                                "timeout_s": 5.0})


def dag_task(task_id: str, *deps: str, rule: str = "all_success") -> dict[str, Any]:
    return {"id": task_id, "target": http(f"http://t.test/{task_id}"), "depends_on": list(deps),
            "trigger_rule": rule, "retry": None, "timeout_s": None}


DAG = ("kron.DagTarget", {"tasks": [
    dag_task("a"), dag_task("b", "a"), dag_task("cleanup", "d", rule="all_done"),
    dag_task("c", "a"), dag_task("d", "b", "c")]})


def job_state(job_id: str, event_type: str, *, dag: bool, applied: list[str],
              running: list[str]) -> dict[str, Any]:
    base = SAMPLES[(names.JOB_STATE, 3)][0]
    spec = {**base["spec"], "name": job_id, "overlap": "allow"}
    spec["target"] = DAG if dag else http("http://t.test/plain")
    return {**base, "envelope": envelope(event_type, f"{job_id}-{len(applied)}"),
            "job_id": job_id, "status": "active", "spec": spec, "idempotency_key": None,
            "applied_command_ids": applied, "running": running, "queued_slot_ms": None}


def envelope(event_type: str, event_id: str) -> dict[str, Any]:
    return dict(make_envelope(event_id=event_id, event_type=event_type, occurred_at_ms=SLOT,
                              tenant=TENANT, producer="worker-0"))


def attempt(n: int, start: int, end: int | None = None, *, outcome: str | None = None,
            status: int | None = None, error: str | None = None) -> dict[str, Any]:
    return {"attempt": n, "fencing_token": 100 + n, "worker": "worker-0",
            "started_at_ms": SLOT + start, "finished_at_ms": None if end is None else SLOT + end,
            "outcome": outcome, "status_code": status, "error": error}


def execution(ex_id: str, event_type: str, state: str, *, job_id: str = JOB, slot: int = SLOT,
              attempts: tuple[dict[str, Any], ...] = (), run_id: str | None = None,
              task_id: str | None = None, dag: list[dict[str, Any]] | None = None,
              last_error: str | None = None, reason: str | None = None,
              at: int = 0) -> dict[str, Any]:
    last = attempts[-1] if attempts else None
    return {
        "envelope": envelope(event_type, f"{ex_id}-{event_type}-{at}"), "exec_id": ex_id,
        "job_id": job_id, "scheduled_for_ms": slot, "owner_epoch": 1, "state": state,
        "trigger": "schedule", "attempt": len(attempts),
        "fencing_token": last["fencing_token"] if last else 0, "due_at_ms": slot,
        "worker": "worker-0", "lease_until_ms": None, "retry_at_ms": None, "dst_outcome": None,
        "reason": reason, "last_error": last_error,
        "status_code": last["status_code"] if last else None, "attempts": list(attempts),
        "created_at_ms": slot, "updated_at_ms": slot + at, "run_id": run_id,
        "task_id": task_id, "dag": None if dag is None else {"tasks": dag},
    }


def progress(*states: str, **reasons: str) -> list[dict[str, Any]]:
    """The run's progress in the spec's order (TASKS), one state each."""
    return [{"task_id": t, "state": s, "pending": 0, "succeeded": 0, "failed": 0,
             "skipped": 0, "reason": reasons.get(t)} for t, s in zip(TASKS, states, strict=True)]


def task(task_id: str, event_type: str, state: str, *attempts: dict[str, Any],
         at: int, run_id: str = RUN, slot: int = SLOT, **kw: Any) -> dict[str, Any]:
    return execution(task_exec(task_id, run_id), event_type, state, attempts=attempts,
                     run_id=run_id, task_id=task_id, at=at, slot=slot, **kw)


def run(event_type: str, state: str, states: list[dict[str, Any]], *, at: int,
        run_id: str = RUN, slot: int = SLOT, **kw: Any) -> dict[str, Any]:
    return execution(run_id, event_type, state, dag=states, at=at, slot=slot, **kw)


B1 = attempt(1, 2100, 2200, outcome="transient", status=503, error="HTTP 503")
B2 = attempt(2, 4000, 4100, outcome="permanent", status=500, error="HTTP 500")
OK: dict[str, Any] = {"outcome": "succeeded", "status": 200}

EXECUTIONS: list[dict[str, Any]] = [
    run("dag_run.started", "running", progress("running", "pending", "pending", "pending",
                                               "pending"), at=1000),
    task("a", "execution.started", "running", attempt(1, 1500), at=1500),
    # The report's own start time replaces the dispatch's: the run's first start moves too.
    task("a", "execution.succeeded", "succeeded", attempt(1, 1600, 2000, **OK), at=2000),
    run("dag_run.progressed", "running", progress("succeeded", "running", "pending", "running",
                                                  "pending"), at=2000),
    task("b", "execution.started", "running", attempt(1, 2100), at=2100),
    task("c", "execution.started", "running", attempt(1, 2100), at=2100),
    task("b", "execution.retry_scheduled", "retry_pending", B1, at=2200, last_error="HTTP 503"),
    task("c", "execution.succeeded", "succeeded", attempt(1, 2100, 2300, **OK), at=2300),
    task("b", "execution.started", "running", B1, attempt(2, 4000), at=4000),
    task("b", "execution.failed", "failed", B1, B2, at=4100, last_error="HTTP 500"),
    run("dag_run.progressed", "running", progress(
        "succeeded", "failed", "running", "succeeded", "upstream_failed", d=UPSTREAM),
        at=4100, last_error="task b: HTTP 500"),
    task("cleanup", "execution.started", "running", attempt(1, 4200), at=4200),
    task("cleanup", "execution.succeeded", "succeeded", attempt(1, 4200, 4300, **OK), at=4300),
    run("dag_run.failed", "failed", progress(
        "succeeded", "failed", "succeeded", "succeeded", "upstream_failed", d=UPSTREAM),
        at=4400, last_error="task b: HTTP 500"),
    # The next slot's run, still running its first task.
    run("dag_run.started", "running", progress("running", "pending", "pending", "pending",
                                               "pending"), at=500, run_id=RUN2, slot=SLOT2),
    task("a", "execution.started", "running", attempt(1, 3_600_700), at=700, run_id=RUN2,
         slot=SLOT2),
    # A plain job's run.
    execution(PLAIN_RUN, "execution.succeeded", "succeeded", job_id=PLAIN,
              attempts=(attempt(1, 50, 80, **OK),), at=80),
]
JOBS = [job_state(JOB, "job.created", dag=True, applied=["c1"], running=[]),
        job_state(PLAIN, "job.created", dag=False, applied=["c2"], running=[]),
        job_state(JOB, "job.slot_fired", dag=True, applied=["c1"], running=[RUN2])]


# --- the projection, fed as the projector is ---------------------------------------------------


class Feed:
    """Records to a Projector as the consumer hands them over (encoded, one per offset)."""

    def __init__(self, settings: Settings, views: Views) -> None:
        self.projector = Projector(settings, views)
        self.jobs, self.executions = settings.topic("jobs"), settings.topic("executions")
        self.offsets = {self.jobs: 0, self.executions: 0}

    def job(self, rec: dict[str, Any]) -> None:
        self._apply(self.jobs, codec.encode(names.JOB_STATE, rec))

    def execution(self, rec: dict[str, Any]) -> None:
        self._apply(self.executions, codec.encode(names.EXECUTION_STATE, rec))

    def _apply(self, topic: str, value: bytes) -> None:
        self.projector.apply(topic, 0, self.offsets[topic], value)
        self.offsets[topic] += 1


def feed_live(feed: Feed) -> None:
    """The order a live projector might see: the job's later record among its runs'."""
    feed.job(JOBS[0])
    feed.job(JOBS[1])
    for i, rec in enumerate(EXECUTIONS):
        if i == 14:
            feed.job(JOBS[2])
        feed.execution(rec)


@pytest.fixture(autouse=True)
def dag_request_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """The job view's request form of a DAG spec is api.models' (its own change of issue
    38); where request_of does not know DAG specs yet, the view shows an HTTP stand-in. What
    these tests read of the job's DAG comes from its Avro state, not from that form."""
    real = models.request_of

    def request_of(spec: Any) -> dict[str, Any]:
        try:
            return real(spec)
        except (KeyError, TypeError):
            return real({**spec, "target": http("http://dag.test/")})

    monkeypatch.setattr(models, "request_of", request_of)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(bootstrap_servers="127.0.0.1:1", data_dir=tmp_path, api_create_batch=1,
                    api_keys="acme=key-acme,acme:read=key-read,globex=key-globex",
                    allow_private_targets=True, tenant_burst=1000)


@pytest.fixture
def views(tmp_path: Path, settings: Settings) -> Iterator[Views]:
    v = Views(tmp_path / "views")
    feed_live(Feed(settings, v))
    yield v
    v.close()


class Publisher:
    """The commands the API sends; `react`, if set, plays the worker and the projector."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any], str]] = []
        self.react: Callable[[str, dict[str, Any]], None] | None = None

    async def publish(self, name: str, record: dict[str, Any], *, key: str) -> None:
        codec.encode(name, record)  # what the real publisher writes: it must fit the schema
        self.sent.append((name, record, key))
        if self.react is not None:
            self.react(name, record)

    def close(self) -> None:
        pass


@pytest.fixture
def publisher() -> Publisher:
    return Publisher()


@pytest.fixture
def client(settings: Settings, views: Views, publisher: Publisher,
           monkeypatch: pytest.MonkeyPatch) -> TestClient:
    monkeypatch.setattr(service, "READ_YOUR_WRITES_S", 0.01)  # no worker applies anything
    parts = Components(settings=settings, views=views, projector=Projector(settings, views),
                       publisher=publisher, probe=Probe())  # type: ignore[arg-type]
    return TestClient(create_app(settings, components=parts), headers={"X-API-Key": "key-acme"})


# --- the projection ------------------------------------------------------------------------


def test_task_instances_are_kept_under_their_run_not_in_the_run_history(views: Views) -> None:
    history = [k.decode().rsplit("/", 1)[-1] for k in views.dump() if k.startswith(b"r/")]
    assert sorted(history) == sorted([RUN, RUN2, PLAIN_RUN])
    instances = views.task_instances(RUN)
    assert sorted(instances) == ["a", "b", "c", "cleanup"]  # d never ran
    assert {t: e["state"] for t, e in instances.items()} == {
        "a": "succeeded", "b": "failed", "c": "succeeded", "cleanup": "succeeded"}
    assert instances["b"] == {"exec_id": task_exec("b"), "state": "failed",
                              "started_at_ms": SLOT + 2100}
    assert list(views.task_instances(RUN2)) == ["a"]
    # The job's last run is a run, never a task instance.
    job = views.job(JOB)
    assert job is not None and job["last_run"]["exec_id"] == RUN2
    # A DAG run started when its first task attempt did (a's start as its report gave it).
    dag_run = views.execution(RUN)
    assert dag_run is not None
    assert (dag_run["started_at_ms"], dag_run["lateness_ms"]) == (SLOT + 1600, 1600)
    assert dag_run["finished_at_ms"] == SLOT + 4400


def test_stats_count_runs_and_task_instances_apart(views: Views, client: TestClient) -> None:
    stats = conforms(responses.Stats, client.get("/v1/stats"), 200)["runs_by_state"]
    assert {s: n for s, n in stats.items() if n} == {"running": 1, "failed": 1,
                                                     "succeeded": 1}
    tasks = {s: views.get(f"ct/{TENANT}/{s}".encode()) for s in ("running", "succeeded",
                                                                  "failed", "retry_pending")}
    assert tasks == {"running": 1, "succeeded": 3, "failed": 1, "retry_pending": 0}


def test_rebuilt_views_equal_live_ones(tmp_path: Path, settings: Settings,
                                       views: Views) -> None:
    """The replay tool's rebuild folds the topics again from offset 0, each topic in its
    order but the two topics interleaved as they come: here every job record first, and a
    restart (the store closed and opened again) halfway."""
    path = tmp_path / "rebuilt"
    rebuilt = Views(path)
    feed = Feed(settings, rebuilt)
    for rec in JOBS:
        feed.job(rec)
    for rec in EXECUTIONS[:7]:
        feed.execution(rec)
    rebuilt.close()
    rebuilt = Views(path)
    feed.projector = Projector(settings, rebuilt)
    for rec in EXECUTIONS[7:]:
        feed.execution(rec)
    try:
        assert rebuilt.dump() == views.dump()
        assert rebuilt.offsets() == views.offsets()
    finally:
        rebuilt.close()


def test_a_task_instance_ahead_of_its_run_still_starts_the_run(tmp_path: Path,
                                                               settings: Settings) -> None:
    """The engine writes a run before its task instances; a projection that gets them the
    other way round (a run record lost and written again) still finds the first start."""
    views = Views(tmp_path / "v")
    try:
        feed = Feed(settings, views)
        feed.job(JOBS[0])
        feed.execution(EXECUTIONS[1])  # a started, its run not seen yet
        feed.execution(EXECUTIONS[0])
        dag_run = views.execution(RUN)
        assert dag_run is not None and dag_run["lateness_ms"] == 1500
    finally:
        views.close()


def test_dependency_order_puts_each_task_after_its_parents() -> None:
    entries = [{"task_id": t} for t in TASKS]
    spec = {t["id"]: t for t in DAG[1]["tasks"]}
    assert [e["task_id"] for e in dependency_order(entries, spec)] == IN_ORDER
    # Without the DAG (a job changed since), the run's own order; unknown parents ignored.
    assert [e["task_id"] for e in dependency_order(entries, {})] == list(TASKS)
    odd = {"a": {"depends_on": ["gone"]}, "b": {"depends_on": ["c"]}}
    assert [e["task_id"] for e in dependency_order(entries, odd)] == [
        "a", "cleanup", "c", "b", "d"]


# --- the routes: reads -----------------------------------------------------------------------


def test_runs_list_a_dag_run_with_its_task_counts_and_no_task_instances(
        client: TestClient) -> None:
    listed = conforms(responses.RunList, client.get(f"/v1/jobs/{JOB}/runs"), 200)["runs"]
    assert [r["run_id"] for r in listed] == [RUN2, RUN]  # newest slot first
    latest, failed = listed
    assert failed["state"] == "failed" and failed["error"] == "task b: HTTP 500"
    assert failed["tasks"] == {"pending": 0, "running": 0, "succeeded": 3, "failed": 1,
                               "skipped": 0, "upstream_failed": 1, "cancelled": 0}
    assert failed["lateness_ms"] == 1600
    assert failed["started_at"] == "2023-11-14T22:13:21.600Z"
    assert failed["finished_at"] == "2023-11-14T22:13:24.400Z"
    assert latest["tasks"]["running"] == 1 and latest["tasks"]["pending"] == 4
    assert [r["run_id"] for r in conforms(responses.RunList, client.get(
        f"/v1/jobs/{JOB}/runs", params={"status": "failed"}), 200)["runs"]] == [RUN]
    # Another job's runs are as they always were: no `tasks`.
    [plain] = conforms(responses.RunList, client.get(f"/v1/jobs/{PLAIN}/runs"), 200)["runs"]
    assert "tasks" not in plain and plain["run_id"] == PLAIN_RUN and plain["lateness_ms"] == 50


def test_a_dag_run_shows_its_tasks_in_dependency_order_with_their_attempts(
        client: TestClient) -> None:
    body = conforms(responses.RunDetail, client.get(f"/v1/runs/{RUN}"), 200)
    assert body["run_id"] == RUN and body["state"] == "failed" and body["attempts"] == []
    assert body["lateness_ms"] == 1600  # a's first attempt start - scheduled_for
    assert "exec_id" not in body and "task_id" not in body
    tasks = body["tasks"]
    assert [t["task_id"] for t in tasks] == IN_ORDER
    by_id = {t["task_id"]: t for t in tasks}
    assert {t: v["state"] for t, v in by_id.items()} == {
        "a": "succeeded", "b": "failed", "c": "succeeded", "d": "upstream_failed",
        "cleanup": "succeeded"}
    assert by_id["d"] == {"task_id": "d", "state": "upstream_failed", "depends_on": ["b", "c"],
                          "trigger_rule": "all_success", "reason": UPSTREAM, "attempts": []}
    assert by_id["cleanup"]["trigger_rule"] == "all_done"
    assert by_id["cleanup"]["depends_on"] == ["d"]
    assert by_id["b"]["attempts"] == [
        {"attempt": 1, "started_at": "2023-11-14T22:13:22.100Z",
         "finished_at": "2023-11-14T22:13:22.200Z", "outcome": "transient",
         "status_code": 503, "error": "HTTP 503", "output": None},
        {"attempt": 2, "started_at": "2023-11-14T22:13:24.000Z",
         "finished_at": "2023-11-14T22:13:24.100Z", "outcome": "permanent",
         "status_code": 500, "error": "HTTP 500", "output": None}]
    assert [len(by_id[t]["attempts"]) for t in IN_ORDER] == [1, 2, 1, 0, 1]
    running = conforms(responses.RunDetail, client.get(f"/v1/runs/{RUN2}"), 200)
    assert [(t["task_id"], t["state"], len(t["attempts"])) for t in running["tasks"]] == [
        ("a", "running", 1), ("b", "pending", 0), ("c", "pending", 0), ("d", "pending", 0),
        ("cleanup", "pending", 0)]
    assert running["tasks"][0]["attempts"][0]["finished_at"] is None


def test_a_task_instance_answers_as_its_execution_with_its_run_and_task(
        client: TestClient) -> None:
    body = conforms(responses.RunDetail, client.get(f"/v1/runs/{task_exec('b')}"), 200)
    assert (body["exec_id"], body["run_id"], body["task_id"]) == (task_exec("b"), RUN, "b")
    assert body["state"] == "failed" and body["attempt"] == 2 and body["status_code"] == 500
    assert [a["outcome"] for a in body["attempts"]] == ["transient", "permanent"]
    assert "tasks" not in body
    plain = conforms(responses.RunDetail, client.get(f"/v1/runs/{PLAIN_RUN}"), 200)
    assert not {"tasks", "exec_id", "task_id"} & plain.keys()


def test_another_tenants_runs_and_task_instances_are_not_found(client: TestClient) -> None:
    other = {"X-API-Key": "key-globex"}
    for run_id in (RUN, task_exec("a")):
        problem(client.get(f"/v1/runs/{run_id}", headers=other), 404, "run-not-found", "run_id")
    problem(client.get("/v1/runs/nope"), 404, "run-not-found", "run_id")


# --- the routes: :cancel and :retry ----------------------------------------------------------


def test_cancel_and_retry_send_their_commands_and_answer_202(client: TestClient,
                                                             publisher: Publisher) -> None:
    r = client.post(f"/v1/runs/{RUN2}:cancel")
    body = conforms(responses.RunCommandAccepted, r, 202)
    name, record, key = publisher.sent[-1]
    assert (name, key) == (names.CANCEL_RUN, JOB)
    assert body == {"command_id": record["command_id"], "action": "cancel", "run_id": RUN2,
                    "job_id": JOB, "applied": False, "state": "running"}
    assert record["run_id"] == RUN2 and record["reason"] is None
    assert record["envelope"]["event_type"] == "run.cancel_requested"
    assert record["envelope"]["tenant"] == TENANT
    assert record["envelope"]["event_id"] == record["command_id"]
    # With a reason (the body is optional; when sent it is JSON).
    conforms(responses.RunCommandAccepted,
             client.post(f"/v1/runs/{RUN2}:cancel", json={"reason": "wrong data"}), 202)
    assert publisher.sent[-1][1]["reason"] == "wrong data"
    problem(client.post(f"/v1/runs/{RUN2}:cancel", json={"why": "x"}), 422, "invalid-input",
            "why")
    problem(client.post(f"/v1/runs/{RUN2}:cancel", content=b"x",
                        headers={"Content-Type": "text/plain"}), 415, "unsupported-media-type")
    r = client.post(f"/v1/runs/{RUN}:retry")
    body = conforms(responses.RunCommandAccepted, r, 202)
    name, record, key = publisher.sent[-1]
    assert (name, key, body["action"], body["state"]) == (names.RETRY_RUN, JOB, "retry",
                                                          "failed")
    assert record["envelope"]["event_type"] == "run.retry_requested"
    assert record["run_id"] == RUN and "reason" not in record
    assert body["command_id"] == record["command_id"]
    assert len(publisher.sent) == 3


def test_run_commands_a_run_cannot_take_are_409(client: TestClient,
                                                publisher: Publisher) -> None:
    p = problem(client.post(f"/v1/runs/{RUN}:cancel"), 409, "run-not-running", "run_id")
    assert p["state"] == "failed"
    problem(client.post(f"/v1/runs/{RUN2}:retry"), 409, "run-not-retryable", "run_id")
    # A plain run takes both commands too (test_api_run_controls.py); this one succeeded.
    p = problem(client.post(f"/v1/runs/{PLAIN_RUN}:cancel"), 409, "run-not-running", "run_id")
    assert p["state"] == "succeeded"
    problem(client.post(f"/v1/runs/{PLAIN_RUN}:retry"), 409, "run-not-retryable", "run_id")
    for action in ("cancel", "retry"):
        p = problem(client.post(f"/v1/runs/{task_exec('b')}:{action}"), 409, "not-a-run",
                    "run_id")
        assert RUN in p["detail"]
    assert publisher.sent == []


def test_run_commands_on_unknown_or_other_runs_are_404_and_read_keys_403(
        client: TestClient, publisher: Publisher) -> None:
    for action in ("cancel", "retry"):
        problem(client.post(f"/v1/runs/nope:{action}"), 404, "run-not-found", "run_id")
        problem(client.post(f"/v1/runs/{RUN2}:{action}", headers={"X-API-Key": "key-globex"}),
                404, "run-not-found", "run_id")
        problem(client.post(f"/v1/runs/{RUN2}:{action}", headers={"X-API-Key": "key-read"}),
                403, "read-only-key")
        problem(client.post(f"/v1/runs/{RUN2}:{action}", headers={"X-API-Key": ""}),
                401, "unauthorized")
    # The run is looked up before a body is read, as a job is for the job's routes.
    problem(client.post("/v1/runs/nope:cancel", content=b"{",
                        headers={"Content-Type": "application/json"}), 404, "run-not-found",
            "run_id")
    problem(client.post(f"/v1/runs/{RUN2}:explode"), 405, "method-not-allowed")
    assert publisher.sent == []


def test_a_command_the_worker_applies_is_read_back(client: TestClient, settings: Settings,
                                                   views: Views, publisher: Publisher,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "READ_YOUR_WRITES_S", 5.0)
    feed = Feed(settings, views)
    feed.offsets = {topic: 100 for topic in feed.offsets}

    def worker(name: str, cmd: dict[str, Any]) -> None:  # CancelRun, as the engine does it
        feed.execution(task("a", "execution.cancelled", "cancelled",
                            attempt(1, 3_600_700, 3_600_900, outcome="cancelled"),
                            at=900, run_id=RUN2, slot=SLOT2, reason=cmd["reason"]))
        feed.execution(run("dag_run.cancelled", "cancelled", progress(
            "cancelled", "skipped", "skipped", "skipped", "skipped",
            **dict.fromkeys(TASKS[1:], cmd["reason"])), at=900, run_id=RUN2, slot=SLOT2,
            reason=cmd["reason"]))
        feed.job(job_state(JOB, "job.run_cancelled", dag=True,
                           applied=["c1", cmd["command_id"]], running=[]))

    publisher.react = worker
    body = conforms(responses.RunCommandAccepted, client.post(
        f"/v1/runs/{RUN2}:cancel", json={"reason": "run cancelled"}), 202)
    assert (body["applied"], body["state"]) == (True, "cancelled")
    after = client.get(f"/v1/runs/{RUN2}").json()
    assert [(t["task_id"], t["state"], t["reason"]) for t in after["tasks"]] == [
        ("a", "cancelled", "run cancelled"), ("b", "skipped", "run cancelled"),
        ("c", "skipped", "run cancelled"), ("d", "skipped", "run cancelled"),
        ("cleanup", "skipped", "run cancelled")]
    problem(client.post(f"/v1/runs/{RUN2}:cancel"), 409, "run-not-running", "run_id")


def test_the_openapi_document_describes_tasks_and_run_commands(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    for action in ("cancel", "retry"):
        op = doc["paths"][f"/v1/runs/{{run_id}}:{action}"]["post"]
        ref = op["responses"]["202"]["content"]["application/json"]["schema"]["$ref"]
        assert ref.endswith("/RunCommandAccepted")
    cancel = doc["paths"]["/v1/runs/{run_id}:cancel"]["post"]
    assert "CancelRunRequest" in json.dumps(cancel["requestBody"])
    assert "requestBody" not in doc["paths"]["/v1/runs/{run_id}:retry"]["post"]
    detail = schemas["RunDetail"]["properties"]
    assert {"tasks", "exec_id", "task_id", "attempts"} <= detail.keys()
    assert set(schemas["Task"]["properties"]) == {"task_id", "state", "depends_on",
                                                  "trigger_rule", "reason", "attempts"}
    assert set(schemas["TaskAttempt"]["properties"]) == {
        "attempt", "started_at", "finished_at", "outcome", "status_code", "error", "output"}
    assert "upstream_failed" in schemas["TaskCounts"]["properties"]
    assert "tasks" in schemas["Run"]["properties"]


# --- the CLI ---------------------------------------------------------------------------------


@pytest.fixture
def cli(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """`kron jobs ...` against the in-process API."""
    def request(method: str, url: str, **kw: Any) -> Any:
        kw.pop("timeout", None)
        return client.request(method, url.removeprefix(jobs_cli.DEFAULT_URL), **kw)

    monkeypatch.setattr(httpx, "request", request)
    runner = CliRunner()

    def invoke(*args: str) -> Any:
        result = runner.invoke(jobs_cli.jobs_app, [*args, "--key", "key-acme"],
                               env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        return result

    return invoke


def test_cli_runs_shows_a_dag_runs_tasks_in_dependency_order(cli: Callable[..., Any]) -> None:
    out = cli("runs", JOB).output
    lines = out.splitlines()
    assert "3 succeeded, 1 failed, 1 upstream_failed" in out
    assert f"run {RUN} (failed)" in out and f"run {RUN2} (running)" in out
    failed = lines[next(i for i, line in enumerate(lines) if f"run {RUN} " in line):]
    rows = [line.split("│")[1:-1] for line in failed if line.startswith("│")][:5]
    cells = [[c.strip() for c in row] for row in rows]
    assert [c[0] for c in cells] == IN_ORDER
    assert cells[1] == ["b", "failed", "2", "500", "HTTP 500"]
    assert cells[3] == ["d", "upstream_failed", "0", "", UPSTREAM]
    assert cells[4] == ["cleanup", "succeeded", "1", "200", ""]
    data = json.loads(cli("runs", JOB, "--json").output)
    assert [r["run_id"] for r in data["runs"]] == [RUN2, RUN]
    assert data["runs"][1]["tasks"]["upstream_failed"] == 1
    # A plain job's runs: the table as before, no task tables.
    plain = cli("runs", PLAIN).output
    assert PLAIN_RUN in plain and "tasks" not in plain and "run " not in plain


def test_cli_run_get_cancel_and_retry(cli: Callable[..., Any], publisher: Publisher) -> None:
    shown = cli("run-get", RUN).output
    assert "upstream_failed" in shown and "cleanup" in shown
    assert json.loads(cli("run-get", task_exec("b"), "--json").output)["task_id"] == "b"
    out = json.loads(cli("run-cancel", RUN2, "--reason", "bad input", "--json").output)
    assert out["action"] == "cancel" and publisher.sent[-1][1]["reason"] == "bad input"
    assert "retry" in cli("run-retry", RUN).output
    assert [name for name, _, _ in publisher.sent] == [names.CANCEL_RUN, names.RETRY_RUN]
    refused = CliRunner().invoke(jobs_cli.jobs_app, ["run-retry", RUN2, "--key", "key-acme"])
    assert refused.exit_code == 1 and "409" in refused.output
