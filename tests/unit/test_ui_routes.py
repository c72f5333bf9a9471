"""The dashboard in process (no broker, as tests/unit/test_api_routes.py): pages carry a
strict Content-Security-Policy and no data, what the path names is escaped, the static
files are served, and /ui/api answers only a valid key, with its own tenant's jobs."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.projection import Projector, Views
from api.routes import service
from api.server import Components, create_app
from kron.settings import Settings
from tests.unit.test_api_routes import Probe, Publisher

PAGES = ["/ui", "/ui/signin", "/ui/jobs", "/ui/jobs/new", "/ui/jobs/j_1", "/ui/runs/r_1",
         "/ui/failures"]
RUN_AT = (datetime.now(UTC) + timedelta(hours=1)).isoformat()


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setattr(service, "READ_YOUR_WRITES_S", 0.01)
    settings = Settings(bootstrap_servers="127.0.0.1:1", data_dir=tmp_path, api_create_batch=1,
                        api_keys="acme=key-acme,globex=key-globex",
                        allow_private_targets=True, tenant_burst=1000)
    views = Views(tmp_path / "views")
    parts = Components(settings=settings, views=views, projector=Projector(settings, views),
                       publisher=Publisher(), probe=Probe())  # type: ignore[arg-type]
    yield TestClient(create_app(settings, components=parts))
    views.close()


def create(c: TestClient, key: str, **fields: Any) -> str:
    when = {} if "schedule" in fields else {"run_at": RUN_AT}
    body = {"name": "n", **when, "target": {"url": "http://x.test/"}} | fields
    r = c.post("/v1/jobs", json=body, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 201, r.text
    return str(r.json()["job_id"])


@pytest.mark.parametrize("path", PAGES)
def test_every_page_is_html_under_a_strict_policy_and_needs_no_key(client: TestClient,
                                                                   path: str) -> None:
    r = client.get(path)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    assert "<script>" not in r.text and "<script " in r.text  # scripts by src only
    assert " on" + "click=" not in r.text


def test_what_the_path_names_is_escaped(client: TestClient) -> None:
    r = client.get('/ui/jobs/"><img src=x onerror=alert(1)>')
    assert r.status_code == 200
    assert "<img" not in r.text
    assert 'data-job-id="&#34;&gt;&lt;img src=x onerror=alert(1)&gt;"' in r.text


def test_the_static_files_are_served_with_their_types(client: TestClient) -> None:
    page = client.get("/ui").text
    assert "/ui/static/app.js?v=" in page and "/ui/static/style.css?v=" in page
    js = client.get("/ui/static/app.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert "innerHTML" not in js.text  # data goes in as text only
    css = client.get("/ui/static/style.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert client.get("/ui/static/nope.js").status_code == 404
    assert client.get("/ui/static/../server.py").status_code == 404


def test_the_dashboard_is_not_in_the_openapi_document(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert not [p for p in paths if p.startswith("/ui")]


def test_its_read_routes_need_a_key(client: TestClient) -> None:
    for path in ("/ui/api/jobs", "/ui/api/runs", "/ui/api/activity"):
        assert client.get(path).status_code == 401
        assert client.get(path, headers={"Authorization": "Bearer nope"}).status_code == 401


def test_the_search_shows_only_the_tenants_own_jobs(client: TestClient) -> None:
    ops = create(client, "key-acme", name="Nightly report", metadata={"team": "ops"})
    create(client, "key-acme", name="hourly", schedule={"cron": "0 * * * *"},
           metadata={"team": "dev"})
    other = create(client, "key-globex", name="Nightly report", metadata={"team": "ops"})
    acme = {"Authorization": "Bearer key-acme"}

    def names(**query: str) -> list[str]:
        r = client.get("/ui/api/jobs", params=query, headers=acme)
        assert r.status_code == 200, r.text
        assert r.headers["content-security-policy"].startswith("default-src 'none'")
        return sorted(j["name"] for j in r.json()["jobs"])

    assert names() == ["Nightly report", "hourly"]
    assert names(name="NIGHTLY") == ["Nightly report"]
    assert names(label="team=ops") == ["Nightly report"]
    assert names(label="team") == ["Nightly report", "hourly"]
    assert names(kind="cron") == ["hourly"]
    assert names(kind="once", label="team=dev") == []
    assert names(status="paused") == []
    r = client.get("/ui/api/jobs", params={"kind": "bogus"}, headers=acme)
    assert r.status_code == 422
    globex = client.get("/ui/api/jobs", headers={"Authorization": "Bearer key-globex"}).json()
    assert [j["job_id"] for j in globex["jobs"]] == [other]
    # A job's slots: its own tenant's only.
    up = client.get(f"/ui/api/jobs/{ops}/upcoming", headers=acme)
    assert up.status_code == 200, up.text
    assert len(up.json()["upcoming"]) == 1  # a one-off: its run_at
    assert client.get(f"/ui/api/jobs/{other}/upcoming", headers=acme).status_code == 404


def test_a_cron_jobs_next_five_slots(client: TestClient) -> None:
    job = create(client, "key-acme", name="h", schedule={"cron": "0 * * * *",
                                                         "timezone": "Asia/Kolkata"})
    r = client.get(f"/ui/api/jobs/{job}/upcoming", headers={"Authorization": "Bearer key-acme"})
    body = r.json()
    assert body["timezone"] == "Asia/Kolkata"
    slots = [datetime.fromisoformat(t) for t in body["upcoming"]]
    assert len(slots) == 5
    assert all(b - a == timedelta(hours=1) for a, b in itertools.pairwise(slots))
    # In the job's zone, as the API's `upcoming`: :00 at +05:30 (:30 in UTC).
    assert all(s.minute == 0 and s.utcoffset() == timedelta(hours=5, minutes=30)
               for s in slots)
    assert all(s.astimezone(UTC).minute == 30 for s in slots)


def test_runs_and_activity_answer_empty_for_a_tenant_without_runs(client: TestClient) -> None:
    acme = {"Authorization": "Bearer key-acme"}
    r = client.get("/ui/api/runs", params={"state": "failed"}, headers=acme)
    assert r.status_code == 200 and r.json()["runs"] == []
    assert client.get("/ui/api/runs", params={"state": "nope"}, headers=acme).status_code == 422
    a = client.get("/ui/api/activity", headers=acme).json()
    assert len(a["minutes"]) == 60 and a["runs"] == 0
