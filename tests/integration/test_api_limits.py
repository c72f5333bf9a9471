"""Every request limit through the real API process (broker and worker running too): each
answers with a problem+json of its own `type`, so a client can tell which limit it hit.

Three `kron api` processes share one broker, worker and topic prefix: the api_stack's own
(default limits), a roomy one (1 MiB request bodies, so the 256 KiB target.body limit is
reachable at all) and a tight one (a burst of 3 writes, one active job per tenant).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.models import BODY_MAX, HEADER_NAME_MAX, HEADER_VALUE_MAX, HEADERS_MAX
from kron.localkafka import free_ports
from kron.processes import ApiProcess

pytestmark = pytest.mark.integration

PROBLEM = "application/problem+json"
BASE = "https://kron.dev/problems/"


def start_api(api_stack: Any, tmp: Path, **env: str) -> ApiProcess:
    api = ApiProcess(api_stack.settings, tmp, free_ports(1)[0])
    api.env.update(env)
    return api.start()


@pytest.fixture(scope="module")
def roomy(api_stack, tmp_path_factory) -> Iterator[str]:
    api = start_api(api_stack, tmp_path_factory.mktemp("roomy"),
                    KRON_MAX_BODY_BYTES=str(1 << 20))
    yield api.url
    api.stop()


@pytest.fixture(scope="module")
def tight(api_stack, tmp_path_factory) -> Iterator[str]:
    api = start_api(api_stack, tmp_path_factory.mktemp("tight"),
                    KRON_API_KEYS="quota=key-quota,rate=key-rate", KRON_TENANT_BURST="3",
                    KRON_TENANT_RATE_PER_S="0.001", KRON_TENANT_MAX_ACTIVE_JOBS="1")
    yield api.url
    api.stop()


def job(stack: Any, **target: Any) -> dict[str, Any]:
    return {"name": f"lim-{uuid.uuid4().hex[:6]}", "schedule": {"cron": "0 0 1 1 *"},
            "target": {"type": "http", "url": f"{stack.receiver.url}/ok", **target}}


def problem(r: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == PROBLEM
    body = r.json()
    assert body["type"] == BASE + kind and body["status"] == status
    return body


TOO_MANY = {f"X-H{i}": "v" for i in range(HEADERS_MAX + 1)}
LONG_NAME = {"X-" + "n" * HEADER_NAME_MAX: "v"}
LONG_VALUE = {"X-Long": "v" * (HEADER_VALUE_MAX + 1)}
TOO_LARGE = {f"X-H{i}": "v" * HEADER_VALUE_MAX for i in range(5)}  # 40 KiB > 32 KiB in all


@pytest.mark.parametrize(("headers", "kind", "title"), [
    (TOO_MANY, "target-headers-too-many", "Too many target headers"),
    (LONG_NAME, "target-header-too-long", "Target header too long"),
    (LONG_VALUE, "target-header-too-long", "Target header too long"),
    (TOO_LARGE, "target-headers-too-large", "Target headers too large"),
])
def test_target_header_limits_on_create_and_update(api_stack, headers: dict[str, str],
                                                    kind: str, title: str) -> None:
    with api_stack.client() as c:
        created = problem(c.post("/v1/jobs", json=job(api_stack, headers=headers)), 422, kind)
        assert created["title"] == title and created["field"].startswith("target.headers")
        job_id = c.post("/v1/jobs", json=job(api_stack)).json()["job_id"]
        patched = c.patch(f"/v1/jobs/{job_id}", json={"target": {"headers": headers}})
        assert problem(patched, 422, kind)["title"] == title


def test_headers_at_the_limits_are_accepted(api_stack) -> None:
    at_limit = {f"X-H{i}": "v" for i in range(HEADERS_MAX)}
    with api_stack.client() as c:
        r = c.post("/v1/jobs", json=job(api_stack, headers=at_limit))
    assert r.status_code == 201, r.text


def test_target_body_limit_on_create_and_update(api_stack, roomy: str) -> None:
    with httpx.Client(base_url=roomy, headers={"X-API-Key": "key-acme"}, timeout=20) as c:
        big = "x" * (BODY_MAX + 1)
        body = problem(c.post("/v1/jobs", json=job(api_stack, body=big)), 422,
                       "target-body-too-large")
        assert body["field"] == "target.body" and body["title"] == "Target body too large"
        job_id = c.post("/v1/jobs", json=job(api_stack, body="x" * BODY_MAX)).json()["job_id"]
        problem(c.patch(f"/v1/jobs/{job_id}", json={"target": {"body": big}}), 422,
                "target-body-too-large")
        # A multi-byte character counts as its UTF-8 bytes, not as one character.
        problem(c.post("/v1/jobs", json=job(api_stack, body="é" * (BODY_MAX // 2 + 1))), 422,
                "target-body-too-large")


def test_request_body_size_limit(api_stack) -> None:
    with api_stack.client() as c:
        r = c.post("/v1/jobs", json=job(api_stack, body="x" * (64 * 1024)))
    assert problem(r, 413, "body-too-large")["title"] == "Request too large"


def test_json_depth_limit(api_stack) -> None:
    deep = "[" * 100 + "]" * 100
    with api_stack.client() as c:
        r = c.post("/v1/jobs", content=f'{{"name": "d", "metadata": {deep}}}',
                   headers={"Content-Type": "application/json"})
    problem(r, 400, "json-too-deep")


def test_rate_limit(api_stack, tight: str) -> None:
    with httpx.Client(base_url=tight, headers={"X-API-Key": "key-rate"}, timeout=20) as c:
        # Writes to a missing job still spend tokens: the bucket is taken before the lookup.
        statuses = [c.post(f"/v1/jobs/j_{'0' * 32}:pause").status_code for _ in range(3)]
        assert statuses == [404, 404, 404]
        r = c.post(f"/v1/jobs/j_{'0' * 32}:pause")
    problem(r, 429, "rate-limited")
    assert int(r.headers["retry-after"]) >= 1


def test_active_job_quota(api_stack, tight: str) -> None:
    with httpx.Client(base_url=tight, headers={"X-API-Key": "key-quota"}, timeout=20) as c:
        assert c.post("/v1/jobs", json=job(api_stack)).status_code == 201
        r = c.post("/v1/jobs", json=job(api_stack))
    problem(r, 429, "quota-exceeded")
