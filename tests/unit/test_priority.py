"""Priority tiers (issue 39): the domain's Priority and its rank, JobSpec.priority on the wire
(v4), the plan's priority, and the API's `priority` field: the request, its 422, the
canonical form, PATCH and the fingerprint."""

from __future__ import annotations

import json
import typing
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api import models
from api.models import (
    InvalidField,
    PriorityIn,
    build_spec,
    merge_patch,
    parse_patch,
    parse_request,
    request_of,
    spec_fingerprint,
)
from api.projection import Projector, Views
from api.routes import responses, service
from api.server import Components, create_app
from kron.settings import Settings
from schemas import codec, names
from schemas.registry import default_registry
from streams.domain.errors import PermanentError
from streams.domain.policies import PRIORITIES, PRIORITY_RANK, Priority
from streams.engine import spec as spec_module
from streams.engine.spec import JobPlan, plan_of
from tests.golden.make_golden import SAMPLES
from tests.support.stack import spec as stack_spec
from tests.unit.test_api_routes import Probe, conforms, problem

NOW_MS = int(datetime(2026, 6, 1, tzinfo=UTC).timestamp() * 1000)
URL = "https://example.com/hook"
TIERS = ["critical", "normal", "batch"]


# --- the domain ------------------------------------------------------------------------------


def test_priority_is_the_avro_enum_the_api_literal_and_ranked_critical_first() -> None:
    assert [p.value for p in Priority] == TIERS
    assert list(typing.get_args(PriorityIn)) == TIERS
    for name in (names.CREATE_JOB, names.CREATE_JOBS, names.UPDATE_JOB, names.JOB_STATE):
        text = json.dumps(default_registry().latest(name).schema)
        assert '"symbols": ["critical", "normal", "batch"]' in text, name
    assert [p.rank for p in Priority] == [0, 1, 2]
    assert sorted(Priority, key=lambda p: p.rank) == [Priority.CRITICAL, Priority.NORMAL,
                                                       Priority.BATCH]
    # A decoded record's plain string ranks and maps as its member does.
    assert PRIORITY_RANK["batch"] == Priority.BATCH.rank == 2
    assert PRIORITIES["critical"] is Priority.CRITICAL


# --- the plan --------------------------------------------------------------------------------


def _spec(**fields: Any) -> dict[str, Any]:
    return stack_spec(target={"url": URL}, run_at_ms=NOW_MS + 60_000, **fields)


@pytest.mark.parametrize("tier", TIERS)
def test_the_plan_takes_the_specs_priority(tier: str) -> None:
    plan = plan_of(_spec(priority=tier))
    assert plan.priority is Priority(tier)
    assert plan.priority.rank == TIERS.index(tier)


def test_a_spec_without_priority_plans_as_normal() -> None:
    spec = _spec()
    del spec["priority"]  # as a dict built before v4, or by a caller that left it out
    assert plan_of(spec).priority is Priority.NORMAL
    assert JobPlan.__dataclass_fields__["priority"].default is Priority.NORMAL


@pytest.mark.parametrize("bad", ["urgent", "", None, 1, ["batch"], "CRITICAL"])
def test_an_unknown_priority_is_refused_naming_the_field(bad: Any) -> None:
    with pytest.raises(PermanentError) as refused:
        plan_of(_spec(priority=bad))
    assert refused.value.field == "priority"
    assert "critical, normal, batch" in refused.value.message


def test_jobs_sharing_their_cached_policies_keep_their_own_priority() -> None:
    """Most jobs share one cached copy of their policies (streams.engine.spec): the tier is
    each job's own, not the first one's."""
    spec_module._cached_policies.cache_clear()
    plans = [plan_of(_spec(priority=tier)) for tier in [*TIERS, *reversed(TIERS)]]
    assert [p.priority.value for p in plans] == [*TIERS, *reversed(TIERS)]
    assert len({id(p.retry) for p in plans}) == 1  # the policies are shared
    assert spec_module._cached_policies.cache_info().hits == len(plans) - 1


