"""The HTTP API against the real running stack: broker, worker, `kron api`, a loopback target."""

from __future__ import annotations

import concurrent.futures
import time
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from kron.localkafka import free_ports
from kron.processes import ApiProcess, WorkerProcess
from tests.support.stack import wait_until

pytestmark = pytest.mark.integration

PROBLEM = "application/problem+json"


def at(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


def job_body(stack, **overrides) -> dict:
    body = {"name": f"n-{uuid.uuid4().hex[:6]}", "run_at": at(1.5),
            "target": {"type": "http", "url": f"{stack.receiver.url}/ok", "method": "POST"},
            "retry": {"max_attempts": 2, "backoff": "exponential", "base_s": 0.2, "max_s": 1}}
    body.update(overrides)
    return body


def test_create_then_the_run_happens_and_shows_in_runs(api_stack) -> None:
    with api_stack.client() as c:
        r = c.post("/v1/jobs", json=job_body(api_stack))
        assert r.status_code == 201, r.text
        created = r.json()
        job_id = created["job_id"]
        assert created["next_run_at"] and len(created["upcoming"]) == 1
        assert r.headers["location"] == f"/v1/jobs/{job_id}"
        assert api_stack.receiver.wait_for(job_id, 1, 30)

        def runs():
            body = c.get(f"/v1/jobs/{job_id}/runs").json()
            return [x for x in body["runs"] if x["state"] == "succeeded"]

        (run,) = wait_until(runs, 15)
        assert run["attempt"] == 1 and run["trigger"] == "schedule"
        assert 0 <= run["lateness_ms"] < 2000
        assert c.get(f"/v1/jobs/{job_id}/executions").json()["runs"][0]["run_id"] == run["run_id"]
        full = c.get(f"/v1/runs/{run['run_id']}").json()
        assert [a["outcome"] for a in full["attempts"]] == ["succeeded"]
        assert full["status_code"] == 200
        job = c.get(f"/v1/jobs/{job_id}").json()
        assert job["status"] == "completed"
        assert job["last_run"]["run_id"] == run["run_id"]
        stats = c.get("/v1/stats").json()["runs_by_state"]
        assert stats["succeeded"] >= 1


def test_cron_job_lifecycle_reads_its_own_writes(api_stack) -> None:
    with api_stack.client() as c:
        body = job_body(api_stack, schedule={"cron": "0 3 * * *", "timezone": "Europe/Paris"})
        del body["run_at"]
        created = c.post("/v1/jobs", json=body).json()
        job_id = created["job_id"]
        assert len(created["upcoming"]) == 5
        assert created["next_run_at"].endswith(("T03:00:00.000+01:00", "T03:00:00.000+02:00"))
        assert c.get(f"/v1/jobs/{job_id}").json()["status"] == "active"
        assert c.post(f"/v1/jobs/{job_id}:pause").json()["status"] == "paused"
        assert c.get(f"/v1/jobs/{job_id}").json()["status"] == "paused"
        assert c.post(f"/v1/jobs/{job_id}:resume").json()["status"] == "active"
        patched = c.patch(f"/v1/jobs/{job_id}", json={"schedule": {"cron": "0 4 * * *",
                                                                   "timezone": "UTC"}})
        assert patched.status_code == 200, patched.text
        assert patched.json()["version"] == 2
        assert patched.json()["next_run_at"].endswith("T04:00:00.000Z")
        r = c.post(f"/v1/jobs/{job_id}:trigger")
        assert r.status_code == 202
        assert api_stack.receiver.wait_for(job_id, 1, 20)
        runs = wait_until(lambda: c.get(f"/v1/jobs/{job_id}/runs").json()["runs"], 10)
        assert runs[0]["trigger"] == "manual"
        assert c.delete(f"/v1/jobs/{job_id}").status_code == 200
        assert c.get(f"/v1/jobs/{job_id}").status_code == 404


def test_backfill_through_the_api(api_stack) -> None:
    with api_stack.client() as c:
        body = job_body(api_stack, schedule={"cron": "* * * * *"})
        del body["run_at"]
        job_id = c.post("/v1/jobs", json=body).json()["job_id"]
        start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=4)
        r = c.post(f"/v1/jobs/{job_id}:backfill",
                   json={"from": start.isoformat(),
                         "to": (start + timedelta(minutes=2)).isoformat(), "max_per_s": 50})
        assert r.status_code == 202, r.text
        done = wait_until(lambda: len([x for x in c.get(
            f"/v1/jobs/{job_id}/runs").json()["runs"] if x["trigger"] == "backfill"]) == 3, 20)
        assert done
        c.delete(f"/v1/jobs/{job_id}")


