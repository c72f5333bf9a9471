"""The API's /metrics in process (no broker): request durations by route template, method
and status, a registry per app (two apps in one process don't collide), nothing with
metrics off."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from api.projection import Projector, Views
from api.server import Components, create_app
from kron.settings import Settings
from tests.unit.test_api_routes import Probe, Publisher

Series = dict[tuple[tuple[str, str], ...], float]


def client_of(tmp_path: Path, **overrides: object) -> Iterator[TestClient]:
    settings = Settings(bootstrap_servers="127.0.0.1:1", data_dir=tmp_path, api_create_batch=1,
                        api_keys="acme=key-acme", **overrides)  # type: ignore[arg-type]
    views = Views(tmp_path / "views")
    parts = Components(settings=settings, views=views, projector=Projector(settings, views),
                       publisher=Publisher(), probe=Probe())  # type: ignore[arg-type]
    # Not `with`: the lifespan would start the projector, which needs a broker.
    yield TestClient(create_app(settings, components=parts), headers={"X-API-Key": "key-acme"})
    views.close()


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    yield from client_of(tmp_path)


def counts(client: TestClient) -> Series:
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out: Series = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            if s.name == "kron_api_request_duration_seconds_count":
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def key(route: str, method: str, status: int) -> tuple[tuple[str, str], ...]:
    return (("method", method), ("route", route), ("status", str(status)))


def test_requests_are_timed_by_route_template_method_and_status(client: TestClient) -> None:
    for job in ("a", "b", "c"):
        assert client.get(f"/v1/jobs/{job}").status_code == 404
    assert client.get("/v1/jobs").status_code == 200
    assert client.get("/v1/jobs", headers={"X-API-Key": "wrong"}).status_code == 401
    assert client.get("/no/such/path/42").status_code == 404
    assert client.request("BREW", "/v1/jobs").status_code == 405
    counts(client)
    seen = counts(client)
    assert seen[key("/metrics", "GET", 200)] == 1  # the scrape before this one
    assert seen[key("/v1/jobs/{job_id}", "GET", 404)] == 3
    assert seen[key("/v1/jobs", "GET", 200)] == 1
    assert seen[key("/v1/jobs", "GET", 401)] == 1
    assert seen[key("unmatched", "GET", 404)] == 1
    assert seen[key("/v1/jobs", "other", 405)] == 1
    assert not any(dict(k)["route"].endswith("/a") or "42" in dict(k)["route"] for k in seen)


def test_each_app_has_its_own_registry(client: TestClient, tmp_path: Path) -> None:
    second = next(client_of(tmp_path / "second"))
    client.get("/v1/jobs")
    client.get("/v1/jobs")
    second.get("/v1/jobs")
    assert counts(client)[key("/v1/jobs", "GET", 200)] == 2
    assert counts(second)[key("/v1/jobs", "GET", 200)] == 1


def test_metrics_off_serves_no_page(tmp_path: Path) -> None:
    off = next(client_of(tmp_path, metrics_enabled=False))
    assert off.get("/metrics").status_code == 404


def test_the_metrics_page_is_not_in_the_openapi_document(client: TestClient) -> None:
    assert "/metrics" not in client.get("/openapi.json").json()["paths"]
