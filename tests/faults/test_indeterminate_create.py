"""A create whose outcome the client never learns: its request times out after Kafka accepted
the command (no worker is up, so the API's read-your-writes wait outlasts the client's
timeout), or the client drops the connection right after sending. Retries with the same
idempotency key (the API takes it in the body, `idempotency_key`) yield the same job, never
two; the job runs once."""

from __future__ import annotations

import json
import socket
import time
import uuid

import httpx
import pytest

from kron.localkafka import free_ports
from replay.reader import read_topic
from tests.conftest import fresh_settings
from tests.faults.support import Fleet, now_ms, wait_for_group, wait_until
from tests.support.stack import ApiProcess

pytestmark = pytest.mark.integration


def test_retried_indeterminate_creates_make_one_job(kafka_cluster, tmp_path, fault_receiver,
                                                     reliability) -> None:
    settings = fresh_settings(kafka_cluster, tmp_path / "d", session_timeout_s=6.0,
                              tenant_burst=1000)
    rcv = fault_receiver
    tag = uuid.uuid4().hex[:6]
    api = ApiProcess(settings, tmp_path, free_ports(1)[0])
    headers = {"X-API-Key": "key-acme"}
    run_at = now_ms() + 15_000

    def body(key: str) -> dict:
        return {"name": f"indet-{key}", "idempotency_key": key,
                "run_at": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(run_at / 1000))
                + f".{run_at % 1000:03d}Z",
                "target": {"type": "http", "url": f"{rcv.url}/ok"}}

    k_timeout, k_drop = f"timeout-{tag}", f"drop-{tag}"
    outcomes: list[str] = []
    with Fleet(settings, tmp_path, rcv) as fleet:
        api.start()
        try:
            # 1. No worker: the command is accepted by Kafka, the projection never shows it,
            #    so the API waits 5 s; the client gives up after 1 s.
            with httpx.Client(base_url=api.url, headers=headers, timeout=1.0) as c:
                for _ in range(3):
                    try:
                        r = c.post("/v1/jobs", json=body(k_timeout))
                        outcomes.append(str(r.status_code))
                    except httpx.TimeoutException:
                        outcomes.append("timeout")
                    time.sleep(0.5)
            assert "timeout" in outcomes, outcomes
            accepted = wait_until(lambda: _commands_for(settings, k_timeout), 15)
            assert accepted, "the timed-out create never reached kron.commands"
            # 2. The client drops the connection right after sending the request.
            raw = json.dumps(body(k_drop)).encode()
            with socket.create_connection(("127.0.0.1", api.port)) as s:
                s.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nX-API-Key: key-acme\r\n"
                          b"Content-Type: application/json\r\n"
                          + f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
                time.sleep(0.05)
            fleet.start("w1")
            fleet.start("w2")
            assert wait_for_group(settings, 2, 90), fleet.logs()
            # 3. Retry both until the API answers; the same job each time.
            answers: dict[str, list[tuple[int, str]]] = {k_timeout: [], k_drop: []}
            with httpx.Client(base_url=api.url, headers=headers, timeout=20) as c:
                for key in answers:
                    for _ in range(10):
                        r = c.post("/v1/jobs", json=body(key))
                        answers[key].append((r.status_code, r.json().get("job_id", "")))
                        if r.status_code in (200, 201):
                            break
                        time.sleep(1)
                    r = c.post("/v1/jobs", json=body(key))  # and once more after it settled
                    answers[key].append((r.status_code, r.json().get("job_id", "")))
                listed = _list_all(c)
            hits_k = {k: rcv.wait_for(ids[-1][1], 1, 60) for k, ids in answers.items()}
            time.sleep(3)  # a second run would come right behind the first
            hits_k = {k: rcv.hits_for(ids[-1][1]) for k, ids in answers.items()}
        finally:
            api.stop()
    names = {k: [j for j in listed if j["name"] == f"indet-{k}"] for k in answers}
    dup = sum(max(0, len(v) - 1) for v in names.values())
    lost = sum(1 for k in answers if not hits_k[k])
    reliability.record(
        scenario="indeterminate create", injected="client timeout (1 s) before the API's "
        "read-your-writes wait, x3 with no worker; a connection dropped after sending",
        lost=lost, duplicates=dup + sum(max(0, len(h) - 1) for h in hits_k.values()),
        max_lateness_ms=max((h[0].received_ms - run_at for h in hits_k.values() if h),
                            default=None),
        attempts_ok=True,
        notes=f"first tries: {outcomes}; retries: "
              f"{ {k[:7]: [s for s, _ in v] for k, v in answers.items()} }; "
              f"{len(accepted)} CreateJob commands for the timed-out key")
    for key, got in answers.items():
        assert got[-1][0] == 200 and got[-2][0] in (200, 201), (key, got)
        assert len({j for _, j in got if j}) == 1, (key, got)
        assert len(names[key]) == 1, (key, names[key])
        assert len(hits_k[key]) == 1, (key, hits_k[key])


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
