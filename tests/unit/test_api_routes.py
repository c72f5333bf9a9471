"""The /v1 routes in process (no broker: commands go to a list): the OpenAPI document
describes every answer and write body, answers match their response models, errors come in
kron's order (who calls, the job, the body, then its fields) as problems naming the field,
and a create's body is read and parsed once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import starlette.requests
from fastapi.testclient import TestClient
from pydantic import BaseModel

from api.projection import Projector, Views
from api.routes import responses, service
from api.server import Components, create_app
from kron.settings import Settings

PROBLEM = "application/problem+json"
WRITE_BODIES = {("post", "/v1/jobs"): "JobRequest", ("patch", "/v1/jobs/{job_id}"): "JobPatch",
                ("post", "/v1/jobs/{job_id}:{action}"): "BackfillRequest",
                ("post", "/v1/runs/{run_id}:cancel"): "CancelRunRequest",
                ("post", "/v1/dead-letters/{dl_id}:redrive"): "JobRequest"}


class Publisher:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any], str]] = []

    async def publish(self, name: str, record: dict[str, Any], *, key: str,
                      topic: str | None = None) -> None:
        self.sent.append((name, record, key))

    def close(self) -> None:
        pass


class Probe:
    def check(self, timeout_s: float = 2.0) -> dict[str, object]:
        return {"ok": True, "brokers": 1, "commands_topic": True}


@pytest.fixture
def publisher() -> Publisher:
    return Publisher()


@pytest.fixture
def client(tmp_path: Path, publisher: Publisher,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setattr(service, "READ_YOUR_WRITES_S", 0.01)  # no worker applies anything
    settings = Settings(bootstrap_servers="127.0.0.1:1", data_dir=tmp_path, api_create_batch=1,
                        api_keys="acme=key-acme,acme:read=key-read,globex=key-globex",
                        allow_private_targets=True, tenant_burst=1000)
    views = Views(tmp_path / "views")
    parts = Components(settings=settings, views=views, projector=Projector(settings, views),
                       publisher=publisher, probe=Probe())  # type: ignore[arg-type]
    # Not `with`: the lifespan would start the projector, which needs a broker.
    yield TestClient(create_app(settings, components=parts), headers={"X-API-Key": "key-acme"})
    views.close()


RUN_AT = (datetime.now(UTC) + timedelta(hours=1)).isoformat()


def job_body(**overrides: Any) -> dict[str, Any]:
    return {"name": "n", "run_at": RUN_AT, "target": {"url": "http://x.test/"}} | overrides


def conforms(model: type[BaseModel], r: Any, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body: dict[str, Any] = r.json()
    model.model_validate(body)  # the response models forbid fields they lack
    return body


def problem(r: Any, status: int, kind: str, field: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == PROBLEM
    body: dict[str, Any] = r.json()
    assert body["type"] == f"https://kron.dev/problems/{kind}", body
    assert body.get("field") == field, body
    responses.Problem.model_validate(body)
    return body


def resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def test_the_openapi_document_describes_every_answer_and_write_body(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    operations = [(m, p, op) for p, ops in doc["paths"].items() for m, op in ops.items()]
    assert len(operations) == 17  # GET /v1/runs and the two dead-letter routes (issue 40)
    for method, path, op in operations:
        ok = {code: r for code, r in op["responses"].items() if code.startswith("2")}
        assert ok, (method, path)
        for answer in ok.values():
            schema = resolve(doc, answer["content"]["application/json"]["schema"])
            assert schema.get("properties"), (method, path, schema)
        if path.startswith("/v1/"):
            errors = op["responses"]["4XX"]["content"][PROBLEM]["schema"]
            assert resolve(doc, errors)["properties"]["field"]
            assert "422" not in op["responses"]  # FastAPI's own 422 shape is never sent
        body = op.get("requestBody")
        if (method, path) in WRITE_BODIES:
            schema = body["content"]["application/json"]["schema"]
            refs = [s.get("$ref", "") for s in schema.get("anyOf", [schema])]
            assert any(r.endswith("/" + WRITE_BODIES[(method, path)]) for r in refs), schema
        else:
            assert body is None, (method, path)
    assert set(resolve(doc, {"$ref": "#/components/schemas/JobRequest"})["properties"]) >= {
        "name", "schedule", "run_at", "target", "retry", "idempotency_key"}


def test_answers_match_their_response_models(client: TestClient,
                                             publisher: Publisher) -> None:
    r = client.post("/v1/jobs", json=job_body(idempotency_key="k1"))
    created = conforms(responses.CreatedJob, r, 201)
    job_id = created["job_id"]
    assert r.headers["location"] == f"/v1/jobs/{job_id}" and len(created["upcoming"]) == 1
    assert [name for name, _, _ in publisher.sent] == ["kron.commands.CreateJob"]
    assert conforms(responses.CreatedJob, client.post(
        "/v1/jobs", json=job_body(idempotency_key="k1")), 200)["job_id"] == job_id
    conforms(responses.Job, client.get(f"/v1/jobs/{job_id}"), 200)
    listed = conforms(responses.JobList, client.get("/v1/jobs"), 200)
    assert [j["job_id"] for j in listed["jobs"]] == [job_id]
    conforms(responses.RunList, client.get(f"/v1/jobs/{job_id}/runs"), 200)
    conforms(responses.Stats, client.get("/v1/stats"), 200)
    # Pause ignores a body; the worker never applies it here, so the job is as it was.
    paused = client.post(f"/v1/jobs/{job_id}:pause", json={"anything": [1]})
    conforms(responses.JobAfterAction, paused, 200)
    assert publisher.sent[-1][0] == "kron.commands.PauseJob"
    conforms(responses.Job, client.patch(f"/v1/jobs/{job_id}", json={"name": "m"}), 200)
    conforms(responses.Job, client.delete(f"/v1/jobs/{job_id}"), 200)
    conforms(responses.Health, client.get("/healthz"), 200)
    conforms(responses.Ready, client.get("/readyz"), 503)  # the projector never ran


def test_errors_come_in_order_caller_job_body_fields(client: TestClient,
                                                     publisher: Publisher) -> None:
    bad: dict[str, Any] = {"content": b"{not json",
                           "headers": {"Content-Type": "application/json"}}
    problem(client.post("/v1/jobs", content=b"{not json", headers={
        "Content-Type": "application/json", "X-API-Key": ""}), 401, "unauthorized")
    problem(client.post("/v1/jobs", json={"nmae": 1}, headers={"X-API-Key": "key-read"}), 403,
            "read-only-key")
    problem(client.post("/v1/jobs/j_1:explode", headers={"X-API-Key": ""}), 404, "not-found",
            "action")
    problem(client.patch("/v1/jobs/j_missing", **bad), 404, "job-not-found", "job_id")
    job_id = client.post("/v1/jobs", json=job_body()).json()["job_id"]
    problem(client.patch(f"/v1/jobs/{job_id}", content=b"{}",
                         headers={"Content-Type": "text/plain"}), 415, "unsupported-media-type")
    problem(client.post("/v1/jobs", **bad), 400, "malformed-json")
    problem(client.post("/v1/jobs", content=b"", headers={"Content-Type": "application/json"}),
            400, "malformed-json")
    deep = b'{"metadata": ' + b"[" * 40 + b"]" * 40 + b"}"
    problem(client.post("/v1/jobs", content=deep, headers={"Content-Type": "application/json"}),
            400, "json-too-deep")
    problem(client.post("/v1/jobs", json=job_body(name="x" * 70_000)), 413, "body-too-large")
    problem(client.post(f"/v1/jobs/{job_id}:backfill"), 415, "unsupported-media-type")
    assert len(publisher.sent) == 1  # only the create


@pytest.mark.parametrize(("method", "path", "body", "kind", "field", "detail"), [
    ("POST", "/v1/jobs", job_body(nmae="x"), "invalid-input", "nmae", "did you mean 'name'"),
    ("POST", "/v1/jobs", job_body(target={"url": 3}), "invalid-input", "target.url",
     "valid string"),
    ("POST", "/v1/jobs", job_body(target={"type": "http"}), "invalid-input", "target.url",
     "target.url is required"),
    ("POST", "/v1/jobs", job_body(jitter_s="NaN"), "invalid-input", "jitter_s", "number"),
    ("POST", "/v1/jobs", None, "invalid-input", "body", "valid dictionary"),
    ("POST", "/v1/jobs", [], "invalid-input", "body", "valid dictionary"),
    ("POST", "/v1/jobs", job_body(target={"url": "ftp://x.test/"}), "invalid-input", "target.url",
     "http:// or https://"),
    ("POST", "/v1/jobs", job_body(schedule={"cron": "61 * * * *"}, run_at=None), "invalid-input",
     "schedule.cron", ""),
    ("POST", "/v1/jobs", job_body(target={"url": "http://x.test/",
                                  "headers": {f"X-{i}": "v" for i in range(51)}}),
     "target-headers-too-many", "target.headers", "at most 50"),
    ("PATCH", "{job}", {"schedule": {"cron": "0 0 30 2 *"}}, "invalid-input", "schedule.cron", ""),
    ("PATCH", "{job}", {"target": {"headers": {"Host": "x"}}}, "invalid-input",
     "target.headers.Host", "managed by the HTTP client"),
    ("PATCH", "{job}", {"retry": {"max_attempts": "3"}}, "invalid-input", "retry.max_attempts", ""),
    ("POST", "{job}:backfill", {"from": "2020-01-02T00:00:00Z", "to": "2020-01-01T00:00:00Z"},
     "invalid-input", "to", "must not be before"),
    ("POST", "{job}:backfill", {"to": "2020-01-01T00:00:00Z"}, "invalid-input", "from", "required"),
    ("POST", "{job}:backfill", {"from": "2020-01-01T00:00:00", "to": "2020-01-01T00:00:00Z"},
     "invalid-input", "from", "timezone"),
    ("POST", "{job}:backfill", None, "invalid-input", None, "needs a body"),
])
def test_bad_bodies_are_422_problems_naming_the_field(
        client: TestClient, method: str, path: str, body: Any, kind: str,
        field: str | None, detail: str) -> None:
    if "{job}" in path:
        job_id = client.post("/v1/jobs", json=job_body(
            schedule={"cron": "0 3 * * *"}, run_at=None)).json()["job_id"]
        path = path.replace("{job}", f"/v1/jobs/{job_id}")
    if body is not None and "run_at" in body and body["run_at"] is None:
        del body["run_at"]
    r = client.request(method, path, content=json.dumps(body),
                       headers={"Content-Type": "application/json"})
    assert detail in problem(r, 422, kind, field)["detail"]


def test_a_create_reads_and_parses_its_body_once(client: TestClient,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """read_json streams and parses the body; FastAPI validates that value and must not
    read or parse the body again (starlette's own body()/json() would)."""
    def again(self: starlette.requests.Request) -> Any:
        raise AssertionError("the body was read a second time")

    monkeypatch.setattr(starlette.requests.Request, "body", again)
    monkeypatch.setattr(starlette.requests.Request, "json", again)
    conforms(responses.CreatedJob, client.post("/v1/jobs", json=job_body()), 201)
