"""A create whose outcome the client never learns: the API accepted the command (Kafka acked
it, the API answered) but the answer never reached the client, which timed out; or the client
dropped the connection right after sending. Retries with the same idempotency key (the API
takes it in the body, `idempotency_key`) yield the same job, never two; the job runs once.

The lost answer is real: an AnswerEatingProxy between client and API forwards the request and
keeps the API's response to itself until the client's timeout fires. The API answers at the
Kafka ack, so a slow API cannot stand in for that any more.

The runs are judged by `judge`: the target's log per (Idempotency-Key, X-Kron-Attempt)
against each job's retry policy as kron.jobs records it, executions per slot, and
`replay.audit` over the history; jobs per key by the API's own listing."""

from __future__ import annotations

import json
import socket
import time
import uuid
from typing import Any

import httpx
import pytest

from kron.localkafka import free_ports
from kron.processes import ApiProcess
from kron.settings import Settings
from replay.reader import read_topic
from tests.conftest import fresh_settings
from tests.faults.support import (
    AnswerEatingProxy,
    Fleet,
    Load,
    Withheld,
    judge,
    now_ms,
    wait_for_group,
    wait_settled,
    wait_until,
)

pytestmark = pytest.mark.integration
HEADERS = {"X-API-Key": "key-acme"}


def test_retried_indeterminate_creates_make_one_job(kafka_cluster, tmp_path, fault_receiver,
                                                     reliability) -> None:
    settings = fresh_settings(kafka_cluster, tmp_path / "d", session_timeout_s=6.0,
                              tenant_burst=1000)
    rcv = fault_receiver
    tag = uuid.uuid4().hex[:6]
    api = ApiProcess(settings, tmp_path, free_ports(1)[0])
    run_at = now_ms() + 15_000

    def body(key: str) -> dict:
        return {"name": f"indet-{key}", "idempotency_key": key,
                "run_at": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(run_at / 1000))
                + f".{run_at % 1000:03d}Z",
                "target": {"type": "http", "url": f"{rcv.url}/ok"}}

    k_timeout, k_drop = f"timeout-{tag}", f"drop-{tag}"
    with Fleet(settings, tmp_path, rcv) as fleet, AnswerEatingProxy(api.port) as proxy:
        api.start()
        try:
            # 1. No worker yet. Through the proxy, twice: the API accepts (201, then 200 for
            #    the retry), the proxy keeps both answers, the client times out both times.
            outcomes, lost, accepted = _lose_answers(proxy, settings, body(k_timeout))
            lost_ids = {json.loads(w.body)["job_id"] for w in lost}
            # 2. The client drops the connection right after sending the request.
            _send_and_drop(api.port, body(k_drop))
            # 3. Retries straight to the API, before any worker projected anything (the
            #    accepting API's own read-your-writes) and after the workers are up.
            early = _retry(api.url, body(k_timeout))
            fleet.start("w1")
            fleet.start("w2")
            assert wait_for_group(settings, 2, 90), fleet.logs()
            answers = {k: _retry(api.url, body(k)) for k in (k_timeout, k_drop)}
            answers[k_timeout] = early + answers[k_timeout]
            with httpx.Client(base_url=api.url, headers=HEADERS, timeout=20) as c:
                listed = _list_all(c)
            ids = {k: v[-1][1] for k, v in answers.items()}
            for k in answers:
                rcv.wait_for(ids[k], 1, 60)
            time.sleep(3)  # a second run would come right behind the first
            hits_k = {k: rcv.hits_for(ids[k]) for k in answers}
            # run_at is sent to the millisecond: it is the slot. No retry policy is given,
            # so judge checks the attempts against the one kron.jobs recorded (the API's).
            load = Load(expected={ids[k]: [run_at] for k in answers})
            settled = wait_settled(settings, load, 60)
            verdict = judge(settings, rcv, load)
        finally:
            api.stop()
    keyed = {k: [j for j in listed if j["idempotency_key"] == k] for k in answers}
    dup = sum(max(0, len(v) - 1) for v in keyed.values())
    twice = sorted(set(verdict.duplicates) | set(verdict.same_attempt))
    assert verdict.audit is not None
    audit = [f"{v.kind} {v.job_id}" for v in verdict.audit.violations if v.job_id in load.expected]
    reliability.record(
        scenario="indeterminate create", injected="API's answer withheld by a proxy until "
        "the client's 1 s timeout, x2 with no worker; a connection dropped after sending",
        lost=len(verdict.lost), duplicates=dup + len(twice),
        max_lateness_ms=verdict.max_lateness_ms if verdict.calls else None,
        attempts_ok=verdict.attempts_ok,
        notes=f"first tries: {outcomes}, answers lost: {[w.status for w in lost]}; retries: "
              f"{ {k[:7]: [s for s, _ in v] for k, v in answers.items()} }; "
              f"{len(accepted)} CreateJob commands for the timed-out key; {verdict.calls} "
              f"calls under {verdict.keys} keys for {verdict.slots} slots, "
              f"{verdict.same_attempt_repeats} same-attempt repeats; replay.audit: "
              f"{len(audit)} violations")
    # The first retry, with no worker yet, already knows the job whose answer was lost.
    assert early[0][0] == 200 and {early[0][1]} == lost_ids, (early, lost_ids)
    assert {j for _, j in answers[k_timeout]} == lost_ids, answers[k_timeout]
    assert settled, verdict.summary()
    assert not verdict.lost and not twice and not audit, (verdict.summary(), audit)
    assert verdict.attempts_ok, verdict.summary()
    for key, got in answers.items():
        assert got[-1][0] == 200 and got[-2][0] in (200, 201), (key, got)
        assert len({j for _, j in got if j}) == 1, (key, got)
        assert len(keyed[key]) == 1, (key, keyed[key])
        assert len(hits_k[key]) == 1, (key, hits_k[key])