def test_list_filters_and_paginates(api_stack) -> None:
    with api_stack.client("key-globex") as c:
        tag = uuid.uuid4().hex[:6]
        ids = []
        for i in range(3):
            body = job_body(api_stack, name=f"{tag}-{i}", run_at=at(3600))
            ids.append(c.post("/v1/jobs", json=body).json()["job_id"])
        c.post(f"/v1/jobs/{ids[0]}:pause")
        seen, cursor = [], None
        while True:
            page = c.get("/v1/jobs", params={"name": tag, "limit": 2,
                                             **({"cursor": cursor} if cursor else {})}).json()
            seen += [j["job_id"] for j in page["jobs"]]
            cursor = page["next_cursor"]
            if not cursor:
                break
        assert sorted(seen) == sorted(ids)
        paused = c.get("/v1/jobs", params={"name": tag, "status": "paused"}).json()["jobs"]
        assert [j["job_id"] for j in paused] == [ids[0]]


def test_tenants_are_isolated(api_stack) -> None:
    with api_stack.client("key-acme") as a, api_stack.client("key-globex") as b:
        job_id = a.post("/v1/jobs", json=job_body(api_stack, run_at=at(3600))).json()["job_id"]
        for method, path in [("GET", f"/v1/jobs/{job_id}"), ("PATCH", f"/v1/jobs/{job_id}"),
                             ("DELETE", f"/v1/jobs/{job_id}"),
                             ("POST", f"/v1/jobs/{job_id}:pause"),
                             ("POST", f"/v1/jobs/{job_id}:trigger"),
                             ("GET", f"/v1/jobs/{job_id}/runs")]:
            r = b.request(method, path, json={"name": "x"} if method == "PATCH" else None)
            assert r.status_code == 404, (method, path, r.text)
            assert r.headers["content-type"] == PROBLEM
        assert job_id not in [j["job_id"] for j in b.get("/v1/jobs").json()["jobs"]]
        assert a.get(f"/v1/jobs/{job_id}").status_code == 200
        a.delete(f"/v1/jobs/{job_id}")


def test_idempotency_key_same_body_same_job_different_body_422(api_stack) -> None:
    with api_stack.client() as c:
        key = uuid.uuid4().hex
        body = job_body(api_stack, run_at=at(3600), idempotency_key=key)
        first = c.post("/v1/jobs", json=body)
        again = c.post("/v1/jobs", json=body)
        assert first.status_code == 201 and again.status_code == 200
        assert first.json()["job_id"] == again.json()["job_id"]
        other = c.post("/v1/jobs", json={**body, "name": "different"})
        assert other.status_code == 422 and other.json()["field"] == "idempotency_key"


def test_concurrent_duplicate_idempotency_key_never_makes_two_jobs(api_stack) -> None:
    key = uuid.uuid4().hex
    body = job_body(api_stack, run_at=at(3600), idempotency_key=key)

    def post() -> httpx.Response:
        with api_stack.client() as c:
            return c.post("/v1/jobs", json=body)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: post(), range(8)))
    codes = sorted(r.status_code for r in results)
    assert codes.count(201) == 1, codes
    assert set(codes) <= {200, 201, 409}, codes
    assert len({r.json()["job_id"] for r in results if r.status_code in (200, 201)}) == 1
    conflicts = [r for r in results if r.status_code == 409]
    assert all(r.json()["field"] == "idempotency_key" for r in conflicts)


