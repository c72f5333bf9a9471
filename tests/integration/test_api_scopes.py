"""Scoped API keys through the real stack (broker, worker and `kron api` processes): a read
key lists and reads its tenant's jobs, is refused every write with a 403 problem+json and
changes nothing; two write keys of one tenant both work; a read key sees no other tenant."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from bench.receiver import Receiver
from kron.localkafka import free_ports
from kron.processes import ApiProcess, WorkerProcess
from tests.conftest import fresh_settings
from tests.support.stack import wait_until

pytestmark = pytest.mark.integration

PROBLEM = "application/problem+json"
ACME_W1, ACME_W2, ACME_R = "key-acme", "key-acme-2", "key-acme-read"
GLOBEX_W, GLOBEX_R = "key-globex", "key-globex-read"
KEYS = (f"acme={ACME_W1},acme={ACME_W2},acme:read={ACME_R},"
        f"globex={GLOBEX_W},globex:read={GLOBEX_R}")


@dataclass
class Scoped:
    receiver: Receiver
    api: ApiProcess

    def client(self, key: str) -> httpx.Client:
        return httpx.Client(base_url=self.api.url, headers={"X-API-Key": key}, timeout=20)

    def job_body(self, **overrides: Any) -> dict[str, Any]:
        body = {"name": f"scope-{uuid.uuid4().hex[:6]}",
                "schedule": {"cron": "0 0 1 1 *", "timezone": "UTC"},
                "target": {"type": "http", "url": f"{self.receiver.url}/ok", "method": "POST"}}
        return body | overrides


@pytest.fixture(scope="module")
def scoped(kafka_cluster, tmp_path_factory) -> Iterator[Scoped]:
    tmp = tmp_path_factory.mktemp("scopes")
    settings = fresh_settings(kafka_cluster, tmp / "data", api_keys=KEYS, tenant_burst=1000)
    with Receiver() as receiver:
        worker = WorkerProcess(settings, "w1", tmp).start()
        api = ApiProcess(settings, tmp, free_ports(1)[0])
        try:
            api.start()
            stack = Scoped(receiver=receiver, api=api)
            # The worker owns its partitions once a job fires (see conftest._warm_up).
            with stack.client(ACME_W1) as c:
                warm = stack.job_body(run_at=datetime.now(UTC).isoformat())
                del warm["schedule"]
                r = c.post("/v1/jobs", json=warm)
            assert r.status_code == 201, r.text
            assert receiver.wait_for(r.json()["job_id"], 1, 90), worker.log()[-3000:]
            yield stack
        finally:
            api.stop()
            worker.stop()


def projected(c: httpx.Client, job_id: str) -> dict[str, Any]:
    """The job once the worker's state shows it (not the API's pending create)."""
    def ready() -> dict[str, Any] | None:
        ids = [j["job_id"] for j in c.get("/v1/jobs", params={"limit": 500}).json()["jobs"]]
        r = c.get(f"/v1/jobs/{job_id}")
        return r.json() if job_id in ids and r.status_code == 200 else None

    job = wait_until(ready, 20)
    assert job, f"job {job_id} never showed"
    return job


def assert_read_only(r: httpx.Response) -> None:
    assert r.status_code == 403, r.text
    assert r.headers["content-type"] == PROBLEM
    problem = r.json()
    assert problem["status"] == 403
    assert problem["type"].endswith("/read-only-key")
    assert problem["title"] == "Forbidden"


def stable(job: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in job.items() if k not in ("next_run_at", "upcoming")}


def test_a_read_key_reads_its_tenant_and_every_write_is_refused(scoped: Scoped) -> None:
    with scoped.client(ACME_W1) as writer, scoped.client(ACME_R) as reader:
        r = writer.post("/v1/jobs", json=scoped.job_body())
        assert r.status_code == 201, r.text
        job_id = r.json()["job_id"]
        projected(writer, job_id)
        # A write answers once the projection shows it: from here on every read is the
        # worker's state, not the API's pending create.
        first = writer.patch(f"/v1/jobs/{job_id}", json={"name": f"ro-{uuid.uuid4().hex[:6]}"})
        assert first.status_code == 200, first.text
        before = writer.get(f"/v1/jobs/{job_id}").json()
        assert before["status"] == "active" and before["version"] == 2

        listed = reader.get("/v1/jobs", params={"limit": 500})
        assert listed.status_code == 200
        assert job_id in [j["job_id"] for j in listed.json()["jobs"]]
        got = reader.get(f"/v1/jobs/{job_id}")
        assert got.status_code == 200 and stable(got.json()) == stable(before)
        assert reader.get(f"/v1/jobs/{job_id}/runs").status_code == 200
        assert reader.get("/v1/stats").status_code == 200
        count = len(listed.json()["jobs"])

        start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=2)
        refused = {
            "create": reader.post("/v1/jobs", json=scoped.job_body()),
            "create keyed": reader.post("/v1/jobs", json=scoped.job_body(
                idempotency_key=f"ro-{uuid.uuid4().hex[:8]}")),
            "update": reader.patch(f"/v1/jobs/{job_id}", json={"name": "changed-by-reader"}),
            "pause": reader.post(f"/v1/jobs/{job_id}:pause"),
            "resume": reader.post(f"/v1/jobs/{job_id}:resume"),
            "trigger": reader.post(f"/v1/jobs/{job_id}:trigger"),
            "backfill": reader.post(f"/v1/jobs/{job_id}:backfill", json={
                "from": start.isoformat(), "to": (start + timedelta(minutes=3)).isoformat()}),
            "delete": reader.delete(f"/v1/jobs/{job_id}"),
        }
        for what, response in refused.items():
            assert response.status_code == 403, (what, response.text)
            assert_read_only(response)

        time.sleep(2)  # what a slipped-through write would need to show
        assert stable(reader.get(f"/v1/jobs/{job_id}").json()) == stable(before)
        assert len(reader.get("/v1/jobs", params={"limit": 500}).json()["jobs"]) == count
        assert reader.get(f"/v1/jobs/{job_id}/runs").json()["runs"] == []
        assert scoped.receiver.hits_for(job_id) == []
        # The writer's next update is the only one since `before`: had the reader's update or
        # pause gone through, the version would be past 3 or the job paused.
        patched = writer.patch(f"/v1/jobs/{job_id}", json={"name": "changed-by-writer"})
        assert patched.status_code == 200, patched.text
        assert patched.json()["version"] == before["version"] + 1
        assert patched.json()["status"] == "active"
        assert writer.delete(f"/v1/jobs/{job_id}").status_code == 200


def test_two_write_keys_of_a_tenant_both_work(scoped: Scoped) -> None:
    with scoped.client(ACME_W1) as one, scoped.client(ACME_W2) as two:
        r = one.post("/v1/jobs", json=scoped.job_body())
        assert r.status_code == 201, r.text
        job_id = r.json()["job_id"]
        projected(two, job_id)  # the same tenant: the second key sees the first's job
        assert two.post(f"/v1/jobs/{job_id}:pause").json()["status"] == "paused"
        assert one.post(f"/v1/jobs/{job_id}:resume").json()["status"] == "active"
        patched = two.patch(f"/v1/jobs/{job_id}", json={"name": "renamed-by-key-two"})
        assert patched.status_code == 200, patched.text
        assert one.get(f"/v1/jobs/{job_id}").json()["name"] == "renamed-by-key-two"
        r2 = two.post("/v1/jobs", json=scoped.job_body())
        assert r2.status_code == 201, r2.text
        projected(one, r2.json()["job_id"])
        assert one.delete(f"/v1/jobs/{r2.json()['job_id']}").status_code == 200
        assert two.delete(f"/v1/jobs/{job_id}").status_code == 200


def test_a_read_key_sees_nothing_of_another_tenant(scoped: Scoped) -> None:
    with scoped.client(GLOBEX_W) as globex, scoped.client(ACME_R) as acme_reader, \
            scoped.client(GLOBEX_R) as globex_reader:
        r = globex.post("/v1/jobs", json=scoped.job_body())
        assert r.status_code == 201, r.text
        job_id = r.json()["job_id"]
        projected(globex_reader, job_id)  # globex's own read key sees it

        got = acme_reader.get(f"/v1/jobs/{job_id}")
        assert got.status_code == 404 and got.headers["content-type"] == PROBLEM
        assert acme_reader.get(f"/v1/jobs/{job_id}/runs").status_code == 404
        listed = acme_reader.get("/v1/jobs", params={"limit": 500}).json()["jobs"]
        assert job_id not in [j["job_id"] for j in listed]
        assert all(j["tenant"] == "acme" for j in listed if "tenant" in j)
        # A write with a read key is refused before the job is looked up: 403 says nothing
        # of whether another tenant's job exists.
        assert_read_only(acme_reader.delete(f"/v1/jobs/{job_id}"))
        assert_read_only(acme_reader.delete("/v1/jobs/j_" + "0" * 32))
        assert globex.get(f"/v1/jobs/{job_id}").status_code == 200
        assert globex.delete(f"/v1/jobs/{job_id}").status_code == 200