def test_a_dag_job_has_one_priority_for_its_tasks() -> None:
    dag = codec.decode(codec.encode(names.JOB_STATE, SAMPLES[(names.JOB_STATE, 4)][-1])
                       ).record["spec"]  # a minimal sample: decoded, with every default
    assert dag["priority"] == "batch" and dag["target"][0] == "kron.DagTarget"
    plan = plan_of(dag)
    assert plan.dag is not None and plan.priority is Priority.BATCH


# --- the wire ---------------------------------------------------------------------------------


@pytest.mark.parametrize("tier", TIERS)
def test_a_create_job_carries_its_priority_through_avro(tier: str) -> None:
    spec = build_spec(parse_request({"run_at": "2026-06-01T01:00:00Z", "target": {"url": URL},
                                     "priority": tier}), now_ms=NOW_MS, allow_private=False)
    record = {"envelope": SAMPLES[(names.CREATE_JOB, 4)][0]["envelope"], "command_id": "c",
              "job_id": "j", "idempotency_key": None, "spec": spec}
    back = codec.decode(codec.encode(names.CREATE_JOB, record)).record["spec"]
    assert back == spec and back["priority"] == tier
    assert plan_of(back).priority is Priority(tier)
    assert request_of(back)["priority"] == tier


def test_a_v3_job_state_reads_as_normal_in_every_view_of_it() -> None:
    v3 = SAMPLES[(names.JOB_STATE, 3)][0]
    registry = codec.Codec(default_registry())
    back = registry.decode(registry.encode(names.JOB_STATE, v3, version=3)).record["spec"]
    assert back["priority"] == "normal"
    assert plan_of(back).priority is Priority.NORMAL
    assert request_of(back)["priority"] == "normal"


# --- api.models -------------------------------------------------------------------------------


def build(raw: dict[str, Any]) -> dict[str, Any]:
    return build_spec(parse_request(raw), now_ms=NOW_MS, allow_private=False)


def body(**overrides: Any) -> dict[str, Any]:
    return {"name": "n", "schedule": "0 2 * * *", "target": {"url": URL}} | overrides


def test_a_request_without_priority_is_normal() -> None:
    spec = build(body())
    assert spec["priority"] == "normal"
    assert request_of(spec)["priority"] == "normal"
    assert parse_request(body()).priority == "normal"


@pytest.mark.parametrize("bad", ["urgent", "Critical", 1, True, None, ["batch"], {}])
def test_an_unknown_priority_is_a_422_naming_the_field_and_its_values(bad: Any) -> None:
    with pytest.raises(InvalidField) as refused:
        parse_request(body(priority=bad))
    assert refused.value.field == "priority"
    for tier in TIERS:
        assert tier in refused.value.message
    with pytest.raises(InvalidField) as refused_patch:
        parse_patch({"priority": bad} if bad is not None else {"priority": "x"})
    assert refused_patch.value.field == "priority"


def test_priority_survives_the_canonical_form() -> None:
    for tier in TIERS:
        spec = build(body(priority=tier))
        assert build(request_of(spec)) == spec


def test_a_patch_changes_the_priority_and_null_resets_it() -> None:
    spec = build(body(priority="batch"))

    def patch(raw: dict[str, Any]) -> dict[str, Any]:
        return merge_patch(spec, parse_patch(raw), now_ms=NOW_MS, allow_private=False)

    assert patch({"priority": "critical"})["priority"] == "critical"
    assert patch({"priority": None})["priority"] == "normal"
    assert patch({"name": "m"})["priority"] == "batch"  # kept when not named
    assert patch({"priority": "critical"})["name"] == "n"