@pytest.mark.parametrize(("headers", "status"), [
    ({}, 401), ({"X-API-Key": "wrong"}, 401), ({"Authorization": "Bearer wrong"}, 401),
    ({"Authorization": "Basic a2V5LWFjbWU="}, 401),
])
def test_auth_failures_are_401_problems(api_stack, headers, status) -> None:
    r = httpx.get(f"{api_stack.api.url}/v1/jobs", headers=headers)
    assert r.status_code == status
    assert r.headers["content-type"] == PROBLEM
    assert r.json()["type"].endswith("/unauthorized")


def test_bearer_auth_works(api_stack) -> None:
    r = httpx.get(f"{api_stack.api.url}/v1/jobs", headers={"Authorization": "Bearer key-acme"})
    assert r.status_code == 200


@pytest.mark.parametrize(("content", "ctype", "status", "kind"), [
    (b"{not json", "application/json", 400, "malformed-json"),
    (b"[" * 100 + b"]" * 100, "application/json", 400, "json-too-deep"),
    (b'{"name": "x"}', "text/plain", 415, "unsupported-media-type"),
    (b'{"name": "' + b"x" * 70_000 + b'"}', "application/json", 413, "body-too-large"),
])
def test_malformed_requests(api_stack, content, ctype, status, kind) -> None:
    with api_stack.client() as c:
        r = c.post("/v1/jobs", content=content, headers={"Content-Type": ctype})
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == PROBLEM
    assert r.json()["type"].endswith("/" + kind)


@pytest.mark.parametrize(("change", "field"), [
    ({"schedule": {"cron": "61 * * * *"}, "run_at": None}, "schedule.cron"),
    ({"schedule": {"cron": "*/0 * * * *"}, "run_at": None}, "schedule.cron"),
    ({"schedule": {"cron": "0 0 30 2 *"}, "run_at": None}, "schedule.cron"),
    ({"schedule": {"cron": "0 0 * * *", "timezone": "Mars/Olympus"}, "run_at": None},
     "schedule.timezone"),
    ({"run_at": "2030-01-01T00:00:00"}, "run_at"),
    ({"run_at": "2001-01-01T00:00:00Z"}, "run_at"),
    ({"run_at": "2999-01-01T00:00:00Z"}, "run_at"),
    ({"target": {"type": "http", "url": "ftp://example.com/x"}}, "target.url"),
    ({"retry": {"max_attempts": 0}}, "retry.max_attempts"),
])
def test_semantic_errors_are_422_naming_the_field(api_stack, change, field) -> None:
    body = job_body(api_stack)
    for key, value in change.items():
        if value is None:
            body.pop(key, None)
        else:
            body[key] = value
    with api_stack.client() as c:
        r = c.post("/v1/jobs", json=body)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == PROBLEM
    assert r.json()["field"].startswith(field), r.json()


def test_private_targets_are_refused_unless_allowed(kafka_cluster, tmp_path) -> None:
    """A second API process with KRON_ALLOW_PRIVATE_TARGETS off (the default)."""
    from tests.conftest import fresh_settings

    settings = fresh_settings(kafka_cluster, tmp_path / "d", allow_private_targets=False,
                              tenant_burst=2, tenant_rate_per_s=0.01)
    api = ApiProcess(settings, tmp_path, free_ports(1)[0]).start()
    try:
        with httpx.Client(base_url=api.url, headers={"X-API-Key": "key-acme"}) as c:
            for url in ("http://127.0.0.1/x", "http://169.254.169.254/latest",
                        "http://[::1]/", "http://2130706433/", "http://localhost:8080/"):
                r = c.post("/v1/jobs", json={"name": "x", "run_at": at(60), "target": {
                    "type": "http", "url": url}})
                assert r.status_code in (422, 429), (url, r.text)
                if r.status_code == 422:
                    assert r.json()["field"] == "target.url"
            # The bucket held 2 tokens at 0.01/s: the rest were rate limited.
            r = c.get("/v1/jobs")
            assert r.status_code == 200  # reads are not rate limited
            r = c.post("/v1/jobs", json={"name": "x"})
            assert r.status_code == 429 and "retry-after" in r.headers
    finally:
        api.stop()


