"""The live API's OpenAPI document describes every answer (a 2xx schema with properties) and
the body of every write, and real answers, a finished run's included, match the response
models it documents (the routes return hand-built JSON, not validated on the way out)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from api.routes import responses
from tests.support.stack import wait_until

pytestmark = pytest.mark.integration

WRITE_BODIES = {("post", "/v1/jobs"): "JobRequest", ("patch", "/v1/jobs/{job_id}"): "JobPatch",
                ("post", "/v1/jobs/{job_id}:{action}"): "BackfillRequest"}


def resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def test_every_route_documents_its_answer_and_write_body(api_stack) -> None:
    doc = httpx.get(f"{api_stack.api.url}/openapi.json").json()
    operations = [(m, p, op) for p, ops in doc["paths"].items() for m, op in ops.items()]
    assert len(operations) >= 12
    for method, path, op in operations:
        ok = [r for code, r in op["responses"].items() if code.startswith("2")]
        assert ok, (method, path)
        for answer in ok:
            schema = resolve(doc, answer["content"]["application/json"]["schema"])
            assert schema.get("properties"), (method, path)
    for (method, path), model in WRITE_BODIES.items():
        schema = doc["paths"][path][method]["requestBody"]["content"]["application/json"][
            "schema"]
        refs = [s.get("$ref", "") for s in schema.get("anyOf", [schema])]
        assert any(r.endswith("/" + model) for r in refs), (method, path, schema)
        assert resolve(doc, {"$ref": "#/components/schemas/" + model})["properties"]


def test_real_answers_match_the_documented_models(api_stack) -> None:
    with api_stack.client() as c:
        r = c.post("/v1/jobs", json={
            "name": f"doc-{uuid.uuid4().hex[:6]}", "run_at": datetime.now(UTC).isoformat(),
            "target": {"type": "http", "url": f"{api_stack.receiver.url}/ok"}})
        assert r.status_code == 201, r.text
        responses.CreatedJob.model_validate(r.json())
        job_id = r.json()["job_id"]

        def finished() -> list[dict[str, Any]]:
            runs = c.get(f"/v1/jobs/{job_id}/runs").json()["runs"]
            return [x for x in runs if x["state"] == "succeeded"]

        (run,) = wait_until(finished, 30)
        responses.RunList.model_validate(c.get(f"/v1/jobs/{job_id}/runs").json())
        detail = c.get(f"/v1/runs/{run['run_id']}").json()
        assert responses.RunDetail.model_validate(detail).attempts
        job = wait_until(lambda: (j := c.get(f"/v1/jobs/{job_id}").json())["last_run"] and j,
                         15)
        assert responses.Job.model_validate(job).last_run is not None
        responses.JobList.model_validate(c.get("/v1/jobs", params={"limit": 500}).json())
        responses.Stats.model_validate(c.get("/v1/stats").json())
        responses.Health.model_validate(httpx.get(f"{api_stack.api.url}/healthz").json())
        responses.Ready.model_validate(httpx.get(f"{api_stack.api.url}/readyz").json())