def test_the_fingerprint_of_a_normal_job_is_the_one_it_had_before_priority() -> None:
    """Views keep the fingerprint of a keyed create; a replay after the upgrade compares its
    new spec's (with priority normal) against it."""
    spec = build(body())
    before_v4 = {k: v for k, v in spec.items() if k != "priority"}
    assert spec_fingerprint(spec) == spec_fingerprint(before_v4)
    assert spec_fingerprint(build(body(priority="batch"))) != spec_fingerprint(spec)
    assert spec_fingerprint(build(body(priority="batch"))) != spec_fingerprint(
        build(body(priority="critical")))


# --- the routes ------------------------------------------------------------------------------


class Publisher:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any], str]] = []

    async def publish(self, name: str, record: dict[str, Any], *, key: str) -> None:
        codec.encode(name, record)  # as the real publisher writes it: it must fit the schema
        self.sent.append((name, record, key))

    def close(self) -> None:
        pass


@pytest.fixture
def publisher() -> Publisher:
    return Publisher()


@pytest.fixture
def client(tmp_path: Path, publisher: Publisher,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setattr(service, "READ_YOUR_WRITES_S", 0.01)  # no worker applies anything
    settings = Settings(bootstrap_servers="127.0.0.1:1", data_dir=tmp_path, api_create_batch=1,
                        api_keys="acme=key-acme", allow_private_targets=True,
                        tenant_burst=1000)
    views = Views(tmp_path / "views")
    parts = Components(settings=settings, views=views, projector=Projector(settings, views),
                       publisher=publisher, probe=Probe())  # type: ignore[arg-type]
    yield TestClient(create_app(settings, components=parts), headers={"X-API-Key": "key-acme"})
    views.close()


RUN_AT = (datetime.now(UTC) + timedelta(hours=1)).isoformat()


def test_the_api_refuses_an_unknown_priority_with_a_problem(client: TestClient,
                                                           publisher: Publisher) -> None:
    r = client.post("/v1/jobs", json={"run_at": RUN_AT, "target": {"url": "http://x.test/"},
                                      "priority": "urgent"})
    refused = problem(r, 422, "invalid-input", "priority")
    assert all(tier in refused["detail"] for tier in TIERS), refused
    assert publisher.sent == []


def test_the_api_creates_shows_and_patches_a_jobs_priority(client: TestClient,
                                                          publisher: Publisher) -> None:
    r = client.post("/v1/jobs", json={"run_at": RUN_AT, "target": {"url": "http://x.test/"},
                                      "priority": "batch"})
    created = conforms(responses.CreatedJob, r, 201)
    assert created["definition"]["priority"] == "batch"
    name, record, _ = publisher.sent[-1]
    assert name == names.CREATE_JOB and record["spec"]["priority"] == "batch"
    job_id = created["job_id"]
    got = conforms(responses.Job, client.get(f"/v1/jobs/{job_id}"), 200)
    assert got["definition"]["priority"] == "batch"
    conforms(responses.Job, client.patch(f"/v1/jobs/{job_id}", json={"priority": "critical"}),
             200)
    name, record, _ = publisher.sent[-1]
    assert name == names.UPDATE_JOB and record["spec"]["priority"] == "critical"
    problem(client.patch(f"/v1/jobs/{job_id}", json={"priority": "low"}), 422, "invalid-input",
            "priority")
    # Without a priority, a create is normal.
    r = client.post("/v1/jobs", json={"run_at": RUN_AT, "target": {"url": "http://x.test/"}})
    assert conforms(responses.CreatedJob, r, 201)["definition"]["priority"] == "normal"
    assert publisher.sent[-1][1]["spec"]["priority"] == "normal"


def test_the_openapi_document_lists_the_tiers(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    prop = doc["components"]["schemas"]["JobRequest"]["properties"]["priority"]
    assert prop["enum"] == TIERS and prop["default"] == "normal"
    patch = doc["components"]["schemas"]["JobPatch"]["properties"]["priority"]
    assert {"enum": TIERS, "type": "string"} in patch["anyOf"]


def test_models_module_exports_the_literal() -> None:
    assert models.PriorityIn is PriorityIn
