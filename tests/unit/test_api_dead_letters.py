"""The API's side of failure alerts without a broker: notify in job requests (422s naming
the field), the dead-letters view the projection folds, GET /v1/dead-letters (the caller's
own, paged) and POST /v1/dead-letters/{id}:redrive (404 for another tenant's, 422 for what
can't be redriven or a bad mend, the command sent in the refused one's place, 409 after)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient

from api.dead_letters import dead_letter_id
from api.models import request_of, spec_fingerprint
from api.projection import Projector
from schemas import codec
from tests.support.stack import spec
from tests.unit.test_api_models import body, build, invalid
from tests.unit.test_api_routes import Publisher, client, job_body, problem, publisher  # noqa: F401

T0 = 1_780_000_000_000
ENV = {"event_type": "record.dead_lettered", "schema_version": 1, "causation_id": None,
       "correlation_id": None, "producer": "w1"}


# --- notify in a job request ----------------------------------------------------------------


@pytest.mark.parametrize(("notify", "field", "words"), [
    ({"webhook": "ftp://hooks.example/x"}, "notify.webhook", "http:// or https://"),
    ({"webhook": "http://10.0.0.1/x"}, "notify.webhook", "private"),
    ({"webhook": "http://localhost:8080/"}, "notify.webhook", "private"),
    ({"webhook": "http://metadata/computeMetadata"}, "notify.webhook", "private"),
    ({"webhook": "https://u:p@hooks.example/"}, "notify.webhook", "credentials"),
    ({"webhook": "https://hooks.example/", "on": ["failed", "late"]}, "notify.on.1",
     "'failed' or 'missed'"),
    ({"on": ["failed"]}, "notify.webhook", "required"),
    ({"webhook": "https://hooks.example/", "secret": "x"}, "notify.secret", ""),
])
def test_a_bad_notify_is_refused_naming_its_field(notify: dict[str, Any], field: str,
                                                 words: str) -> None:
    err = invalid(body(notify=notify))
    assert err.field == field and words in err.message, (err.field, err.message)


def test_a_notify_is_normalised_kept_and_shown_and_absent_by_default() -> None:
    spec_ = build(body(notify={"webhook": "https://hooks.example/k",
                               "on": ["missed", "failed", "missed"]}))
    assert spec_["notify"] == {"webhook": "https://hooks.example/k", "on": ["failed", "missed"]}
    assert request_of(spec_)["notify"] == spec_["notify"]
    assert build(body(notify={"webhook": "https://h.example/"}))["notify"]["on"] == ["failed"]
    plain = build(body())
    assert plain["notify"] is None and "notify" not in request_of(plain)
    # A job written before v5 keeps its fingerprint: a null notify is left out of it.
    assert spec_fingerprint(plain) == spec_fingerprint(
        {k: v for k, v in plain.items() if k != "notify"})
    assert build(body(notify={"webhook": "http://10.0.0.1/"}), allow_private=True)["notify"]


def test_notify_is_patched_and_reset(client: TestClient) -> None:  # noqa: F811
    job_id = client.post("/v1/jobs", json=job_body(
        notify={"webhook": "https://hooks.example/a"})).json()["job_id"]
    r = client.patch(f"/v1/jobs/{job_id}", json={"notify": {"on": ["missed"]}})
    assert r.status_code == 200, r.text
    r = client.patch(f"/v1/jobs/{job_id}", json={"notify": {"webhook": "gopher://x"}})
    problem(r, 422, "invalid-input", "notify.webhook")


# --- the view and the routes ----------------------------------------------------------------


def dead_letter(event_id: str, tenant: str, at: int, **fields: Any) -> bytes:
    record = {"envelope": {**ENV, "event_id": event_id, "occurred_at_ms": at, "tenant": tenant},
              "source_topic": "kron.commands", "source_partition": 0, "source_offset": 1,
              "key": b"k", "value": None, "error": "bad", "error_class": "validation",
              **fields}
    return codec.encode("kron.deadletter.DeadLetter", record)


def refused_create(job_id: str, tenant: str, at: int) -> bytes:
    command = {"envelope": {**ENV, "event_id": f"c-{job_id}", "occurred_at_ms": at,
                            "tenant": tenant, "event_type": "job.create_requested"},
               "command_id": f"c-{job_id}", "job_id": job_id, "idempotency_key": None,
               "spec": {**spec(target={"url": "http://x.test/"}, run_at_ms=at),
                        "notify": {"webhook": "ftp://bad", "on": ["failed"]}}}
    return dead_letter(f"dlq:kron.commands:0:{at}", "", at, key=job_id.encode(),
                       value=codec.encode("kron.commands.CreateJob", command),
                       error="PermanentError: notify.webhook must be an http(s) URL")


def failure_alert(job_id: str, tenant: str, at: int) -> bytes:
    doc = {"v": 1, "job_name": "nightly", "run_id": f"r-{job_id}", "attempt": 3,
           "error": "HTTP 500", "output": "oops", "state": "failed", "scheduled_for_ms": at,
           "notify": None}
    return dead_letter(f"alert-{job_id}", tenant, at, value=orjson.dumps(doc),
                       error="execution failed after 3 attempt(s): HTTP 500",
                       error_class="execution_failed",
                       envelope={**ENV, "event_id": f"alert-{job_id}", "occurred_at_ms": at,
                                 "tenant": tenant, "correlation_id": job_id})


@pytest.fixture
def projected(client: TestClient) -> Iterator[Projector]:  # noqa: F811
    projector: Projector = client.app.state.service.projector  # type: ignore[attr-defined]
    topic = projector.settings.topic("dead-letters")
    for offset, value in enumerate([
            refused_create("j-bad", "acme", T0), failure_alert("j1", "acme", T0 + 1),
            failure_alert("j2", "globex", T0 + 2), refused_create("j-g", "globex", T0 + 3),
            dead_letter("dlq:kron.commands:0:9", "", T0 + 4, value=b"\x00junk")]):
        projector.apply(topic, 0, offset, value)
    yield projector


def get(client: TestClient, key: str = "key-acme", **params: Any) -> dict[str, Any]:  # noqa: F811
    r = client.get("/v1/dead-letters", params=params, headers={"X-API-Key": key})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def test_a_tenant_lists_its_own_dead_letters_newest_first_in_pages(
        client: TestClient, projected: Projector) -> None:  # noqa: F811
    acme = get(client)["dead_letters"]
    assert [d["kind"] for d in acme] == ["alert", "command"]
    alert, command = acme
    assert alert["alert"] == {"event": "failed", "job_id": "j1", "job_name": "nightly",
                              "run_id": "r-j1", "task_id": None, "attempt": 3,
                              "state": "failed",
                              "error": "HTTP 500", "output": "oops",
                              "scheduled_for": "2026-05-28T20:26:40.001Z"}
    assert command["command"]["name"] == "CreateJob" and command["command"]["job_id"] == "j-bad"
    assert command["id"] == dead_letter_id(f"dlq:kron.commands:0:{T0}")
    assert "notify.webhook" in command["error"] and command["redriven"] is None
    globex = get(client, "key-globex")["dead_letters"]
    assert {d["id"] for d in globex}.isdisjoint(d["id"] for d in acme) and len(globex) == 2
    page = get(client, limit=1)
    assert [d["id"] for d in page["dead_letters"]] == [alert["id"]]
    rest = get(client, limit=1, cursor=page["next_cursor"])
    assert [d["id"] for d in rest["dead_letters"]] == [command["id"]]
    assert rest["next_cursor"] is None
    r = client.get("/v1/dead-letters", params={"cursor": "../x"})
    problem(r, 422, "invalid-input", "cursor")


def test_a_redrive_sends_the_mended_command_once(
        client: TestClient, projected: Projector, publisher: Publisher) -> None:  # noqa: F811
    acme = {d["kind"]: d for d in get(client)["dead_letters"]}
    dl_id = acme["command"]["id"]
    url = f"/v1/dead-letters/{dl_id}:redrive"
    mended = job_body(notify={"webhook": "https://hooks.example/ok"})
    # Another tenant's id is unknown to this one, whatever the body.
    r = client.post(url, json={"junk": 1}, headers={"X-API-Key": "key-globex"})
    problem(r, 404, "dead-letter-not-found", "dl_id")
    problem(client.post("/v1/dead-letters/dl_nope:redrive", json=mended), 404,
            "dead-letter-not-found", "dl_id")
    r = client.post(url, json={**mended, "notify": {"webhook": "ftp://x"}})
    problem(r, 422, "invalid-input", "notify.webhook")
    problem(client.post(f"/v1/dead-letters/{acme['alert']['id']}:redrive", json=mended), 422,
            "not-redrivable", "dl_id")
    assert publisher.sent == []
    r = client.post(url, json=mended)
    assert r.status_code == 202, r.text
    answer = r.json()
    assert (answer["command"], answer["job_id"], answer["dead_letter_id"]) == (
        "CreateJob", "j-bad", dl_id)
    (create, cmd, key), (mark, record, mark_key) = publisher.sent
    assert (create, key, cmd["command_id"]) == ("kron.commands.CreateJob", "j-bad",
                                                 answer["command_id"])
    assert cmd["envelope"]["tenant"] == "acme"
    assert cmd["spec"]["notify"] == {"webhook": "https://hooks.example/ok", "on": ["failed"]}
    assert (mark, mark_key, record["error_class"]) == (
        "kron.deadletter.DeadLetter", dl_id, "redriven")
    # The projector reads the mark back from the topic: the view says it was redriven.
    projected.apply(projected.settings.topic("dead-letters"), 0, 10,
                    codec.encode(mark, record))
    [shown] = [d for d in get(client)["dead_letters"] if d["id"] == dl_id]
    assert shown["redriven"]["command_id"] == answer["command_id"]
    problem(client.post(url, json=mended), 409, "already-redriven", "dl_id")
    assert client.get("/v1/jobs/j-bad").status_code == 200  # served until projected


def test_a_redrive_mark_from_another_tenant_marks_nothing(
        client: TestClient, projected: Projector) -> None:  # noqa: F811
    dl_id = {d["kind"]: d for d in get(client)["dead_letters"]}["command"]["id"]
    forged = dead_letter("forged", "globex", T0 + 9, error_class="redriven",
                         envelope={**ENV, "event_id": "forged", "occurred_at_ms": T0 + 9,
                                   "tenant": "globex", "causation_id": dl_id,
                                   "correlation_id": "c"})
    projected.apply(projected.settings.topic("dead-letters"), 0, 11, forged)
    assert all(d["redriven"] is None for d in get(client)["dead_letters"])


def test_the_view_is_rebuilt_the_same_from_the_topic(
        client: TestClient, projected: Projector) -> None:  # noqa: F811
    views = projected.views
    before = {k: v for k, v in views.dump().items() if k.startswith((b"dl/", b"dx/"))}
    for key in before:
        views.db.delete(key)
    topic = projected.settings.topic("dead-letters")
    for offset, value in enumerate([
            refused_create("j-bad", "acme", T0), failure_alert("j1", "acme", T0 + 1),
            failure_alert("j2", "globex", T0 + 2), refused_create("j-g", "globex", T0 + 3)]):
        projected.apply(topic, 0, offset, value)
    after = {k: v for k, v in views.dump().items() if k.startswith((b"dl/", b"dx/"))}
    assert after == before and json.loads(next(iter(after.values())))


def test_an_alert_written_before_alerts_carried_their_facts_is_listed_too(
        client: TestClient, projected: Projector) -> None:  # noqa: F811
    old = dead_letter("alert-old", "acme", T0 + 5, key=b"exec-old", value=None,
                      error="execution failed after 2 attempt(s): HTTP 500",
                      error_class="execution_failed",
                      envelope={**ENV, "event_id": "alert-old", "occurred_at_ms": T0 + 5,
                                "tenant": "acme", "correlation_id": "j-old"})
    projected.apply(projected.settings.topic("dead-letters"), 0, 12, old)
    [first, *_] = get(client)["dead_letters"]
    assert first["alert"]["job_id"] == "j-old" and first["alert"]["run_id"] == "exec-old"
    assert first["alert"]["scheduled_for"] is None and "HTTP 500" in first["error"]
