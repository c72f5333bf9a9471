"""Tenant isolation on every /v1 endpoint, against the real stack (broker, worker and `kron
api` processes): tenant globex gets exactly what a missing id gets (404, same problem type)
for acme's job and run ids, and lists and stats never show acme's items. Also the API key
path: plaintext and hashed KRON_API_KEYS entries authenticate; no plaintext reaches the log.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from kron.localkafka import free_ports
from kron.processes import ApiProcess
from tests.support.stack import wait_until

pytestmark = pytest.mark.integration

PROBLEM = "application/problem+json"
PAST_FROM = (datetime.now(UTC) - timedelta(hours=3)).isoformat()
PAST_TO = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
MISSING_JOB = "j_" + "0" * 32
MISSING_RUN = "0" * 32
MISSING_DL = "dl_" + "0" * 32


@dataclass
class World:
    job_id: str   # acme's, with one finished run
    run_id: str
    own_job: str  # globex's own
    dl_id: str  # acme's dead letter: a failed job's alert


def body(stack: Any, **overrides: Any) -> dict[str, Any]:
    out = {"name": f"iso-{uuid.uuid4().hex[:6]}", "schedule": {"cron": "0 0 1 1 *"},
           "target": {"type": "http", "url": f"{stack.receiver.url}/ok", "method": "POST"}}
    return out | overrides


@pytest.fixture(scope="module")
def world(api_stack) -> World:
    with api_stack.client("key-acme") as acme, api_stack.client("key-globex") as globex:
        job_id = acme.post("/v1/jobs", json=body(api_stack, name="acme-secret")).json()["job_id"]
        assert acme.post(f"/v1/jobs/{job_id}:trigger").status_code == 202
        runs = wait_until(lambda: [r for r in acme.get(f"/v1/jobs/{job_id}/runs").json()["runs"]
                                   if r["state"] == "succeeded"], 30)
        assert runs, api_stack.worker.log()[-3000:]
        own = globex.post("/v1/jobs", json=body(api_stack)).json()["job_id"]
        failing = acme.post("/v1/jobs", json=body(
            api_stack, run_at=datetime.now(UTC).isoformat(), schedule=None,
            target={"url": f"{api_stack.receiver.url}/status/404"})).json()["job_id"]
        letters = wait_until(lambda: [d for d in acme.get("/v1/dead-letters").json()[
            "dead_letters"] if d["alert"] and d["alert"]["job_id"] == failing], 30)
        assert letters, api_stack.worker.log()[-3000:]
        return World(job_id=job_id, run_id=runs[0]["run_id"], own_job=own,
                     dl_id=letters[0]["id"])


# Every (method, path) under /v1, with what globex sends when probing acme's ids.
PROBES: dict[tuple[str, str], dict[str, Any]] = {
    ("GET", "/v1/jobs/{job_id}"): {},
    ("PATCH", "/v1/jobs/{job_id}"): {"json": {"name": "pwned"}},
    ("DELETE", "/v1/jobs/{job_id}"): {},
    ("POST", "/v1/jobs/{job_id}:pause"): {},
    ("POST", "/v1/jobs/{job_id}:resume"): {},
    ("POST", "/v1/jobs/{job_id}:trigger"): {},
    ("POST", "/v1/jobs/{job_id}:backfill"): {"json": {"from": PAST_FROM, "to": PAST_TO}},
    ("GET", "/v1/jobs/{job_id}/runs"): {},
    ("GET", "/v1/jobs/{job_id}/executions"): {},
    ("GET", "/v1/runs/{run_id}"): {},
    ("POST", "/v1/runs/{run_id}:cancel"): {},
    ("POST", "/v1/runs/{run_id}:retry"): {},
    ("POST", "/v1/dead-letters/{dl_id}:redrive"): {"json": {
        "name": "pwned", "schedule": {"cron": "0 0 1 1 *"}, "target": {"url": "http://x.test/"}}},
}
LISTS = {("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", "/v1/stats"),
         ("GET", "/v1/dead-letters"), ("GET", "/v1/runs")}


def test_the_probe_table_covers_every_endpoint(api_stack) -> None:
    """A new endpoint fails here until it is added to the isolation checks."""
    spec = httpx.get(f"{api_stack.api.url}/openapi.json").json()
    routes = {(m.upper(), p) for p, ops in spec["paths"].items() if p.startswith("/v1/")
              for m in ops}
    # The job action route is declared once as /v1/jobs/{job_id}:{action}; the run actions
    # each on their own.
    actions = {k for k in PROBES if ":" in k[1] and k[1].startswith("/v1/jobs/")}
    assert routes == (set(PROBES) - actions) | {("POST", "/v1/jobs/{job_id}:{action}")} | LISTS


@pytest.mark.parametrize(("method", "path"), list(PROBES))
def test_another_tenants_ids_answer_like_missing_ones(api_stack, world: World, method: str,
                                                      path: str) -> None:
    kw = PROBES[(method, path)]
    with api_stack.client("key-globex") as globex:
        theirs = globex.request(method, path.format(
            job_id=world.job_id, run_id=world.run_id, dl_id=world.dl_id), **kw)
        missing = globex.request(method, path.format(
            job_id=MISSING_JOB, run_id=MISSING_RUN, dl_id=MISSING_DL), **kw)
    assert theirs.status_code == 404, theirs.text
    assert theirs.headers["content-type"] == PROBLEM
    assert theirs.json()["type"] == missing.json()["type"]
    assert missing.status_code == 404
    assert "acme-secret" not in theirs.text


def test_acme_job_is_untouched_by_globex(api_stack, world: World) -> None:
    for method, path in PROBES:  # every write attempt again, then look from acme's side
        globex_kw = PROBES[(method, path)]
        with api_stack.client("key-globex") as globex:
            globex.request(method, path.format(
                job_id=world.job_id, run_id=world.run_id, dl_id=world.dl_id), **globex_kw)
    with api_stack.client("key-acme") as acme:
        job = acme.get(f"/v1/jobs/{world.job_id}").json()
        runs = acme.get(f"/v1/jobs/{world.job_id}/runs").json()["runs"]
    assert job["status"] == "active" and job["name"] == "acme-secret" and job["version"] == 1
    assert [r["run_id"] for r in runs] == [world.run_id]  # no trigger or backfill got in


def test_lists_and_stats_show_only_the_callers_items(api_stack, world: World) -> None:
    with api_stack.client("key-globex") as globex:
        listed = [j["job_id"] for j in globex.get("/v1/jobs", params={"limit": 500}).json()["jobs"]]
        by_name = globex.get("/v1/jobs", params={"name": "acme-secret"}).json()["jobs"]
        # A cursor is a position in the caller's own key range: acme's id can't escape it.
        cursored = globex.get("/v1/jobs", params={"cursor": world.job_id}).json()["jobs"]
        stats = globex.get("/v1/stats").json()["runs_by_state"]
        letters = globex.get("/v1/dead-letters").json()["dead_letters"]
        # Runs across the caller's jobs: acme's run is not among them, in any state.
        runs = globex.get("/v1/runs", params={"limit": 500}).json()["runs"]
        succeeded = globex.get("/v1/runs", params={"state": "succeeded"}).json()["runs"]
    assert world.run_id not in [r["run_id"] for r in runs + succeeded]
    assert world.own_job in listed and world.job_id not in listed
    assert by_name == []
    assert world.job_id not in [j["job_id"] for j in cursored]
    assert sum(stats.values()) == 0  # globex never ran anything; acme did
    assert world.dl_id not in [d["id"] for d in letters]
    with api_stack.client("key-acme") as acme:
        assert acme.get("/v1/stats").json()["runs_by_state"]["succeeded"] >= 1
        assert world.run_id in [r["run_id"] for r in acme.get(
            "/v1/runs", params={"limit": 500}).json()["runs"]]
        assert world.own_job not in [j["job_id"] for j in acme.get(
            "/v1/jobs", params={"limit": 500}).json()["jobs"]]


def test_same_idempotency_key_makes_separate_jobs_per_tenant(api_stack) -> None:
    key = f"idem-{uuid.uuid4().hex[:8]}"
    with api_stack.client("key-acme") as acme, api_stack.client("key-globex") as globex:
        a = acme.post("/v1/jobs", json=body(api_stack, idempotency_key=key))
        g = globex.post("/v1/jobs", json=body(api_stack, idempotency_key=key))
    assert a.status_code == g.status_code == 201, (a.text, g.text)
    assert a.json()["job_id"] != g.json()["job_id"]


def test_plaintext_and_hashed_keys_through_the_real_api(api_stack, tmp_path) -> None:
    """A second `kron api` whose KRON_API_KEYS has one plaintext and one hashed entry."""
    plain, hashed_only = f"plain-{uuid.uuid4().hex}", f"hashed-{uuid.uuid4().hex}"
    digest = "sha256:" + hashlib.sha256(hashed_only.encode()).hexdigest()
    api = ApiProcess(api_stack.settings, tmp_path, free_ports(1)[0])
    api.env["KRON_API_KEYS"] = f"acme={plain},globex={digest}"
    api.env["KRON_LOG_LEVEL"] = "DEBUG"  # the chattiest the log gets
    api.start()
    try:
        def status(key: str) -> int:
            return httpx.get(f"{api.url}/v1/jobs", headers={"X-API-Key": key}).status_code

        assert status(plain) == 200
        assert status(hashed_only) == 200
        assert status(digest) == 401  # the stored hash is not a key
        assert status(plain + "x") == 401
    finally:
        api.stop()
    assert plain not in api.log()