def test_kafka_down_answers_503_with_retry_after(tmp_path) -> None:
    from kron.settings import Settings

    dead = free_ports(1)[0]
    settings = Settings(bootstrap_servers=f"127.0.0.1:{dead}", topic_prefix="dead",
                        api_keys="acme=key-acme", allow_private_targets=True,
                        data_dir=tmp_path / "d")
    api = ApiProcess(settings, tmp_path, free_ports(1)[0])
    try:
        api.start(wait_path="/healthz", ok_statuses=(503,))
        with httpx.Client(base_url=api.url, headers={"X-API-Key": "key-acme"},
                          timeout=30) as c:
            r = c.post("/v1/jobs", json={"name": "x", "run_at": at(60), "target": {
                "type": "http", "url": "http://127.0.0.1:1/"}})
        assert r.status_code == 503, r.text
        assert r.headers["content-type"] == PROBLEM and r.headers["retry-after"]
    finally:
        api.stop()


def test_openapi_docs_are_served(api_stack) -> None:
    r = httpx.get(f"{api_stack.api.url}/openapi.json")
    assert r.status_code == 200
    paths = r.json()["paths"]
    for p in ("/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/runs", "/v1/runs/{run_id}"):
        assert p in paths
    assert httpx.get(f"{api_stack.api.url}/docs").status_code == 200


def test_healthz_reports_broker_connectivity(api_stack) -> None:
    body = httpx.get(f"{api_stack.api.url}/healthz").json()
    assert body["broker"]["ok"] is True and body["broker"]["commands_topic"] is True


def test_active_job_quota_answers_429(kafka_cluster, tmp_path) -> None:
    from tests.conftest import fresh_settings

    settings = fresh_settings(kafka_cluster, tmp_path / "d", tenant_max_active_jobs=2)
    worker = WorkerProcess(settings, "wq", tmp_path).start()
    api = ApiProcess(settings, tmp_path, free_ports(1)[0]).start()
    try:
        with httpx.Client(base_url=api.url, headers={"X-API-Key": "key-acme"},
                          timeout=20) as c:
            body = {"run_at": at(3600), "target": {"type": "http", "url": "http://x.test/"}}
            codes = [c.post("/v1/jobs", json={**body, "name": f"q{i}"}).status_code
                     for i in range(3)]
            assert codes == [201, 201, 429]
            r = c.post("/v1/jobs", json={**body, "name": "q3"})
            assert r.json()["type"].endswith("/quota-exceeded")
            # Another tenant has its own quota.
            other = c.post("/v1/jobs", json={**body, "name": "g"},
                           headers={"X-API-Key": "key-globex"})
            assert other.status_code == 201
    finally:
        api.stop()
        worker.stop()