def _lose_answers(proxy: AnswerEatingProxy, settings: Settings, body: dict[str, Any]
                  ) -> tuple[list[str], list[Withheld], list[dict[str, Any]]]:
    """Two creates through the proxy: both time out at the client, both were answered."""
    outcomes: list[str] = []
    with httpx.Client(base_url=proxy.url, headers=HEADERS, timeout=1.0) as c:
        for _ in range(2):
            try:
                outcomes.append(str(c.post("/v1/jobs", json=body).status_code))
            except httpx.TimeoutException:
                outcomes.append("timeout")
    assert outcomes == ["timeout", "timeout"], outcomes
    lost = wait_until(lambda: len(proxy.withheld) >= 2, 10) and list(proxy.withheld)
    assert lost and [w.status for w in lost] == [201, 200], proxy.withheld
    accepted = wait_until(lambda: _commands_for(settings, body["idempotency_key"]), 15)
    assert len(accepted) == 1, accepted  # the retry was recognised, not sent again
    return outcomes, lost, accepted


def _send_and_drop(port: int, body: dict[str, Any]) -> None:
    raw = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nX-API-Key: key-acme\r\n"
                  b"Content-Type: application/json\r\n"
                  + f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
        time.sleep(0.05)


def _retry(url: str, body: dict[str, Any]) -> list[tuple[int, str]]:
    """Until the API answers 200/201 (409 while the first is in flight), then once more."""
    got: list[tuple[int, str]] = []
    with httpx.Client(base_url=url, headers=HEADERS, timeout=20) as c:
        for _ in range(10):
            r = c.post("/v1/jobs", json=body)
            got.append((r.status_code, r.json().get("job_id", "")))
            if r.status_code in (200, 201):
                break
            time.sleep(1)
        r = c.post("/v1/jobs", json=body)
        got.append((r.status_code, r.json().get("job_id", "")))
    return got


def _commands_for(settings, key: str) -> list:
    return [e.record for e in read_topic(settings.bootstrap_servers, settings.topic("commands"))
            if e.record and e.record.get("idempotency_key") == key]


def _list_all(c: httpx.Client) -> list[dict]:
    out: list[dict] = []
    cursor = None
    for _ in range(50):
        r = c.get("/v1/jobs", params={"limit": 500, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        out.extend(r.json()["jobs"])
        cursor = r.json()["next_cursor"]
        if not cursor:
            break
    return out