def test_create_is_answered_at_the_kafka_ack_and_read_back_before_the_worker(
        kafka_cluster, tmp_path) -> None:
    """201 means Kafka has the CreateJob (acks=all); no worker needs to have applied it. The
    API's own reads (get, list, idempotent retries, quota, patch validation) see the job from
    its accepted-not-projected cache until the projection shows it."""
    from tests.conftest import fresh_settings

    settings = fresh_settings(kafka_cluster, tmp_path / "d", tenant_max_active_jobs=3)
    api = ApiProcess(settings, tmp_path, free_ports(1)[0]).start()  # no worker yet
    worker = None
    try:
        with httpx.Client(base_url=api.url, headers={"X-API-Key": "key-acme"},
                          timeout=20) as c:
            key = uuid.uuid4().hex
            body = {"name": "early", "idempotency_key": key,
                    "schedule": {"cron": "0 3 * * *", "timezone": "Europe/Paris"},
                    "target": {"type": "http", "url": "http://x.test/"}}
            t0 = time.monotonic()
            r = c.post("/v1/jobs", json=body)
            assert r.status_code == 201, r.text
            assert time.monotonic() - t0 < 2.0  # it used to wait 5 s for the worker
            created = r.json()
            job_id = created["job_id"]
            assert created["status"] == "active" and created["version"] == 1
            assert created["next_run_at"] == created["upcoming"][0]
            assert len(created["upcoming"]) == 5
            assert r.headers["location"] == f"/v1/jobs/{job_id}"
            got = c.get(f"/v1/jobs/{job_id}")
            assert got.status_code == 200 and got.json()["name"] == "early"
            assert [j["job_id"] for j in c.get("/v1/jobs").json()["jobs"]] == [job_id]
            again = c.post("/v1/jobs", json=body)
            assert again.status_code == 200 and again.json()["job_id"] == job_id
            reused = c.post("/v1/jobs", json={**body, "name": "other"})
            assert reused.status_code == 422 and reused.json()["field"] == "idempotency_key"
            bad = c.patch(f"/v1/jobs/{job_id}", json={"schedule": {"cron": "61 * * * *"}})
            assert bad.status_code == 422 and bad.json()["field"] == "schedule.cron"
            other = c.get(f"/v1/jobs/{job_id}", headers={"X-API-Key": "key-globex"})
            assert other.status_code == 404
            assert c.get("/v1/jobs", headers={"X-API-Key": "key-globex"}).json()["jobs"] == []
            # The quota counts creates the worker has not applied yet.
            one = {"run_at": at(3600), "target": {"type": "http", "url": "http://x.test/"}}
            codes = [c.post("/v1/jobs", json={**one, "name": f"q{i}"}).status_code
                     for i in range(3)]
            assert codes == [201, 201, 429]
            assert httpx.get(f"{api.url}/readyz").json()["unprojected_creates"] == 3

            worker = WorkerProcess(settings, "late", tmp_path).start()
            assert wait_until(lambda: httpx.get(f"{api.url}/readyz").json()[
                "unprojected_creates"] == 0, 90), worker.log()[-3000:]
            listed = c.get("/v1/jobs").json()["jobs"]
            assert len(listed) == 3 and job_id in [j["job_id"] for j in listed]
            assert c.get(f"/v1/jobs/{job_id}").json()["next_run_at"] == created["next_run_at"]
            assert c.post("/v1/jobs", json=body).status_code == 200
            r = c.post("/v1/jobs", json={**one, "name": "q3"})
            assert r.status_code == 429 and r.json()["type"].endswith("/quota-exceeded")
    finally:
        api.stop()
        if worker is not None:
            worker.stop()


def test_a_burst_of_concurrent_creates_cannot_overrun_the_quota(kafka_cluster,
                                                               tmp_path) -> None:
    from tests.conftest import fresh_settings

    settings = fresh_settings(kafka_cluster, tmp_path / "d", tenant_max_active_jobs=5,
                              tenant_burst=1000)
    api = ApiProcess(settings, tmp_path, free_ports(1)[0]).start()
    try:
        def post(i: int) -> int:
            with httpx.Client(base_url=api.url, headers={"X-API-Key": "key-acme"},
                              timeout=20) as c:
                return c.post("/v1/jobs", json={
                    "name": f"b{i}", "run_at": at(3600),
                    "target": {"type": "http", "url": "http://x.test/"}}).status_code

        with concurrent.futures.ThreadPoolExecutor(20) as pool:
            codes = sorted(pool.map(post, range(20)))
        assert codes == [201] * 5 + [429] * 15, codes
    finally:
        api.stop()
